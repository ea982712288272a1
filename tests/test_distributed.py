"""S2T across 2 real processes: `accelerate launch --multi_gpu --num_processes 2` starts 2 gloo CPU processes."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_two_processes_match_the_single_process_step(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true")
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29533",
        str(HERE / "distributed_s2t.py"),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group: the launcher and both workers go together on timeout
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"2-process run timed out:\n{output[-5000:]}")
    assert process.returncode == 0, output[-5000:]
    assert "rank 0: distributed S2T OK" in output and "rank 1: distributed S2T OK" in output, output[-3000:]
