"""The command line of the training scripts: recipe and method, `--help`, checks before anything slow, one-line errors.

A script (`examples/train_math.py`) describes itself with a `TrainingScript` and hands its `main` to `run`:

    run(TrainingScript(prog=..., description=..., examples=..., arguments=MyScriptArguments,
                       offline_recipe=Path(...)), main)    # main(script_args, training_args, model_args)

Values combine as command line > recipe (`--config FILE`) > method (`--method`, or `method:` in the recipe) >
STAPOConfig's defaults (the paper's setting). Without `--config` the script's offline recipe is the base, and every
option given changes one field of it, `--model_name_or_path` included: a new model never silently drops the CPU
settings or switches the dataset. `{method}` in a value (e.g. `output_dir: outputs/toy-{method}`) becomes the
method's name, so the same recipe run with another `--method` writes elsewhere.

Expected user errors (a misspelled option, a missing file, a model or dataset not reachable offline, bf16 without a
GPU, a package the settings need, an output directory that holds another run) raise `UsageError` before any model is
loaded; `run` prints it as one line and exits with status 2.
"""

import argparse
import difflib
import importlib.util
import json
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import yaml

from .methods import METHODS, method_config
from .output_dir import TRAINER_STATE, prepare_output_dir


TOY = "toy"  # model_name_or_path / dataset_name of the offline toy world (stapo_trl.toy)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The reporting integrations of `report_to` and the package each one needs.
_REPORTER_PACKAGES = {
    "trackio": "trackio",
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "comet_ml": "comet_ml",
    "clearml": "clearml",
    "swanlab": "swanlab",
}


class UsageError(ValueError):
    """An expected user error. `run` prints it as one line (no traceback) and exits with status 2."""


@dataclass
class TrainingScriptArguments:
    """Options every training script has; a script's own options subclass this."""

    method: str = field(
        default="stapo",
        metadata={
            "help": "The method to train. Its STAPOConfig values (stapo_trl.methods.METHODS) become defaults that the "
            "recipe and the command line can override.",
            "choices": sorted(METHODS),
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start over in an output_dir that already holds files: its checkpoint-* folders are deleted "
            "first. Without it (or --resume_from_checkpoint) such an output_dir is refused."
        },
    )


@dataclass(frozen=True)
class TrainingScript:
    """What `--help` says about a script, its own options and the recipe used without `--config`."""

    prog: str  # as the user types it, e.g. "examples/train_math.py"
    description: str  # what the script does, a few lines
    examples: str  # the common invocations, one per line
    arguments: type  # a dataclass subclassing TrainingScriptArguments
    offline_recipe: Path  # the base recipe when no --config is given


def is_main_launcher_process() -> bool:
    """Rank 0, or a single process (before any process group exists)."""
    return os.environ.get("RANK", "0") == "0"


# ---- parsing ----------------------------------------------------------------------------------------------------


