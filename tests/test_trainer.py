"""STAPOTrainer against GRPOTrainer (parity) and against Eq. 6 written out by hand (tests/eq6.py)."""

import copy
import dataclasses
import json
import math

import pytest
import torch
from conftest import cpu_config, cpu_settings, length_reward
from eq6 import s2t_silenced, stapo_loss, token_logps_and_entropies
from trl import GRPOConfig, GRPOTrainer

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.s2t import spurious_token_mask
from stapo_trl.toy.model import tiny_qwen3


# With a 100-token vocabulary a random model gives most tokens probability ~0.01: τ_p = 0.02 makes candidates common.
TEST_TAU_P = 0.02


def make_inputs(vocab_size, batch=6, prompt_length=5, completion_length=7, seed=0, old_logps_noise=None, model=None):
    """A micro-batch as GRPOTrainer's _prepare_inputs hands it to the loss (single process, on-policy).

    Up to 6 completions have fixed advantages and lengths; beyond that they are drawn from `seed`.
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab_size, (batch, prompt_length), generator=generator)
    completion_ids = torch.randint(3, vocab_size, (batch, completion_length), generator=generator)
    prompt_mask = torch.ones(batch, prompt_length, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    completion_mask = torch.ones(batch, completion_length, dtype=torch.long)
    completion_mask[1, -3:] = 0  # a completion that ended early
    completion_mask[2, -1:] = 0
    advantages = torch.tensor([1.2, 0.7, -0.4, 0.9, -1.5, 0.0])[:batch]
    if batch > 6:
        advantages = torch.cat([advantages, torch.randn(batch - 6, generator=generator)])
        lengths = torch.randint(2, completion_length + 1, (batch - 6,), generator=generator)
        completion_mask[6:] = (torch.arange(completion_length) < lengths[:, None]).long()
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
    }
    if old_logps_noise is not None:
        # Off-policy inputs (as with num_iterations > 1): ratios far enough from 1 to hit both clips.
        with torch.no_grad():
            logps, _ = token_logps_and_entropies(model, inputs)
        inputs["old_per_token_logps"] = logps + old_logps_noise * torch.randn(logps.shape, generator=generator)
    return inputs


def split_rows(inputs, sizes):
    """Consecutive row slices of a batch, as micro-batches; `num_items_in_batch` stays the whole batch's count."""
    parts, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        parts.append({key: value[rows] if value.dim() else value for key, value in inputs.items()})
        start += size
    return parts


def grpo_config_like(config_kwargs) -> GRPOConfig:
    """The GRPOConfig a user would write for the same run: STAPOConfig's paper defaults, the same overrides."""
    grpo_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    paper_defaults = {
        f.name: f.default
        for f in dataclasses.fields(STAPOConfig)
        if f.name in grpo_fields and f.default != grpo_fields[f.name].default
    }
    stapo_only = {"spurious_prob_threshold", "spurious_entropy_quantile", "spurious_mask_mode", "spurious_mask_scope"}
    return GRPOConfig(**{**paper_defaults, **{k: v for k, v in config_kwargs.items() if k not in stapo_only}})


def build(trainer_class, model, tokenizer, prompt_dataset, tmp_path, **overrides):
    config = cpu_config(tmp_path, **{"spurious_prob_threshold": TEST_TAU_P, **overrides})
    if trainer_class is GRPOTrainer:
        config = grpo_config_like(cpu_settings(output_dir=str(tmp_path), **overrides))
    trainer = trainer_class(
        model=model, reward_funcs=length_reward, args=config, train_dataset=prompt_dataset, processing_class=tokenizer
    )
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    return trainer


def loss_and_grads(trainer, inputs):
    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same_grads(grads, expected, rtol=1e-5, atol=1e-7):
    assert grads.keys() == expected.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], rtol=rtol, atol=atol, msg=name)


PARITY_CASES = {
    "dapo": {},
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "top_entropy": {"top_entropy_quantile": 0.5},
    "two_sided_clip": {"delta": 1.5},
    "off_policy_mask": {"off_policy_mask_threshold": 0.1},
}


@pytest.mark.parametrize("case", PARITY_CASES)
def test_mode_none_matches_grpo_trainer(case, tokenizer, model, prompt_dataset, tmp_path):
    overrides = dict(PARITY_CASES[case], spurious_mask_mode="none")
    inputs = make_inputs(len(tokenizer), old_logps_noise=0.3, model=model)
    grpo = build(GRPOTrainer, copy.deepcopy(model), tokenizer, prompt_dataset, tmp_path / "grpo", **overrides)
    stapo = build(STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path / "stapo", **overrides)
    grpo_loss, grpo_grads = loss_and_grads(grpo, inputs)
    stapo_loss_value, stapo_grads = loss_and_grads(stapo, inputs)
    assert torch.equal(stapo_loss_value, grpo_loss)
    assert_same_grads(stapo_grads, grpo_grads, rtol=0, atol=0)
    for key in ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean"):
        assert stapo._metrics["train"][key] == grpo._metrics["train"][key]


