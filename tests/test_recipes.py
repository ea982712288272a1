"""The shipped recipes, accelerate configs and SLURM script (docs/launching.md), checked on a CPU, offline.

Every recipe trains one optimizer step here with only the overrides a CPU needs (the toy model and problems, no vLLM,
no bf16, short completions), through `examples/train_math.py`'s own path (stapo_trl.cli), so that no recipe can break
silently. The paper's settings are checked where the recipes derive them (batch arithmetic, the method switch);
each accelerate config goes through `accelerate launch`'s own loading and validation, without starting anything.
"""

import importlib.util
import json
import os
import re
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml


os.environ["HF_HUB_OFFLINE"] = "1"

from stapo_trl.cli import check_before_loading, parse_args, quiet_known_warnings  # noqa: E402
from stapo_trl.methods import METHODS, method_config  # noqa: E402


REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "examples" / "recipes"
ACCELERATE_CONFIGS = REPO / "examples" / "accelerate_configs"
SLURM_SCRIPT = REPO / "examples" / "slurm" / "train_multinode.slurm"
LAUNCHING_DOC = REPO / "docs" / "launching.md"

MODELS = ("Qwen3-1.7B-Base", "Qwen3-8B-Base", "Qwen3-14B-Base")
PAPER_RECIPES = [RECIPES / model / "stapo.yaml" for model in MODELS]
LORA_RECIPE = RECIPES / "Qwen3-1.7B-Base" / "stapo_lora_1gpu.yaml"
MATH_RECIPES = PAPER_RECIPES + [LORA_RECIPE, RECIPES / "toy" / "stapo_cpu.yaml"]

# The paper's batch (paper App. 10, JustRL setting): 64 GPUs; 256 prompts x 8 per generation, in 4 optimizer steps
PAPER_GPUS = 64
COMPLETIONS_PER_OPTIMIZER_STEP = 512
COMPLETIONS_PER_GENERATION = 2048
OPTIMIZER_STEPS_PER_GENERATION = 4
MAX_PROMPT_LENGTH = 1024

# What a CPU needs, and nothing else: the toy model and problems, no vLLM, no bf16, short completions (the toy model's
# context is short, and 15k-token rollouts would take hours), one optimizer step and its log, a held-out check (where
# a recipe has one) on 2 problems.
CPU_OVERRIDES = ["--model_name_or_path", "toy", "--dataset_name", "toy", "--use_vllm", "false", "--bf16", "false",
                 "--use_cpu", "true", "--max_completion_length", "32", "--max_steps", "1", "--logging_steps", "1",
                 "--heldout_max_problems", "2", "--heldout_num_samples", "1"]  # fmt: skip


def recipe_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.fixture(scope="module")
def train_math():
    spec = importlib.util.spec_from_file_location("train_math", REPO / "examples" / "train_math.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_recipe(train_math, path: Path, *extra: str):
    """(script_args, training_args, model_args) as the script builds them; `--use_cpu true` lets bf16 pass."""
    return parse_args(train_math.SCRIPT, ["--config", str(path), "--use_cpu", "true", *extra])


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, method",
    [(path, "stapo") for path in MATH_RECIPES] + [(PAPER_RECIPES[0], "grpo")],
    ids=lambda value: recipe_id(value) if isinstance(value, Path) else value,
)
def test_recipe_trains_one_step(path, method, train_math, tmp_path):
    """The recipe as shipped, plus CPU_OVERRIDES: parse, early checks, trainer, one optimizer step, saved run."""
    output_dir = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated setting in a recipe
        script_args, args, model_args = parse_args(
            train_math.SCRIPT,
            ["--config", str(path), *CPU_OVERRIDES, "--method", method, "--output_dir", str(output_dir)],
        )
    check_before_loading(script_args, args, model_args)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # nothing deprecated on the way...
        quiet_known_warnings()  # ...but what TRL's own code triggers, silenced as `run` does
        train_math.main(script_args, args, model_args)
    results = json.loads((output_dir / "results.json").read_text())
    assert results["steps"] == 1 and results["method"] == method
    (logged,) = [entry for entry in json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
                 if "loss" in entry]  # fmt: skip
    assert "spurious/silenced_ratio" in logged and logged["step"] == 1
    saved = "adapter_model.safetensors" if model_args.use_peft else "model.safetensors"
    assert (output_dir / saved).is_file()


