"""The output directory rules (stapo_trl.output_dir) and STAPOTrainer's failed-save cleanup."""

import errno
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import is_gone, run_command

from stapo_trl import output_dir as output_dirs
from stapo_trl.output_dir import (
    LOCK_FILE,
    check_writable,
    hold_output_dir,
    last_complete_checkpoint,
    prepare_output_dir,
    resolve_resume,
)


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
    assert (tmp_path / "new").is_dir() and os.listdir(tmp_path / "new") == [LOCK_FILE]  # held by this process
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
    assert sorted(os.listdir(tmp_path)) == [LOCK_FILE, "notes.txt"]


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


# --- one run at a time: the lock ---------------------------------------------------------------------------------

# A run that holds its output directory until its stdin closes (then exits normally), reporting its pid once it holds.
HOLDER = """
import os, sys
from stapo_trl.output_dir import hold_output_dir
hold_output_dir(sys.argv[1])
print(os.getpid(), flush=True)
sys.stdin.read()
"""


class Holder:
    """Another run (a separate process) holding `output_dir`."""

    def __init__(self, output_dir):
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(output_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=dict(os.environ, PYTHONPATH=str(TESTS.parent)),
        )
        assert select.select([self.process.stdout], [], [], 120)[0], "the holder did not start"
        self.pid = int(self.process.stdout.readline())

    def end(self, how: str) -> None:
        if how == "normally":
            self.process.stdin.close()
        else:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


def test_a_second_run_on_a_held_directory_is_refused_before_it_deletes_anything(tmp_path):
    output_dir = tmp_path / "run"
    with Holder(output_dir) as first_run:
        make_checkpoint(output_dir, 10)
        for overwrite in (False, True):
            with pytest.raises(ValueError) as refused:
                prepare_output_dir(output_dir, None, overwrite=overwrite)
            message = str(refused.value)
            assert "in use by a run that is still going" in message and "another --output_dir" in message
            assert f"pid {first_run.pid} on host {socket.gethostname()}" in message
        assert (output_dir / "checkpoint-10" / "trainer_state.json").is_file()
        assert json.loads((output_dir / LOCK_FILE).read_text())["pid"] == first_run.pid
        first_run.end("normally")
    assert not (output_dir / LOCK_FILE).exists()  # released at exit
    hold_output_dir(output_dir)  # the directory is free again
    assert json.loads((output_dir / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_a_lock_left_by_a_killed_run_is_stale_and_taken_over(tmp_path, caplog):
    with Holder(tmp_path / "run") as killed_run:
        killed_run.end("with SIGKILL")
        assert is_gone(killed_run.pid)
        assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"] == killed_run.pid  # left behind
    with caplog.at_level(logging.WARNING, logger="stapo_trl.output_dir"):
        hold_output_dir(tmp_path / "run")
    assert any(f"a run that has ended (pid {killed_run.pid}" in message for message in caplog.messages)
    assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"] == os.getpid()
    hold_output_dir(tmp_path / "run")  # again, in the process that holds it: nothing to do


def test_a_folder_made_only_for_the_lock_is_removed_at_exit(tmp_path):
    with Holder(tmp_path / "made") as run:
        assert (tmp_path / "made" / LOCK_FILE).is_file()
        run.end("normally")
    assert not (tmp_path / "made").exists()


def test_without_flock_the_recorded_pid_and_host_tell_a_live_run_from_an_ended_one(tmp_path, monkeypatch):
    def no_flock(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(output_dirs.fcntl, "flock", no_flock)
    records = {
        "alive": {"pid": os.getppid(), "host": socket.gethostname(), "started": "2026-01-01T00:00:00+00:00"},
        "elsewhere": {"pid": 1, "host": socket.gethostname() + "-other", "started": "2026-01-01T00:00:00+00:00"},
    }
    for name, record in records.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / LOCK_FILE).write_text(json.dumps(record))
        with pytest.raises(ValueError, match=f"pid {record['pid']} on host {record['host']},.*delete .*{LOCK_FILE}"):
            hold_output_dir(tmp_path / name)
    with Holder(tmp_path / "ended") as ended_run:
        ended_run.end("with SIGKILL")
    hold_output_dir(tmp_path / "ended")
    assert json.loads((tmp_path / "ended" / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_the_training_script_refuses_a_held_output_dir_in_one_line(tmp_path):
    with Holder(tmp_path / "run") as first_run:
        result = run_command(
            [sys.executable, str(TESTS.parent / "examples" / "train_math.py"), "--output_dir", str(tmp_path / "run")],
            timeout=300,
            env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(TESTS.parent)),
        )
        assert result.returncode == 2, result.stderr[-3000:]
        (line,) = result.stderr.strip().splitlines()
        assert "in use by a run that is still going" in line and f"pid {first_run.pid}" in line


def test_the_trainer_holds_its_output_dir(tmp_path, tokenizer, prompt_dataset):
    from conftest import cpu_config, length_reward

    from stapo_trl import STAPOTrainer
    from stapo_trl.toy.model import tiny_qwen3

    with Holder(tmp_path / "run") as first_run:
        with pytest.raises(ValueError, match=f"pid {first_run.pid}"):
            STAPOTrainer(
                model=tiny_qwen3(tokenizer),
                reward_funcs=length_reward,
                args=cpu_config(tmp_path / "run"),
                train_dataset=prompt_dataset,
                processing_class=tokenizer,
            )
    STAPOTrainer(
        model=tiny_qwen3(tokenizer),
        reward_funcs=length_reward,
        args=cpu_config(tmp_path / "mine"),
        train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )
    assert json.loads((tmp_path / "mine" / LOCK_FILE).read_text())["pid"] == os.getpid()
