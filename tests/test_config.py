"""STAPOConfig: the paper's defaults, and every invalid value refused with the field's name."""

import math
import warnings

import pytest
from conftest import CPU_SETTINGS
from transformers import HfArgumentParser

from stapo_trl import STAPOConfig


def config(**overrides):
    return STAPOConfig(output_dir="unused", **CPU_SETTINGS, **overrides)


def test_paper_defaults():
    args = config()
    assert args.spurious_prob_threshold == 0.002
    assert args.spurious_entropy_quantile == 0.75
    assert args.spurious_mask_mode == "low_entropy"
    assert args.spurious_mask_scope == "step"
    assert (args.loss_type, args.epsilon, args.epsilon_high, args.delta, args.beta) == ("dapo", 0.2, 0.28, 10.0, 0.0)
    assert args.learning_rate == 1e-6 and args.warmup_steps == 10 and args.weight_decay == 0.1
    assert args.lr_scheduler_type == "constant_with_warmup"
    assert args.max_grad_norm == 1.0 and args.num_generations == 8
    assert args.temperature == 1.0 and args.top_p == 1.0


@pytest.mark.parametrize(
    "overrides, field_name",
    [
        ({"spurious_prob_threshold": 0.0}, "spurious_prob_threshold"),
        ({"spurious_prob_threshold": -0.1}, "spurious_prob_threshold"),
        ({"spurious_prob_threshold": 1.5}, "spurious_prob_threshold"),
        ({"spurious_entropy_quantile": -0.01}, "spurious_entropy_quantile"),
        ({"spurious_entropy_quantile": 75}, "spurious_entropy_quantile"),
        ({"spurious_mask_mode": "lowest"}, "spurious_mask_mode"),
        ({"use_liger_kernel": True}, "use_liger_kernel"),
        ({"loss_type": "cispo"}, "loss_type"),
        ({"loss_type": "sapo"}, "loss_type"),
        ({"loss_type": "vespo"}, "loss_type"),
        ({"loss_type": "luspo"}, "loss_type"),
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"spurious_mask_scope": "mini_batch"}, "spurious_mask_scope"),
        ({"delta": 1.0}, "delta"),
        ({"delta": 0.5}, "delta"),
        ({"delta": math.nan}, "delta"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"epsilon_high": math.nan}, "epsilon_high"),
        ({"temperature": math.nan}, "temperature"),
        ({"learning_rate": math.nan}, "learning_rate"),
        ({"top_entropy_quantile": 0.0}, "top_entropy_quantile"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ({"top_entropy_quantile": math.nan}, "top_entropy_quantile"),
        # A step that would start a new generation in its middle cannot be decided before its first backward.
        ({"gradient_accumulation_steps": 2, "steps_per_generation": 3}, "steps_per_generation"),
        ({"gradient_accumulation_steps": 4, "steps_per_generation": 2}, "spurious_mask_scope='micro_batch'"),
    ],
)
def test_invalid_values_name_the_field(overrides, field_name):
    with pytest.raises(ValueError, match=field_name):
        config(**overrides)


def test_boundaries_are_accepted():
    config(spurious_prob_threshold=1.0, spurious_entropy_quantile=0.0)
    config(spurious_entropy_quantile=1.0)
    config(delta=None)
    config(delta=1.0001, top_entropy_quantile=1.0)
    config(top_entropy_quantile=0.2)
    # Steps that start where generations start; and any split when the decision is per micro-batch.
    config(gradient_accumulation_steps=2, steps_per_generation=8)
    config(gradient_accumulation_steps=4, steps_per_generation=2, num_iterations=2)
    config(gradient_accumulation_steps=2, steps_per_generation=3, spurious_mask_scope="micro_batch")
    config(gradient_accumulation_steps=2, steps_per_generation=3, spurious_mask_mode="none")
    for loss_type in ("dapo", "bnpo", "grpo", "dr_grpo"):
        config(loss_type=loss_type)


def test_command_line_help_explains_the_fields():
    parser = HfArgumentParser(STAPOConfig)
    text = parser.format_help()
    needles = ("--spurious_prob_threshold", "τ_p", "--spurious_entropy_quantile", "q (STAPO Eq. 6)", "clip-higher",
               "--spurious_mask_scope", "each mini-batch")  # fmt: skip
    for needle in needles:
        assert needle in text
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "o", "--use_cpu", "--bf16", "false", "--spurious_mask_mode", "random"]
    )
    assert args.spurious_mask_mode == "random"
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--output_dir", "o", "--spurious_mask_mode", "bogus"])


def test_defaults_raise_no_deprecation_notice(tmp_path):
    # TRL's own default, gradient_checkpointing=True, makes transformers 5 warn on every config it builds.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config = STAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert config.activation_checkpointing is True and config.gradient_checkpointing is True  # the alias mirrors it
