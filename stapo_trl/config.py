"""STAPOConfig: GRPOConfig plus the S2T mask's settings, with the paper's defaults."""

import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from .s2t import MASK_MODES


MASK_SCOPES = ("step", "micro_batch")

# Loss types whose objective is the clipped surrogate of paper Eq. 4/6, a per-token sum that a token mask edits.
SUPPORTED_LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo")


@dataclass
class STAPOConfig(GRPOConfig):
    r"""
    Configuration for [`STAPOTrainer`]: every [`~trl.GRPOConfig`] field, plus the S2T mask of STAPO ("Stabilizing
    Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens", 2026, Eq. 6).

    Among the loss tokens of positive-advantage completions whose probability is below τ_p (the *candidates*), S2T
    silences those whose entropy is below the q-quantile of the candidates' entropies: they leave the loss and the
    normalizer. On top of that, the defaults are the paper's training setting (§5.1, App. 10, the JustRL setting) where
    GRPOConfig differs: DAPO token-level normalization (`loss_type="dapo"`), clip-higher (ε_low 0.2, ε_high 0.28),
    JustRL's dual-clip c = 10 (`delta=10`), no KL (`beta=0`), constant learning rate 1e-6 after 10 warm-up steps,
    AdamW weight decay 0.1, gradient clipping 1.0, G = 8 completions per prompt sampled at temperature 1.0 / top-p 1.0,
    no dropout (`disable_dropout=True`).

    Parameters:
        spurious_prob_threshold (`float`, defaults to `0.002`):
            τ_p: a token is a candidate when its probability π_θ(y_t) is strictly below this value. Must be in (0, 1].
        spurious_entropy_quantile (`float`, defaults to `0.75`):
            q: the candidates with entropy below the q-quantile of all candidates' entropies (pooled over processes)
            are silenced. Must be in [0, 1]. For mode `"random"`, the probability of silencing a candidate.
        spurious_mask_mode (`str`, defaults to `"low_entropy"`):
            `"low_entropy"` (STAPO), `"high_entropy"` (silence candidates above the (1 - q)-quantile; ablation of
            Fig. 8), `"random"` (silence each candidate with probability q; ablation), `"all"` (every candidate:
            JustRL-FullMask), `"none"` (plain DAPO/JustRL baseline, identical to GRPOTrainer).
        spurious_mask_scope (`str`, defaults to `"step"`):
            The pool over which the silenced tokens are decided. `"step"`: the paper's "each mini-batch", one
            optimizer step; before the step's first backward, the candidates of all its micro-batches on all processes
            are pooled, τ_h is their q-quantile, and the DAPO normalizer counts the unsilenced tokens of the whole
            step, so the result does not depend on `per_device_train_batch_size`, `gradient_accumulation_steps` or the
            number of processes. It needs the per-token log-probabilities and entropies of the step before its first
            backward: taken from TRL's own no-grad forward where that ran at the same weights, otherwise from a no-grad
            forward of the step's positive-advantage completions (the only ones that can hold a candidate).
            `"micro_batch"`: each micro-batch decides alone (pooled over processes) inside its loss, at no extra
            forward; its τ_h and normalizer then depend on how the step is split.
        spurious_mechanism_metrics (`bool`, defaults to `False`):
            Log the paper's Table 1 every optimizer step (`mechanism/*`, see `stapo_trl.diagnostics.quadrants`): the
            loss tokens of positive-advantage completions split by probability (τ_p) and entropy (τ_h), and the
            silenced tokens, each with its share of the tokens, its share of the summed logit-gradient norm and its
            mean first-order entropy change, exact over the step and every process. Costs a vocabulary-wide
            reduction over those tokens from the loss's final hidden states.
        spurious_trace (`bool`, defaults to `False`):
            Write the silenced tokens and a sample of the kept candidates, with context and top-k alternatives, to
            `<output_dir>/spurious_trace/rank-<i>.jsonl` (see `stapo_trl.diagnostics.trace`). Bounded per
            micro-batch by `spurious_trace_max_silenced` and `spurious_trace_max_kept`.
    """

    spurious_prob_threshold: float = field(
        default=0.002,
        metadata={
            "help": "τ_p (STAPO Eq. 6): tokens of positive-advantage completions with probability below τ_p are "
            "candidates for silencing. In (0, 1]; paper: 0.002."
        },
    )
    spurious_entropy_quantile: float = field(
        default=0.75,
        metadata={
            "help": "q (STAPO Eq. 6): candidates with entropy below the q-quantile τ_h of the candidates' entropies "
            "(pooled over all processes) are silenced. In [0, 1]; paper: 0.75. Mode 'random': silencing probability."
        },
    )
    spurious_mask_mode: str = field(
        default="low_entropy",
        metadata={
            "help": "Which candidates to silence: 'low_entropy' (STAPO), 'high_entropy' and 'random' (the paper's "
            "Fig. 8 ablations), 'all' (JustRL-FullMask), 'none' (plain baseline, same as GRPOTrainer).",
            "choices": list(MASK_MODES),
        },
    )
    spurious_mask_scope: str = field(
        default="step",
        metadata={
            "help": "Over what τ_h and the silenced count are taken: 'step' (the paper's 'each mini-batch': every "
            "micro-batch of one optimizer step on every process, decided before its first backward; independent of "
            "batch size, accumulation and process count) or 'micro_batch' (each micro-batch alone, inside its loss; "
            "no extra forward pass).",
            "choices": list(MASK_SCOPES),
        },
    )

    spurious_mechanism_metrics: bool = field(
        default=False,
        metadata={
            "help": "Log the paper's Table 1 every optimizer step: the positive-advantage loss tokens in four "
            "quadrants (probability vs τ_p, entropy vs τ_h) and the silenced ones, with each group's share of tokens, "
            "share of the logit-gradient norm and mean first-order entropy change (mechanism/*). Costs a "
            "vocabulary-wide reduction over those tokens (see benchmarks/mechanism_cost.py)."
        },
    )
    spurious_trace: bool = field(
        default=False,
        metadata={
            "help": "Write a trace of the silenced tokens (and a sample of kept candidates) with probability, "
            "entropy, advantage, context and top-k alternatives to <output_dir>/spurious_trace/rank-<i>.jsonl."
        },
    )
    spurious_trace_max_silenced: int = field(
        default=64, metadata={"help": "Trace at most this many silenced tokens per micro-batch and process."}
    )
    spurious_trace_max_kept: int = field(
        default=16, metadata={"help": "Trace at most this many kept candidates per micro-batch and process."}
    )
    spurious_trace_context_tokens: int = field(
        default=32, metadata={"help": "Completion tokens of context traced on each side of a token."}
    )
    spurious_trace_top_k: int = field(default=5, metadata={"help": "Alternatives traced per token (paper: top-5)."})

    # GRPOConfig fields whose defaults differ in the paper's setting (§5.1, App. 10, Table 4)
    loss_type: str = field(
        default="dapo",
        metadata={"help": "Loss normalization. STAPO uses DAPO's token-level normalization (paper Eq. 4, 6)."},
    )
    epsilon: float = field(default=0.2, metadata={"help": "ε_low of the clipped ratio (paper: 0.2)."})
    epsilon_high: float = field(default=0.28, metadata={"help": "ε_high, DAPO's clip-higher (paper: 0.28)."})
    delta: float | None = field(
        default=10.0,
        metadata={
            "help": "Dual-clip c of the JustRL setting (paper: 10): TRL's two-sided clipping caps the ratio at delta, "
            "bounding the loss of negative-advantage tokens by c·|Â|. None disables it."
        },
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient β. The paper uses no KL term (0.0)."})
    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate (paper: constant 1e-6)."})
    lr_scheduler_type: str = field(
        default="constant_with_warmup",
        metadata={"help": "Learning-rate schedule (paper: constant after warm-up)."},
    )
    warmup_steps: float = field(default=10, metadata={"help": "Linear warm-up steps (paper: 10)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (paper, JustRL setting: 0.1)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (paper: 1.0)."})
    # TRL defaults to `gradient_checkpointing=True`, a name transformers 5 deprecates with a FutureWarning on every
    # config: the same default under its new name, the old one left unset (transformers then mirrors the new one).
    activation_checkpointing: bool = field(
        default=True, metadata={"help": "Recompute activations in the backward pass to save memory (TRL's default)."}
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5)."}
    )
    disable_dropout: bool = field(
        default=True,
        metadata={
            "help": "Train without dropout, as the paper does. S2T decides from a forward pass of its own when "
            "spurious_mask_scope='step', so dropout would give the decision and the loss different functions."
        },
    )
    num_generations: int | None = field(default=8, metadata={"help": "G, completions sampled per prompt (paper: 8)."})
    temperature: float = field(default=1.0, metadata={"help": "Rollout sampling temperature (paper: 1.0)."})
    top_p: float = field(default=1.0, metadata={"help": "Rollout nucleus sampling top-p (paper: 1.0)."})

    def __post_init__(self):
        # Checked before GRPOConfig's own set-up, so a wrong value fails before anything expensive starts.
        if not 0.0 < self.spurious_prob_threshold <= 1.0:
            raise ValueError(
                f"spurious_prob_threshold (τ_p) must be in (0, 1], got {self.spurious_prob_threshold}; "
                "the paper uses 0.002."
            )
        if not 0.0 <= self.spurious_entropy_quantile <= 1.0:
            raise ValueError(
                f"spurious_entropy_quantile (q) must be in [0, 1], got {self.spurious_entropy_quantile}; "
                "the paper uses 0.75 (a fraction, not a percentage)."
            )
        if self.spurious_mask_mode not in MASK_MODES:
            raise ValueError(f"spurious_mask_mode must be one of {MASK_MODES}, got {self.spurious_mask_mode!r}.")
        if self.spurious_mask_scope not in MASK_SCOPES:
            raise ValueError(f"spurious_mask_scope must be one of {MASK_SCOPES}, got {self.spurious_mask_scope!r}.")
        for name in ("epsilon", "epsilon_high", "temperature", "learning_rate"):
            value = getattr(self, name)
            if value is not None and math.isnan(value):
                raise ValueError(f"{name} is NaN; give a number (the paper's value is this field's default).")
        if self.delta is not None and not self.delta > 1.0:  # also refuses NaN
            raise ValueError(
                f"delta (dual-clip c) must be > 1 or None, got {self.delta}: the ratio is capped at delta, and a cap "
                "at or below 1 clips every ratio of negative-advantage tokens. The JustRL setting uses 10; None "
                "disables it."
            )
        if not 0.0 < self.top_entropy_quantile <= 1.0:  # also refuses NaN
            raise ValueError(
                f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}: the fraction of "
                "highest-entropy tokens that are trained (1.0 = all; 20-Entropy: 0.2)."
            )
        for name in ("spurious_trace_max_silenced", "spurious_trace_max_kept", "spurious_trace_context_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if self.spurious_trace_top_k < 1:
            raise ValueError(f"spurious_trace_top_k must be >= 1, got {self.spurious_trace_top_k}.")
        if self.use_liger_kernel:
            raise ValueError(
                "use_liger_kernel=True computes the GRPO loss inside the Liger kernel, where the S2T mask cannot be "
                "applied; set use_liger_kernel=False."
            )
        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported by STAPO: the S2T mask edits the per-token clipped "
                f"surrogate of Eq. 6. Use one of {SUPPORTED_LOSS_TYPES} ('dapo' is the paper's)."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r}: a sequence-level ratio ties every "
                "token of a completion together, so silencing single tokens is meaningless. Set "
                "importance_sampling_level='token'."
            )
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            raise ValueError(
                "entropy_coef / use_adaptive_entropy (an entropy bonus) is not supported by STAPOTrainer: S2T "
                "stabilizes entropy without a bonus term (paper §5). Set entropy_coef=0.0 and "
                "use_adaptive_entropy=False."
            )
        super().__post_init__()
        # After GRPOConfig has resolved steps_per_generation.
        generate_every = self.steps_per_generation * self.num_iterations
        decides_per_step = self.spurious_mask_scope == "step" and self.spurious_mask_mode != "none"
        if decides_per_step and generate_every % self.gradient_accumulation_steps != 0:
            raise ValueError(
                f"spurious_mask_scope='step' decides over every micro-batch of an optimizer step before its first "
                f"backward, so a step must not start a new generation in its middle: steps_per_generation x "
                f"num_iterations ({self.steps_per_generation} x {self.num_iterations}) must be a multiple of "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}). Change one of these fields, or "
                "use spurious_mask_scope='micro_batch'."
            )
