"""The token-level mechanism behind S2T (paper §3.2, Table 1, Fig. 2c, Lemma 3.2, Theorem 3.3), per token.

At a completion position the policy's logits a (after the sampling temperature) give π = softmax(a), its entropy
H = -Σ_n π_n ln π_n and its collision probability C = Σ_n π_n². For the sampled token y:

- the gradient of log π(y) with respect to the logits is e_y - π, so (paper App. 7)

      ‖∇_a log π(y)‖ = sqrt(1 - 2 π(y) + C),

  largest for a low-probability token at a low-entropy (concentrated, large C) position (Theorem 3.3). The loss
  scales it by |Â| and by the weight w its clipped surrogate applies to ∇ log π(y) (`surrogate_weight`);
- gradient ascent moves the logits along s (e_y - π) with s = Â w, and with ∂H/∂a_n = -π_n (ln π_n + H) the
  first-order entropy change at that position, per unit step, is

      dH = -s [π(y) (ln π(y) + H) - (Σ_n π_n² ln π_n + H C)],

  positive for a low-probability token of a positive-advantage completion (Lemma 3.2: such tokens raise entropy).

C and Σ π² ln π need the whole next-token distribution, which TRL's fused LM head never materializes:
`logit_statistics` recomputes them from the final hidden states, a vocabulary-wide reduction with no graph.
`quadrant_sums` splits tokens into the four quadrants of Table 1 (named in `stapo_trl.diagnostics.metrics`). Pure
torch, no trainer state.
"""

import torch


def logit_statistics(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_n π_n², Σ_n π_n² ln π_n) of π = softmax((hidden @ weight.T + bias) / temperature), per row of `hidden`.

    Computed in float32, `chunk_size` rows at a time, so at most (chunk_size, vocabulary) logits exist at once.
    """
    collision, collision_log = [], []
    with torch.no_grad():
        for start in range(0, hidden.size(0), chunk_size):
            logits = hidden[start : start + chunk_size].float() @ weight.float().t()
            if bias is not None:
                logits = logits + bias.float()
            log_probs = (logits / temperature).log_softmax(-1)
            squared = (2 * log_probs).exp()
            collision.append(squared.sum(-1))
            collision_log.append((squared * log_probs).sum(-1))
    empty = hidden.new_zeros(0, dtype=torch.float32)
    return torch.cat(collision) if collision else empty, torch.cat(collision_log) if collision_log else empty


def logit_gradient_norm(per_token_logps: torch.Tensor, collision: torch.Tensor) -> torch.Tensor:
    """‖∇_a log π(y)‖ = sqrt(1 - 2 π(y) + Σ π²) (paper App. 7), elementwise."""
    return (1 - 2 * per_token_logps.exp() + collision).clamp(min=0).sqrt()


def first_order_entropy_change(
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    collision: torch.Tensor,
    collision_log: torch.Tensor,
    step: torch.Tensor,
) -> torch.Tensor:
    """dH of a logit step `step` x (e_y - π) at the token's own position, to first order (see the module docstring)."""
    probability = per_token_logps.exp()
    return -step * (probability * (per_token_logps + entropies) - (collision_log + entropies * collision))


def surrogate_weight(ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float):
    """w: the factor the clipped surrogate min(ρ Â, clip(ρ, 1 - ε_low, 1 + ε_high) Â) puts on Â ∇ log π(y).

    The unclipped term ρ Â has gradient ρ Â ∇ log π; where the clipped term is the smaller one it is constant and the
    token gets no gradient.
    """
    clipped = torch.where(advantages > 0, ratio > 1 + epsilon_high, ratio < 1 - epsilon_low)
    return torch.where(clipped, torch.zeros_like(ratio), ratio)


def quadrant_sums(
    probabilities: torch.Tensor,
    entropies: torch.Tensor,
    grad_norms: torch.Tensor,
    entropy_changes: torch.Tensor,
    silenced: torch.Tensor,
    *,
    prob_threshold: float,
    entropy_threshold: torch.Tensor,
) -> torch.Tensor:
    """Sums over groups of tokens (1-D tensors, one entry per token): a (6, 3) tensor.

    Rows: the four quadrants (P < τ_p & H < τ_h, P < τ_p & H ≥ τ_h, P ≥ τ_p & H < τ_h, P ≥ τ_p & H ≥ τ_h), the
    silenced tokens, all tokens. Columns: token count, summed gradient norm, summed entropy change. With a NaN τ_h
    every entropy comparison is False: every token counts as high-entropy.
    """
    low_prob = probabilities < prob_threshold
    low_entropy = entropies < entropy_threshold
    groups = torch.stack(
        [
            low_prob & low_entropy,
            low_prob & ~low_entropy,
            ~low_prob & low_entropy,
            ~low_prob & ~low_entropy,
            silenced.bool(),
            torch.ones_like(low_prob),
        ]
    ).float()
    values = torch.stack([torch.ones_like(grad_norms), grad_norms, entropy_changes], dim=1).float()
    return groups @ values