def test_parity_with_tool_mask_and_kl(tokenizer, model, prompt_dataset, tmp_path):
    inputs = make_inputs(len(tokenizer), old_logps_noise=0.3, model=model)
    inputs["tool_mask"] = torch.ones_like(inputs["completion_mask"])
    inputs["tool_mask"][3, 2:4] = 0  # tool output inside a completion: attended to, not trained on
    inputs["num_items_in_batch"] = (inputs["completion_mask"] * inputs["tool_mask"]).sum()
    inputs["ref_per_token_logps"] = inputs["old_per_token_logps"] - 0.1
    overrides = dict(spurious_mask_mode="none", beta=0.04)
    model.save_pretrained(tmp_path / "model")  # with β > 0 the trainers load their reference model from a path
    grpo = build(GRPOTrainer, str(tmp_path / "model"), tokenizer, prompt_dataset, tmp_path / "grpo", **overrides)
    stapo = build(STAPOTrainer, str(tmp_path / "model"), tokenizer, prompt_dataset, tmp_path / "stapo", **overrides)
    grpo_loss, grpo_grads = loss_and_grads(grpo, inputs)
    stapo_loss_value, stapo_grads = loss_and_grads(stapo, inputs)
    assert torch.equal(stapo_loss_value, grpo_loss)
    assert_same_grads(stapo_grads, grpo_grads, rtol=0, atol=0)
    assert stapo._metrics["train"]["kl"] == grpo._metrics["train"]["kl"]


def test_parity_with_vllm_importance_sampling_correction(tokenizer, model, prompt_dataset, tmp_path):
    """The vLLM truncated-IS weights multiply the loss the same way (vLLM itself is not needed for the loss)."""
    inputs = make_inputs(len(tokenizer), old_logps_noise=0.3, model=model)
    weights = torch.Generator().manual_seed(7)
    inputs["importance_sampling_ratio"] = torch.rand(inputs["completion_mask"].shape, generator=weights) + 0.5
    overrides = dict(spurious_mask_mode="none")
    grpo = build(GRPOTrainer, copy.deepcopy(model), tokenizer, prompt_dataset, tmp_path / "grpo", **overrides)
    stapo = build(STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path / "stapo", **overrides)
    for trainer in (grpo, stapo):  # what use_vllm=True sets, without starting vLLM
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    grpo_loss, grpo_grads = loss_and_grads(grpo, inputs)
    stapo_loss_value, stapo_grads = loss_and_grads(stapo, inputs)
    assert torch.equal(stapo_loss_value, grpo_loss)
    assert_same_grads(stapo_grads, grpo_grads, rtol=0, atol=0)
    stapo.use_vllm = False  # the weights do enter the loss
    assert not torch.equal(loss_and_grads(stapo, inputs)[0], grpo_loss)


@pytest.mark.parametrize("old_logps_noise, temperature", [(None, 1.0), (0.4, 1.0), (None, 0.7)])
def test_loss_and_gradients_equal_eq6(old_logps_noise, temperature, tokenizer, model, prompt_dataset, tmp_path):
    inputs = make_inputs(len(tokenizer), old_logps_noise=old_logps_noise, model=model)
    trainer = build(STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path, temperature=temperature)
    loss, grads = loss_and_grads(trainer, inputs)

    reference_model = tiny_qwen3(tokenizer, seed=0)  # the same weights, untouched by the trainer
    eq6_settings = dict(prob_threshold=TEST_TAU_P, entropy_quantile=0.75, epsilon_low=0.2, epsilon_high=0.28)
    reference_loss, silenced = stapo_loss(reference_model, inputs, temperature=temperature, **eq6_settings)
    reference_loss.backward()
    expected = {name: p.grad for name, p in reference_model.named_parameters() if p.grad is not None}

    # The case must exercise the mask: some tokens silenced, some candidates kept.
    num_silenced = int(silenced.sum())
    assert 0 < num_silenced < int(inputs["completion_mask"].sum())
    assert trainer._metrics["train"]["spurious/silenced_count"] == [num_silenced]
    torch.testing.assert_close(loss, reference_loss.detach(), rtol=1e-5, atol=1e-6)
    assert_same_grads(grads, expected, rtol=1e-4, atol=1e-6)
    # ...and differ from plain DAPO (nothing silenced) by more than the tolerance.
    plain_loss, _ = stapo_loss(
        tiny_qwen3(tokenizer, seed=0), inputs, silenced=torch.zeros_like(silenced), temperature=temperature,
        **eq6_settings,
    )  # fmt: skip
    assert not torch.allclose(plain_loss, reference_loss, rtol=1e-3)
    if temperature != 1.0:  # the temperature matters: Eq. 6 at T = 1 gives another silenced set
        _, silenced_at_1 = stapo_loss(tiny_qwen3(tokenizer, seed=0), inputs, **eq6_settings)
        assert not torch.equal(silenced_at_1, silenced)


