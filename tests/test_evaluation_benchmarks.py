"""The six math benchmarks ship with the package: declared as package data, the default source, and the same
files as the project's reference copies; no user-facing text points anywhere else."""

import functools
import os
import sys
from pathlib import Path

import pytest
from conftest import run_commands

from stapo_trl.evaluation import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    SHIPPED_BENCHMARKS_DIR,
    grade_completions,
    load_benchmark,
)


ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = ROOT.parent / "shared" / "data" / "math_eval"
ROWS = {"AIME24": 30, "AIME25": 30, "AMC23": 40, "MATH500": 500, "Minerva": 272, "OlympiadBench": 674}


def test_the_six_files_are_package_data_and_the_default_source():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"stapo_trl.math" = ["benchmarks/*.parquet", "benchmarks/SOURCES.md"]' in pyproject
    assert SHIPPED_BENCHMARKS_DIR == ROOT / "stapo_trl" / "math" / "benchmarks"
    for name in PAPER_BENCHMARKS:
        problems = load_benchmark(name)  # no directory, no Hub: the shipped file
        assert len(problems) == ROWS[name] == len(set(problems["id"]))
    assert (SHIPPED_BENCHMARKS_DIR / "SOURCES.md").is_file()


# CI always has the reference copies beside the checkout: there a missing copy fails instead of skipping.
@pytest.mark.skipif(
    not REFERENCE_DIR.is_dir() and not os.environ.get("CI"), reason="the reference copies are not beside this checkout"
)
def test_the_shipped_files_are_the_reference_copies():
    for benchmark in BENCHMARKS.values():
        shipped = (SHIPPED_BENCHMARKS_DIR / benchmark.file).read_bytes()
        assert shipped == (REFERENCE_DIR / benchmark.file).read_bytes(), benchmark.file


def test_a_boxed_gold_grades_correct_for_every_shipped_problem():
    for name in PAPER_BENCHMARKS:
        golds = load_benchmark(name)["solution"]
        grades = grade_completions([rf"Reasoning... so the answer is \boxed{{{gold}}}" for gold in golds], golds)
        wrong = [gold for gold, grade in zip(golds, grades) if not grade["correct"]]
        assert not wrong, f"{name}: {len(wrong)} golds not accepted, e.g. {wrong[:3]}"


def test_no_user_facing_text_points_to_the_reference_folder():
    texts = [(ROOT / "docs" / "evaluation.md").read_text(), (SHIPPED_BENCHMARKS_DIR / "SOURCES.md").read_text()]
    commands = [
        [sys.executable, str(ROOT / "examples" / script), "--help"]
        for script in ("evaluate_math.py", "evaluate_code.py")
    ]
    for result in run_commands(commands, timeout=120):
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout)
    texts += [path.read_text() for path in (ROOT / "stapo_trl" / "evaluation").glob("*.py")]
    assert not [text[:80] for text in texts if "shared/" in text]


def test_grading_a_benchmark_is_not_cut_by_the_training_reward_call_budget(monkeypatch):
    from stapo_trl.evaluation import math_task
    from stapo_trl.math.reward import math_reward

    # A training call that ran out of its budget would score the answers it did not reach -1.
    monkeypatch.setattr(math_task, "math_reward", functools.partial(math_reward, time_budget=1e-3))
    golds = list(load_benchmark("AMC23")["solution"])
    grades = grade_completions([rf"\boxed{{{gold}}}" for gold in golds], golds)
    assert all(grade["correct"] for grade in grades)
