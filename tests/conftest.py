import contextlib
import os
import signal
import subprocess
import threading
import time


os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
from datasets import Dataset  # noqa: E402

from stapo_trl import STAPOConfig  # noqa: E402
from stapo_trl.toy.model import tiny_qwen3  # noqa: E402
from stapo_trl.toy.tokenizer import build_tokenizer  # noqa: E402


def run_command(command, *, timeout: float, stderr=subprocess.PIPE, **popen_kwargs) -> subprocess.CompletedProcess:
    """Run `command` in a new session (its own process group), capturing its text output (stderr=subprocess.STDOUT
    merges the two); on timeout SIGKILL the whole group, then fail the test with the output's tail. `popen_kwargs`
    (env, cwd) go to Popen. Launchers and trainers leave children behind otherwise, and a hung child hangs the suite."""
    return run_commands([command], timeout=timeout, stderr=stderr, **popen_kwargs)[0]


def run_commands(commands, *, timeout: float, **kwargs) -> list[subprocess.CompletedProcess]:
    """Run `commands` at the same time, each as `run_command` runs one; all must end within `timeout` s of their
    start, or every group still running is SIGKILLed and the test fails."""
    with started_commands(commands, timeout=timeout, **kwargs) as finish:
        return finish()


@contextlib.contextmanager
def started_commands(commands, *, timeout: float, stderr=subprocess.PIPE, each=None, **popen_kwargs):
    """Start `commands`, each in a new session as `run_command` does, and yield `finish`, which waits for them all
    and returns their CompletedProcess: the test does other work in between. `each`: per command, Popen arguments
    over `popen_kwargs` (an env of its own). Their output is read as it comes (a full pipe never stalls one), and
    they must all end within `timeout` s of their start; on timeout, or when the block is left any other way, every
    group still running is SIGKILLed."""
    deadline = time.monotonic() + timeout
    processes, outputs, readers = [], [], []
    try:
        for command, own in zip(commands, each or [{}] * len(commands), strict=True):
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
                **{**popen_kwargs, **own},
            )
            processes.append(process)
            outputs.append(None)
            reader = threading.Thread(target=_communicate, args=(process, outputs, len(outputs) - 1), daemon=True)
            reader.start()
            readers.append(reader)

        def finish() -> list[subprocess.CompletedProcess]:
            for reader in readers:
                reader.join(max(deadline - time.monotonic(), 0))
            late = [process.args for process, reader in zip(processes, readers) if reader.is_alive()]
            if late:
                _kill_running(processes, readers)
                tails = "\n".join(f"{command}:\n{_text(output)[-5000:]}" for command, output in zip(commands, outputs))
                pytest.fail(f"{late} timed out after {timeout} s:\n{tails}")
            for reader in readers:
                reader.join()
            return [
                subprocess.CompletedProcess(process.args, process.returncode, *output)
                for process, output in zip(processes, outputs, strict=True)
            ]

        yield finish
    finally:
        _kill_running(processes, readers)


def _communicate(process, outputs, index):
    outputs[index] = process.communicate()


def _text(output) -> str:
    return "" if output is None else (output[0] or "") + (output[1] or "")


def _kill_running(processes, readers):
    """SIGKILL the group of every command whose output is still open (its leader, or a child holding its pipes)."""
    for process, reader in zip(processes, readers):
        if reader.is_alive():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for reader in readers:
        reader.join()


# CPU settings every test config needs: TRL defaults to bf16, which refuses to start without a GPU.
CPU_SETTINGS = dict(
    use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False, dataloader_num_workers=0
)


def cpu_settings(**overrides) -> dict:
    """Small, fast, CPU-only config values for tests; `overrides` win."""
    settings = dict(
        CPU_SETTINGS,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    settings.update(overrides)
    return settings


def cpu_config(output_dir, **overrides) -> STAPOConfig:
    return STAPOConfig(**cpu_settings(output_dir=str(output_dir), **overrides))


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def model(tokenizer):
    return tiny_qwen3(tokenizer, seed=0)


@pytest.fixture(scope="session")
def prompt_dataset():
    prompts = [[{"role": "user", "content": f"What is {a}+{a + 1}?"}] for a in range(16)]
    return Dataset.from_dict({"prompt": prompts, "solution": [str(2 * a + 1) for a in range(16)]})


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from the IHDR chunk, after checking the PNG signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def train_tiny_run(output_dir, tokenizer, prompt_dataset, **overrides):
    """A 2-step STAPO run of the tiny random model (τ_p = 0.02, so tokens get silenced) that saves its state."""
    from stapo_trl import STAPOTrainer

    args = cpu_config(output_dir, **{"spurious_prob_threshold": 0.02, "max_steps": 2, **overrides})
    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer), reward_funcs=length_reward, args=args, train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    trainer.save_state()
    return output_dir


def length_reward(completions, **kwargs):
    """A deterministic reward that varies within groups, so advantages are non-zero."""
    return [float(len(c[0]["content"]) % 3) - 1.0 for c in completions]


def is_gone(pid: int) -> bool:
    """No such process, or only its zombie waiting to be reaped by whoever inherited it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
