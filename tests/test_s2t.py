"""The S2T mask against hand-computed tensors (paper Eq. 6)."""

import math

import pytest
import torch

from stapo_trl.s2t import MASK_MODES, masked_quantile, pooled_spurious_token_masks, spurious_token_mask


TAU_P = 0.002


def logp(probabilities):
    return torch.tensor(probabilities, dtype=torch.float32).log()


# Two completions of five tokens. Row 0 has Â > 0, row 1 has Â < 0. Probabilities below τ_p are candidates in row 0:
# positions 0, 1, 3, 4 with entropies 0.5, 2.0, 1.0, 3.0; position 2 is likely (0.5) and never a candidate.
PROBS = [[0.001, 0.0005, 0.5, 0.0019, 0.001], [0.001, 0.001, 0.001, 0.001, 0.001]]
ENTROPIES = torch.tensor([[0.5, 2.0, 0.1, 1.0, 3.0], [0.1, 0.2, 0.3, 0.4, 0.5]])
ADVANTAGES = torch.tensor([1.0, -1.0])
LOSS_MASK = torch.ones(2, 5, dtype=torch.long)


def mask(mode="low_entropy", q=0.75, **kwargs):
    arguments = dict(
        per_token_logps=logp(PROBS),
        entropies=ENTROPIES,
        advantages=ADVANTAGES,
        loss_mask=LOSS_MASK,
        prob_threshold=TAU_P,
        entropy_quantile=q,
        mode=mode,
    )
    arguments.update(kwargs)
    return spurious_token_mask(**arguments)


def positions(silenced):
    return [tuple(index) for index in silenced.nonzero().tolist()]


def test_low_entropy_silences_candidates_below_the_quantile():
    # Candidate entropies sorted: 0.5, 1.0, 2.0, 3.0. Quantile 0.75 at position 0.75 * 3 = 2.25:
    # 2.0 + 0.25 * (3.0 - 2.0) = 2.25. Silenced: entropies 0.5, 1.0, 2.0 -> positions 0, 3, 1.
    silenced, candidates, threshold = mask(return_details=True)
    assert threshold.item() == pytest.approx(2.25)
    assert positions(candidates) == [(0, 0), (0, 1), (0, 3), (0, 4)]
    assert positions(silenced) == [(0, 0), (0, 1), (0, 3)]
    assert silenced.dtype == torch.bool and silenced.shape == (2, 5)


def test_low_entropy_with_q_half():
    # Quantile 0.5 at position 1.5: 1.0 + 0.5 * (2.0 - 1.0) = 1.5 -> entropies 0.5 and 1.0 silenced.
    assert positions(mask(q=0.5)) == [(0, 0), (0, 3)]


def test_high_entropy_is_the_mirror_ablation():
    # Quantile 1 - 0.75 = 0.25 at position 0.75: 0.5 + 0.75 * (1.0 - 0.5) = 0.875 -> entropies 1.0, 2.0, 3.0.
    silenced, _, threshold = mask("high_entropy", return_details=True)
    assert threshold.item() == pytest.approx(0.875)
    assert positions(silenced) == [(0, 1), (0, 3), (0, 4)]


def test_all_and_none():
    assert positions(mask("all")) == [(0, 0), (0, 1), (0, 3), (0, 4)]
    assert not mask("none").any()


def test_random_silences_only_candidates_with_probability_q():
    generator = torch.Generator().manual_seed(0)
    probs = torch.full((200, 50), 0.001)
    silenced = spurious_token_mask(
        probs.log(),
        torch.rand(200, 50),
        torch.ones(200),
        torch.ones(200, 50),
        prob_threshold=TAU_P,
        entropy_quantile=0.3,
        mode="random",
        generator=generator,
    )
    assert abs(silenced.float().mean().item() - 0.3) < 0.02  # 10,000 Bernoulli(0.3) draws: std 0.0046
    # Reproducible from the generator, and never outside the candidates.
    again = mask("random", q=0.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, mask("random", q=0.5, generator=torch.Generator().manual_seed(1)))
    assert not (again & ~mask("all")).any()
    assert not mask("random", q=0.0).any()
    assert torch.equal(mask("random", q=1.0), mask("all"))


