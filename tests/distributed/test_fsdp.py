"""STAPOTrainer under FSDP2 in 2 CPU processes (gloo), against DDP and one process on the same completions.

accelerate does not enable FSDP on CPU processes; the test-only `fsdp_on_cpu/sitecustomize.py`, put first on the
children's PYTHONPATH, does. Every FSDP run checks that the prepared model is an `FSDPModule` on every rank. Each
launch runs under conftest's `run_commands` timeout, which kills its whole process group: a hang fails the test. Runs
that a test compares (FSDP and one process, say) are started together, each a process group of its own.
"""

import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import run_command, run_commands
from eq6 import s2t_silenced, token_logps_and_entropies
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from stapo_trl.toy.model import tiny_qwen3
from stapo_trl.toy.tokenizer import build_tokenizer


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FSDP_ON_CPU = HERE / "fsdp_on_cpu"
RUN = HERE / "fixed_completions_run.py"
FSDP2_CONFIG = ROOT / "examples" / "accelerate_configs" / "fsdp2.yaml"
TAU_P, Q = 0.02, 0.75  # fixed_completions_run.py's S2T settings
# Float32 sums in another order (FSDP's reduce-scatter, DDP's all-reduce, one process's accumulation) change gradients
# by ~1e-7 relative; AdamW turns that into parameter differences of the same order (measured: 1.2e-7), while each run
# moves the parameters by ~4e-3 between steps 4 and 8.
PARAMETER_TOLERANCE = 1e-6

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(fsdp_on_cpu: bool) -> dict:
    paths = [str(FSDP_ON_CPU)] if fsdp_on_cpu else []
    paths += [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


def launch_command(*, config=FSDP2_CONFIG, num_processes=2, port=None) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
        "--num_processes", str(num_processes), "--mixed_precision", "no", "--main_process_port", str(port or free_port()),
    ]  # fmt: skip


def run_fixed(output_dir, *flags, processes: int, fsdp_on_cpu: bool = True) -> str:
    """fixed_completions_run.py in one process, or launched with fsdp2.yaml in 2 (with or without the shim)."""
    [output] = run_fixed_together(
        dict(output_dir=output_dir, flags=flags, processes=processes, fsdp_on_cpu=fsdp_on_cpu)
    )
    return output


def run_fixed_together(*runs: dict) -> list[str]:
    """Several `run_fixed` runs (their keyword arguments, `flags` a tuple) at the same time, in separate output
    directories; their outputs."""
    commands, each = [], []
    for run in runs:
        prefix = [sys.executable] if run["processes"] == 1 else launch_command()
        commands.append([*prefix, str(RUN), str(run["output_dir"]), *run.get("flags", ())])
        each.append(dict(env=child_env(run.get("fsdp_on_cpu", True))))
    results = run_commands(commands, each=each, timeout=600, cwd=ROOT, stderr=subprocess.STDOUT)
    for result in results:
        assert result.returncode == 0, result.stdout[-5000:]
    return [result.stdout for result in results]


def assert_fsdp_on_every_rank(output: str, output_dir=None, model_class="FSDPQwen3ForCausalLM"):
    for rank in range(2):
        assert f"fsdp_on_cpu: rank {rank}: {model_class} is an FSDPModule" in output, output[-3000:]
        if output_dir is not None:
            assert (Path(output_dir) / f"fsdp-rank{rank}").read_text() == model_class


def decisions(output_dir) -> dict[int, list[dict]]:
    """Per optimizer step, the micro-batches of every process, with their S2T decision."""
    steps = {}
    for path in sorted(Path(output_dir).glob("decisions-rank*.pt")):
        for micro_batch in torch.load(path):
            steps.setdefault(micro_batch.pop("step"), []).append(micro_batch)
    return steps


def silenced_by_completion(micro_batches) -> Counter:
    """The step's completions (prompt and completion tokens) with their silenced flags, in no particular order."""
    rows = Counter()
    for batch in micro_batches:
        for i in range(batch["completion_ids"].size(0)):
            prompt, loss = batch["prompt_mask"][i].bool(), batch["completion_mask"][i].bool()
            rows[
                tuple(batch["prompt_ids"][i][prompt].tolist()),
                tuple(batch["completion_ids"][i][loss].tolist()),
                tuple(batch["spurious_silenced"][i][loss].tolist()),
            ] += 1
    return rows


def eq6_silenced(micro_batches) -> Counter:
    """Eq. 6 (tests/eq6.py) over a step's micro-batches, from the initial model in this process: the first step's
    decision must be this, whichever layout took it."""
    model = tiny_qwen3(build_tokenizer(), seed=0)
    logps, entropies, masks, advantages = [], [], [], []
    width = max(batch["completion_ids"].size(1) for batch in micro_batches)
    with torch.no_grad():
        for batch in micro_batches:
            batch_logps, batch_entropies = token_logps_and_entropies(model, batch)
            pad = (0, width - batch_logps.size(1))
            logps.append(torch.nn.functional.pad(batch_logps, pad))
            entropies.append(torch.nn.functional.pad(batch_entropies, pad))
            masks.append(torch.nn.functional.pad(batch["completion_mask"], pad))
            advantages.append(batch["advantages"])
    silenced = s2t_silenced(torch.cat(logps), torch.cat(entropies), torch.cat(advantages), torch.cat(masks), TAU_P, Q)
    row = 0
    expected = []
    for batch in micro_batches:
        rows = batch["completion_ids"].size(0)
        expected.append({**batch, "spurious_silenced": silenced[row : row + rows, : batch["completion_ids"].size(1)]})
        row += rows
    return silenced_by_completion(expected)


