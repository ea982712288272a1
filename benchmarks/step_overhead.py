"""Benchmark 1: training-step time and peak memory of STAPOTrainer (S2T, low_entropy) against GRPOTrainer.

    python benchmarks/step_overhead.py                          # tiny CPU models 64x2 and 256x4 (hidden x layers)
    python benchmarks/step_overhead.py --quick                  # smoke-test sizes
    python benchmarks/step_overhead.py --preset qwen3-0.6b --device cuda --dtype bfloat16   # on a GPU

`--preset qwen3-0.6b`: a randomly initialised model of Qwen3-0.6B's shape (596M parameters, vocabulary 151,936),
micro-batches of 16 completions x 1,024 tokens after 128-token prompts unless given otherwise.

Both trainers get the same config (`STAPOConfig` for STAPO; for GRPO a `GRPOConfig` with the same values: paper
defaults `loss_type="dapo"`, ε_low 0.2, ε_high 0.28, δ = 10, β = 0), models with the same initial weights, and the
same fixed micro-batch (a generation batch as `_prepare_inputs` hands it to the loss: left-padded prompts,
completions of varying length, GRPO group-normalised advantages of ±1 rewards). Generation is left out on purpose: it
is identical for both and would only dilute the difference. What is timed is one optimizer step on that micro-batch:

    loss = trainer.compute_loss(model, inputs); accelerator.backward(loss); clip_grad_norm_; optimizer.step()

(with `optimizer.zero_grad(set_to_none=True)` before it, untimed). τ_p is calibrated on the model so that a
realistic fraction of the loss tokens are candidates (default 0.05%; a random model gives every token probability
~1/vocab, so the paper's 0.002 would make almost every token or none a candidate); the measured candidate and
silenced rates are printed.

The two trainers run interleaved: each round runs one step of each in random order; warm-up rounds are discarded.
Reported: the median step time of each, the median of the per-round ratios STAPO / GRPO and its interquartile range,
and the ratio of the fastest steps (the least disturbed on a shared machine). Because the difference is far below the
noise of a busy machine, the S2T work is also timed *inside* the STAPO steps: `_spurious_mask_and_log`, which holds
all of S2T's tensor work and host reads but two element-wise products, is wrapped with a timer (wall clock on CPU,
CUDA events on a GPU); "S2T share" is its median over the median STAPO step.
Peak memory: weights + AdamW states (resident at the start of a step) plus the peak of the tensors allocated during
one step (see `_common.peak_memory_bytes`: `torch.profiler` allocation events on CPU, `torch.cuda.max_memory_allocated`
on a GPU), measured on extra, untimed steps.
"""

import argparse
import copy
import dataclasses
import random
import sys
import tempfile
import time

import torch

from _common import describe_machine, markdown_table, peak_memory_bytes, summary, time_call

COLUMNS = [
    "model",
    "params",
    "loss tokens",
    "candidates %",
    "silenced %",
    "GRPO ms",
    "STAPO ms",
    "time ratio (median)",
    "ratio IQR",
    "min-time ratio",
    "S2T ms in step",
    "S2T share",
    "GRPO peak MB",
    "STAPO peak MB",
    "peak ratio",
    "step-peak ratio",
]

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


