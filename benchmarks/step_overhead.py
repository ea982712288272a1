"""Benchmark 1: training-step time and peak memory of STAPOTrainer (scopes "step" and "micro_batch") against
GRPOTrainer, as a function of the share of positive-advantage completions.

    python benchmarks/step_overhead.py                          # tiny CPU model 64x2 (hidden x layers)
    python benchmarks/step_overhead.py --quick                  # smoke-test sizes
    python benchmarks/step_overhead.py --preset qwen3-0.6b --device cuda --dtype bfloat16   # on a GPU

`--preset qwen3-0.6b`: a randomly initialised model of Qwen3-0.6B's shape (596M parameters, vocabulary 151,936),
micro-batches of 4 completions x 1,024 tokens after 128-token prompts unless given otherwise.

Three trainers get the same config (`STAPOConfig` with `spurious_mask_scope="step"`, the same with `"micro_batch"`,
and a `GRPOConfig` with the same values: paper defaults `loss_type="dapo"`, ε_low 0.2, ε_high 0.28, δ = 10, β = 0),
models with the same initial weights, and the same generation batches. One generation batch per positive share p
(`--positive-shares`, default 0.1, 0.3, 0.5, 1.0): left-padded prompts, completions of varying length, and advantages
+1 for exactly round(p x N) completions drawn at random, -1 for the others (only Â > 0 matters to S2T: the step
scope's pre-pass forwards those completions only). Two configurations:

* on-policy: `steps_per_generation = gradient_accumulation_steps` (4), `num_iterations = 1`. TRL runs no forward
  before the loss, so scope "step" forwards the step's positive completions (no grad): new work.
* off-policy: `steps_per_generation = 4 x gradient_accumulation_steps` (16), as in the shipped GPU recipes. TRL runs a
  no-grad forward over the generation batch for the old log-probabilities; scope "step" reuses it (with its entropies)
  for the first of the 4 optimizer steps and forwards the positive completions itself for the 3 others (the weights
  have changed).

Generation itself is left out: `GRPOTrainer._generate_and_score_completions` is replaced, for all three trainers, by
what TRL does after generating and scoring: the no-grad forward for the old log-probabilities when TRL runs it (the
same call as TRL's), and the token count. Everything else is the real training-loop code: `_prepare_inputs` (TRL's
buffering, shuffle and split; STAPO's step decision), `compute_loss`, `accelerator.backward` per micro-batch, then
`clip_grad_norm_`, `optimizer.step()`, `zero_grad`. The timed unit is one optimizer step; a cycle is one generation
batch (the replaced generation + every optimizer step it feeds). τ_p is calibrated on the model and each batch so
that a realistic fraction of the loss tokens are candidates (default 0.05%; a random model gives every token
probability ~1/vocab); the measured candidate and silenced rates are printed.

Paired, interleaved measurement: each round runs, for every positive share in random order, one cycle of each
trainer in random order on that share's batch; warm-up rounds are discarded. Reported per share and STAPO scope: the
median time per optimizer step, the median of the per-round ratios STAPO / GRPO and its interquartile range, and
(off-policy) the same ratio split into the first step of each generation batch (TRL's forward reused) and the later
steps. "forward share" f is the step scope's pre-pass time per step at share 1.0 (every completion forwarded) over
GRPO's step time, and the target 1 + f x p is what forwarding only the positive share p should cost. Inside the STAPO
cycles, the S2T decision (`_spurious_mask_and_log`) and the step scope's pre-pass (`_no_grad_logps_and_entropies`)
are timed separately (wall clock on CPU, CUDA events on a GPU), per optimizer step. Peak memory: weights + AdamW
states plus the peak of the tensors allocated during one cycle (see `_common.peak_memory_bytes`), on an extra,
untimed cycle at the largest share.
"""

import argparse
import copy
import random
import sys
import tempfile
import time

import torch
from _common import describe_machine, grpo_config_like, markdown_table, peak_memory_bytes, summary, time_call


