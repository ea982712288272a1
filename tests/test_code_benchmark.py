"""benchmarks/code_reward_throughput.py runs (--quick) and prints its table. No timing checks."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


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
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--quick"],
        cwd=tmp_path,
        env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    assert process.returncode == 0, stderr[-4000:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith("|")
    ]
    assert rows[0] == COLUMNS and len(rows) == 5  # header, separator, three settings
    assert all(len(row) == len(COLUMNS) and all(row) for row in rows[2:])