def make_inputs(vocab_size, batch, prompt_length, completion_length, num_generations, device, seed):
    """A micro-batch as GRPOTrainer's `_prepare_inputs` hands it to the loss (single process, on-policy)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab_size, (batch, prompt_length), generator=generator)
    completion_ids = torch.randint(3, vocab_size, (batch, completion_length), generator=generator)
    positions = torch.arange(prompt_length)
    prompt_lengths = torch.randint(prompt_length // 2, prompt_length + 1, (batch,), generator=generator)
    prompt_mask = (positions >= prompt_length - prompt_lengths[:, None]).long()  # left padding
    positions = torch.arange(completion_length)
    lengths = torch.randint(completion_length // 2, completion_length + 1, (batch,), generator=generator)
    completion_mask = (positions < lengths[:, None]).long()
    # GRPO advantages: ±1 rewards normalised within groups of `num_generations` completions
    rewards = torch.randint(0, 2, (batch,), generator=generator).float() * 2 - 1
    groups = rewards.view(-1, num_generations)
    advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
    }
    return {key: value.to(device) for key, value in inputs.items()}


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


def build_trainers(args, size, tokenizer, device, dtype, output_dir):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from stapo_trl import STAPOConfig, STAPOTrainer

    sequence_length = args.prompt_length + args.completion_length
    model = build_model(tokenizer, size, sequence_length, seed=args.seed).to(dtype)
    settings = dict(
        output_dir=output_dir,
        use_cpu=device.type == "cpu",
        bf16=dtype == torch.bfloat16,
        fp16=False,
        report_to="none",
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        per_device_train_batch_size=args.batch,
        num_generations=args.num_generations,
        max_completion_length=args.completion_length,
        save_strategy="no",
        seed=args.seed,
    )
    stapo_config = STAPOConfig(**settings, spurious_mask_mode="low_entropy")
    # The GRPOConfig a user would write for the same run (as tests/test_trainer.py's grpo_config_like): the values
    # where STAPOConfig's paper defaults differ from GRPOConfig's, plus the same settings.
    grpo_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    paper_defaults = {
        f.name: f.default
        for f in dataclasses.fields(STAPOConfig)
        if f.name in grpo_fields and f.default != grpo_fields[f.name].default
    }
    grpo_config = GRPOConfig(**paper_defaults, **settings)
    for name in ("loss_type", "epsilon", "epsilon_high", "delta", "beta", "learning_rate", "max_grad_norm"):
        assert getattr(grpo_config, name) == getattr(stapo_config, name), name

    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1?"}]] * args.batch})

    def reward(completions, **kwargs):
        return [0.0] * len(completions)

    trainers = {}
    for name, trainer_class, config in (("GRPO", GRPOTrainer, grpo_config), ("STAPO", STAPOTrainer, stapo_config)):
        trainer = trainer_class(
            model=copy.deepcopy(model),
            reward_funcs=reward,
            args=config,
            train_dataset=prompts,
            processing_class=tokenizer,
        )
        trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
        trainer.model.train()
        trainer.create_optimizer()
        trainers[name] = trainer
    return trainers


def make_step(trainer, inputs):
    model, optimizer, accelerator = trainer.model, trainer.optimizer, trainer.accelerator
    max_grad_norm = trainer.args.max_grad_norm

    def step():
        loss = trainer.compute_loss(model, inputs)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()

    return step


def time_s2t_calls(trainer, device) -> list:
    """Wrap the trainer's `_spurious_mask_and_log` (all of S2T's added tensor work but two element-wise ops) so that
    every call's duration is recorded: wall clock on CPU; CUDA events on a GPU, i.e. the GPU-timeline span of the call,
    including any idle gap its host syncs cause. Read the list after the step (the step's final sync)."""
    original, spans = trainer._spurious_mask_and_log, []

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

    trainer._spurious_mask_and_log = wrapper
    return spans


def resident_bytes(trainer) -> int:
    """Weights and optimizer states: what is allocated at the start of a step (gradients are set to None)."""
    tensors = list(trainer.model.parameters())
    for state in trainer.optimizer.state.values():
        tensors += [value for value in state.values() if torch.is_tensor(value)]
    return sum(t.numel() * t.element_size() for t in tensors)


def run_size(args, size, tokenizer, device, dtype) -> list:
    with tempfile.TemporaryDirectory() as output_dir:
        trainers = build_trainers(args, size, tokenizer, device, dtype, output_dir)
        vocab_size = trainers["GRPO"].model.config.vocab_size
        inputs = make_inputs(
            vocab_size, args.batch, args.prompt_length, args.completion_length, args.num_generations, device, args.seed
        )
        tau_p = calibrate_prob_threshold(trainers["STAPO"], inputs, args.candidate_rate)
        trainers["STAPO"].args.spurious_prob_threshold = tau_p
        steps = {name: make_step(trainer, inputs) for name, trainer in trainers.items()}
        s2t_spans = time_s2t_calls(trainers["STAPO"], device)

        rng = random.Random(args.seed)
        times = {name: [] for name in trainers}
        ratios = []
        for round_index in range(args.warmup + args.rounds):
            order = list(trainers)
            rng.shuffle(order)
            elapsed = {}
            for name in order:
                trainers[name].optimizer.zero_grad(set_to_none=True)
                elapsed[name] = time_call(steps[name], device)
            if round_index >= args.warmup:
                for name in trainers:
                    times[name].append(elapsed[name])
                ratios.append(elapsed["STAPO"] / elapsed["GRPO"])
        s2t_ms = [span() for span in s2t_spans[-args.rounds :]]

        peaks = {}
        for name in trainers:
            trainers[name].optimizer.zero_grad(set_to_none=True)
            step_peak, start = peak_memory_bytes(steps[name], device)
            resident = start if device.type == "cuda" else resident_bytes(trainers[name])
            peaks[name] = (resident + step_peak, step_peak)

        metrics = trainers["STAPO"]._metrics["train"]
        candidates = 100 * sum(metrics["spurious/candidate_ratio"]) / len(metrics["spurious/candidate_ratio"])
        silenced = 100 * sum(metrics["spurious/silenced_ratio"]) / len(metrics["spurious/silenced_ratio"])
        params = sum(p.numel() for p in trainers["GRPO"].model.parameters())
        ratio = summary(ratios)
        grpo_ms, stapo_ms = (summary(times[name])["median"] * 1e3 for name in ("GRPO", "STAPO"))
        print(
            f"[{size}] τ_p = {tau_p:.4g}; per-round ratios: min {ratio['min']:.4f}, max {ratio['max']:.4f}; "
            f"STAPO metric spurious/mask_time_ms median "
            f"{summary(metrics['spurious/mask_time_ms'])['median']:.3f} ms",
            file=sys.stderr,
        )
        return [
            size,
            f"{params / 1e6:.2f}M",
            int(inputs["completion_mask"].sum()),
            f"{candidates:.3f}",
            f"{silenced:.3f}",
            f"{grpo_ms:.2f}",
            f"{stapo_ms:.2f}",
            f"{ratio['median']:.4f}",
            f"[{ratio['q25']:.4f}, {ratio['q75']:.4f}]",
            f"{min(times['STAPO']) / min(times['GRPO']):.4f}",
            f"{summary(s2t_ms)['median']:.3f}",
            f"{summary(s2t_ms)['median'] / stapo_ms:.2%}",
            f"{peaks['GRPO'][0] / 2**20:.2f}",
            f"{peaks['STAPO'][0] / 2**20:.2f}",
            f"{peaks['STAPO'][0] / peaks['GRPO'][0]:.4f}",
            f"{peaks['STAPO'][1] / peaks['GRPO'][1]:.4f}",
        ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=["tiny", "qwen3-0.6b"], default="tiny")
    parser.add_argument("--sizes", default=None, help="comma-separated HIDDENxLAYERS of tiny Qwen3 models")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch", type=int, default=16, help="completions per micro-batch")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=None, help="default: 32 (tiny), 128 (qwen3-0.6b)")
    parser.add_argument("--completion-length", type=int, default=None, help="default: 256 (tiny), 1024 (qwen3-0.6b)")
    parser.add_argument("--candidate-rate", type=float, default=5e-4, help="target fraction of loss tokens")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds (smoke test)")
    args = parser.parse_args(argv)
    qwen = args.preset == "qwen3-0.6b"
    args.prompt_length = args.prompt_length or (128 if qwen else 32)
    args.completion_length = args.completion_length or (1024 if qwen else 256)
    if args.quick:
        args.sizes = args.sizes or "32x1"
        args.batch, args.completion_length, args.prompt_length = 8, 32, 8
        args.rounds, args.warmup = 3, 1
    if args.sizes is None:
        args.sizes = "qwen3-0.6b" if qwen else "64x2,256x4"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    from stapo_trl.toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    rows = [run_size(args, size, tokenizer, device, dtype) for size in args.sizes.split(",")]
    print(f"Machine: {describe_machine(device)}")
    print(
        f"Micro-batch: {args.batch} completions x {args.completion_length} tokens (prompt {args.prompt_length}), "
        f"{args.dtype} on {device}; {args.rounds} interleaved rounds after {args.warmup} warm-up rounds; "
        f"target candidate rate {args.candidate_rate:.2%}\n"
    )
    print(markdown_table(COLUMNS, rows))


if __name__ == "__main__":
    main()