@pytest.mark.parametrize("path", PAPER_RECIPES + [LORA_RECIPE], ids=recipe_id)
def test_recipe_leaves_method_values_to_the_method(path):
    """Recipe keys win over the method's values, so a recipe that set one would break `--method`."""
    recipe = yaml.safe_load(path.read_text())
    assert recipe.get("method") in METHODS
    method_keys = {key for values in METHODS.values() for key in values}
    assert not sorted(set(recipe) & method_keys), f"{recipe_id(path)} sets values that belong to `--method`"


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=recipe_id)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_on_the_command_line(path, method, train_math):
    """`--method X` on the one recipe per model gives X's values, the paper's shared setting, and X's own run names."""
    _, args, _ = load_recipe(train_math, path, "--method", method)
    for key, value in method_config(method).items():
        assert getattr(args, key) == value, key
    assert (args.spurious_prob_threshold, args.spurious_entropy_quantile) == (0.002, 0.75)  # paper Table 4
    assert (args.epsilon, args.learning_rate, args.weight_decay, args.max_grad_norm) == (0.2, 1e-6, 0.1, 1.0)
    assert args.num_generations == 8 and args.temperature == 1.0 and args.top_p == 1.0
    for name in (args.output_dir, args.run_name, args.hub_model_id):
        assert name.endswith(f"{path.parent.name}-{method}")


@pytest.mark.parametrize("path", PAPER_RECIPES + [LORA_RECIPE], ids=recipe_id)
def test_batch_arithmetic(path, train_math):
    """512 completions per optimizer step and 2048 per generation on 64 GPUs (4 optimizer steps per generation);
    the one-GPU recipe keeps the 4 steps per generation. Warm-up: the paper's 10 veRL steps, 4 optimizer steps each."""
    _, args, _ = load_recipe(train_math, path)
    gpus = 1 if path == LORA_RECIPE else PAPER_GPUS
    assert args.steps_per_generation == OPTIMIZER_STEPS_PER_GENERATION * args.gradient_accumulation_steps
    assert args.warmup_steps == 10 * OPTIMIZER_STEPS_PER_GENERATION
    per_generation = args.per_device_train_batch_size * gpus * args.steps_per_generation
    assert per_generation % args.num_generations == 0
    if gpus == PAPER_GPUS:
        assert (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * gpus
            == COMPLETIONS_PER_OPTIMIZER_STEP
        )
        assert per_generation == COMPLETIONS_PER_GENERATION
    if args.use_vllm:
        assert args.vllm_max_model_length >= MAX_PROMPT_LENGTH + args.max_completion_length
        assert gpus % args.vllm_tensor_parallel_size == 0


# ---- accelerate configs ---------------------------------------------------------------------------------------------

ACCELERATE_FILES = ("fsdp2.yaml", "fsdp1.yaml", "ddp.yaml", "zero3.yaml", "multi_node_fsdp2.yaml")