def _pre_parse(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(--config, --method, argv without --config FILE)."""
    pre_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre_parser.error = _raise_usage_error
    pre_parser.add_argument("--config")
    pre_parser.add_argument("--method")
    known, _ = pre_parser.parse_known_args(argv)
    rest, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--config":
            skip = True
        elif not token.startswith("--config="):
            rest.append(token)
    return known.config, known.method, rest


def _shown(path: str | os.PathLike) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def _raise_usage_error(message: str):
    raise UsageError(message)


def read_recipe(path: str | os.PathLike) -> dict:
    """A recipe's YAML mapping, or `UsageError` naming the file."""
    try:
        with open(path, encoding="utf-8") as file:
            recipe = yaml.safe_load(file)
    except OSError as error:
        raise UsageError(f"--config {path}: {error.strerror or error}.") from None
    except yaml.YAMLError as error:
        raise UsageError(f"--config {path}: not valid YAML ({str(error).splitlines()[0]}).") from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise UsageError(f"--config {path}: a recipe is a YAML mapping of option names to values.")
    return recipe


def _closest(name: str, candidates) -> str:
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else " (--help lists them)."


def _full_parser(script: TrainingScript):
    """TrlParser over (script options, STAPOConfig, ModelConfig), raising UsageError instead of exiting."""
    from trl import ModelConfig, TrlParser

    from .config import STAPOConfig

    class Parser(TrlParser):
        def error(self, message):
            raise UsageError(message)

    return Parser((script.arguments, STAPOConfig, ModelConfig), prog=script.prog)


def _check_names(parser, recipe: dict, argv: list[str], config: str | None) -> None:
    options = parser._option_string_actions
    for token in argv:
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            if name not in options:
                raise UsageError(f"unknown option {name}{_closest(name, [o for o in options if o.startswith('--')])}")
    destinations = {action.dest for action in parser._actions}
    for key in recipe:
        if key not in destinations:
            raise UsageError(f"--config {config}: unknown key '{key}'{_closest(key, destinations)}")


def _with_method_name(value, method: str):
    return value.replace("{method}", method) if isinstance(value, str) else value


def parse_args(script: TrainingScript, argv: list[str] | None = None, problems: list[str] | None = None):
    """(script_args, training_args, model_args) from the command line; see the module docstring for the rules.

    `--help` runs `print_help` and exits. Errors are `UsageError`s naming the option or recipe key at fault. With a
    `problems` list, `bf16` without a GPU is appended to it instead and parsing goes on with `bf16: false`, so that
    the other checks can report their problems in the same message.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print_help(script, argv)
        raise SystemExit(0)
    config, method, rest = _pre_parse(argv)
    recipe = read_recipe(config or script.offline_recipe)
    method = method or recipe.get("method") or "stapo"
    if method not in METHODS:
        raise UsageError(
            f"--method {method}: unknown method{_closest(method, METHODS)} Choose from {sorted(METHODS)}."
        )
    for name, value in (recipe.pop("env", None) or {}).items():  # TrlParser's `env:` block
        os.environ[name] = str(value)
    recipe = {key: _with_method_name(value, method) for key, value in recipe.items()}
    rest = [_with_method_name(token, method) for token in rest]

    parser = _full_parser(script)
    _check_names(parser, recipe, rest, config or script.offline_recipe)
    parser.set_defaults(**method_config(method))
    parser.set_defaults_with_config(**recipe)
    parser.set_defaults(method=method)
    try:
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=rest)
    except ValueError as error:  # the configs' own validation (__post_init__)
        if isinstance(error, UsageError):
            raise
        if "support bf16" not in str(error):  # TrainingArguments: "Your setup doesn't support bf16/gpu."
            raise UsageError(str(error)) from None
        message = (
            "bf16: true needs a GPU with bfloat16 support and none was found: pass --bf16 false (with "
            "--use_cpu true to train on the CPU), or run on a GPU."
        )
        if problems is None:
            raise UsageError(message) from None
        problems.append(message)
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=[*rest, "--bf16", "false"])
    if config is None and "--model_name_or_path" in {token.split("=", 1)[0] for token in argv}:
        if model_args.model_name_or_path != TOY and is_main_launcher_process():
            print(
                f"Note: no --config, so the offline recipe ({_shown(script.offline_recipe)}) is the base and "
                f"--model_name_or_path changes only the model: CPU, float32, its data and lengths stay. For a GPU "
                "run pass --config <recipe> (examples/recipes/).",
                file=sys.stderr,
            )
    return script_args, training_args, model_args


# ---- help -------------------------------------------------------------------------------------------------------

RULES = """\
How values combine: command line > recipe (--config FILE) > method (--method, or `method:` in the recipe) >
STAPOConfig's defaults (the paper's setting). Without --config the base is the offline recipe
{offline_recipe}: every option you pass changes one field of it, --model_name_or_path too (the CPU
settings and the toy problems stay; pass --config <recipe> for a GPU run). `{{method}}` in a value becomes the
method's name. The defaults shown are the base recipe's values with the method applied.