def test_micro_batch_scope_deviation_is_bounded(tokenizer, model, prompt_dataset, tmp_path):
    """Scope "micro_batch", two micro-batches per optimizer step: each is renormalized by its own silenced share s_k.

    The accumulated gradient is Σ_k c_k g*_k with c_k = (1 - s) / (1 - s_k), where g*_k is micro-batch k's share of
    the exact Eq. 6 gradient over the step; so |g - g*| <= max_k |c_k - 1| Σ_k |g*_k|.
    """
    micro_batches = [make_inputs(len(tokenizer), seed=seed) for seed in (1, 2)]
    total_loss_tokens = sum(int(mb["completion_mask"].sum()) for mb in micro_batches)
    for mb in micro_batches:
        mb["num_items_in_batch"] = torch.tensor(total_loss_tokens)  # TRL counts the whole generation batch
    trainer = build(
        STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path, gradient_accumulation_steps=2,
        spurious_mask_scope="micro_batch",
    )  # fmt: skip
    trainer.model.train()
    trainer.model.zero_grad()
    for mb in micro_batches:
        trainer._compute_loss(trainer.model, mb).backward()
    accumulated = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    # Exact Eq. 6 over the step: every micro-batch's unsilenced sum divided by the step's unsilenced count.
    reference_model = tiny_qwen3(tokenizer, seed=0)  # the same weights, untouched by the trainer
    silenced, kept_counts = [], []
    for mb in micro_batches:
        with torch.no_grad():
            logps, entropies = token_logps_and_entropies(reference_model, mb)
        silenced.append(s2t_silenced(logps, entropies, mb["advantages"], mb["completion_mask"], TEST_TAU_P, 0.75))
        kept_counts.append(int((mb["completion_mask"].bool() & ~silenced[-1]).sum()))
    total_kept = sum(kept_counts)
    shares, factors = [], []
    for mb, mb_silenced, kept in zip(micro_batches, silenced, kept_counts, strict=True):
        reference_model.zero_grad()
        mb_loss, _ = stapo_loss(
            reference_model, mb, mb_silenced, prob_threshold=0, entropy_quantile=0, epsilon_low=0.2, epsilon_high=0.28
        )
        (mb_loss * kept / total_kept).backward()  # this micro-batch's share of the step's token mean
        shares.append({n: p.grad.clone() for n, p in reference_model.named_parameters() if p.grad is not None})
        loss_tokens = int(mb["completion_mask"].sum())
        factors.append((total_kept / total_loss_tokens) / (kept / loss_tokens))
    assert factors[0] != pytest.approx(factors[1], rel=1e-3), "the micro-batches must differ in silenced fraction"

    exact = {n: shares[0][n] + shares[1][n] for n in accumulated}
    deviation = torch.sqrt(sum(((accumulated[n] - exact[n]) ** 2).sum() for n in exact))
    bound = max(abs(c - 1) for c in factors) * sum(
        torch.sqrt(sum((share[n] ** 2).sum() for n in share)) for share in shares
    )
    assert 0 < deviation <= bound * (1 + 1e-4)
    # The documented weighting holds exactly: g = Σ_k c_k g*_k.
    weighted = {n: factors[0] * shares[0][n] + factors[1] * shares[1][n] for n in exact}
    assert_same_grads(accumulated, weighted, rtol=1e-4, atol=1e-6)


def step_gradient(trainer, micro_batches):
    """One optimizer step's accumulated gradient as the training loop forms it: `_prepare_inputs` decides the step's
    mask at its first micro-batch (scope "step"), then each micro-batch's loss is backpropagated (also GRPOTrainer)."""
    trainer.model.train()
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = len(micro_batches)
    if getattr(trainer.args, "spurious_mask_scope", None) == "step":
        micro_batches = trainer._decide_step(micro_batches)
    for micro_batch in micro_batches:
        trainer._compute_loss(trainer.model, micro_batch).backward()
        trainer._step += 1  # as GRPOTrainer.training_step does after each micro-batch
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    silenced = [mb["spurious_silenced"] for mb in micro_batches] if "spurious_silenced" in micro_batches[0] else None
    return grads, silenced


