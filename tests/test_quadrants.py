"""Table 1 as the trainer logs it, against the same table computed by hand from the model's full logits."""

import math

import pytest
import torch
from conftest import cpu_config, length_reward
from eq6 import clipped_surrogate, s2t_silenced
from test_trainer import TEST_TAU_P, make_inputs, split_rows

from stapo_trl import STAPOTrainer
from stapo_trl.diagnostics.metrics import QUADRANTS
from stapo_trl.toy.model import tiny_qwen3


def train_one_step(trainer, micro_batches):
    """One optimizer step as the training loop runs it: the step's decision, then each micro-batch's loss."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = len(micro_batches)
    if trainer._decides_per_step:
        micro_batches = trainer._decide_step(micro_batches)
    for micro_batch in micro_batches:
        trainer._compute_loss(trainer.model, micro_batch).backward()
        trainer._step += 1
    return torch.cat([mb["spurious_silenced"] for mb in micro_batches]) if trainer._decides_per_step else None


def reference_tokens(model, inputs):
    """Per positive-advantage loss token, by autograd through the full softmax: probability, entropy, the norm of the
    surrogate's gradient w.r.t. the logits, and the entropy change along that gradient (first order, unit step)."""
    prompt_length = inputs["prompt_ids"].size(1)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, prompt_length - 1 : -1]
    logits = logits.double().requires_grad_(True)
    log_probs = logits.log_softmax(-1)
    logps = log_probs.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropies = -(log_probs.exp() * log_probs).sum(-1)
    old = inputs.get("old_per_token_logps")
    old = logps.detach() if old is None else old.double()
    surrogate = clipped_surrogate(logps, old, inputs["advantages"].double(), 0.2, 0.28)
    (surrogate_gradient,) = torch.autograd.grad(surrogate.sum(), logits, retain_graph=True)
    (entropy_gradient,) = torch.autograd.grad(entropies.sum(), logits)
    selected = inputs["completion_mask"].bool() & (inputs["advantages"].view(-1, 1) > 0)
    return {
        "probability": logps.detach().exp()[selected],
        "entropy": entropies.detach()[selected],
        "grad_norm": surrogate_gradient.norm(dim=-1)[selected],
        "entropy_change": (entropy_gradient * surrogate_gradient).sum(-1)[selected],
        "logps": logps.detach(),
        "entropies": entropies.detach(),
        "selected": selected,
    }


# The random model gives every token a probability near 1/100: this τ_p makes about half of them low-probability, so
# that all four quadrants are populated.
QUADRANT_TAU_P = 0.0101


def reference_table(tokens, silenced, prob_threshold=QUADRANT_TAU_P, entropy_quantile=0.75):
    candidates = tokens["probability"] < prob_threshold
    threshold = torch.quantile(tokens["entropy"][candidates], entropy_quantile)
    low_prob, low_entropy = candidates, tokens["entropy"] < threshold
    groups = {
        "low_prob_low_entropy": low_prob & low_entropy,
        "low_prob_high_entropy": low_prob & ~low_entropy,
        "high_prob_low_entropy": ~low_prob & low_entropy,
        "high_prob_high_entropy": ~low_prob & ~low_entropy,
        "silenced": silenced,
    }
    table = {"entropy_threshold": threshold.item()}
    for name, group in groups.items():
        table[f"{name}/token_share"] = group.double().mean().item()
        table[f"{name}/grad_norm_share"] = (tokens["grad_norm"][group].sum() / tokens["grad_norm"].sum()).item()
        table[f"{name}/entropy_change"] = tokens["entropy_change"][group].mean().item() if group.any() else math.nan
    return table


