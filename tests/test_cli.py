"""The training command line (stapo_trl.cli) as examples/train_math.py uses it: rules, help, one-line errors."""

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_command, run_commands

from stapo_trl.cli import UsageError, check_before_loading, parse_args


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_math.py"
OFFLINE_RECIPE = ROOT / "examples" / "recipes" / "toy" / "stapo_cpu.yaml"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


@pytest.fixture(scope="module")
def train_math():
    spec = importlib.util.spec_from_file_location("train_math", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(train_math, *argv):
    from stapo_trl.cli import parse_args

    return parse_args(train_math.SCRIPT, list(argv))


def test_no_arguments_means_the_offline_recipe(train_math):
    script_args, args, model_args = parse(train_math)
    assert script_args.dataset_name == "toy" and model_args.model_name_or_path == "toy"
    assert args.use_cpu and not args.bf16 and args.spurious_mask_mode == "low_entropy"
    assert args.output_dir == "outputs/toy-stapo"


def test_a_model_without_a_recipe_keeps_the_offline_recipe(train_math):
    """Changing the model changes only the model: the CPU settings and the toy problems stay."""
    script_args, args, model_args = parse(train_math, "--model_name_or_path", "Qwen/Qwen3-0.6B-Base")
    assert model_args.model_name_or_path == "Qwen/Qwen3-0.6B-Base"
    assert script_args.dataset_name == "toy" and args.use_cpu and not args.bf16
    assert args.max_completion_length == 32 and model_args.dtype == "float32"


def test_precedence_command_line_over_recipe_over_method(train_math):
    _, args, _ = parse(train_math, "--config", str(OFFLINE_RECIPE), "--method", "20_entropy")
    assert (args.spurious_mask_mode, args.top_entropy_quantile) == ("none", 0.2)
    _, args, _ = parse(train_math, "--method", "grpo", "--beta", "0.01")
    assert (args.loss_type, args.epsilon_high, args.delta, args.beta) == ("grpo", 0.2, None, 0.01)
    _, args, _ = parse(train_math, "--method", "justrl_fullmask", "--spurious_mask_mode", "random")
    assert args.spurious_mask_mode == "random"
    _, args, _ = parse(train_math, "--max_steps", "3", "--method", "justrl")
    assert args.max_steps == 3 and args.spurious_mask_mode == "none"


def test_another_method_writes_to_its_own_directory(train_math):
    script_args, args, _ = parse(train_math, "--method", "justrl")
    assert script_args.method == "justrl" and args.output_dir == "outputs/toy-justrl"
    _, args, _ = parse(train_math, "--method", "justrl", "--output_dir", "runs/{method}-seed1")
    assert args.output_dir == "runs/justrl-seed1"


def test_no_deprecated_checkpointing_notice(train_math, recwarn):
    _, args, _ = parse(train_math, "--config", str(ROOT / "examples/recipes/Qwen3-1.7B-Base/stapo.yaml"),
                       "--use_cpu", "true")  # fmt: skip
    assert args.activation_checkpointing is True
    assert not [w for w in recwarn if "checkpointing" in str(w.message)]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--spurious_prob_treshold", "0.01"], "unknown option --spurious_prob_treshold; did you mean --spurious_prob_threshold?"),
        (["--config", "nope.yaml"], "--config nope.yaml: No such file or directory"),
        (["--method", "justrlx"], "did you mean justrl?"),
        (["--spurious_prob_threshold", "2"], "spurious_prob_threshold"),
        (["--spurious_mask_mode", "lowest"], "invalid choice: 'lowest'"),
        (["--use_cpu", "false", "--bf16", "true"], "pass --bf16 false"),
    ],
)  # fmt: skip
def test_bad_arguments_are_usage_errors(train_math, argv, expected):
    with pytest.raises(UsageError) as error:
        parse(train_math, *argv)
    assert expected in str(error.value)