def saved_parameters(path) -> dict:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()  # in this one process


def assert_same_parameters(actual, expected, tolerance=PARAMETER_TOLERANCE):
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=tolerance, msg=name)


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory) -> dict:
    """The FSDP2 run, the DDP run (fsdp2.yaml without the shim) and the one-process run, started together (each a
    process group of its own, in an output directory of its own): their directories, and the DDP run's output."""
    directories = {name: tmp_path_factory.mktemp(name) for name in ("fsdp", "ddp", "one")}
    fsdp_output, ddp_output, _ = run_fixed_together(
        dict(output_dir=directories["fsdp"], processes=2),
        dict(output_dir=directories["ddp"], processes=2, fsdp_on_cpu=False),
        dict(output_dir=directories["one"], processes=1),
    )
    assert_fsdp_on_every_rank(fsdp_output, directories["fsdp"])
    return {**directories, "ddp_output": ddp_output}


@pytest.fixture(scope="module")
def fsdp_run(reference_runs):
    return reference_runs["fsdp"]


def test_fsdp2_decides_and_trains_as_ddp_and_one_process(fsdp_run, reference_runs):
    """Scope "step", accumulation 2, steps_per_generation 4, num_iterations 2, 8 steps: the silenced set of every
    step and the parameters after the 8 steps are those of DDP and of one process. The DDP run is what
    `accelerate launch --config_file fsdp2.yaml` gives on CPUs without the shim: accelerate drops FSDP, and the
    trainer says so once."""
    ddp_output, ddp_run, one_run = reference_runs["ddp_output"], reference_runs["ddp"], reference_runs["one"]
    assert "is an FSDPModule" not in ddp_output and "done, DistributedDataParallel" in ddp_output
    assert ddp_output.count("FSDP (fsdp_version 2) was asked for, but accelerate runs this job as MULTI_CPU") == 1

    fsdp, ddp, one = decisions(fsdp_run), decisions(ddp_run), decisions(one_run)
    assert sorted(fsdp) == sorted(ddp) == sorted(one) == list(range(1, 9))
    assert silenced_by_completion(fsdp[1]) == eq6_silenced(fsdp[1])
    for step in fsdp:
        expected = silenced_by_completion(one[step])
        assert silenced_by_completion(fsdp[step]) == expected == silenced_by_completion(ddp[step]), f"step {step}"
        silenced = sum(sum(flags) * count for (_, _, flags), count in expected.items())
        assert silenced > 0, f"step {step}: nothing silenced, the comparison is vacuous"

    final = saved_parameters(fsdp_run / "final")
    assert_same_parameters(final, saved_parameters(one_run / "final"))
    assert_same_parameters(final, saved_parameters(ddp_run / "final"))
    moved = max(
        (final[name] - value).abs().max().item() for name, value in saved_parameters(fsdp_run / "checkpoint-4").items()
    )
    assert moved > 100 * PARAMETER_TOLERANCE, moved


def test_fsdp2_checkpoint_resumes_as_the_uninterrupted_run(fsdp_run, tmp_path):
    """Resuming the FSDP2 run from its step-4 checkpoint (`--resume_from_checkpoint latest`) gives steps 5-8 the
    uninterrupted run's decisions and parameters."""
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    checkpoint = fsdp_run / "checkpoint-4"
    assert (checkpoint / "pytorch_model_fsdp.bin").is_file() and (checkpoint / "optimizer.bin").is_file()
    subprocess.run(["cp", "-r", str(checkpoint), str(resumed)], check=True)
    assert_fsdp_on_every_rank(run_fixed(resumed, "--resume", processes=2), resumed)

    uninterrupted, after_resume = decisions(fsdp_run), decisions(resumed)
    assert sorted(after_resume) == [5, 6, 7, 8]
    for step in after_resume:
        assert silenced_by_completion(after_resume[step]) == silenced_by_completion(uninterrupted[step]), step
    assert_same_parameters(saved_parameters(resumed / "final"), saved_parameters(fsdp_run / "final"))