@pytest.mark.parametrize("off_policy", [False, True])
def test_step_table_equals_the_hand_computed_one(off_policy, tokenizer, prompt_dataset, tmp_path):
    """A step of 2 micro-batches; off-policy ratios (as with num_iterations > 1) hit both clips."""
    model = tiny_qwen3(tokenizer, seed=0)
    inputs = make_inputs(len(tokenizer), batch=12, seed=5, old_logps_noise=0.3 if off_policy else None, model=model)
    trainer = STAPOTrainer(
        model=model, reward_funcs=length_reward, train_dataset=prompt_dataset, processing_class=tokenizer,
        args=cpu_config(
            tmp_path, spurious_prob_threshold=QUADRANT_TAU_P, gradient_accumulation_steps=2,
            per_device_train_batch_size=6, spurious_mechanism_metrics=True,
        ),
    )  # fmt: skip
    tokens = reference_tokens(tiny_qwen3(tokenizer, seed=0), inputs)
    silenced = train_one_step(trainer, split_rows(inputs, [6, 6]))
    expected_silenced = s2t_silenced(
        tokens["logps"], tokens["entropies"], inputs["advantages"], inputs["completion_mask"], QUADRANT_TAU_P, 0.75
    )
    assert torch.equal(silenced, expected_silenced)
    expected = reference_table(tokens, expected_silenced[tokens["selected"]])
    metrics = trainer._metrics["train"]
    for name, value in expected.items():
        logged = metrics[f"mechanism/{name}"]
        assert len(logged) == 1, name  # one entry per optimizer step
        assert logged[0] == pytest.approx(value, rel=1e-4, abs=1e-7, nan_ok=True), name
    # The sample covers the interesting cases: every quadrant is populated, and the silenced tokens are exactly the
    # low-probability, low-entropy quadrant (STAPO's mode, the same τ_h).
    assert all(expected[f"{q}/token_share"] > 0 for q in QUADRANTS)
    assert expected["silenced/token_share"] == expected["low_prob_low_entropy/token_share"]


def test_vllm_logp_gap_by_group(tokenizer, model, prompt_dataset, tmp_path):
    """vLLM runs hand the loss vLLM's sampling log-probabilities: the mean absolute gap per group of tokens."""
    inputs = make_inputs(len(tokenizer), batch=8, seed=6)
    tokens = reference_tokens(tiny_qwen3(tokenizer, seed=0), inputs)
    generator = torch.Generator().manual_seed(0)
    inputs["sampling_per_token_logps"] = tokens["logps"].float() + 0.1 * torch.randn(
        tokens["logps"].shape, generator=generator
    )
    trainer = STAPOTrainer(
        model=model, reward_funcs=length_reward, train_dataset=prompt_dataset, processing_class=tokenizer,
        args=cpu_config(tmp_path, spurious_prob_threshold=TEST_TAU_P, per_device_train_batch_size=8),
    )  # fmt: skip
    train_one_step(trainer, [inputs])
    gap = (tokens["logps"] - inputs["sampling_per_token_logps"].double()).abs()
    loss_mask = inputs["completion_mask"].bool()
    candidates = tokens["selected"] & (tokens["logps"].exp() < TEST_TAU_P)
    silenced = s2t_silenced(
        tokens["logps"], tokens["entropies"], inputs["advantages"], inputs["completion_mask"], TEST_TAU_P, 0.75
    )
    assert silenced.any()
    metrics = trainer._metrics["train"]
    for group, mask in (("all", loss_mask), ("candidates", candidates), ("silenced", silenced)):
        assert metrics[f"sampling/logp_gap/{group}"] == [pytest.approx(gap[mask].mean().item(), rel=1e-4)], group
    assert not any(key.startswith("mechanism/") for key in metrics)  # Table 1 is opt-in


def test_models_with_transformed_logits_are_refused(tokenizer, prompt_dataset, tmp_path):
    model = tiny_qwen3(tokenizer, seed=0)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0.*spurious_mechanism_metrics=False"):
        STAPOTrainer(
            model=model, reward_funcs=length_reward, train_dataset=prompt_dataset, processing_class=tokenizer,
            args=cpu_config(tmp_path, spurious_mechanism_metrics=True),
        )  # fmt: skip
