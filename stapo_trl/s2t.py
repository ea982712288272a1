"""The S2T mask ("Silencing Spurious Tokens") of STAPO, paper Eq. 6.

A token y_{i,t} is *spurious* and silenced (I_{i,t} = 1) iff

    Â_i > 0   and   π_θ(y_{i,t}) < τ_p   and   H_{i,t} < τ_h^(q)

where τ_h^(q) is the q-quantile of the entropies of the *candidates*: the loss tokens of positive-advantage
completions whose probability is below τ_p, taken over the whole batch of every process. The paper takes it over each
mini-batch, i.e. one optimizer step: `pooled_spurious_token_masks` decides over the micro-batches of a step at once.
The other modes are the paper's ablations (Fig. 8) and baselines (JustRL-FullMask = "all", JustRL = "none").

Everything here is pure torch: no trainer state, and no host-device synchronisation except what `gather` needs.
"""

from collections.abc import Callable, Sequence

import torch


MASK_MODES = ("low_entropy", "high_entropy", "random", "all", "none")


def masked_quantile(values: torch.Tensor, valid: torch.Tensor, q: float | list[float]) -> torch.Tensor:
    """`torch.quantile(values[valid], q)` (linear interpolation), NaN when nothing is valid, without host syncs.

    Invalid entries are sorted to the end as +inf and the interpolation indices are computed on the device, so the
    result never needs the number of valid entries on the host. `q` may be a list: one sort serves every quantile.
    """
    q = torch.as_tensor(q, dtype=torch.float32, device=values.device)
    if values.numel() == 0:  # a shape, known on the host: no sync
        return torch.full_like(q, torch.nan)
    count = valid.sum()
    ordered = torch.where(valid, values.float(), torch.inf).flatten().sort().values
    position = q * (count - 1).clamp(min=0)
    lower, upper = position.floor().long(), position.ceil().long()
    low_value, high_value = ordered[lower], ordered[upper]
    # torch.quantile's "linear" interpolation; with no valid entry both values are +inf and the result is NaN.
    quantile = low_value + (high_value - low_value) * (position - lower)
    return torch.where(count > 0, quantile, torch.nan)


def spurious_token_mask(
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    prob_threshold: float,
    entropy_quantile: float,
    mode: str = "low_entropy",
    generator: torch.Generator | None = None,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    return_details: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return the S2T indicator I_{i,t} of paper Eq. 6: a bool tensor shaped like `per_token_logps`, True = silenced.

    Args:
        per_token_logps: (B, T) log π_θ(y_{i,t}) of the sampled tokens under the current policy.
        entropies: (B, T) entropy H_{i,t} of the full next-token distribution at each position.
        advantages: (B,), (B, 1) or (B, T) advantages Â; only tokens with Â > 0 can be silenced.
        loss_mask: (B, T) 1 for tokens that enter the loss (completion, not padding, not tool output).
        prob_threshold: τ_p; candidates have probability strictly below it (paper: 0.002).
        entropy_quantile: q; the quantile of candidate entropies that separates silenced from kept (paper: 0.75).
        mode: "low_entropy" (STAPO: silence candidates with H < quantile q), "high_entropy" (silence candidates with
            H > quantile 1 - q), "random" (silence each candidate with probability q), "all" (every candidate),
            "none" (nothing).
        generator: random generator for mode "random", for reproducibility.
        gather: all-gathers a variable-length 1-D tensor across processes, so that the entropy quantile is taken
            over the candidates of all processes; None for a single process.
        return_details: return `(silenced, candidates, entropy_threshold)` instead of `silenced` alone; the threshold
            is a 0-d tensor, NaN when the mode uses none or when no process has a candidate.
    """
    if mode not in MASK_MODES:
        raise ValueError(f"Unknown spurious_mask_mode {mode!r}; choose one of {MASK_MODES}.")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    candidates = loss_mask.bool() & (advantages > 0) & (per_token_logps.detach().exp() < prob_threshold)
    entropies = entropies.detach()
    threshold = torch.full((), torch.nan, device=entropies.device)

    if mode in ("low_entropy", "high_entropy"):
        q = entropy_quantile if mode == "low_entropy" else 1.0 - entropy_quantile
        if gather is None:
            threshold = masked_quantile(entropies, candidates, q)
        else:
            pooled = gather(entropies[candidates].float())
            threshold = masked_quantile(pooled, torch.ones_like(pooled, dtype=torch.bool), q)
        # A NaN threshold (no candidate anywhere) compares False: nothing is silenced.
        beyond = entropies < threshold if mode == "low_entropy" else entropies > threshold
        silenced = candidates & beyond
    elif mode == "random":
        draws = torch.rand(candidates.shape, generator=generator, device=candidates.device)
        silenced = candidates & (draws < entropy_quantile)
    elif mode == "all":
        silenced = candidates
    else:
        silenced = torch.zeros_like(candidates)

    return (silenced, candidates, threshold) if return_details else silenced


def pooled_spurious_token_masks(
    per_token_logps: Sequence[torch.Tensor],
    entropies: Sequence[torch.Tensor],
    advantages: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    **kwargs,
) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """`spurious_token_mask` over the union of several batches (e.g. the micro-batches of one optimizer step).

    One decision for the pool: τ_h is the q-quantile of the candidates of every batch (and, with `gather`, of every
    process), so the result does not depend on how the pool is split. The batches may differ in shape. Returns one
    mask per batch, or with `return_details=True` `(silenced, candidates, entropy_threshold)` with lists for the first
    two. Keyword arguments are those of `spurious_token_mask`.
    """
    shapes = [logps.shape for logps in per_token_logps]

    def pooled(tensors):
        return torch.cat([tensor.reshape(-1) for tensor in tensors]).unsqueeze(0)

    # Advantages per token, so that they line up with the flattened tokens.
    per_token_advantages = [
        torch.broadcast_to(a.unsqueeze(1) if a.dim() == 1 else a, shape)
        for a, shape in zip(advantages, shapes, strict=True)
    ]
    result = spurious_token_mask(
        pooled(per_token_logps), pooled(entropies), pooled(per_token_advantages), pooled(loss_masks), **kwargs
    )

    def unpool(mask):
        return [
            part.view(shape) for part, shape in zip(mask[0].split([s.numel() for s in shapes]), shapes, strict=True)
        ]

    if kwargs.get("return_details"):
        silenced, candidates, threshold = result
        return unpool(silenced), unpool(candidates), threshold
    return unpool(result)
