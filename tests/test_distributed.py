"""S2T across 2 real processes: `accelerate launch --multi_gpu --num_processes 2` starts 2 gloo CPU processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_command


HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_two_processes_match_the_single_process_step(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true")
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29533",
        str(HERE / "distributed_s2t.py"),
    ]  # fmt: skip
    result = run_command(command, timeout=600, env=env, cwd=tmp_path, stderr=subprocess.STDOUT)
    output = result.stdout
    assert result.returncode == 0, output[-5000:]
    assert "rank 0: distributed S2T OK" in output and "rank 1: distributed S2T OK" in output, output[-3000:]