def validated_launch_args(config_file: Path):
    """Run `accelerate launch --config_file ...`'s own parsing and validation, without launching anything."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(config_file), "examples/train_math.py"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args, _, _ = _validate_launch_command(args)
    return parser, args


@pytest.mark.parametrize("name", ACCELERATE_FILES)
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    path = ACCELERATE_CONFIGS / name
    config = load_config_from_file(str(path))  # refuses unknown top-level keys
    assert isinstance(config, ClusterConfig)
    assert config.mixed_precision == "bf16"

    parser, args = validated_launch_args(path)
    # accelerate copies fsdp_config / deepspeed_config entries onto launch arguments without checking their names:
    # make sure each one is a real launch argument.
    launch_dests = {action.dest for action in parser._actions}
    for key in list(config.fsdp_config) + list(config.deepspeed_config):
        assert key in launch_dests, f"{name}: {key!r} is not an `accelerate launch` argument"
    if config.fsdp_config:
        assert args.use_fsdp
        # FSDP's activation checkpointing and the recipes' activation_checkpointing exclude each other
        assert str(config.fsdp_config.get("fsdp_activation_checkpointing", False)).lower() == "false"


@pytest.mark.parametrize("name", ["fsdp2.yaml", "multi_node_fsdp2.yaml", "fsdp1.yaml"])
def test_fsdp_environment(name):
    """The FSDP_* environment `accelerate launch` would hand to the training processes."""
    from accelerate.utils.launch import prepare_multi_gpu_env

    _, args = validated_launch_args(ACCELERATE_CONFIGS / name)
    args.main_process_port = 0  # pick a free port: only the environment is built, nothing listens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = prepare_multi_gpu_env(args)
    expected_version = "1" if name == "fsdp1.yaml" else "2"
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_VERSION"] == expected_version
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    assert env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
    assert env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    assert env["FSDP_SYNC_MODULE_STATES"] == "true"  # accelerate requires it with cpu_ram_efficient_loading
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "false"
    if expected_version == "2":
        assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_multi_node_config_is_8_by_8():
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ACCELERATE_CONFIGS / "multi_node_fsdp2.yaml"))
    assert (config.num_machines, config.num_processes) == (8, 64)
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.main_process_ip and config.main_process_port
    _, args = validated_launch_args(ACCELERATE_CONFIGS / "multi_node_fsdp2.yaml")
    assert (args.num_machines, args.num_processes) == (8, 64)


def test_zero3_config():
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ACCELERATE_CONFIGS / "zero3.yaml"))
    assert config.deepspeed_config["zero_stage"] == 3
    _, args = validated_launch_args(ACCELERATE_CONFIGS / "zero3.yaml")
    assert args.use_deepspeed


def test_zero3_deepspeed_plugin():
    """DeepSpeed-specific validation, only where deepspeed is installed."""
    pytest.importorskip("deepspeed")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    config = load_config_from_file(str(ACCELERATE_CONFIGS / "zero3.yaml")).deepspeed_config
    plugin = DeepSpeedPlugin(
        zero_stage=config["zero_stage"],
        zero3_init_flag=config["zero3_init_flag"],
        zero3_save_16bit_model=config["zero3_save_16bit_model"],
        offload_optimizer_device=config["offload_optimizer_device"],
        offload_param_device=config["offload_param_device"],
    )
    assert plugin.zero_stage == 3


# ---- SLURM script and docs ------------------------------------------------------------------------------------------


def test_slurm_script():
    text = SLURM_SCRIPT.read_text()
    subprocess.run(["bash", "-n", str(SLURM_SCRIPT)], check=True)
    assert "#SBATCH --nodes=8" in text and "#SBATCH --gres=gpu:8" in text
    for flag in ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port", "--config_file"):
        assert flag in text
    assert "srun" in text and "$SLURM_NODEID" in text


REFERRING_FILES = [SLURM_SCRIPT, LAUNCHING_DOC, REPO / "README.md", *sorted(ACCELERATE_CONFIGS.glob("*.yaml")),
                   *sorted(RECIPES.glob("*/*.yaml")), REPO / "examples" / "train_math.py"]  # fmt: skip


@pytest.mark.parametrize("path", REFERRING_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_referenced_files_exist(path):
    """Every examples/... or docs/... path named in the launch files and the README exists."""
    text = path.read_text()
    referenced = set(re.findall(r"\b((?:examples|docs)/[\w./-]+\.(?:py|yaml|slurm|md))", text))
    missing = sorted(p for p in referenced if not (REPO / p).exists())
    assert not missing, f"{path.name} names missing files: {missing}"
