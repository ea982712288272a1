"""The recipes, accelerate configs and SLURM script of the GPU launches (docs/launching.md), checked on CPU, offline.

Each recipe is loaded the way `examples/train_math.py` loads it (its `parse_args`: method values as defaults, then the
recipe, then the command line) and compared with the paper's settings (REFERENCE.md). Only `--use_cpu true` is added:
with it, `bf16: true` passes TrainingArguments' checks without a GPU, and `use_vllm: true` is only read at trainer
construction, so the recipes' own values are the ones checked. Each accelerate config goes through `accelerate launch`'s
own loading and validation, without starting anything.
"""

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

os.environ["HF_HUB_OFFLINE"] = "1"

from trl import ModelConfig  # noqa: E402

from stapo_trl import STAPOConfig  # noqa: E402
from stapo_trl.methods import METHODS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "examples" / "recipes"
ACCELERATE_CONFIGS = REPO / "examples" / "accelerate_configs"
SLURM_SCRIPT = REPO / "examples" / "slurm" / "train_multinode.slurm"
LAUNCHING_DOC = REPO / "docs" / "launching.md"

MODELS = ("Qwen3-1.7B-Base", "Qwen3-8B-Base", "Qwen3-14B-Base")
PAPER_METHODS = ("stapo", "justrl", "grpo", "20_entropy")
PAPER_RECIPES = [RECIPES / model / f"{method}.yaml" for model in MODELS for method in PAPER_METHODS]
LORA_RECIPE = RECIPES / "Qwen3-1.7B-Base" / "stapo_lora_1gpu.yaml"
GPU_RECIPES = PAPER_RECIPES + [LORA_RECIPE]

# The paper's setting (REFERENCE.md, paper §5.1 / App. 10 / Table 4: the JustRL setting)
PAPER_GPUS = 64  # 8 nodes x 8 GPUs
COMPLETIONS_PER_OPTIMIZER_STEP = 512  # mini-batch of 64 prompts x G = 8
COMPLETIONS_PER_GENERATION = 2048  # 256 prompts x G = 8
OPTIMIZER_STEPS_PER_GENERATION = 4
MAX_PROMPT_LENGTH = 1024

# Per method: (spurious_mask_mode, loss_type, epsilon_high, beta, top_entropy_quantile, delta)
EXPECTED_METHOD_VALUES = {
    "stapo": ("low_entropy", "dapo", 0.28, 0.0, 1.0, 10.0),
    "justrl": ("none", "dapo", 0.28, 0.0, 1.0, 10.0),
    "20_entropy": ("none", "dapo", 0.28, 0.0, 0.2, 10.0),
    "grpo": ("none", "grpo", 0.2, 0.04, 1.0, None),  # DeepSeekMath: symmetric ε, KL β = 0.04, no dual-clip
}

# Fields set by some method: a recipe setting them would stop `--method` from switching them.
METHOD_KEYS = sorted({key for values in METHODS.values() for key in values})
# Fields that only name the run.
NAME_FIELDS = ("output_dir", "run_name", "hub_model_id", "logging_dir")