An output_dir that already holds files is refused: pass --resume_from_checkpoint latest (or a checkpoint folder)
to continue that run, or --overwrite_output_dir true to start over in it."""


def _format_options(parser, actions) -> str:
    formatter = parser._get_formatter()
    formatter.add_arguments(actions)
    return formatter.format_help()


def print_help(script: TrainingScript, argv: list[str]) -> None:
    """Print what the script does, its common invocations and its own and STAPO's options (before torch and TRL
    are imported, so it shows at once), then TRL's full list of options."""
    try:
        config, method, _ = _pre_parse([token for token in argv if token not in ("-h", "--help")])
        recipe = read_recipe(config or script.offline_recipe)
    except UsageError as error:
        config, method, recipe = None, None, {}
        print(f"({error})")
    method = method if method in METHODS else recipe.get("method", "stapo")
    recipe = {key: _with_method_name(value, method) for key, value in recipe.items()}

    # The script's options, listed without importing transformers (HfArgumentParser would pull in torch)
    short = argparse.ArgumentParser(
        prog=script.prog, add_help=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    short.add_argument("--config", metavar="FILE", help="A YAML recipe of option values (examples/recipes/).")
    for option in fields(script.arguments):
        default = None if option.default is MISSING else option.default
        default = method if option.name == "method" else recipe.get(option.name, default)
        choices = option.metadata.get("choices")
        short.add_argument(f"--{option.name}", default=default, choices=choices, help=option.metadata.get("help"))
    print(f"usage: {script.prog} [--config FILE] [--method METHOD] [--option VALUE ...]\n")
    print(script.description.strip() + "\n")
    print("Common invocations:\n" + "\n".join(f"  {line}" for line in script.examples.strip().splitlines()) + "\n")
    print(RULES.format(offline_recipe=_shown(script.offline_recipe)) + "\n")
    print(f"Options of this script (base recipe: {_shown(config or script.offline_recipe)}):")
    print(_format_options(short, short._actions))
    sys.stdout.flush()

    from trl import GRPOConfig

    from .config import STAPOConfig

    parser = _full_parser(script)
    parser.set_defaults(**method_config(method))
    parser.set_defaults_with_config(**{key: value for key, value in recipe.items() if key != "env"})
    grpo_fields = {f.name for f in fields(GRPOConfig)}
    stapo_fields = {f.name for f in fields(STAPOConfig)} - grpo_fields
    print("STAPO options (STAPOConfig):")
    print(_format_options(parser, [action for action in parser._actions if action.dest in stapo_fields]))
    print("All options (this script's, STAPOConfig = TRL's GRPOConfig + the above, TRL's ModelConfig):")
    print(parser.format_help())


# ---- checks before anything slow ----------------------------------------------------------------------------------


def check_hub_repo(repo_id: str, repo_type: str, flag: str, revision: str | None = None) -> None:
    """A Hub model or dataset id: in the local cache, or reachable on the Hub; else `UsageError` saying what to do."""
    if not _HUB_ID.match(repo_id):
        raise UsageError(f"{flag} {repo_id}: no such file or directory.")
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    cached = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    if cached.is_dir():
        return
    download = f"`hf download {repo_id}{' --repo-type dataset' if repo_type == 'dataset' else ''}`"
    if constants.HF_HUB_OFFLINE:
        raise UsageError(
            f"{flag} {repo_id}: not a local path and not in the Hugging Face cache, and the Hub is off "
            f"(HF_HUB_OFFLINE=1): download it first ({download}) or pass a local path to {flag}."
        )
    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=10)
    except RepositoryNotFoundError:
        raise UsageError(
            f"{flag} {repo_id}: no such local path, and no such {repo_type} on the Hugging Face Hub (or it is "
            "private or gated: log in with `hf auth login`)."
        ) from None
    except RevisionNotFoundError:
        raise UsageError(f"{flag} {repo_id}: the Hub has no revision {revision!r} of it.") from None
    except Exception as error:  # no network, proxy, DNS, ...
        raise UsageError(
            f"{flag} {repo_id}: not in the local Hugging Face cache and the Hub cannot be reached "
            f"({type(error).__name__}): connect, download it elsewhere ({download}) and copy the cache, or pass a "
            f"local path to {flag}."
        ) from None


def check_data_source(source: str, flag: str = "--dataset_name") -> None:
    """`toy`, a local file or directory, or a Hub dataset available now (`stapo_trl.data_source`)."""
    from .data_source import is_hub_id

    if source == TOY or os.path.exists(os.path.expanduser(source)):
        return
    if not is_hub_id(source):
        raise UsageError(f"{flag} {source}: no such file or directory.")
    check_hub_repo(source, "dataset", flag)


def check_model_source(name: str | None, revision: str | None = None, flag: str = "--model_name_or_path") -> None:
    """`toy`, a local model directory, or a Hub model available now."""
    if name in (None, TOY):
        return
    path = Path(name).expanduser()
    if path.exists():
        if not any((path / file).is_file() for file in ("config.json", "adapter_config.json")):
            raise UsageError(
                f"{flag} {name}: no config.json there; pass a folder written by save_pretrained (or a "
                "checkpoint-N folder) or a Hub model id."
            )
        return
    check_hub_repo(name, "model", flag, revision)


