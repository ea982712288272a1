"""STAPO's objective (paper Eq. 6) written out from a model's own logits: the independent reference of the tests."""

import torch


def token_logps_and_entropies(model, inputs, temperature=1.0):
    """log π_θ(y_t) and H_t of every completion token, from log-softmax over the full vocabulary of the logits divided
    by the sampling temperature (the distribution the completions were sampled from, as TRL scores them)."""
    prompt_length = inputs["prompt_ids"].size(1)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    log_probs = (logits[:, prompt_length - 1 : -1].float() / temperature).log_softmax(
        -1
    )  # position t-1 predicts token t
    logps = log_probs.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropies = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropies


def s2t_silenced(logps, entropies, advantages, loss_mask, prob_threshold, entropy_quantile):
    """I_{i,t} of Eq. 6 from boolean indexing and torch.quantile."""
    candidates = loss_mask.bool() & (advantages.view(-1, 1) > 0) & (logps.detach().exp() < prob_threshold)
    if not candidates.any():
        return torch.zeros_like(candidates)
    entropy_threshold = torch.quantile(entropies.detach()[candidates], entropy_quantile)
    return candidates & (entropies.detach() < entropy_threshold)


def clipped_surrogate(logps, old_logps, advantages, epsilon_low, epsilon_high):
    """min(ρ Â, clip(ρ, 1 - ε_low, 1 + ε_high) Â) per token."""
    ratio = torch.exp(logps - old_logps)
    advantages = advantages.view(-1, 1)
    return torch.min(ratio * advantages, ratio.clamp(1 - epsilon_low, 1 + epsilon_high) * advantages)


def stapo_loss(
    model, inputs, silenced=None, *, prob_threshold, entropy_quantile, epsilon_low, epsilon_high, temperature=1.0
):
    """-J_STAPO: the token mean of the clipped surrogate over the loss tokens that are not silenced.

    Returns the loss and the silenced mask (computed here unless given).
    """
    logps, entropies = token_logps_and_entropies(model, inputs, temperature)
    loss_mask = inputs["completion_mask"].bool()
    if silenced is None:
        silenced = s2t_silenced(logps, entropies, inputs["advantages"], loss_mask, prob_threshold, entropy_quantile)
    old_logps = inputs.get("old_per_token_logps")
    old_logps = logps.detach() if old_logps is None else old_logps
    surrogate = clipped_surrogate(logps, old_logps, inputs["advantages"], epsilon_low, epsilon_high)
    kept = loss_mask & ~silenced
    return -(surrogate * kept).sum() / kept.sum(), silenced
