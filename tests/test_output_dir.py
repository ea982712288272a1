"""The output directory rules (stapo_trl.output_dir) and STAPOTrainer's failed-save cleanup."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_command

from stapo_trl.output_dir import check_writable, last_complete_checkpoint, prepare_output_dir, resolve_resume


TESTS = Path(__file__).resolve().parent


def make_checkpoint(output_dir: Path, step: int, complete: bool = True) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_a_fresh_or_empty_directory_is_accepted(tmp_path):
    assert prepare_output_dir(tmp_path / "new", None, overwrite=False) is None
    assert (tmp_path / "new").is_dir() and os.listdir(tmp_path / "new") == []
    assert prepare_output_dir(tmp_path / "new", None, overwrite=False) is None


def test_a_directory_with_an_earlier_run_is_refused_and_left_alone(tmp_path):
    make_checkpoint(tmp_path, 10)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ValueError) as refused:
        prepare_output_dir(tmp_path, None, overwrite=False)
    message = str(refused.value)
    assert "--resume_from_checkpoint latest" in message and "--overwrite_output_dir true" in message
    assert (tmp_path / "checkpoint-10" / "model.safetensors").is_file() and (tmp_path / "results.json").is_file()


def test_overwrite_deletes_the_earlier_checkpoints_only(tmp_path):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20, complete=False)
    (tmp_path / "notes.txt").write_text("mine")
    assert prepare_output_dir(tmp_path, None, overwrite=True) is None
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_resume_latest_is_the_last_complete_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 9)
    make_checkpoint(tmp_path, 30)
    make_checkpoint(tmp_path, 100, complete=False)  # a save cut short
    (tmp_path / "checkpoint-40").write_text("not a folder")
    expected = str(tmp_path / "checkpoint-30")
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-30"
    for value in ("latest", "true", "True"):
        assert prepare_output_dir(tmp_path, value, overwrite=False) == expected
    assert (tmp_path / "checkpoint-100").is_dir()  # resuming deletes nothing, even with overwrite
    assert prepare_output_dir(tmp_path, "latest", overwrite=True) == expected
    assert (tmp_path / "checkpoint-100").is_dir()


def test_resume_needs_a_complete_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_resume("latest", tmp_path)
    partial = make_checkpoint(tmp_path, 20, complete=False)
    make_checkpoint(tmp_path, 10)
    with pytest.raises(ValueError, match="incomplete checkpoint.*checkpoint-10"):
        resolve_resume(str(partial), tmp_path)
    with pytest.raises(ValueError, match="no such directory"):
        resolve_resume(str(tmp_path / "checkpoint-5"), tmp_path)
    assert resolve_resume(str(tmp_path / "checkpoint-10"), tmp_path) == str(tmp_path / "checkpoint-10")


def test_unwritable_directory(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="--output_dir .* is not writable"):
        check_writable(tmp_path / "file" / "run")


SAVE_WITH_A_FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
from conftest import cpu_config, length_reward, prompt_dataset
from stapo_trl import STAPOTrainer
from stapo_trl.toy import toy_checkpoint
from datasets import Dataset

prompts = [[{{"role": "user", "content": f"What is {{a}}+1?"}}] for a in range(8)]
dataset = Dataset.from_dict({{"prompt": prompts, "solution": ["1"] * 8}})
args = cpu_config({output_dir!r}, max_steps=1, save_strategy="steps", save_steps=1)
trainer = STAPOTrainer(model=toy_checkpoint(), reward_funcs=length_reward, args=args, train_dataset=dataset)
# A file system that refuses writes beyond 4 KB per file (the model is ~500 KB): a full disk, as the process sees it.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
trainer.train()
"""


def test_a_failed_checkpoint_save_names_the_folder_and_leaves_no_checkpoint(tmp_path):
    output_dir = tmp_path / "run"
    script = SAVE_WITH_A_FULL_DISK.format(tests=str(TESTS), output_dir=str(output_dir))
    result = run_command([sys.executable, "-c", script], timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                         stderr=subprocess.STDOUT)  # fmt: skip
    output = result.stdout
    assert result.returncode != 0
    checkpoint = output_dir / "checkpoint-1"
    assert f"Saving the checkpoint '{checkpoint}' failed" in output, output[-3000:]
    assert "--resume_from_checkpoint latest" in output
    assert not checkpoint.exists()
    assert last_complete_checkpoint(output_dir) is None