def _load_train_math():
    path = REPO / "examples" / "train_math.py"
    if not path.exists():
        pytest.skip("examples/train_math.py does not exist yet")
    if "train_math" in sys.modules:
        return sys.modules["train_math"]
    spec = importlib.util.spec_from_file_location("train_math", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_math"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def train_math():
    return _load_train_math()


def load_recipe(train_math, path: Path, *extra: str):
    """(script_args, training_args, model_args) exactly as the script builds them, plus `--use_cpu true`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. transformers' deprecation notice for `gradient_checkpointing`
        return train_math.parse_args(["--config", str(path), "--use_cpu", "true", *extra])


def raw(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def recipe_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_every_recipe_exists():
    missing = [recipe_id(p) for p in GPU_RECIPES if not p.exists()]
    assert not missing, f"missing recipes: {missing}"


@pytest.mark.parametrize("path", GPU_RECIPES, ids=recipe_id)
def test_recipe_keys_are_fields(path, train_math):
    """Every key is a field of MathScriptArguments, STAPOConfig or ModelConfig (TrlParser would refuse others)."""
    known = {"env"}
    for cls in (train_math.MathScriptArguments, STAPOConfig, ModelConfig):
        known.update(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(raw(path)) - known)
    assert not unknown, f"{recipe_id(path)}: not a field of any config class: {unknown}"


@pytest.mark.parametrize("path", GPU_RECIPES, ids=recipe_id)
def test_recipe_leaves_method_values_to_the_method(path):
    """Recipe keys win over the method's values, so a recipe that set one would break `--method`."""
    data = raw(path)
    assert data.get("method") in METHODS
    overlap = sorted(set(data) & set(METHOD_KEYS))
    assert not overlap, f"{recipe_id(path)} sets {overlap}, which belong to `method:` (stapo_trl.methods.METHODS)"


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=recipe_id)
def test_paper_recipe_values(path, train_math):
    script_args, args, model_args = load_recipe(train_math, path)
    model, method = path.parent.name, path.stem

    assert script_args.method == method
    assert model_args.model_name_or_path == f"Qwen/{model}"
    assert script_args.dataset_name == "BytedTsinghua-SIA/DAPO-Math-17k"
    assert script_args.dataset_format == "dapo"
    assert model_args.use_peft is False

    # S2T thresholds (Table 4)
    assert args.spurious_prob_threshold == 0.002
    assert args.spurious_entropy_quantile == 0.75
    # Rollouts (App. 10, §5.1, JustRL setting)
    assert args.num_generations == 8
    assert args.temperature == 1.0 and args.top_p == 1.0
    assert args.max_completion_length == 15360
    assert args.num_iterations == 1
    assert args.scale_rewards == "group"
    # Clipping: ε_low everywhere; ε_high, β, loss and mask from the method; dual-clip c = 10 except GRPO
    mode, loss_type, epsilon_high, beta, top_entropy_quantile, delta = EXPECTED_METHOD_VALUES[method]
    assert args.epsilon == 0.2
    assert args.spurious_mask_mode == mode
    assert args.loss_type == loss_type
    assert args.epsilon_high == epsilon_high
    assert args.beta == beta
    assert args.top_entropy_quantile == top_entropy_quantile
    assert args.delta == delta
    # Optimizer (App. 10, JustRL setting)
    assert args.learning_rate == 1e-6
    assert args.lr_scheduler_type == "constant_with_warmup"  # a str-valued enum
    assert args.warmup_steps == 10
    assert args.weight_decay == 0.1
    assert args.max_grad_norm == 1.0
    # Precision: fp32 master weights (1e-6 updates vanish in bf16 weights), bf16 compute
    assert model_args.dtype == "float32"
    assert args.bf16 is True
    assert args.gradient_checkpointing is True
    # Run names carry the model and the method; nothing is pushed by default
    for name in (args.output_dir, args.run_name, args.hub_model_id):
        assert model in name and method in name
    assert args.push_to_hub is False
    assert args.logging_steps == 1


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=recipe_id)
def test_batch_arithmetic_for_64_gpus(path, train_math):
    """512 completions per optimizer step and 2048 per generation, i.e. 4 optimizer steps per generation."""
    _, args, _ = load_recipe(train_math, path)
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * PAPER_GPUS
    assert per_step == COMPLETIONS_PER_OPTIMIZER_STEP
    assert args.steps_per_generation == OPTIMIZER_STEPS_PER_GENERATION * args.gradient_accumulation_steps
    # TRL: generation_batch_size = per_device_train_batch_size x num_processes x steps_per_generation
    per_generation = args.per_device_train_batch_size * PAPER_GPUS * args.steps_per_generation
    assert per_generation == COMPLETIONS_PER_GENERATION
    assert per_generation % args.num_generations == 0
    assert args.per_device_train_batch_size <= 2  # 15k-token completions
    # The header states the assumption and how to rescale it
    text = path.read_text()
    assert "GPU COUNT ASSUMPTION: 64 GPUs" in text and "RESCALING" in text


