"""The evaluation scripts' command line (stapo_trl.evaluation.cli): wrong input is one line, before anything slow,
and nothing is left behind."""

import os
import sys
from pathlib import Path

import pytest
from conftest import run_commands

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


SCRIPTS = ["evaluate_math.py", "evaluate_code.py"]


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory) -> dict:
    """Both scripts on a model that is not here, started together (each a process of its own, in an empty directory
    of its own): by script, the directory and the result."""
    directories = [tmp_path_factory.mktemp(script) for script in SCRIPTS]
    commands = [
        [sys.executable, str(ROOT / "examples" / script), "--model", "Qwen/Qwen3-0.6B-Base", "--output_dir", "out"]
        for script in SCRIPTS
    ]
    results = run_commands(
        commands,
        each=[dict(cwd=directory) for directory in directories],
        timeout=300,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    return dict(zip(SCRIPTS, zip(directories, results, strict=True), strict=True))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_print_one_line(script, script_runs):
    directory, result = script_runs[script]
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: --model Qwen/Qwen3-0.6B-Base: "), lines
    assert not any(directory.iterdir())
