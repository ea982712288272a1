"""The mechanism quantities against autograd and finite differences on a small vocabulary, and Table 1's sums by hand."""

import math

import pytest
import torch

from stapo_trl.diagnostics.metrics import GROUPS
from stapo_trl.diagnostics.quadrants import quadrant_table
from stapo_trl.mechanism import (
    first_order_entropy_change,
    logit_gradient_norm,
    logit_statistics,
    quadrant_sums,
    surrogate_weight,
)


def entropy(logits):
    log_probs = logits.log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def positions(seed=0, count=64, vocab=11):
    """Logits from flat to peaked (scaled up to 12x) and one sampled-or-not token per position, in float64."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.1, 12.0, count, dtype=torch.float64).unsqueeze(1)
    logits = scale * torch.randn(count, vocab, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, vocab, (count,), generator=generator)
    return logits, targets


def statistics(logits):
    probs = logits.softmax(-1)
    return (probs**2).sum(-1), (probs**2 * probs.log()).sum(-1)


def test_logit_gradient_norm_is_the_norm_of_autograd_gradient():
    logits, targets = positions()
    logits.requires_grad_(True)
    logps = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    (gradient,) = torch.autograd.grad(logps.sum(), logits)  # row t: ∇ of log π(y_t) w.r.t. that row's logits
    collision, _ = statistics(logits.detach())
    expected = gradient.norm(dim=-1)
    torch.testing.assert_close(logit_gradient_norm(logps.detach(), collision), expected, rtol=1e-10, atol=1e-12)
    assert expected.max() > 1.3 and expected.min() < 0.2  # the sample spans large and small norms


@pytest.mark.parametrize("step", [1.0, -0.7])
def test_entropy_change_is_the_entropy_after_a_small_logit_step(step):
    logits, targets = positions(seed=1)
    probs = logits.softmax(-1)
    logps = probs.gather(-1, targets[:, None]).squeeze(-1).log()
    collision, collision_log = statistics(logits)
    eta = 1e-6
    # Gradient ascent on step x log π(y): the logits move along step x (e_y - π).
    direction = step * (torch.nn.functional.one_hot(targets, logits.size(-1)).double() - probs)
    finite_difference = (entropy(logits + eta * direction) - entropy(logits - eta * direction)) / (2 * eta)
    computed = first_order_entropy_change(logps, entropy(logits), collision, collision_log, torch.tensor(step))
    torch.testing.assert_close(computed, finite_difference, rtol=1e-6, atol=1e-9)
    assert (computed > 0).any() and (computed < 0).any()


def test_low_probability_tokens_of_positive_completions_raise_entropy():
    """Lemma 3.2's sign, on peaked distributions: sampling a token far below the top one and reinforcing it."""
    logits = torch.tensor([[8.0, 1.0, 0.0, -1.0], [5.0, 4.0, -3.0, -3.0]], dtype=torch.float64)
    probs = logits.softmax(-1)
    targets = torch.tensor([3, 2])  # probabilities ~3e-4 and ~2e-4
    logps = probs.gather(-1, targets[:, None]).squeeze(-1).log()
    collision, collision_log = statistics(logits)
    change = first_order_entropy_change(logps, entropy(logits), collision, collision_log, torch.tensor(1.0))
    assert (change > 0).all()
    top = first_order_entropy_change(probs[:, 0].log(), entropy(logits), collision, collision_log, torch.tensor(1.0))
    assert (top < 0).all()  # reinforcing the top token sharpens the distribution


def test_logit_statistics_from_hidden_states():
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(13, 6, generator=generator)
    weight, bias = torch.randn(17, 6, generator=generator), torch.randn(17, generator=generator)
    collision, collision_log = logit_statistics(hidden, weight, bias, temperature=0.7, chunk_size=4)
    expected = statistics(((hidden @ weight.t() + bias) / 0.7).double())
    torch.testing.assert_close(collision.double(), expected[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(collision_log.double(), expected[1], rtol=1e-5, atol=1e-7)
    empty = logit_statistics(hidden[:0], weight)
    assert empty[0].shape == (0,) and empty[1].shape == (0,)


def test_surrogate_weight_is_the_autograd_weight_of_the_clipped_surrogate():
    ratio = torch.tensor([0.5, 0.9, 1.0, 1.2, 1.5, 0.5, 0.9, 1.5, 2.0], dtype=torch.float64)
    advantages = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    logps = torch.zeros_like(ratio, requires_grad=True)  # ρ = ratio · exp(log π - log π_now): dρ/dlog π = ρ
    scaled = ratio * logps.exp()
    surrogate = torch.min(scaled * advantages, scaled.clamp(1 - 0.2, 1 + 0.28) * advantages)
    (gradient,) = torch.autograd.grad(surrogate.sum(), logps)
    torch.testing.assert_close(surrogate_weight(ratio, advantages, 0.2, 0.28) * advantages, gradient)


def test_quadrant_sums_and_table_by_hand():
    # Six tokens, τ_p = 0.1, τ_h = 1.0.
    probabilities = torch.tensor([0.05, 0.01, 0.2, 0.5, 0.05, 0.9])
    entropies = torch.tensor([0.5, 2.0, 0.3, 1.5, 0.9, 0.1])
    grad_norms = torch.tensor([4.0, 1.0, 2.0, 1.0, 2.0, 0.0])
    entropy_changes = torch.tensor([0.3, 0.1, -0.2, 0.0, 0.5, -0.1])
    silenced = torch.tensor([True, False, False, False, True, False])
    sums = quadrant_sums(
        probabilities, entropies, grad_norms, entropy_changes, silenced,
        prob_threshold=0.1, entropy_threshold=torch.tensor(1.0),
    )  # fmt: skip
    # low p & low H: tokens 0, 4; low p & high H: 1; high p & low H: 2, 5; high p & high H: 3.
    expected = [[2, 6.0, 0.8], [1, 1.0, 0.1], [2, 2.0, -0.3], [1, 1.0, 0.0], [2, 6.0, 0.8], [6, 10.0, 0.6]]
    torch.testing.assert_close(sums, torch.tensor(expected))
    table = quadrant_table(sums)
    assert list(table) == list(GROUPS)
    assert table["low_prob_low_entropy"] == pytest.approx(
        {"token_share": 2 / 6, "grad_norm_share": 0.6, "entropy_change": 0.4}
    )
    assert table["high_prob_low_entropy"] == pytest.approx(
        {"token_share": 2 / 6, "grad_norm_share": 0.2, "entropy_change": -0.15}
    )
    empty = quadrant_table(torch.tensor([[0.0, 0.0, 0.0]] * 5 + [[3.0, 1.0, 0.0]]))
    assert math.isnan(empty["silenced"]["entropy_change"]) and empty["silenced"]["token_share"] == 0.0