def eq6_reference(tokenizer, inputs, silenced=None):
    """Gradient and silenced set of Eq. 6 over the whole batch, from an untouched copy of the initial weights."""
    reference_model = tiny_qwen3(tokenizer, seed=0)
    loss, silenced = stapo_loss(
        reference_model, inputs, silenced, prob_threshold=TEST_TAU_P, entropy_quantile=0.75, epsilon_low=0.2,
        epsilon_high=0.28,
    )  # fmt: skip
    loss.backward()
    return {name: p.grad for name, p in reference_model.named_parameters() if p.grad is not None}, silenced


def grads_differ(grads, expected):
    return any(not torch.allclose(grads[n], expected[n], rtol=1e-3, atol=1e-6) for n in expected)


def test_step_scope_is_invariant_to_the_split_and_equals_eq6(tokenizer, prompt_dataset, tmp_path):
    """16 completions as (batch 16, accumulation 1) and (batch 4, accumulation 4): the same silenced set and the same
    gradient, equal to Eq. 6 over the 16 (2 processes x (batch 4, accumulation 2): tests/distributed_s2t.py)."""
    inputs = make_inputs(len(tokenizer), batch=16, seed=8)
    expected, reference_silenced = eq6_reference(tokenizer, inputs)
    assert (
        0
        < int(reference_silenced.sum())
        < int((inputs["completion_mask"] * (inputs["advantages"][:, None] > 0)).sum())
    )
    for batch, accumulation in ((16, 1), (4, 4)):
        trainer = build(
            STAPOTrainer, tiny_qwen3(tokenizer, seed=0), tokenizer, prompt_dataset, tmp_path / f"b{batch}",
            per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        )  # fmt: skip
        grads, silenced = step_gradient(trainer, split_rows(inputs, [batch] * accumulation))
        assert torch.equal(torch.cat(silenced), reference_silenced), (batch, accumulation)
        assert_same_grads(grads, expected, rtol=1e-4, atol=1e-6)
        metrics = trainer._metrics["train"]
        assert metrics["spurious/silenced_count"] == [reference_silenced.sum().item()]  # one decision per step

    # Scope "micro_batch" with accumulation 4 decides four times over 4 completions: another gradient.
    trainer = build(
        STAPOTrainer, tiny_qwen3(tokenizer, seed=0), tokenizer, prompt_dataset, tmp_path / "micro",
        gradient_accumulation_steps=4, spurious_mask_scope="micro_batch",
    )  # fmt: skip
    micro_batches = split_rows(inputs, [4] * 4)
    grads, _ = step_gradient(trainer, micro_batches)
    assert grads_differ(grads, expected)
    # Logged once for the step: the total of its four decisions, each Eq. 6's mask over its own micro-batch.
    silenced_per_micro_batch = []
    for micro_batch in micro_batches:
        with torch.no_grad():
            logps, entropies = token_logps_and_entropies(tiny_qwen3(tokenizer, seed=0), micro_batch)
        mask = s2t_silenced(
            logps, entropies, micro_batch["advantages"], micro_batch["completion_mask"], TEST_TAU_P, 0.75
        )
        silenced_per_micro_batch.append(int(mask.sum()))
    metrics = trainer._metrics["train"]
    assert len([n for n in silenced_per_micro_batch if n]) > 1  # several micro-batches silence tokens
    assert metrics["spurious/silenced_count"] == [sum(silenced_per_micro_batch)]
    assert (
        len(metrics["spurious/entropy_threshold_micro_batch_mean"]) == 1
        and "spurious/entropy_threshold" not in metrics
    )


def with_attention_dropout(model, rate=0.1):
    """The model with attention dropout, which Qwen3's attention reads from a float (it has no nn.Dropout module)."""
    model.config.attention_dropout = rate
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = rate
    return model


