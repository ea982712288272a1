"""examples/train_math.py end to end on the offline toy world, in one process and in two."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_math.py"
TINY_RUN = ["--max_steps", "2", "--logging_steps", "1", "--heldout_max_problems", "4", "--heldout_num_samples", "1",
            "--per_device_train_batch_size", "16", "--save_strategy", "no"]  # fmt: skip
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def load_script():
    spec = importlib.util.spec_from_file_location("train_math", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_arguments_means_the_offline_recipe():
    script_args, args, model_args = load_script().parse_args([])
    assert script_args.dataset_name == "toy" and model_args.model_name_or_path == "toy"
    assert args.use_cpu and not args.bf16 and args.spurious_mask_mode == "low_entropy"
    # Other arguments without a recipe or a model change the offline recipe.
    script_args, args, model_args = load_script().parse_args(["--max_steps", "3", "--method", "justrl"])
    assert model_args.model_name_or_path == "toy" and args.max_steps == 3 and args.spurious_mask_mode == "none"


def test_precedence_command_line_over_recipe_over_method():
    parse = load_script().parse_args
    recipe = str(ROOT / "examples" / "recipes" / "toy" / "stapo_cpu.yaml")
    _, args, _ = parse(["--config", recipe, "--method", "20_entropy"])
    assert (args.spurious_mask_mode, args.top_entropy_quantile) == ("none", 0.2)
    _, args, _ = parse(["--config", recipe, "--method", "grpo", "--beta", "0.01"])
    assert (args.loss_type, args.epsilon_high, args.delta, args.beta) == ("grpo", 0.2, None, 0.01)
    _, args, _ = parse(["--config", recipe, "--method", "justrl_fullmask", "--spurious_mask_mode", "random"])
    assert args.spurious_mask_mode == "random"


def test_a_missing_dataset_fails_before_any_model_is_loaded(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(ROOT / "examples/recipes/toy/stapo_cpu.yaml"),
         "--dataset_name", str(tmp_path / "nope.parquet"), "--output_dir", str(tmp_path)],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "nope.parquet" in result.stderr and "Loading weights" not in result.stderr


def check_run(output_dir: Path, output: str):
    assert "Held-out accuracy before training" in output and "Model saved to" in output
    results = json.loads((output_dir / "results.json").read_text())
    assert results["steps"] == 2 and 0.0 <= results["heldout_accuracy_after"] <= 1.0
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    logged = [entry for entry in history if "spurious/silenced_ratio" in entry]
    assert len(logged) == 2 and all("reward" in entry and "entropy/p95" in entry for entry in logged)
    assert (output_dir / "model.safetensors").is_file()


@pytest.mark.slow
def test_single_process(tmp_path):
    command = [sys.executable, str(SCRIPT), "--config", str(ROOT / "examples/recipes/toy/stapo_cpu.yaml"),
               *TINY_RUN, "--output_dir", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    output = result.stdout + result.stderr
    assert "Method stapo (1 process)" in output
    check_run(tmp_path, output)


@pytest.mark.slow
def test_two_processes(tmp_path):
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29534",
        str(SCRIPT), "--config", str(ROOT / "examples/recipes/toy/stapo_cpu.yaml"), *TINY_RUN,
        "--output_dir", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Method stapo (2 processes)" in output
    check_run(tmp_path, output)
