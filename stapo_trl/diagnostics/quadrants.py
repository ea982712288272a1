"""Table 1 of the paper, live: the positive-advantage loss tokens of each optimizer step in four quadrants.

`STAPOConfig(spurious_mechanism_metrics=True)` logs, per optimizer step and over every process, for the loss tokens
of positive-advantage completions split by probability (τ_p) and entropy (τ_h, the q-quantile of the step's
candidates' entropies, as S2T takes it, whatever the mask mode), and for the tokens S2T silenced:

    mechanism/<group>/token_share       the group's share of those tokens
    mechanism/<group>/grad_norm_share   its share of their summed logit-gradient norm |Â| w ‖∇_a log π(y)‖
    mechanism/<group>/entropy_change    its mean first-order entropy change per unit step (`stapo_trl.mechanism`)
    mechanism/entropy_threshold         the τ_h that split them

with <group> one of `stapo_trl.diagnostics.metrics.GROUPS`: the four quadrants and `silenced`. w is the weight of the clipped surrogate (and of
vLLM's importance-sampling correction when it is on), before any token mask, so a token gets the same figures in
every method and the silenced group's share is what silencing took out. The loss normalizer, the same for every
token of the step under the DAPO loss, is left out. The quadrant rows are NaN at a step without candidates (no τ_h).

The figures come from the loss's own forward: log π and H as the loss computes them, and Σ π², Σ π² ln π from the
final hidden states of that forward (a forward hook on the backbone), reduced over the vocabulary for the
positive-advantage loss tokens only. That reduction is the extra cost (`benchmarks/mechanism_cost.py`).

In runs whose completions come with vLLM's sampling log-probabilities (`use_vllm=True`), every step also logs the
mean |log π_trainer(y) - log π_vLLM(y)| over the loss tokens, the candidates and the silenced tokens
(`sampling/logp_gap/{all,candidates,silenced}`, exact over the step and every process): the mismatch between the
two engines is largest on low-probability tokens, the ones S2T decides on. log π_trainer is the loss's reference:
the old log-probabilities when TRL computed them, else the loss's own (then at the sampling weights).
"""

from contextlib import contextmanager

import torch
from trl.trainer.utils import maybe_gather_lm_head_ctx

from ..mechanism import (
    first_order_entropy_change,
    logit_gradient_norm,
    logit_statistics,
    quadrant_sums,
    surrogate_weight,
)
from ..s2t import masked_quantile
from .metrics import COLUMNS, GROUPS, MECHANISM_PREFIX, QUADRANTS


GAP_PREFIX = "sampling/logp_gap/"
# Config fields of models whose LM head transforms the logits (TRL's fused head applies them; `logit_statistics` not).
LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)
GAP_GROUPS = ("all", "candidates", "silenced")


def quadrant_table(sums: torch.Tensor) -> dict[str, dict[str, float]]:
    """Table 1 from `quadrant_sums` (or a sum of them): per group, its share of the tokens, its share of the summed
    logit-gradient norm, and its mean first-order entropy change per token (NaN for an empty group)."""
    sums = sums.double().tolist()
    total_tokens, total_norm, _ = sums[-1]
    table = {}
    for group, (tokens, norm, entropy_change) in zip(GROUPS, sums[:-1], strict=True):
        values = (
            tokens / total_tokens if total_tokens else float("nan"),
            norm / total_norm if total_norm else float("nan"),
            entropy_change / tokens if tokens else float("nan"),
        )
        table[group] = dict(zip(COLUMNS, values, strict=True))
    return table


