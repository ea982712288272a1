"""benchmarks/code_reward_throughput.py runs (--quick) and prints its table. No timing checks."""

import os
import sys
from pathlib import Path

import pytest
from conftest import run_command


SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "code_reward_throughput.py"
COLUMNS = [
    "setting",
    "start ms",
    "per test ms",
    "completions",
    "tests each",
    "threads",
    "seconds",
    "completions/s",
    "CPU s",
]


@pytest.mark.slow
def test_throughput_benchmark_runs(tmp_path):
    result = run_command([sys.executable, str(SCRIPT), "--quick"], timeout=300, cwd=tmp_path,
                         env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"))  # fmt: skip
    stdout, stderr = result.stdout, result.stderr
    assert result.returncode == 0, stderr[-4000:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith("|")
    ]
    assert rows[0] == COLUMNS and len(rows) == 5  # header, separator, three settings
    assert all(len(row) == len(COLUMNS) and all(row) for row in rows[2:])