def check_before_loading(script_args: TrainingScriptArguments, training_args, model_args, problems=None) -> None:
    """Everything that can be checked before a model is loaded; sets `training_args.resume_from_checkpoint` to
    the checkpoint folder to resume from (for `true`/`latest`, the last complete one).

    Every problem found (and those already in `problems`) is reported in one `UsageError`, one line each, so that a
    recipe run on the wrong machine lists all it lacks at once. A finished run asked to resume exits with status 0.
    """
    problems = list(problems or [])

    def check(step: Callable[[], None]) -> None:
        try:
            step()
        except (UsageError, ValueError) as error:
            problems.append(str(error))

    def output_dir() -> None:
        training_args.resume_from_checkpoint = prepare_output_dir(
            training_args.output_dir,
            training_args.resume_from_checkpoint,
            overwrite=script_args.overwrite_output_dir,
            is_main_process=is_main_launcher_process(),
        )

    check(output_dir)
    if not problems:
        stop_if_finished(training_args)
    if training_args.use_vllm and importlib.util.find_spec("vllm") is None:
        problems.append(
            "use_vllm: true needs vLLM, which is not installed: pip install -e '.[vllm]' (CUDA machines), or pass "
            "--use_vllm false to generate with transformers."
        )
    for reporter in training_args.report_to or []:
        package = _REPORTER_PACKAGES.get(reporter)
        if package and importlib.util.find_spec(package) is None:
            problems.append(
                f"report_to: {reporter} needs the {package} package, which is not installed: pip install {package}, "
                "or pass --report_to none (the logs are kept in trainer_state.json either way)."
            )
    check(lambda: check_model_source(model_args.model_name_or_path, model_args.model_revision))
    dataset = getattr(script_args, "dataset_name", None)
    if dataset:
        check(lambda: check_data_source(dataset))
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(
            f"{len(problems)} problems, all to fix before this run can start:\n  " + "\n  ".join(problems)
        )


def stop_if_finished(training_args) -> None:
    """Resuming a run that already reached its last step would train past it and overwrite the finished model and
    `results.json` (transformers' resume does): say so instead, and exit with status 0."""
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is None:
        return
    state = json.loads((Path(checkpoint) / TRAINER_STATE).read_text())
    target = training_args.max_steps if training_args.max_steps > 0 else state.get("max_steps", 0)
    if target and state.get("global_step", 0) >= target:
        if is_main_launcher_process():
            print(
                f"{_shown(training_args.output_dir)}: this run is finished ({_shown(checkpoint)} is step "
                f"{state['global_step']} of {target}); nothing to resume. To train it further raise --max_steps; to "
                "start over pass --overwrite_output_dir true instead of --resume_from_checkpoint.",
                file=sys.stderr,
            )
        raise SystemExit(0)


# ---- the run around the trainer -----------------------------------------------------------------------------------


def model_and_peft_config(training_args, model_args):
    """The model path for the trainer (`toy` → the shipped toy checkpoint) and the PEFT config of `model_args`;
    ModelConfig's loading options (revision, attention, dtype) go into `training_args.model_init_kwargs`."""
    from trl import get_peft_config

    model_path = model_args.model_name_or_path
    if model_path in (None, TOY):
        from .toy import toy_checkpoint

        model_path = toy_checkpoint()
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    return model_path, get_peft_config(model_args)