def test_fsdp2_uneven_processes_take_the_one_process_decision(tmp_path):
    """Process 1 holds 1-token completions with advantage 0 (no candidates), process 0 12-token ones: the entropy
    gather and the step's forwards still line up (a hang would hit the timeout), and every decision is the one
    process's on the same completions."""
    output, _ = run_fixed_together(
        dict(output_dir=tmp_path / "fsdp", flags=("--uneven",), processes=2),
        dict(output_dir=tmp_path / "one", flags=("--uneven",), processes=1),
    )
    assert_fsdp_on_every_rank(output, tmp_path / "fsdp")
    fsdp, one = decisions(tmp_path / "fsdp"), decisions(tmp_path / "one")
    for rank, length in ((0, 12), (1, 1)):
        for batch in torch.load(tmp_path / "fsdp" / f"decisions-rank{rank}.pt"):
            assert batch["completion_mask"].sum(1).tolist() == [length] * batch["completion_mask"].size(0)
            if rank == 1:
                assert not batch["advantages"].any() and not batch["spurious_silenced"].any()
    assert silenced_by_completion(fsdp[1]) == eq6_silenced(fsdp[1])
    assert sorted(fsdp) == sorted(one)
    for step in fsdp:
        assert silenced_by_completion(fsdp[step]) == silenced_by_completion(one[step]), f"step {step}"
    assert_same_parameters(saved_parameters(tmp_path / "fsdp" / "final"), saved_parameters(tmp_path / "one" / "final"))


# What examples/train_math.py needs on 2 CPU processes besides the offline toy recipe (which already sets use_cpu and
# bf16 off): a small step and a short held-out check.
TOY_CPU_OVERRIDES = [
    "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
    "--max_completion_length", "16", "--heldout_max_problems", "4", "--heldout_num_samples", "1",
]  # fmt: skip


def test_train_math_under_fsdp2_as_a_user_launches_it(tmp_path):
    """`accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml examples/train_math.py` with CPU
    overrides: 2 steps under FSDP2, and the saved model loads in one process."""
    command = [
        *launch_command(), str(ROOT / "examples" / "train_math.py"), *TOY_CPU_OVERRIDES, "--output_dir", str(tmp_path),
    ]  # fmt: skip
    result = run_command(command, timeout=600, env=child_env(True), cwd=ROOT, stderr=subprocess.STDOUT)
    assert result.returncode == 0, result.stdout[-5000:]
    assert_fsdp_on_every_rank(result.stdout)
    assert "was asked for, but accelerate" not in result.stdout
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.model_type == "qwen3"


def slurm_launch_line() -> str:
    """The per-node command of examples/slurm/train_multinode.slurm: the body of its `srun ... bash -c '...'`."""
    script = (ROOT / "examples" / "slurm" / "train_multinode.slurm").read_text()
    return script.split("bash -c '", 1)[1].split("'", 1)[0]


def test_two_machines_as_the_slurm_script_starts_them(tmp_path):
    """The slurm script's launch line on each of 2 simulated machines of one process each (machine ranks 0 and 1,
    rendezvous on 127.0.0.1), multi_node_fsdp2.yaml, the toy recipe with CPU overrides: both train 2 steps under
    FSDP2. A hang of either kills both process groups."""
    base = dict(
        child_env(True),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),  # `accelerate` of this Python
        ACCELERATE_CONFIG=str(ROOT / "examples" / "accelerate_configs" / "multi_node_fsdp2.yaml"),
        RECIPE=str(ROOT / "examples" / "recipes" / "toy" / "stapo_cpu.yaml"),
        SLURM_NNODES="2", NUM_PROCESSES="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
    )  # fmt: skip
    arguments = [*TOY_CPU_OVERRIDES, "--output_dir", str(tmp_path)]
    processes = [
        subprocess.Popen(
            ["bash", "-c", slurm_launch_line(), "bash", *arguments], env=dict(base, SLURM_NODEID=str(machine)),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        for machine in range(2)
    ]  # fmt: skip
    try:
        outputs = [process.communicate(timeout=600)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
    for machine, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"machine {machine}:\n{output[-5000:]}"
        assert f"fsdp_on_cpu: rank {machine}: FSDPQwen3ForCausalLM is an FSDPModule" in output, output[-3000:]
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.model_type == "qwen3"


def test_lora_under_fsdp2_trains_as_one_process(tmp_path):
    """A LoRA adapter (LoRA dropout 0.05, switched off by disable_dropout) under FSDP2: every step's decision and the
    trained adapter are those of one process on the same completions, and the adapter moved."""
    output, _ = run_fixed_together(
        dict(output_dir=tmp_path / "fsdp", flags=("--lora",), processes=2),
        dict(output_dir=tmp_path / "one", flags=("--lora",), processes=1),
    )
    assert_fsdp_on_every_rank(output, tmp_path / "fsdp", model_class="FSDPPeftModel")
    fsdp, one = decisions(tmp_path / "fsdp"), decisions(tmp_path / "one")
    assert sorted(fsdp) == sorted(one) == list(range(1, 9))
    assert silenced_by_completion(fsdp[1]) == eq6_silenced(fsdp[1])
    for step in fsdp:
        assert silenced_by_completion(fsdp[step]) == silenced_by_completion(one[step]), f"step {step}"
    adapter = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert_same_parameters(adapter, load_file(tmp_path / "one" / "final" / "adapter_model.safetensors"))
    lora_b = [value for name, value in adapter.items() if "lora_B" in name]
    assert lora_b and all(value.abs().max() > 100 * PARAMETER_TOLERANCE for value in lora_b)  # initialized to 0