class StepDiagnostics:
    """Collects the step's loss tokens micro-batch by micro-batch and returns the step's metrics at its end.

    Args:
        mechanism: log Table 1 (`mechanism/*`); needs `capture` around the loss's forward.
        prob_threshold, entropy_quantile: τ_p and q of S2T.
        epsilon_low, epsilon_high: the clip range of the surrogate.
        temperature: the sampling temperature the loss divides the logits by.
        gather: all-gathers a variable-length 1-D tensor over processes (None: one process).
        reduce: sums a tensor over processes (None: one process).
        model_config: the policy's config; the mechanism metrics refuse models whose LM head transforms its logits.
    """

    def __init__(
        self, *, mechanism, prob_threshold, entropy_quantile, epsilon_low, epsilon_high, temperature, gather, reduce,
        model_config=None,
    ):  # fmt: skip
        if mechanism and model_config is not None:
            text_config = model_config.get_text_config()
            for name in LOGIT_TRANSFORMS:
                if getattr(text_config, name, None) not in (None, 1, 1.0):
                    raise ValueError(
                        f"spurious_mechanism_metrics=True recomputes the next-token distribution as softmax(h W^T / T) "
                        f"and does not apply this model's {name}={getattr(text_config, name)!r}; set "
                        "spurious_mechanism_metrics=False for this model."
                    )
        self.mechanism = mechanism
        self.prob_threshold, self.entropy_quantile = prob_threshold, entropy_quantile
        self.epsilon_low, self.epsilon_high = epsilon_low, epsilon_high
        self.temperature = temperature
        self.gather, self.reduce = gather, reduce
        self._hidden = None  # (final hidden states, LM head) of the forward captured last
        self._tokens = []  # per micro-batch: (probability, entropy, grad norm, entropy change, silenced)
        self._gap = None  # (3, 2): summed |log-prob gap| and token count of GAP_GROUPS

    @contextmanager
    def capture(self, model):
        """Keep the backbone's last hidden states of every forward of `model` (unwrapped) run inside the block."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
        chunks = []

        def keep(module, args, output):
            chunks.append(output[0].detach())  # last_hidden_state

        handle = base.base_model.register_forward_hook(keep)
        try:
            yield
        finally:
            handle.remove()
            self._hidden = (torch.cat(chunks) if chunks else None), base.get_output_embeddings()

    def record(
        self, inputs, per_token_logps, entropies, advantages, loss_mask, silenced, ratio, trainer_logps, last_of_step
    ):  # fmt: skip
        """Add one micro-batch; at the step's last micro-batch, return the step's metrics (else None).

        `advantages` is (B, 1) or (B, T); `ratio` the importance ratio ρ of the loss (before the dual clip);
        `trainer_logps` the log-probabilities the vLLM gap compares with vLLM's.
        """
        advantages = advantages.expand_as(per_token_logps)
        candidates = loss_mask.bool() & (advantages > 0) & (per_token_logps.detach().exp() < self.prob_threshold)
        if "sampling_per_token_logps" in inputs:
            gap = (trainer_logps.detach() - inputs["sampling_per_token_logps"]).abs().float()
            groups = torch.stack([loss_mask.bool(), candidates, silenced.bool()]).float()
            sums = torch.stack([(groups * gap.nan_to_num()).flatten(1).sum(1), groups.flatten(1).sum(1)], dim=1)
            self._gap = sums if self._gap is None else self._gap + sums
        if self.mechanism:
            self._record_mechanism(inputs, per_token_logps, entropies, advantages, loss_mask, silenced, ratio)
        if not last_of_step:
            return None
        metrics = {}
        if self.mechanism:
            tokens = (torch.cat(t) for t in zip(*self._tokens))
            self._tokens = []
            metrics.update(self.table_metrics(*tokens))
        if self._gap is not None:
            gap = self._gap if self.reduce is None else self.reduce(self._gap)
            self._gap = None
            for group, (total, count) in zip(GAP_GROUPS, gap.tolist(), strict=True):
                metrics[f"{GAP_PREFIX}{group}"] = total / count if count else float("nan")
        return metrics

    def _record_mechanism(self, inputs, per_token_logps, entropies, advantages, loss_mask, silenced, ratio):
        hidden, head = self._hidden
        self._hidden = None
        selected = loss_mask.bool() & (advantages > 0)
        hidden = hidden[:, -per_token_logps.size(1) - 1 : -1][selected]  # position t - 1 predicts completion token t
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):  # FSDP2 shards the head as a DTensor
            weight, bias = weight.full_tensor(), None if bias is None else bias.full_tensor()
        with maybe_gather_lm_head_ctx(weight, bias):  # ZeRO-3 partitions it; TRL's fused head gathers it the same way
            collision, collision_log = logit_statistics(hidden, weight, bias, self.temperature)
        logps, entropy = per_token_logps.detach()[selected].float(), entropies.detach()[selected].float()
        step = advantages[selected] * surrogate_weight(
            ratio.detach()[selected], advantages[selected], self.epsilon_low, self.epsilon_high
        )
        if "importance_sampling_ratio" in inputs:  # TRL passes it only when it applies the correction
            step = step * inputs["importance_sampling_ratio"].expand_as(per_token_logps)[selected]
        grad_norm = step.abs() * logit_gradient_norm(logps, collision)
        entropy_change = first_order_entropy_change(logps, entropy, collision, collision_log, step)
        self._tokens.append((logps.exp(), entropy, grad_norm, entropy_change, silenced[selected].float()))

    def table_metrics(self, probability, entropy, grad_norm, entropy_change, silenced) -> dict[str, float]:
        """Table 1 of one step's tokens (this process's; the threshold and the sums span every process)."""
        candidate_entropies = entropy[probability < self.prob_threshold]
        if self.gather is not None:
            candidate_entropies = self.gather(candidate_entropies)
        threshold = masked_quantile(
            candidate_entropies, torch.ones_like(candidate_entropies, dtype=torch.bool), self.entropy_quantile
        )
        sums = quadrant_sums(
            probability, entropy, grad_norm, entropy_change, silenced,
            prob_threshold=self.prob_threshold, entropy_threshold=threshold,
        )  # fmt: skip
        if self.reduce is not None:
            sums = self.reduce(sums)
        threshold = float(threshold)
        metrics = {f"{MECHANISM_PREFIX}entropy_threshold": threshold}
        for group, row in quadrant_table(sums).items():
            undefined = group in QUADRANTS and threshold != threshold  # no candidate anywhere: no τ_h
            for name, value in row.items():
                metrics[f"{MECHANISM_PREFIX}{group}/{name}"] = float("nan") if undefined else value
        return metrics