def train_and_save(
    trainer,
    method: str,
    model_path: str,
    evaluate: Callable[[str], float] | None = None,
    dataset_name: str | None = None,
) -> dict:
    """Train (resuming if asked), save the model and `trainer_state.json`, and write `results.json`.

    `evaluate(path) -> accuracy`, when given, runs on the main process on `model_path` before training and on the
    trained model after (the held-out check). Returns the results written.
    """
    from .interruption import StopOnSignal, tied_weights_explained

    start = time.perf_counter()
    args, accelerator = trainer.args, trainer.accelerator
    processes = f"{accelerator.num_processes} process" + ("es" if accelerator.num_processes > 1 else "")
    completions = args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes
    accelerator.print(
        f"Method {method} ({processes}): spurious_mask_mode={args.spurious_mask_mode}, τ_p="
        f"{args.spurious_prob_threshold}, q={args.spurious_entropy_quantile}, loss_type={args.loss_type}; "
        f"{len(trainer.train_dataset)} training problems; output in {Path(args.output_dir).resolve()}\n"
        f"Each optimizer step: {completions // args.num_generations} prompts x {args.num_generations} completions "
        f"(per_device_train_batch_size {args.per_device_train_batch_size} x gradient_accumulation_steps "
        f"{args.gradient_accumulation_steps} x {processes})"
    )
    results = {"method": method, "seed": args.seed}
    if evaluate is not None and accelerator.is_main_process:
        results["heldout_accuracy_before"] = evaluate(model_path)
        print(f"Held-out accuracy before training: {results['heldout_accuracy_before']:.3f}")

    stop = StopOnSignal(accelerator)
    trainer.add_callback(stop)
    with stop.installed(), tied_weights_explained(trainer.model):
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    if stop.received is not None:
        if accelerator.is_main_process:
            print(stop.report(trainer.state, args.output_dir), file=sys.stderr)
        end_processes(trainer)
        raise SystemExit(130 if stop.received == signal.SIGINT else 143)
    trainer.save_model(args.output_dir)
    trainer.save_state()  # trainer_state.json beside the model: the logs that `stapo-report plots` reads
    trainer.create_model_card(dataset_name=dataset_name)  # README.md: the method and its S2T settings
    accelerator.print(f"Model saved to {Path(args.output_dir).resolve()}")
    results["steps"] = trainer.state.global_step
    if evaluate is not None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            results["heldout_accuracy_after"] = evaluate(args.output_dir)
            print(
                f"Held-out accuracy: before {results['heldout_accuracy_before']:.3f}, after "
                f"{results['heldout_accuracy_after']:.3f}"
            )
    if args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
        accelerator.print(f"Pushed to the Hub: {trainer.hub_model_id}")
    results["seconds"] = round(time.perf_counter() - start, 1)
    if accelerator.is_main_process:
        (Path(args.output_dir) / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    accelerator.print(f"Done in {results['seconds']:.0f} s.")
    end_processes(trainer)
    return results


def end_processes(trainer) -> None:
    """Free the DDP wrapper (its gradient reducer holds the process group) while every process is still here, then
    end the group: a reducer freed at interpreter exit, after the group, can hang a rank in gloo's destructor."""
    trainer.accelerator.wait_for_everyone()
    trainer.model_wrapped = trainer.model
    trainer.accelerator.free_memory()
    trainer.end()


def use_one_thread_per_cpu_process(training_args) -> None:
    """On a CPU, one intra-op thread per process unless OMP_NUM_THREADS says otherwise. On cores shared with other
    work the threads of a process wait for each other: 20 steps of the offline demo on a busy 2-core machine took 4-11
    times the wall time and 3-6 times the CPU time with two threads (README, "Time, and threads"). Launchers already
    start each of several processes with one thread."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ and (training_args.use_cpu or not torch.cuda.is_available()):
        torch.set_num_threads(1)


def quiet_known_warnings() -> None:
    """Silence the deprecation notices TRL 1.16's own generation code triggers under transformers 5
    (`model.is_gradient_checkpointing`, `gradient_checkpointing_enable/disable`, once per process): nothing the user
    can or should change."""
    warnings.filterwarnings(
        "ignore",
        message=r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated",
        category=FutureWarning,
    )


def run(script: TrainingScript, main: Callable, argv: list[str] | None = None) -> None:
    """Parse, check before loading anything, then `main(script_args, training_args, model_args)`.

    A `UsageError` (from parsing, the checks, or `main` before its first slow step) is printed as one line on the
    main process and ends the program with status 2.
    """
    quiet_known_warnings()
    try:
        problems = []
        script_args, training_args, model_args = parse_args(script, argv, problems)
        check_before_loading(script_args, training_args, model_args, problems)
        use_one_thread_per_cpu_process(training_args)
        main(script_args, training_args, model_args)
    except UsageError as error:
        if is_main_launcher_process():
            print(f"{script.prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:  # before training (loading, the held-out check) or a second Ctrl-C during it
        if is_main_launcher_process():
            print(
                f"\n{script.prog}: interrupted; checkpoints already saved in its output_dir are kept.", file=sys.stderr
            )
        raise SystemExit(130) from None
