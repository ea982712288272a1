"""The commands and the library example of the README, docs/ and notebooks/README.md, run as written.

The commands are read from the documents' code blocks (```bash blocks, and `$ `-prompted lines of output blocks)
and run in order, README first, in a copy of the repository, the way a reader of a fresh clone runs them. Training
commands get `--max_steps 2` (and a smaller held-out check) appended: the same command, fewer steps; the reference
sections' placeholders (`RUN_DIR`) name runs that the README's commands made. A command that
cannot run on this machine must match one of `NOT_HERE`, with the reason; any other command runs.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_command, started_commands


ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "notebooks" / "README.md"]
# Commands that cannot run in this test, each with the reason (a pattern searched in the command).
NOT_HERE = {
    r"^pip install": "installs packages: the test runs in the environment they installed",
    r"^python -m pytest": "the test suite itself",
    r"Qwen3-(1\.7B|8B|14B)-Base|accelerate_configs/(fsdp|multi_node|zero)|\bsbatch\b|^trl vllm-serve": "needs GPUs: "
    "a paper recipe, a multi-GPU launch, or a model such a run trains",
    r"^papermill ": "papermill is not a dependency: tests/test_notebook.py executes the notebook with nbclient",
    r"^python examples/study\.py": "21 training runs: tests/test_study.py runs the study script at toy size",
    r"outputs/rep/run1": "reads the run tests/test_report.py writes (an untrained model, which no script trains)",
    r"\.ci-venv-vllm|^pip uninstall|STAPO_REQUIRE_VLLM": ".ci/vllm runs these steps, in a virtual environment of its own",
}
# Placeholders of the reference sections (`stapo-report RUN_DIR ...`), filled with runs the README's commands made.
PLACEHOLDERS = {
    r"\bRUN_DIR\b": "outputs/toy-trace",
    r"\boutputs/(stapo|justrl)\b(?![-\w])": r"outputs/toy-\1",
    r"\boutputs/grpo\b(?![-\w])": "outputs/toy-stapo-20",
}
TRAINING_SCRIPTS = ("examples/train_math.py", "examples/train_code.py")
FEWER_STEPS = ["--max_steps", "2"]
SMALLER_HELDOUT = ["--heldout_max_problems", "4", "--heldout_num_samples", "1"]


def code_blocks(markdown: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced code block of a Markdown text ("" when the fence names none)."""
    blocks, language, lines = [], None, []
    for line in markdown.splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            if language is None:
                language, lines = fence[3:].strip(), []
            else:
                blocks.append((language, lines))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def documented_commands(path: Path) -> list[str]:
    """The shell commands of a document, continuation lines joined, comments and `$ ` prompts removed."""
    commands = []
    for language, lines in code_blocks(path.read_text(encoding="utf-8")):
        if language not in ("bash", ""):
            continue
        command = None
        for line in lines:
            text = line.strip()
            if language == "" and command is None:  # an output block: only its `$ `-prompted lines are commands
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            if command is None and (not text or text.startswith(("#", "-"))):  # comments, option fragments
                continue
            text = re.sub(r"\s+#.*$", "", text)  # a trailing comment
            command = text if command is None else f"{command} {text}"
            if command.endswith("\\"):
                command = command[:-1].rstrip()
            else:
                commands.append(command)
                command = None
    return commands


def reason_not_run(command: str) -> str | None:
    return next((reason for pattern, reason in NOT_HERE.items() if re.search(pattern, command)), None)


def as_run_here(command: str) -> str:
    """The command with its placeholders filled, and fewer training steps (and a smaller held-out check) appended
    when it trains."""
    for placeholder, run in PLACEHOLDERS.items():
        command = re.sub(placeholder, run, command)
    if not any(script in command for script in TRAINING_SCRIPTS):
        return command
    extra = FEWER_STEPS + ([] if '--heldout_dataset ""' in command or "train_code" in command else SMALLER_HELDOUT)
    return f"{command} {' '.join(extra)}"


@pytest.fixture
def clone(tmp_path):
    """A copy of the repository's files (those git tracks or would track), without anything a run wrote."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    target = tmp_path / "clone"
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.split("\0")):
            if (ROOT / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, target / name)
    else:  # not a git checkout (an unpacked source archive)
        shutil.copytree(ROOT, target, ignore=shutil.ignore_patterns("outputs", ".git", "__pycache__", "*.egg-info"))
    return target


def environment(clone: Path) -> dict:
    """This interpreter's environment (its `python`, `accelerate` and `stapo-report` first on PATH), offline, with
    the copy's package first on the import path."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(clone))
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def test_commands_are_read_from_the_documents():
    readme = documented_commands(ROOT / "README.md")
    assert readme[0].startswith("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert "python examples/train_math.py" in readme
    assert any(command.startswith("accelerate launch --multi_gpu --num_processes 2") for command in readme)
    assert not [command for command in readme if "#" in command or command.endswith("\\")]
    assert as_run_here("python examples/train_math.py").split() == [
        "python",
        "examples/train_math.py",
        *FEWER_STEPS,
        *SMALLER_HELDOUT,
    ]
    assert reason_not_run("sbatch examples/slurm/train_multinode.slurm --method justrl") is not None


@pytest.fixture(scope="module")
def library_example(tmp_path_factory):
    """The "Use it like GRPOTrainer" block of the README, verbatim, started in a process of its own (in a directory of
    its own, on this checkout) as soon as a test asks for it, so that it trains while the documented commands run;
    `finish()` waits for it and gives its CompletedProcess."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use it like GRPOTrainer") :]
    example = next(lines for language, lines in code_blocks(section) if language == "python")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-c", "\n".join(example)]
    with started_commands([command], timeout=900, cwd=tmp_path_factory.mktemp("library"), env=env) as finish:
        yield lambda: finish()[0]


@pytest.mark.slow
def test_every_documented_command_runs_as_written(clone, library_example):  # the library example trains meanwhile
    env, ran, failures = environment(clone), [], []
    for document in DOCUMENTS:
        for command in documented_commands(document):
            if reason_not_run(command):
                continue
            result = run_command(
                ["bash", "-c", as_run_here(command)], timeout=900, cwd=clone, env=env, stderr=subprocess.STDOUT
            )
            ran.append(command)
            if result.returncode != 0:
                failures.append(f"{document.relative_to(ROOT)}: {command}\n{result.stdout[-1500:]}")
    assert not failures, "\n\n".join(failures)
    assert len(ran) >= 10, ran


@pytest.mark.slow
def test_the_readme_library_example_runs_as_shown(library_example):
    """The "Use it like GRPOTrainer" block, verbatim, on a CPU: it trains and logs the S2T metrics."""
    result = library_example()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'spurious/silenced_ratio'" in result.stdout and "'reward'" in result.stdout, result.stdout[-2000:]