def test_dropout_is_off_by_default_so_the_step_decision_is_eq6s(tokenizer, prompt_dataset, tmp_path):
    """A model with attention dropout 0.1, scope "step", accumulation 2: the default disable_dropout=True gives Eq. 6's
    silenced set and gradient (the decision's forward and the loss's see one function). With disable_dropout=False
    the setting is refused, for attention and for LoRA dropout; where it is accepted (one micro-batch per step) the
    gradient is not Eq. 6's, so the dropout is real."""
    from peft import LoraConfig

    inputs = make_inputs(len(tokenizer), batch=16, seed=8)
    expected, reference_silenced = eq6_reference(tokenizer, inputs)
    step_of_two = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)
    trainer = build(
        STAPOTrainer, with_attention_dropout(tiny_qwen3(tokenizer, seed=0)), tokenizer, prompt_dataset,
        tmp_path / "default", **step_of_two,
    )  # fmt: skip
    grads, silenced = step_gradient(trainer, split_rows(inputs, [8, 8]))
    assert torch.equal(torch.cat(silenced), reference_silenced)
    assert_same_grads(grads, expected, rtol=1e-4, atol=1e-6)

    with pytest.raises(ValueError, match=r"attention_dropout=0.1.*Set disable_dropout=True"):
        build(
            STAPOTrainer, with_attention_dropout(tiny_qwen3(tokenizer, seed=0)), tokenizer, prompt_dataset,
            tmp_path / "refused", disable_dropout=False, **step_of_two,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"p=0.05.*Set disable_dropout=True"):
        STAPOTrainer(
            model=tiny_qwen3(tokenizer, seed=0), reward_funcs=length_reward, train_dataset=prompt_dataset,
            args=cpu_config(tmp_path / "lora", disable_dropout=False, **step_of_two), processing_class=tokenizer,
            peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]),
        )  # fmt: skip

    trainer = build(
        STAPOTrainer, with_attention_dropout(tiny_qwen3(tokenizer, seed=0)), tokenizer, prompt_dataset,
        tmp_path / "one_micro_batch", disable_dropout=False, per_device_train_batch_size=16,
    )  # fmt: skip
    torch.manual_seed(0)
    assert grads_differ(loss_and_grads(trainer, inputs)[1], expected)


def count_forwards(model):
    """Record the rows of every forward of `model`: returns the list the forwards append to, and the hook."""
    rows = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: rows.append(kwargs["input_ids"].size(0)),
                                           with_kwargs=True)  # fmt: skip
    return rows, hook


