"""examples/train_code.py end to end on the toy model and the shipped sample problems, offline."""

import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import run_command

from stapo_trl.cli import check_before_loading, parse_args


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_code.py"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def test_a_malformed_dataset_fails_before_any_model_is_loaded(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": "{"}}))
    command = [sys.executable, str(SCRIPT), "--dataset_name", str(bad), "--output_dir", str(tmp_path / "out")]
    result = run_command(command, timeout=300, env=ENV)
    assert result.returncode == 2
    assert "row 0: field 'reward_model.ground_truth'" in result.stderr and "drop_invalid" in result.stderr
    assert "Loading weights" not in result.stderr


@pytest.mark.slow
def test_trains_offline_on_the_sample_problems(tmp_path):
    command = [sys.executable, str(SCRIPT), "--max_steps", "2", "--output_dir", str(tmp_path)]
    result = run_command(command, timeout=600, env=ENV)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Method stapo (1 process)" in result.stdout + result.stderr
    assert json.loads((tmp_path / "results.json").read_text())["steps"] == 2
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    logged = [entry for entry in history if "rewards/code_reward/mean" in entry]
    assert len(logged) == 2
    assert all(
        -1.0 <= entry["rewards/code_reward/mean"] <= 1.0 and "spurious/silenced_ratio" in entry for entry in logged
    )
    assert (tmp_path / "model.safetensors").is_file()


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["stapo", "justrl", "grpo", "20_entropy"])
def test_the_code_recipe_trains_as_the_math_recipe_of_the_same_model(method):
    """Paper Table 4: one setting for both tasks. Every STAPOConfig value equals the math recipe's but the names."""
    recipes = ROOT / "examples" / "recipes" / "Qwen3-1.7B-Base"
    argv = ["--method", method, "--use_cpu", "true"]
    code_args, code, code_model = parse_args(
        load_script("train_code").SCRIPT, ["--config", str(recipes / "code.yaml"), *argv]
    )
    _, math, math_model = parse_args(
        load_script("train_math").SCRIPT, ["--config", str(recipes / "stapo.yaml"), *argv]
    )
    names = {"output_dir", "run_name", "hub_model_id", "logging_dir"}
    differences = {
        f.name: (getattr(code, f.name), getattr(math, f.name))
        for f in dataclasses.fields(code)
        if f.name not in names and getattr(code, f.name) != getattr(math, f.name)
    }
    assert differences == {}
    assert code_model == math_model
    assert code.output_dir.endswith(f"code-{method}") and code.max_completion_length == 15360
    assert (code_args.dataset_name, code_args.max_prompt_length, code_args.test_timeout) == (
        "PRIME-RL/Eurus-2-RL-Data",
        1024,
        5.0,
    )


@pytest.mark.slow
def test_the_code_recipe_trains_one_step_on_the_toy_model(tmp_path):
    """The recipe as shipped, with only what a CPU and the toy model need changed: one optimizer step, saved."""
    train_code = load_script("train_code")
    cpu_overrides = ["--model_name_or_path", "toy", "--dataset_name", "toy", "--keep_system_prompt", "false",
                     "--max_prompt_length", "480", "--use_vllm", "false", "--bf16", "false", "--use_cpu", "true",
                     "--max_completion_length", "32", "--max_steps", "1", "--output_dir", str(tmp_path)]  # fmt: skip
    recipe = ROOT / "examples" / "recipes" / "Qwen3-1.7B-Base" / "code.yaml"
    script_args, args, model_args = parse_args(train_code.SCRIPT, ["--config", str(recipe), *cpu_overrides])
    check_before_loading(script_args, args, model_args)
    train_code.main(script_args, args, model_args)
    assert json.loads((tmp_path / "results.json").read_text())["steps"] == 1
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/code_reward/mean" in entry for entry in history)