@pytest.mark.parametrize("path", GPU_RECIPES, ids=recipe_id)
def test_vllm_colocate_settings(path, train_math):
    data = raw(path)
    assert data["use_vllm"] is True
    assert data["vllm_mode"] == "colocate"
    assert data["vllm_enable_sleep_mode"] is True
    assert 0.0 < data["vllm_gpu_memory_utilization"] < 1.0
    _, args, _ = load_recipe(train_math, path)
    assert args.use_vllm is True and args.vllm_mode == "colocate"
    assert args.vllm_max_model_length == MAX_PROMPT_LENGTH + args.max_completion_length
    gpus = 1 if path == LORA_RECIPE else PAPER_GPUS
    assert gpus % args.vllm_tensor_parallel_size == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", ["justrl", "20_entropy", "grpo"])
def test_method_switch_reproduces_the_method_recipe(model, method, train_math):
    """`--method X` on stapo.yaml gives X's recipe, up to the run names."""
    _, switched, switched_model = load_recipe(train_math, RECIPES / model / "stapo.yaml", "--method", method)
    _, direct, direct_model = load_recipe(train_math, RECIPES / model / f"{method}.yaml")
    assert differing_fields(switched, direct) == []
    assert switched_model == direct_model


def differing_fields(a: STAPOConfig, b: STAPOConfig) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(STAPOConfig)
        if f.name not in NAME_FIELDS and getattr(a, f.name) != getattr(b, f.name)
    ]


def test_lora_one_gpu_recipe(train_math):
    script_args, args, model_args = load_recipe(train_math, LORA_RECIPE)
    assert script_args.method == "stapo" and args.spurious_mask_mode == "low_entropy"
    assert model_args.model_name_or_path in ("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-0.6B-Base")
    assert model_args.use_peft is True
    assert 32 <= model_args.lora_r <= 64
    assert model_args.lora_target_modules == "all-linear"
    assert model_args.lora_dropout == 0.0
    # Its own, documented departures from the paper
    assert args.learning_rate == 1e-5
    assert 2048 <= args.max_completion_length <= 4096
    assert 100 <= args.max_steps <= 1000
    assert args.vllm_gpu_memory_utilization <= 0.4
    # Everything else as in the paper
    assert args.spurious_prob_threshold == 0.002 and args.spurious_entropy_quantile == 0.75
    assert (args.epsilon, args.epsilon_high, args.beta, args.delta) == (0.2, 0.28, 0.0, 10.0)
    assert args.num_generations == 8 and args.temperature == 1.0 and args.top_p == 1.0
    assert args.warmup_steps == 10 and args.weight_decay == 0.1 and args.max_grad_norm == 1.0
    # One GPU, still 4 optimizer steps per generation
    assert args.steps_per_generation == OPTIMIZER_STEPS_PER_GENERATION * args.gradient_accumulation_steps
    assert (args.per_device_train_batch_size * args.steps_per_generation) % args.num_generations == 0
    assert "GPU COUNT ASSUMPTION: 1 GPU" in LORA_RECIPE.read_text()


@pytest.mark.parametrize("path", GPU_RECIPES, ids=recipe_id)
def test_every_value_has_a_comment(path):
    """Open-r1 style: each top-level `key: value` line states where its value comes from."""
    bare = [
        line
        for line in path.read_text().splitlines()
        if re.match(r"^[A-Za-z_]\w*:", line) and "#" not in line
    ]
    assert not bare, f"{recipe_id(path)}: values without a source comment: {bare}"


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
        # FSDP's activation checkpointing and the recipes' gradient_checkpointing exclude each other
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


@pytest.mark.parametrize("path", [SLURM_SCRIPT, LAUNCHING_DOC] + GPU_RECIPES, ids=lambda p: p.name)
def test_referenced_files_exist(path):
    """Every examples/... or docs/... path named in the launch files exists."""
    text = path.read_text()
    referenced = set(re.findall(r"\b((?:examples|docs)/[\w./-]+\.(?:py|yaml|slurm|md))", text))
    missing = sorted(p for p in referenced if not (REPO / p).exists())
    assert not missing, f"{path.name} names missing files: {missing}"