@pytest.mark.parametrize("positive_rows", [(0, 1, 3, 6, 9, 12, 15), (5,), ()])
def test_step_pre_pass_forwards_only_positive_completions(positive_rows, tokenizer, prompt_dataset, tmp_path):
    """Scope "step", 4 micro-batches of 4: the pre-pass forwards the rows with Â > 0 only, packed 4 to a forward,
    and the decision is Eq. 6's over the 16 completions; the entropy quantiles come from the loss forwards, over
    every loss token."""
    inputs = make_inputs(len(tokenizer), batch=16, seed=8)
    positive = torch.zeros(16, dtype=torch.bool)
    positive[list(positive_rows)] = True
    inputs["advantages"] = torch.where(positive, inputs["advantages"].abs() + 0.1, -inputs["advantages"].abs())
    # τ_p = 0.05 (not TEST_TAU_P): a single positive completion holds enough candidates for some to be silenced.
    with torch.no_grad():
        logps, entropies = token_logps_and_entropies(tiny_qwen3(tokenizer, seed=0), inputs)
    reference_silenced = s2t_silenced(logps, entropies, inputs["advantages"], inputs["completion_mask"], 0.05, 0.75)
    assert bool(reference_silenced.any()) == bool(positive_rows)  # the case exercises the mask
    trainer = build(
        STAPOTrainer, tiny_qwen3(tokenizer, seed=0), tokenizer, prompt_dataset, tmp_path,
        gradient_accumulation_steps=4, spurious_prob_threshold=0.05,
    )  # fmt: skip
    rows, hook = count_forwards(trainer.model)
    decided = trainer._decide_step(split_rows(inputs, [4] * 4))
    hook.remove()
    assert rows == [4] * (len(positive_rows) // 4) + ([len(positive_rows) % 4] if len(positive_rows) % 4 else [])

    trainer.model.train()
    trainer.model.zero_grad()
    for micro_batch in decided:
        trainer._compute_loss(trainer.model, micro_batch).backward()
    grads = {name: p.grad for name, p in trainer.model.named_parameters() if p.grad is not None}
    assert torch.equal(torch.cat([mb["spurious_silenced"] for mb in decided]), reference_silenced)
    expected, _ = eq6_reference(tokenizer, inputs, silenced=reference_silenced)
    assert_same_grads(grads, expected, rtol=1e-4, atol=1e-6)
    metrics = trainer._metrics["train"]
    assert metrics["spurious/silenced_count"] == [reference_silenced.sum().item()]
    loss_entropies = entropies[inputs["completion_mask"].bool()]
    for name, q in (("p50", 0.5), ("p80", 0.8), ("p95", 0.95)):  # one value for the step, over all 16 completions
        assert metrics[f"entropy/{name}"] == [pytest.approx(torch.quantile(loss_entropies, q).item(), rel=1e-5)]


def test_step_pre_pass_forwards_a_micro_batch_with_images_whole(tokenizer, model, prompt_dataset, tmp_path):
    """Image tensors are not per row: a micro-batch that carries them goes to the model whole, with them."""
    trainer = build(STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path, gradient_accumulation_steps=2)
    micro_batches = split_rows(make_inputs(len(tokenizer), batch=8, seed=4), [4, 4])
    micro_batches[1]["pixel_values"] = torch.zeros(3, 2)  # stands for a processor's output
    calls, forward = [], trainer._get_per_token_logps_and_entropies

    def recording_forward(model, input_ids, attention_mask, logits_to_keep, pixel_values=None, **kwargs):
        calls.append((input_ids.size(0), pixel_values))
        return forward(model, input_ids, attention_mask, logits_to_keep, **kwargs)  # the tiny model has no vision

    trainer._get_per_token_logps_and_entropies = recording_forward
    trainer._no_grad_logps_and_entropies(micro_batches)
    num_positive = int((micro_batches[0]["advantages"] > 0).sum())
    assert calls == [(num_positive, None), (4, micro_batches[1]["pixel_values"])]


@pytest.mark.parametrize("loss_type, pre_pass", [("dapo", True), ("bnpo", False)])
def test_mode_all_needs_a_pre_pass_only_for_the_dapo_normalizer(loss_type, pre_pass, tokenizer, prompt_dataset,
                                                                 tmp_path):  # fmt: skip
    """Mode "all" silences every candidate, each decided alone: only DAPO's normalizer, which counts the step's
    silenced tokens, needs them before the first backward. Either way the gradient is the step's with every candidate
    out of the loss."""
    inputs = make_inputs(len(tokenizer), batch=8, seed=4)
    trainer = build(
        STAPOTrainer, tiny_qwen3(tokenizer, seed=0), tokenizer, prompt_dataset, tmp_path,
        gradient_accumulation_steps=2, spurious_mask_mode="all", loss_type=loss_type,
    )  # fmt: skip
    rows, hook = count_forwards(trainer.model)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    micro_batches = split_rows(inputs, [4, 4])
    if trainer._decides_per_step:  # as _prepare_inputs does
        micro_batches = trainer._decide_step(micro_batches)
    for micro_batch in micro_batches:
        trainer._compute_loss(trainer.model, micro_batch).backward()
    hook.remove()
    grads = {name: p.grad for name, p in trainer.model.named_parameters() if p.grad is not None}
    num_positive = int((inputs["advantages"] > 0).sum())
    assert num_positive == 5
    assert rows == ([4, 1] if pre_pass else []) + [4, 4]  # the pre-pass (packed 4 to a forward), then the losses

    with torch.no_grad():
        logps, _ = token_logps_and_entropies(tiny_qwen3(tokenizer, seed=0), inputs)
    candidates = inputs["completion_mask"].bool() & (inputs["advantages"][:, None] > 0) & (logps.exp() < TEST_TAU_P)
    assert candidates.any()
    # GRPOTrainer's step with the candidates out of its loss mask (a tool mask: attended to, not trained on).
    masked = dict(inputs, tool_mask=(~candidates).long())
    masked["num_items_in_batch"] = (masked["completion_mask"] * masked["tool_mask"]).sum()
    grpo = build(GRPOTrainer, tiny_qwen3(tokenizer, seed=0), tokenizer, prompt_dataset, tmp_path / "grpo",
                 gradient_accumulation_steps=2, loss_type=loss_type)  # fmt: skip
    expected, _ = step_gradient(grpo, split_rows(masked, [4, 4]))
    assert_same_grads(grads, expected, rtol=1e-4, atol=1e-6)


def one_candidate_per_micro_batch(vocab_size):
    """4 micro-batches of 4 completions where only row 0 has Â > 0, and that row has a single loss token."""
    micro_batches = []
    for seed in range(4):
        inputs = make_inputs(vocab_size, batch=4, seed=seed)
        inputs["advantages"] = torch.tensor([1.0, -1.0, -0.5, 0.0])
        inputs["completion_mask"][0] = 0
        inputs["completion_mask"][0, 0] = 1
        micro_batches.append(inputs)
    total = sum(int(mb["completion_mask"].sum()) for mb in micro_batches)
    for inputs in micro_batches:
        inputs["num_items_in_batch"] = torch.tensor(total)
    return micro_batches


@pytest.mark.parametrize("scope, expected_silenced", [("step", 3), ("micro_batch", 0)])
def test_one_candidate_per_micro_batch(scope, expected_silenced, tokenizer, model, prompt_dataset, tmp_path):
    # τ_p = 1: every loss token of a positive-advantage completion is a candidate, so there are exactly 4.
    trainer = build(
        STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path, gradient_accumulation_steps=4,
        spurious_mask_scope=scope, spurious_prob_threshold=1.0,
    )  # fmt: skip
    step_gradient(trainer, one_candidate_per_micro_batch(len(tokenizer)))
    metrics = trainer._metrics["train"]
    assert sum(metrics["spurious/silenced_count"]) == expected_silenced  # the q share of 4 candidates, or none
    num_loss = sum(int(mb["completion_mask"].sum()) for mb in one_candidate_per_micro_batch(len(tokenizer)))
    if scope == "step":
        assert metrics["spurious/candidate_ratio"] == [pytest.approx(4 / num_loss)]


def test_no_candidates_silence_nothing(tokenizer, model, prompt_dataset, tmp_path):
    inputs = make_inputs(len(tokenizer), batch=8, seed=4)
    trainer = build(  # no token is that unlikely
        STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path, gradient_accumulation_steps=2,
        spurious_prob_threshold=1e-30,
    )  # fmt: skip
    grads, silenced = step_gradient(trainer, split_rows(inputs, [4, 4]))
    assert not any(part.any() for part in silenced)
    assert all(torch.isfinite(g).all() for g in grads.values())
    expected, _ = eq6_reference(
        tokenizer, inputs, silenced=torch.zeros_like(inputs["completion_mask"], dtype=torch.bool)
    )
    assert_same_grads(grads, expected, rtol=1e-4, atol=1e-6)  # plain DAPO
    metrics = trainer._metrics["train"]
    assert metrics["spurious/silenced_count"] == [0.0] and metrics["spurious/candidate_ratio"] == [0.0]
    assert math.isnan(metrics["spurious/entropy_threshold"][0])


@pytest.mark.slow
def test_training_recomputes_the_mask_of_every_step(tokenizer, prompt_dataset, tmp_path):
    """steps_per_generation = 2 x accumulation and num_iterations = 2: 4 optimizer steps per generation batch. Each
    step's mask is the Eq. 6 mask of that step's micro-batches under the weights of that step; TRL's old-log-prob
    forward is reused for the first step (same weights) and a no-grad forward runs for the others."""
    overrides = dict(
        learning_rate=1e-2, warmup_steps=0, max_steps=4, gradient_accumulation_steps=2, steps_per_generation=4,
        num_iterations=2, per_device_train_batch_size=4,
    )  # fmt: skip
    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer, seed=0), reward_funcs=length_reward,
        args=cpu_config(tmp_path, spurious_prob_threshold=TEST_TAU_P, **overrides),
        train_dataset=prompt_dataset, processing_class=tokenizer,
    )  # fmt: skip
    decisions, forwards = [], []
    decide_step, forward = trainer._decide_step, trainer._no_grad_logps_and_entropies

    def recording_decide_step(micro_batches):
        decided = decide_step(micro_batches)
        with torch.no_grad():  # Eq. 6's mask over the step, from the model's own logits at this moment
            full = {key: torch.cat([mb[key] for mb in micro_batches]) for key in ("prompt_ids", "prompt_mask",
                    "completion_ids", "completion_mask", "advantages")}  # fmt: skip
            logps, entropies = token_logps_and_entropies(trainer.model, full)
        expected = s2t_silenced(logps, entropies, full["advantages"], full["completion_mask"], TEST_TAU_P, 0.75)
        decisions.append((trainer.state.global_step, torch.cat([mb["spurious_silenced"] for mb in decided]), expected))
        return decided

    def recording_forward(inputs):
        forwards.append(trainer.state.global_step)
        return forward(inputs)

    trainer._decide_step, trainer._no_grad_logps_and_entropies = recording_decide_step, recording_forward
    trainer.train()
    assert [step for step, _, _ in decisions] == [0, 1, 2, 3]
    for step, silenced, expected in decisions:
        assert torch.equal(silenced, expected), step
    assert any(silenced.any() for _, silenced, _ in decisions)
    assert forwards == [1, 2, 3]  # step 0 reused TRL's forward of the old log-probabilities
    # Steps 0 and 2 train on the same completions (second iteration) under different weights: decided anew.
    assert not torch.equal(decisions[0][1], decisions[2][1]) or not torch.equal(decisions[0][2], decisions[2][2])


