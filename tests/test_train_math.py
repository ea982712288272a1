"""examples/train_math.py end to end on the offline toy world, in one process and in two."""

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import run_command, run_commands


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_math.py"
TINY_RUN = ["--max_steps", "2", "--logging_steps", "1", "--heldout_max_problems", "4", "--heldout_num_samples", "1",
            "--per_device_train_batch_size", "16", "--save_strategy", "no"]  # fmt: skip
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def check_run(output_dir: Path, output: str):
    assert "Held-out accuracy before training" in output and "Model saved to" in output
    results = json.loads((output_dir / "results.json").read_text())
    assert results["steps"] == 2 and 0.0 <= results["heldout_accuracy_after"] <= 1.0
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    logged = [entry for entry in history if "spurious/silenced_ratio" in entry]
    assert len(logged) == 2 and all("reward" in entry and "entropy/p95" in entry for entry in logged)
    assert (output_dir / "model.safetensors").is_file()
    assert "Method: **stapo**" in (output_dir / "README.md").read_text()
    # Only what the user must see: no deprecation or DDP notices the package causes
    for noise in ("FutureWarning", "find_unused_parameters=True", "is deprecated"):
        assert noise not in output


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The one-process and the two-process run, started together (each a process group of its own, in an output
    directory of its own): by name, the output directory and the result."""
    single, two = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("two")
    commands = [
        [sys.executable, str(SCRIPT), *TINY_RUN, "--output_dir", str(single)],
        [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29534",
            str(SCRIPT), "--config", str(ROOT / "examples/recipes/toy/stapo_cpu.yaml"), *TINY_RUN,
            "--output_dir", str(two),
        ],
    ]  # fmt: skip
    results = run_commands(commands, timeout=600, env=ENV)
    return {"single": (single, results[0]), "two": (two, results[1])}


@pytest.mark.slow
def test_single_process(runs):
    output_dir, result = runs["single"]
    assert result.returncode == 0, result.stderr[-4000:]
    output = result.stdout + result.stderr
    assert "Method stapo (1 process)" in output
    check_run(output_dir, output)
    # The same directory again is refused, the run left as it was
    before = (output_dir / "results.json").read_text()
    again = run_command(
        [sys.executable, str(SCRIPT), *TINY_RUN, "--output_dir", str(output_dir)], timeout=600, env=ENV
    )
    assert again.returncode == 2 and "--overwrite_output_dir true" in again.stderr
    assert (output_dir / "results.json").read_text() == before


@pytest.mark.slow
def test_two_processes(runs):
    output_dir, result = runs["two"]
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Method stapo (2 processes)" in output
    check_run(output_dir, output)