def test_q_zero_and_one():
    # q = 0: τ_h is the smallest candidate entropy and nothing is strictly below it.
    assert not mask(q=0.0).any()
    # q = 1: τ_h is the largest; every candidate but the highest-entropy one is silenced.
    assert positions(mask(q=1.0)) == [(0, 0), (0, 1), (0, 3)]


def test_ties_at_the_threshold_are_kept():
    entropies = torch.tensor([[1.0, 1.0, 0.1, 1.0, 1.0], [0.0] * 5])
    silenced, _, threshold = mask(entropies=entropies, return_details=True)
    assert threshold.item() == 1.0
    assert not silenced.any()
    entropies = torch.tensor([[0.5, 1.0, 0.1, 1.0, 1.0], [0.0] * 5])
    assert positions(mask(entropies=entropies)) == [(0, 0)]


def test_one_candidate_is_never_silenced_by_low_entropy():
    probs = [[0.001, 0.5, 0.5, 0.5, 0.5], [0.5] * 5]
    silenced, candidates, threshold = mask(per_token_logps=logp(probs), return_details=True)
    assert positions(candidates) == [(0, 0)]
    assert threshold.item() == 0.5  # its own entropy: not strictly below
    assert not silenced.any()
    assert positions(mask("all", per_token_logps=logp(probs))) == [(0, 0)]


def test_no_candidate_gives_empty_mask_and_nan_threshold():
    probs = [[0.5] * 5, [0.5] * 5]
    for mode in MASK_MODES:
        silenced, candidates, threshold = mask(mode, per_token_logps=logp(probs), return_details=True)
        assert not silenced.any() and not candidates.any()
        assert math.isnan(threshold.item())


def test_padding_is_never_silenced():
    loss_mask = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]])
    # Candidates now: positions 0 and 3 (entropies 0.5, 1.0). Quantile 0.75: 0.5 + 0.75 * 0.5 = 0.875.
    silenced, candidates, threshold = mask(loss_mask=loss_mask, return_details=True)
    assert positions(candidates) == [(0, 0), (0, 3)]
    assert threshold.item() == pytest.approx(0.875)
    assert positions(silenced) == [(0, 0)]


def test_zero_and_negative_advantages_are_never_silenced():
    for advantages in (torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -1.0])):
        for mode in MASK_MODES:
            assert not mask(mode, advantages=advantages).any()


def test_advantage_shapes():
    expected = mask()
    assert torch.equal(mask(advantages=ADVANTAGES.unsqueeze(1)), expected)
    assert torch.equal(mask(advantages=ADVANTAGES.unsqueeze(1).expand(2, 5)), expected)
    # Per-token advantages: a negative advantage on token (0, 1) removes it from the candidates.
    per_token = ADVANTAGES.unsqueeze(1).expand(2, 5).clone()
    per_token[0, 1] = -1.0
    # Candidates 0.5, 1.0, 3.0: quantile 0.75 at 1.5 -> 1.0 + 0.5 * 2.0 = 2.0 -> silenced entropies 0.5, 1.0.
    assert positions(mask(advantages=per_token)) == [(0, 0), (0, 3)]


def test_probability_threshold_is_strict():
    # Just below / just above τ_p.
    probs = [[0.00199, 0.00201, 0.5, 0.5, 0.5], [0.5] * 5]
    _, candidates, _ = mask("all", per_token_logps=logp(probs), return_details=True)
    assert positions(candidates) == [(0, 0)]
    # τ_p = 1: exp(log 1) = 1 exactly, so a certain token is not a candidate (strict "<"); a likely one is.
    certain = torch.tensor([[0.0, math.log(0.9), 0.0, 0.0, 0.0], [0.0] * 5])
    _, candidates, _ = mask("all", prob_threshold=1.0, per_token_logps=certain, return_details=True)
    assert positions(candidates) == [(0, 1)]


