"""The evaluation scripts' command line (stapo_trl.evaluation.cli): wrong input is one line, before anything slow,
and nothing is left behind."""

import os
import sys
from pathlib import Path

import pytest
from conftest import run_command

from stapo_trl.cli import UsageError
from stapo_trl.evaluation import cli


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "task, argv, expected",
    [
        ("math", ["--model", "Qwen/Qwen3-0.6B-Base"], "--model Qwen/Qwen3-0.6B-Base: not a local path and not in the Hugging Face cache"),
        ("math", ["--model", "no/such/folder"], "--model no/such/folder: no such file or directory"),
        ("math", ["--model", "toy", "--benchmarks", "AIME24=missing.parquet"], "--benchmarks AIME24 missing.parquet: no such file or directory"),
        ("math", ["--model", "toy", "--benchmarks", "GSM8K=openai/gsm8k"], "--benchmarks GSM8K openai/gsm8k: not a local path"),
        ("code", ["--model", "toy"], "--benchmarks_dir: the code benchmarks are read from local files"),
        ("code", ["--model", "toy", "--benchmarks_dir", "nowhere"], "benchmark HumanEval+: no file nowhere/HumanEvalPlus.jsonl"),
    ],
)  # fmt: skip
def test_wrong_input_is_refused_before_anything_is_written(task, argv, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as error:
        cli.main([*argv, "--output_dir", "out"], task=task)
    assert expected in str(error.value)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("script", ["evaluate_math.py", "evaluate_code.py"])
def test_the_scripts_print_one_line(script, tmp_path):
    argv = [sys.executable, str(ROOT / "examples" / script), "--model", "Qwen/Qwen3-0.6B-Base", "--output_dir", "out"]
    result = run_command(argv, timeout=300, cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: --model Qwen/Qwen3-0.6B-Base: "), lines
    assert not any(tmp_path.iterdir())