def test_metrics_against_the_mask(tokenizer, model, prompt_dataset, tmp_path):
    inputs = make_inputs(len(tokenizer))
    trainer = build(STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path)
    loss_and_grads(trainer, inputs)
    with torch.no_grad():
        logps, entropies = token_logps_and_entropies(model, inputs)
    loss_mask = inputs["completion_mask"].bool()
    silenced = s2t_silenced(logps, entropies, inputs["advantages"], loss_mask, TEST_TAU_P, 0.75)
    candidates = loss_mask & (inputs["advantages"].view(-1, 1) > 0) & (logps.exp() < TEST_TAU_P)
    metrics = trainer._metrics["train"]
    num_loss = loss_mask.sum().item()
    assert metrics["spurious/silenced_ratio"][0] == pytest.approx(silenced.sum().item() / num_loss)
    assert metrics["spurious/candidate_ratio"][0] == pytest.approx(candidates.sum().item() / num_loss)
    assert metrics["spurious/entropy_threshold"][0] == pytest.approx(
        torch.quantile(entropies[candidates], 0.75).item(), rel=1e-5
    )
    for name, q in (("p50", 0.5), ("p80", 0.8), ("p95", 0.95)):
        assert metrics[f"entropy/{name}"][0] == pytest.approx(torch.quantile(entropies[loss_mask], q).item(), rel=1e-5)
    # The logged entropy is over the tokens the loss kept.
    kept = loss_mask & ~silenced
    assert metrics["entropy"][0] == pytest.approx((entropies[kept]).mean().item(), rel=1e-5)