COLUMNS = [
    "model",
    "config",
    "positive share",
    "scope",
    "params",
    "loss tokens / step",
    "candidates %",
    "silenced %",
    "GRPO ms",
    "STAPO ms",
    "time ratio (median)",
    "ratio IQR",
    "ratio, reused steps",
    "ratio, other steps",
    "target 1 + f·p",
    "pre-pass ms / step",
    "S2T ms / step",
    "GRPO peak MB",
    "STAPO peak MB",
    "peak ratio",
]

# name: (steps_per_generation as a multiple of gradient_accumulation_steps)
CONFIGS = {"on-policy": 1, "off-policy": 4}
TRAINERS = ("GRPO", "STAPO step", "STAPO micro_batch")

QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)


def build_model(tokenizer, size: str, sequence_length: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from stapo_trl.toy.model import tiny_qwen3

    if size == "qwen3-0.6b":
        config = Qwen3Config(
            **QWEN3_0_6B,
            max_position_embeddings=max(40960, sequence_length),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return Qwen3ForCausalLM(config)
    hidden, layers = (int(x) for x in size.split("x"))
    return tiny_qwen3(
        tokenizer,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        max_position_embeddings=max(512, sequence_length),
        seed=seed,
    )


def make_generation_batch(vocab_size, batch, prompt_length, completion_length, positive_share, device, seed):
    """The tensors of a generation batch as TRL has them after generating and scoring (single process), with
    exactly round(positive_share x batch) completions of advantage +1, drawn at random, and -1 for the others."""
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab_size, (batch, prompt_length), generator=generator)
    completion_ids = torch.randint(3, vocab_size, (batch, completion_length), generator=generator)
    positions = torch.arange(prompt_length)
    prompt_lengths = torch.randint(prompt_length // 2, prompt_length + 1, (batch,), generator=generator)
    prompt_mask = (positions >= prompt_length - prompt_lengths[:, None]).long()  # left padding
    positions = torch.arange(completion_length)
    lengths = torch.randint(completion_length // 2, completion_length + 1, (batch,), generator=generator)
    completion_mask = (positions < lengths[:, None]).long()
    advantages = -torch.ones(batch)
    advantages[torch.randperm(batch, generator=generator)[: round(positive_share * batch)]] = 1.0
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }
    return {key: value.to(device) for key, value in inputs.items()}


def scored_generation_batch(trainer, _inputs):
    """Stands in for `GRPOTrainer._generate_and_score_completions`: TRL's work after generation and reward (its
    no-grad forward of the old log-probabilities when it runs one, the loss-token count), without generating."""
    from trl.models.utils import disable_gradient_checkpointing

    args = trainer.args
    batch = dict(trainer.benchmark_generation_batch)
    if args.gradient_accumulation_steps % (args.steps_per_generation * trainer.num_iterations) != 0:  # TRL's test
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad(), disable_gradient_checkpointing(trainer.model, args.gradient_checkpointing_kwargs):
            batch["old_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, input_ids, attention_mask, batch["completion_ids"].size(1),
                batch_size=args.per_device_train_batch_size,
            )  # fmt: skip
    batch["num_items_in_batch"] = batch["completion_mask"].sum()
    return batch


def calibrate_prob_threshold(trainer, inputs, candidate_rate: float) -> float:
    """τ_p such that about `candidate_rate` of the loss tokens are candidates (Â > 0 and π < τ_p), at least one."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, inputs["completion_ids"].size(1), compute_entropy=True
        )
    mask = inputs["completion_mask"].bool()
    eligible = mask & (inputs["advantages"][:, None] > 0)
    probs = logps.float().exp()[eligible].sort().values
    count = max(1, round(candidate_rate * int(mask.sum())))
    if count >= probs.numel():
        return 1.0
    return float((probs[count - 1] + probs[count]) / 2)


def build_trainers(args, size, tokenizer, device, dtype, output_dir, steps_per_generation_factor):
    from datasets import Dataset
    from trl import GRPOTrainer

    from stapo_trl import STAPOConfig, STAPOTrainer

    sequence_length = args.prompt_length + args.completion_length
    model = build_model(tokenizer, size, sequence_length, seed=args.seed).to(dtype)
    settings = dict(
        output_dir=output_dir,
        use_cpu=device.type == "cpu",
        bf16=dtype == torch.bfloat16,
        fp16=False,
        report_to="none",
        activation_checkpointing=False,
        dataloader_num_workers=0,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accumulation,
        steps_per_generation=args.accumulation * steps_per_generation_factor,
        num_generations=args.num_generations,
        max_completion_length=args.completion_length,
        save_strategy="no",
        seed=args.seed,
    )
    configs = {
        "STAPO step": STAPOConfig(**settings, spurious_mask_mode="low_entropy", spurious_mask_scope="step"),
        "STAPO micro_batch": STAPOConfig(
            **settings, spurious_mask_mode="low_entropy", spurious_mask_scope="micro_batch"
        ),
    }
    configs["GRPO"] = grpo_config_like(**settings)
    for name in ("loss_type", "epsilon", "epsilon_high", "delta", "beta", "learning_rate", "max_grad_norm"):
        assert getattr(configs["GRPO"], name) == getattr(configs["STAPO step"], name), name

    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1?"}]] * args.batch})

    def reward(completions, **kwargs):
        return [0.0] * len(completions)

    trainers = {}
    for name in TRAINERS:
        trainer_class = GRPOTrainer if name == "GRPO" else STAPOTrainer
        trainer = trainer_class(
            model=copy.deepcopy(model), reward_funcs=reward, args=configs[name], train_dataset=prompts,
            processing_class=tokenizer,
        )  # fmt: skip
        trainer.model.train()
        trainer.create_optimizer()
        trainers[name] = trainer
    return trainers


def make_cycle(trainer, steps_per_cycle, device):
    """One generation batch's worth of training, as Transformers' loop runs it (generation stood in for); the cycle
    returns the seconds of each optimizer step (the first includes the stand-in generation)."""
    model, optimizer, accelerator, args = trainer.model, trainer.optimizer, trainer.accelerator, trainer.args

    def optimizer_step():
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        for _ in range(args.gradient_accumulation_steps):
            inputs = trainer._prepare_inputs(None)
            accelerator.backward(trainer.compute_loss(model, inputs))
            trainer._step += 1
        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trainer.state.global_step += 1

    def cycle():
        return [time_call(optimizer_step, device) for _ in range(steps_per_cycle)]

    return cycle


def time_calls(trainer, method_name, device) -> list:
    """Wrap a method of the trainer so that every call's duration is recorded: wall clock on CPU; CUDA events on a GPU
    (the GPU-timeline span of the call, including idle gaps its host syncs cause). Read the values after a sync."""
    original, spans = getattr(trainer, method_name), []

    def wrapper(*args, **kwargs):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = original(*args, **kwargs)
            end.record()
            spans.append(lambda: start.elapsed_time(end))
        else:
            start = time.perf_counter()
            result = original(*args, **kwargs)
            elapsed = (time.perf_counter() - start) * 1e3
            spans.append(lambda: elapsed)
        return result

    setattr(trainer, method_name, wrapper)
    return spans


def resident_bytes(trainer) -> int:
    """Weights and optimizer states: what is allocated at the start of a step (gradients are set to None)."""
    tensors = list(trainer.model.parameters())
    for state in trainer.optimizer.state.values():
        tensors += [value for value in state.values() if torch.is_tensor(value)]
    return sum(t.numel() * t.element_size() for t in tensors)


def run_config(args, size, config_name, tokenizer, device, dtype) -> list:
    from trl import GRPOTrainer

    factor = CONFIGS[config_name]
    steps_per_cycle = factor  # optimizer steps fed by one generation batch
    with tempfile.TemporaryDirectory() as output_dir:
        trainers = build_trainers(args, size, tokenizer, device, dtype, output_dir, factor)
        grpo_args = trainers["GRPO"].args
        vocab_size = trainers["GRPO"].model.config.vocab_size
        batches, tau_p = {}, {}
        for share in args.positive_shares:
            batches[share] = make_generation_batch(
                vocab_size, args.batch * grpo_args.steps_per_generation, args.prompt_length, args.completion_length,
                share, device, args.seed,
            )  # fmt: skip
            tau_p[share] = calibrate_prob_threshold(trainers["STAPO step"], batches[share], args.candidate_rate)
        cycles = {name: make_cycle(trainer, steps_per_cycle, device) for name, trainer in trainers.items()}
        spans = {
            (name, method): time_calls(trainers[name], method, device)
            for name in TRAINERS[1:]
            for method in ("_spurious_mask_and_log", "_no_grad_logps_and_entropies")
        }

        def use_batch(share):
            for name, trainer in trainers.items():
                trainer.benchmark_generation_batch = batches[share]
                if name != "GRPO":
                    trainer.args.spurious_prob_threshold = tau_p[share]

        original_generation = GRPOTrainer._generate_and_score_completions
        GRPOTrainer._generate_and_score_completions = scored_generation_batch
        try:
            rng = random.Random(args.seed)
            times = {(name, share): [] for name in trainers for share in args.positive_shares}  # per cycle: steps
            span_ms = {(key, share): 0.0 for key in spans for share in args.positive_shares}
            s2t_metrics = {(name, share): {} for name in TRAINERS[1:] for share in args.positive_shares}
            for round_index in range(args.warmup + args.rounds):
                shares = list(args.positive_shares)
                rng.shuffle(shares)
                for share in shares:
                    use_batch(share)
                    order = list(trainers)
                    rng.shuffle(order)
                    for name in order:
                        counts = {key: len(values) for key, values in spans.items()}
                        metrics = {k: len(v) for k, v in trainers[name]._metrics["train"].items()}
                        step_seconds = cycles[name]()
                        if round_index < args.warmup:
                            continue
                        times[(name, share)].append(step_seconds)
                        for key, values in spans.items():
                            span_ms[(key, share)] += sum(span() for span in values[counts[key] :])
                        if name != "GRPO":
                            for key, values in trainers[name]._metrics["train"].items():
                                if key.startswith("spurious/"):
                                    s2t_metrics[(name, share)].setdefault(key, []).extend(
                                        values[metrics.get(key, 0) :]
                                    )
            peaks = {}
            use_batch(max(args.positive_shares))
            for name in trainers:
                step_peak, start = peak_memory_bytes(cycles[name], device)
                resident = start if device.type == "cuda" else resident_bytes(trainers[name])
                peaks[name] = resident + step_peak
        finally:
            GRPOTrainer._generate_and_score_completions = original_generation

        params = sum(p.numel() for p in trainers["GRPO"].model.parameters())
        timed_steps = args.rounds * steps_per_cycle
        full_share = max(args.positive_shares)
        grpo_full_ms = summary([sum(c) / steps_per_cycle for c in times[("GRPO", full_share)]])["median"] * 1e3
        forward_share = span_ms[(("STAPO step", "_no_grad_logps_and_entropies"), full_share)] / timed_steps
        forward_share /= grpo_full_ms * full_share
        rows = []
        for share in args.positive_shares:
            batch = batches[share]
            loss_tokens = int(batch["completion_mask"].sum()) // grpo_args.steps_per_generation * args.accumulation
            grpo_cycles = times[("GRPO", share)]
            for name in TRAINERS[1:]:
                stapo_cycles = times[(name, share)]
                metrics = s2t_metrics[(name, share)]
                candidates = 100 * _mean(metrics["spurious/candidate_ratio"])
                silenced = 100 * _mean(metrics["spurious/silenced_ratio"])
                ratios = [sum(s) / sum(g) for s, g in zip(stapo_cycles, grpo_cycles, strict=True)]
                ratio = summary(ratios)
                grpo_ms, stapo_ms = (
                    summary([sum(c) / steps_per_cycle for c in cycles_])["median"] * 1e3
                    for cycles_ in (grpo_cycles, stapo_cycles)
                )
                reused, others = "—", "—"
                if steps_per_cycle > 1:  # the first step of a generation batch reuses TRL's forward
                    reused = f"{summary([s[0] / g[0] for s, g in zip(stapo_cycles, grpo_cycles)])['median']:.4f}"
                    others = summary([sum(s[1:]) / sum(g[1:]) for s, g in zip(stapo_cycles, grpo_cycles)])
                    others = f"{others['median']:.4f}"
                target = f"{1 + forward_share * share:.3f}" if name == "STAPO step" else "—"
                print(
                    f"[{size} {config_name} share {share} {name}] τ_p = {tau_p[share]:.4g}; per-round ratios: min "
                    f"{ratio['min']:.4f}, max {ratio['max']:.4f}",
                    file=sys.stderr,
                )
                rows.append([
                    size, config_name, f"{share:.1f}", name.split()[1], f"{params / 1e6:.2f}M", loss_tokens,
                    f"{candidates:.3f}", f"{silenced:.3f}", f"{grpo_ms:.1f}", f"{stapo_ms:.1f}",
                    f"{ratio['median']:.4f}", f"[{ratio['q25']:.4f}, {ratio['q75']:.4f}]", reused, others, target,
                    f"{span_ms[((name, '_no_grad_logps_and_entropies'), share)] / timed_steps:.1f}",
                    f"{span_ms[((name, '_spurious_mask_and_log'), share)] / timed_steps:.2f}",
                    f"{peaks['GRPO'] / 2**20:.2f}", f"{peaks[name] / 2**20:.2f}", f"{peaks[name] / peaks['GRPO']:.4f}",
                ])  # fmt: skip
        print(f"[{size} {config_name}] forward share f = {forward_share:.3f}", file=sys.stderr)
        return rows


def _mean(values):
    return sum(values) / len(values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=["tiny", "qwen3-0.6b"], default="tiny")
    parser.add_argument("--sizes", default=None, help="comma-separated HIDDENxLAYERS of tiny Qwen3 models")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated: on-policy, off-policy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch", type=int, default=4, help="completions per micro-batch")
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=None, help="default: 32 (tiny), 128 (qwen3-0.6b)")
    parser.add_argument("--completion-length", type=int, default=None, help="default: 256 (tiny), 1024 (qwen3-0.6b)")
    parser.add_argument("--candidate-rate", type=float, default=5e-4, help="target fraction of loss tokens")
    parser.add_argument("--positive-shares", default="0.1,0.3,0.5,1.0", help="shares of completions with Â > 0")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds (smoke test)")
    args = parser.parse_args(argv)
    args.positive_shares = [float(share) for share in args.positive_shares.split(",")]
    qwen = args.preset == "qwen3-0.6b"
    args.prompt_length = args.prompt_length or (128 if qwen else 32)
    args.completion_length = args.completion_length or (1024 if qwen else 256)
    if args.quick:
        args.sizes = args.sizes or "32x1"
        args.positive_shares = [0.3, 1.0]
        args.batch, args.accumulation, args.completion_length, args.prompt_length = 4, 2, 32, 8
        args.rounds, args.warmup = 2, 1
    if args.sizes is None:
        args.sizes = "qwen3-0.6b" if qwen else "64x2"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    from stapo_trl.toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    rows = [
        row
        for size in args.sizes.split(",")
        for config_name in args.configs.split(",")
        for row in run_config(args, size, config_name, tokenizer, device, dtype)
    ]
    print(f"Machine: {describe_machine(device)}")
    print(
        f"Optimizer step: {args.accumulation} micro-batches of {args.batch} completions x {args.completion_length} "
        f"tokens (prompt {args.prompt_length}), {args.dtype} on {device}; {args.rounds} interleaved rounds after "
        f"{args.warmup} warm-up rounds; target candidate rate {args.candidate_rate:.2%}; times per optimizer step\n"
    )
    print(markdown_table(COLUMNS, rows))


if __name__ == "__main__":
    main()