def test_unknown_recipe_key(train_math, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(OFFLINE_RECIPE.read_text() + "learnig_rate: 1.0e-5\n")
    with pytest.raises(UsageError, match="unknown key 'learnig_rate'; did you mean learning_rate"):
        parse(train_math, "--config", str(recipe))


def test_checks_before_loading(train_math, tmp_path):
    def check(*argv):
        script_args, args, model_args = parse(train_math, "--output_dir", str(tmp_path / "run"), *argv)
        check_before_loading(script_args, args, model_args)
        return args

    with pytest.raises(UsageError, match="Qwen/Qwen3-0.6B-Base: not a local path and not in the Hugging Face cache"):
        check("--model_name_or_path", "Qwen/Qwen3-0.6B-Base")
    with pytest.raises(UsageError, match="no config.json there"):
        check("--model_name_or_path", str(tmp_path))
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(UsageError, match="use_vllm: true needs vLLM"):
            check("--use_vllm", "true")
    if importlib.util.find_spec("trackio") is None:
        with pytest.raises(UsageError, match="report_to: trackio needs the trackio package"):
            check("--report_to", "trackio")
    (tmp_path / "run" / "checkpoint-5").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-5" / "trainer_state.json").write_text("{}")
    with pytest.raises(UsageError, match="--output_dir .* already holds files"):
        check()
    assert check("--resume_from_checkpoint", "latest").resume_from_checkpoint == str(tmp_path / "run" / "checkpoint-5")


ERROR_CASES = [
    (["--spurious_prob_treshold", "0.01"], "did you mean --spurious_prob_threshold?"),
    (["--dataset_name", "BytedTsinghua-SIA/DAPO-Math-17k"], "--dataset_name BytedTsinghua-SIA/DAPO-Math-17k: not a"),
    (["--output_dir", "{directory}/run"], "--overwrite_output_dir true"),  # a finished run's
]  # fmt: skip


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory) -> dict:
    """The script on each of ERROR_CASES (in a directory holding a finished run, "run": `{directory}`) and with --help,
    started together (each a process of its own): the directory, and the results by name."""
    directory = tmp_path_factory.mktemp("errors")
    (directory / "run").mkdir()
    (directory / "run" / "results.json").write_text("{}")
    argvs = [[arg.format(directory=directory) for arg in argv] for argv, _ in ERROR_CASES]
    commands = [
        [sys.executable, str(SCRIPT), *argv] if "--output_dir" in argv else
        [sys.executable, str(SCRIPT), *argv, "--output_dir", str(directory / "out")]
        for argv in argvs
    ] + [[sys.executable, str(SCRIPT), "--help"]]  # fmt: skip
    each = [dict(cwd=directory)] * len(ERROR_CASES) + [dict(cwd=ROOT)]
    results = run_commands(commands, each=each, timeout=300, env=ENV)
    return {"directory": directory, "errors": results[: len(ERROR_CASES)], "help": results[-1]}


@pytest.mark.slow
def test_errors_are_one_line_before_any_model_is_loaded(script_runs):
    for (_, expected), result in zip(ERROR_CASES, script_runs["errors"], strict=True):
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0] and lines[0].startswith("examples/train_math.py: error:")
    assert (script_runs["directory"] / "run" / "results.json").read_text() == "{}"


@pytest.mark.slow
def test_help_starts_with_the_script_then_stapo_then_everything(script_runs):
    result = script_runs["help"]
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    first = text.index("Common invocations:")
    script_options, stapo_options, everything = (text.index(s) for s in (
        "Options of this script", "STAPO options", "All options"))  # fmt: skip
    assert text.startswith("usage: examples/train_math.py") and "Train a model on math problems" in text[:first]
    assert first < script_options < stapo_options < everything
    short = text[:stapo_options]
    for option in ("--config FILE", "--method {", "--overwrite_output_dir", "--dataset_name"):
        assert option in short
    # The defaults shown are the offline recipe's, which apply without --config
    assert "(default: toy)" in short and "examples/recipes/toy/stapo_cpu.yaml" in short
    assert "--spurious_prob_threshold" in text[stapo_options:everything]
    assert "--learning_rate" in text[everything:] and "--lora_r" in text[everything:]


