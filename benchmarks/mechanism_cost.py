"""Benchmark 7: what `spurious_mechanism_metrics=True` (the paper's Table 1, logged every step) adds to a step.

    python benchmarks/mechanism_cost.py                         # tiny CPU models: toy vocabulary, then Qwen3's
    python benchmarks/mechanism_cost.py --quick                 # smoke-test sizes
    python benchmarks/mechanism_cost.py --sizes qwen3-0.6b --device cuda --dtype bfloat16 --completion-length 1024

Two `STAPOTrainer`s with the same config (scope "step", the paper's defaults, on-policy: `steps_per_generation =
gradient_accumulation_steps`), one with the metrics off and one with them on, get models with the same initial
weights and the same generation batch (from `step_overhead.py`: left-padded prompts, completions of varying length,
GRPO advantages of ±1 rewards, τ_p calibrated to 0.05% candidates). Generation is stood in for as in
`step_overhead.py`; everything else is the training loop's code (`_prepare_inputs`, `compute_loss`, backward, clip,
optimizer step). The two run interleaved, one cycle each per round in random order after warm-up rounds; the table
gives the median time per optimizer step of each, the median and interquartile range of the per-round ratio (on /
off), and the time spent in the metrics' own call per step (`_record_step_diagnostics`: the vocabulary-wide
reduction over the positive-advantage loss tokens, the binning, the host reads). Generation, which a real step also
spends (most of it with long completions), is not in the denominator: the ratio is an upper bound of the share of a
real step.

Sizes: HIDDENxLAYERS (a tiny Qwen3 with the toy tokenizer's vocabulary), HIDDENxLAYERSxVOCAB (another vocabulary;
the extra work grows with vocabulary x hidden size, the step's with the layers), or qwen3-0.6b (Qwen3-0.6B's shape:
596M parameters, vocabulary 151,936).
"""

import argparse
import copy
import random
import sys
import tempfile

import torch
from _common import describe_machine, markdown_table, summary, time_call
from step_overhead import (
    QWEN3_0_6B,
    build_model,
    calibrate_prob_threshold,
    make_cycle,
    make_generation_batch,
    scored_generation_batch,
    time_calls,
)


COLUMNS = [
    "model",
    "params",
    "vocabulary",
    "loss tokens / step",
    "off ms",
    "on ms",
    "time ratio (median)",
    "ratio IQR",
    "metrics ms / step",
]
VARIANTS = ("off", "on")


def model_for(size, tokenizer, sequence_length, seed):
    parts = size.split("x")
    if size == "qwen3-0.6b" or len(parts) == 2:
        return build_model(tokenizer, size, sequence_length, seed)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, layers, vocab = (int(part) for part in parts)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128), head_dim=64,
        max_position_embeddings=max(512, sequence_length), tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def run_size(args, size, tokenizer, device, dtype) -> list:
    from datasets import Dataset
    from trl import GRPOTrainer

    from stapo_trl import STAPOConfig, STAPOTrainer

    sequence_length = args.prompt_length + args.completion_length
    model = model_for(size, tokenizer, sequence_length, args.seed).to(dtype)
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1?"}]] * args.batch})
    with tempfile.TemporaryDirectory() as output_dir:
        settings = dict(
            output_dir=output_dir, use_cpu=device.type == "cpu", bf16=dtype == torch.bfloat16, fp16=False,
            report_to="none", activation_checkpointing=False, dataloader_num_workers=0,
            per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.accumulation,
            steps_per_generation=args.accumulation, num_generations=args.num_generations,
            max_completion_length=args.completion_length, save_strategy="no", seed=args.seed,
        )  # fmt: skip
        trainers = {}
        for variant in VARIANTS:
            config = STAPOConfig(**settings, spurious_mechanism_metrics=variant == "on")
            trainers[variant] = STAPOTrainer(
                model=copy.deepcopy(model), reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                args=config, train_dataset=prompts, processing_class=tokenizer,
            )  # fmt: skip
            trainers[variant].model.train()
            trainers[variant].create_optimizer()
        vocab_size = model.config.vocab_size
        batch = make_generation_batch(
            vocab_size, args.batch * args.accumulation, args.prompt_length, args.completion_length,
            args.num_generations, device, args.seed,
        )  # fmt: skip
        tau_p = calibrate_prob_threshold(trainers["off"], batch, 5e-4)
        for trainer in trainers.values():
            trainer.benchmark_generation_batch = batch
            trainer.args.spurious_prob_threshold = tau_p
        cycles = {variant: make_cycle(trainer, 1, device) for variant, trainer in trainers.items()}
        spans = time_calls(trainers["on"], "_record_step_diagnostics", device)

        original_generation = GRPOTrainer._generate_and_score_completions
        GRPOTrainer._generate_and_score_completions = scored_generation_batch
        try:
            rng = random.Random(args.seed)
            times = {variant: [] for variant in VARIANTS}
            for round_index in range(args.warmup + args.rounds):
                order = list(VARIANTS)
                rng.shuffle(order)
                elapsed = {variant: time_call(cycles[variant], device) for variant in order}
                if round_index >= args.warmup:
                    for variant in VARIANTS:
                        times[variant].append(elapsed[variant])
        finally:
            GRPOTrainer._generate_and_score_completions = original_generation
        assert any(key.startswith("mechanism/") for key in trainers["on"]._metrics["train"])
        metrics_ms = sum(span() for span in spans) / (args.warmup + args.rounds)

    ratio = summary([on / off for on, off in zip(times["on"], times["off"], strict=True)])
    off_ms, on_ms = (summary(times[variant])["median"] * 1e3 for variant in VARIANTS)
    print(
        f"[{size}] τ_p = {tau_p:.4g}; per-round ratios: min {ratio['min']:.4f}, max {ratio['max']:.4f}",
        file=sys.stderr,
    )
    params = sum(p.numel() for p in model.parameters())
    loss_tokens = int(batch["completion_mask"].sum())
    return [[
        size, f"{params / 1e6:.2f}M", vocab_size, loss_tokens, f"{off_ms:.1f}", f"{on_ms:.1f}",
        f"{ratio['median']:.4f}", f"[{ratio['q25']:.4f}, {ratio['q75']:.4f}]", f"{metrics_ms:.2f}",
    ]]  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64x2,256x4,256x4x151936", help="comma-separated sizes (see above)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch", type=int, default=4, help="completions per micro-batch")
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--completion-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = "32x1"
        args.batch, args.accumulation, args.completion_length, args.prompt_length = 4, 2, 32, 8
        args.rounds, args.warmup = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    assert QWEN3_0_6B["vocab_size"] == 151936  # the shape the docstring names

    from stapo_trl.toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    print(
        f"Optimizer step: {args.accumulation} micro-batches of {args.batch} completions x {args.completion_length} "
        f"tokens (prompt {args.prompt_length}), {args.dtype} on {device}, scope step, on-policy; {args.rounds} "
        f"interleaved rounds after {args.warmup} warm-up rounds; times per optimizer step, generation excluded\n"
    )
    table = markdown_table(COLUMNS, []).splitlines()
    print("\n".join(table), flush=True)
    for size in args.sizes.split(","):  # each row as soon as it is measured
        for row in run_size(args, size, tokenizer, device, dtype):
            print(markdown_table(COLUMNS, [row]).splitlines()[-1], flush=True)
    print(f"\nMachine: {describe_machine(device)}")


if __name__ == "__main__":
    main()