def test_gather_pools_candidates_across_processes():
    # A fake second process holds candidates with entropies 0.0 and 0.2; pooled with ours (0.5, 1.0, 2.0, 3.0),
    # sorted 0.0, 0.2, 0.5, 1.0, 2.0, 3.0: quantile 0.75 at position 3.75 -> 1.0 + 0.75 * (2.0 - 1.0) = 1.75.
    def gather(local):
        return torch.cat([local, torch.tensor([0.0, 0.2])])

    silenced, _, threshold = mask(gather=gather, return_details=True)
    assert threshold.item() == pytest.approx(1.75)
    assert positions(silenced) == [(0, 0), (0, 3)]
    # Another process's candidates decide the threshold even when this process has none.
    no_local = logp([[0.5] * 5, [0.5] * 5])
    silenced, _, threshold = mask(per_token_logps=no_local, gather=gather, return_details=True)
    assert threshold.item() == pytest.approx(0.15) and not silenced.any()
    # No candidate on any process: the pooled tensor is empty.
    silenced, _, threshold = mask(per_token_logps=no_local, gather=lambda local: local, return_details=True)
    assert math.isnan(threshold.item()) and not silenced.any()


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="spurious_mask_mode"):
        mask("lowest")


@pytest.mark.parametrize("count", [1, 2, 7, 300])
def test_masked_quantile_matches_torch_quantile(count):
    generator = torch.Generator().manual_seed(count)
    values = torch.rand(20, 40, generator=generator)
    valid = torch.zeros(800, dtype=torch.bool)
    valid[torch.randperm(800, generator=generator)[:count]] = True
    valid = valid.view(20, 40)
    quantiles = [0.0, 0.25, 0.5, 0.75, 0.95, 1.0]
    expected = torch.quantile(values[valid], torch.tensor(quantiles))
    assert torch.allclose(masked_quantile(values, valid, quantiles), expected)
    assert torch.allclose(masked_quantile(values, valid, 0.75), torch.quantile(values[valid], 0.75))


def test_masked_quantile_of_nothing_is_nan():
    assert torch.isnan(masked_quantile(torch.empty(0), torch.empty(0, dtype=torch.bool), [0.5, 0.8])).all()
    assert torch.isnan(masked_quantile(torch.ones(3, 4), torch.zeros(3, 4, dtype=torch.bool), 0.5))


def test_pooled_decision_does_not_depend_on_the_split():
    # The two rows as one batch, or as two batches of one row (of different lengths): the same mask.
    whole, _, threshold = mask(return_details=True)
    parts, candidates, pooled_threshold = pooled_spurious_token_masks(
        [logp(PROBS)[:1], logp(PROBS)[1:, :3]],
        [ENTROPIES[:1], ENTROPIES[1:, :3]],
        [ADVANTAGES[:1], ADVANTAGES[1:]],
        [LOSS_MASK[:1], LOSS_MASK[1:, :3]],
        prob_threshold=TAU_P,
        entropy_quantile=0.75,
        return_details=True,
    )
    assert pooled_threshold.item() == pytest.approx(threshold.item()) == pytest.approx(2.25)
    assert [part.shape for part in parts] == [(1, 5), (1, 3)]
    assert positions(parts[0]) == [(0, 0), (0, 1), (0, 3)] and not parts[1].any()
    assert positions(candidates[0]) == [(0, 0), (0, 1), (0, 3), (0, 4)]


def test_one_candidate_per_batch_is_silenced_only_when_pooled():
    # Four micro-batches with one candidate each (entropies 0.5, 1.0, 2.0, 3.0). Pooled, the 0.75-quantile is 2.25 and
    # the three below it are silenced (the q share); each micro-batch alone is its own quantile and keeps it.
    entropies = [torch.tensor([[value, 0.1]]) for value in (2.0, 0.5, 3.0, 1.0)]
    logps = [logp([[0.001, 0.5]])] * 4
    advantages = [torch.tensor([1.0])] * 4
    loss_masks = [torch.ones(1, 2)] * 4
    kwargs = dict(prob_threshold=TAU_P, entropy_quantile=0.75)
    pooled = pooled_spurious_token_masks(logps, entropies, advantages, loss_masks, **kwargs)
    assert [bool(part[0, 0]) for part in pooled] == [True, True, False, True]
    alone = [spurious_token_mask(*tensors, **kwargs) for tensors in zip(logps, entropies, advantages, loss_masks)]
    assert not any(part.any() for part in alone)