def test_a_finished_run_is_not_resumed(train_math, tmp_path, capsys):
    """Resuming a run whose last checkpoint is its last step would train past it and overwrite the finished model."""
    checkpoint = tmp_path / "run" / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 4, "max_steps": 4}')
    (tmp_path / "run" / "results.json").write_text("{}")
    argv = ["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", "latest"]
    script_args, args, model_args = parse(train_math, *argv, "--max_steps", "4")
    with pytest.raises(SystemExit) as exit:
        check_before_loading(script_args, args, model_args)
    assert exit.value.code == 0 and "this run is finished" in capsys.readouterr().err
    script_args, args, model_args = parse(train_math, *argv, "--max_steps", "8")  # asked to go further: resumes
    check_before_loading(script_args, args, model_args)
    assert args.resume_from_checkpoint == str(checkpoint)


def test_a_gpu_recipe_on_a_cpu_lists_all_its_problems_at_once(train_math, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the recipe's bf16 is fine here")
    problems = []
    recipe = str(ROOT / "examples" / "recipes" / "Qwen3-1.7B-Base" / "stapo.yaml")
    script_args, args, model_args = parse_args(
        train_math.SCRIPT, ["--config", recipe, "--output_dir", str(tmp_path / "run")], problems
    )
    with pytest.raises(UsageError) as error:
        check_before_loading(script_args, args, model_args, problems)
    lines = str(error.value).splitlines()
    expected = ["bf16: true needs a GPU", "--model_name_or_path Qwen/Qwen3-1.7B-Base:", "--dataset_name BytedTsinghua"]
    if importlib.util.find_spec("vllm") is None:
        expected.append("use_vllm: true needs vLLM")
    assert lines[0] == f"{len(expected)} problems, all to fix before this run can start:"
    assert sorted(line.strip().split(" ")[0] for line in lines[1:]) == sorted(e.split(" ")[0] for e in expected)
    for part in expected:
        assert any(line.strip().startswith(part) for line in lines[1:]), part


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(tmp_path):
    """SIGINT mid-run: the step under way ends, a checkpoint is saved, one line says which and the command that
    continues; that command resumes without a "missing keys" alarm about the tied output layer."""
    output_dir = tmp_path / "run"
    argv = [sys.executable, str(SCRIPT), "--heldout_dataset", "", "--save_strategy", "no", "--max_steps", "200",
            "--output_dir", str(output_dir)]  # fmt: skip
    process = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        progress = ""
        while " 2/200 " not in progress:  # tqdm's progress line: two optimizer steps are done
            character = process.stderr.read(1)
            assert character, f"the run ended early:\n{progress[-3000:]}"
            progress += character
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=600)[1]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, rest[-3000:]
    stopped = [line for line in rest.splitlines() if line.startswith("Stopped at step")]
    assert len(stopped) == 1 and "of 200 (SIGINT)" in stopped[0], rest[-3000:]
    step = int(stopped[0].split()[3])
    checkpoint = output_dir / f"checkpoint-{step}"
    assert (checkpoint / "trainer_state.json").is_file() and not (output_dir / "results.json").exists()
    command = stopped[0].split("To continue: ")[1]
    assert command.startswith(f"python {SCRIPT} ") and command.endswith(" --resume_from_checkpoint latest")
    assert "Traceback" not in rest

    resumed = run_command(
        [sys.executable, *shlex.split(command)[1:], "--max_steps", str(step + 1)], timeout=600, cwd=tmp_path, env=ENV
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "There were missing keys" not in resumed.stderr and "lm_head.weight is tied" in resumed.stderr
    assert json.loads((output_dir / "results.json").read_text())["steps"] == step + 1