def test_trainer_silences_what_the_public_function_returns(tokenizer, model, prompt_dataset, tmp_path):
    """The trainer silences exactly what the public function returns for the same tensors."""
    inputs = make_inputs(len(tokenizer), seed=3)
    trainer = build(STAPOTrainer, model, tokenizer, prompt_dataset, tmp_path, spurious_mask_mode="high_entropy")
    loss_and_grads(trainer, inputs)
    with torch.no_grad():
        logps, entropies = token_logps_and_entropies(model, inputs)
    silenced = spurious_token_mask(
        logps,
        entropies,
        inputs["advantages"],
        inputs["completion_mask"],
        prob_threshold=TEST_TAU_P,
        entropy_quantile=0.75,
        mode="high_entropy",
    )
    assert trainer._metrics["train"]["spurious/silenced_count"] == [silenced.sum().item()]


def test_default_config_and_type_check(tokenizer, model, prompt_dataset, tmp_path):
    with pytest.raises(TypeError, match="STAPOConfig"):
        STAPOTrainer(
            model=model,
            reward_funcs=length_reward,
            args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False),
            train_dataset=prompt_dataset,
            processing_class=tokenizer,
        )


@pytest.mark.slow
def test_train_logs_changes_weights_saves_and_resumes(tokenizer, prompt_dataset, tmp_path):
    model = tiny_qwen3(tokenizer, seed=0)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    overrides = dict(
        learning_rate=1e-2,
        warmup_steps=0,
        max_steps=2,
        save_strategy="steps",
        save_steps=2,
        num_iterations=2,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
    )
    trainer = STAPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=cpu_config(tmp_path, spurious_prob_threshold=TEST_TAU_P, **overrides),
        train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "spurious/silenced_ratio" in entry]
    assert len(logged) == 2
    for entry in logged:
        for key in ("spurious/candidate_ratio", "spurious/silenced_count", "entropy/p50", "entropy/p95"):
            assert key in entry
        assert 0.0 <= entry["spurious/silenced_ratio"] <= entry["spurious/candidate_ratio"] <= 1.0
    assert any(entry["spurious/silenced_ratio"] > 0 for entry in logged)
    assert any(not torch.equal(p, initial[n]) for n, p in trainer.model.named_parameters())

    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "trainer_state.json").exists()
    card = (tmp_path / "README.md").read_text()
    assert "STAPO" in card and "Silencing Rare Spurious Tokens" in card and "stapo" in card

    resumed = STAPOTrainer(
        model=tiny_qwen3(tokenizer, seed=1),
        reward_funcs=length_reward,
        args=cpu_config(tmp_path, spurious_prob_threshold=TEST_TAU_P, **dict(overrides, max_steps=3)),
        train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert [e["step"] for e in resumed.state.log_history if "spurious/silenced_ratio" in e][-1] == 3


@pytest.mark.slow
def test_train_with_peft_lora(tokenizer, prompt_dataset, tmp_path):
    from peft import LoraConfig

    model = tiny_qwen3(tokenizer, seed=0)
    trainer = STAPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=cpu_config(tmp_path, spurious_prob_threshold=TEST_TAU_P, learning_rate=1e-2, warmup_steps=0, max_steps=2),
        train_dataset=prompt_dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert lora_before
    trainer.train()
    assert any(not torch.equal(p, lora_before[n]) for n, p in trainer.model.named_parameters() if n in lora_before)
    assert any(e.get("spurious/silenced_ratio", 0) > 0 for e in trainer.state.log_history)
