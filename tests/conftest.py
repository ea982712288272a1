import os
import signal
import subprocess


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
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True, **popen_kwargs
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{command} timed out after {timeout} s:\n{(out + (err or ''))[-5000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


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
