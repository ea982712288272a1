"""Benchmark 2: the S2T work of one micro-batch alone, at the paper's scale, on synthetic tensors.

    python benchmarks/mask_cost.py                              # 8 x 20,480 and 64 x 4,096 tokens, CPU
    python benchmarks/mask_cost.py --quick                      # smoke-test sizes
    python benchmarks/mask_cost.py --device cuda                # on a GPU

Two things are timed, each as the median over `--repeats` calls after `--warmup` discarded ones:

* `spurious_token_mask` alone (mode `low_entropy`, single process);
* everything STAPOTrainer adds to a micro-batch's loss: the real `STAPOTrainer._spurious_mask_and_log` (the mask,
  the entropy quantiles p50/p80/p95 of the loss tokens, the counts, their gather and the host reads of the logged
  metrics), called on a stub trainer that holds only what it reads (config values, a single-process `Accelerator`,
  the metrics dict), plus the two tensor operations `_compute_loss` adds (`mask * ~silenced` and the normaliser's
  `* keep_ratio`).

The tensors: per-token log-probabilities and entropies in `--dtype` (float32: what TRL's loss computes them in), a
loss mask of completions whose lengths are uniform in [T/2, T], GRPO advantages of ±1 rewards in groups of 8, and
exactly `round(rate x loss tokens)` candidates (Â > 0, π < τ_p = 0.002) at random positions (default rate 0.05%, the
paper's order of magnitude: about 0.01% of the tokens end up silenced). Extra memory: the peak of the tensors
allocated during one call (see `_common.peak_memory_bytes`).
"""

import argparse
import collections
import types

import torch
from _common import describe_machine, markdown_table, peak_memory_bytes, summary, time_call


COLUMNS = [
    "shape",
    "loss tokens",
    "candidates",
    "silenced",
    "mask ms",
    "mask µs / 1k tokens",
    "S2T total ms",
    "S2T total µs / 1k tokens",
    "S2T ms IQR",
    "S2T extra peak MB",
]
PROB_THRESHOLD = 0.002
ENTROPY_QUANTILE = 0.75


def synthetic_batch(batch, length, candidate_rate, num_generations, device, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(length)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=generator)
    loss_mask = (positions < lengths[:, None]).long()
    rewards = torch.randint(0, 2, (batch,), generator=generator).float() * 2 - 1
    if batch % num_generations == 0:
        groups = rewards.view(-1, num_generations)
        advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
    else:
        advantages = rewards
    if not (advantages > 0).any():
        advantages[0] = 1.0
    # Token probabilities in [τ_p, 1), and exactly `count` candidates with probability in [1e-6, τ_p).
    probs = PROB_THRESHOLD + (1 - PROB_THRESHOLD) * torch.rand(batch, length, generator=generator)
    eligible = (loss_mask.bool() & (advantages[:, None] > 0)).flatten().nonzero().squeeze(1)
    count = min(max(1, round(candidate_rate * int(loss_mask.sum()))), eligible.numel())
    chosen = eligible[torch.randperm(eligible.numel(), generator=generator)[:count]]
    probs.view(-1)[chosen] = 1e-6 + (PROB_THRESHOLD - 1e-6) * torch.rand(count, generator=generator)
    # Entropies ~ Exponential(1): most positions confident, a long tail.
    entropies = -torch.log(torch.rand(batch, length, generator=generator).clamp(min=1e-12))
    tensors = dict(
        per_token_logps=probs.log().to(dtype),
        entropies=entropies.to(dtype),
        advantages=advantages.unsqueeze(1),
        loss_mask=loss_mask,
    )
    return {key: value.to(device) for key, value in tensors.items()}


def stub_trainer(accelerator, trainer_class):
    """What `STAPOTrainer._spurious_mask_and_log` reads from `self` for one decision per step, and nothing else."""
    return types.SimpleNamespace(
        args=types.SimpleNamespace(
            spurious_mask_mode="low_entropy",
            spurious_prob_threshold=PROB_THRESHOLD,
            spurious_entropy_quantile=ENTROPY_QUANTILE,
            seed=0,
        ),
        accelerator=accelerator,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        _tracer=None,
        _random_mask_generator=None,
        current_gradient_accumulation_steps=1,
        _log_decision=trainer_class._log_decision,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x20480,64x4096", help="comma-separated BATCHxLENGTH")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--candidate-rate", type=float, default=5e-4)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.repeats, args.warmup = "8x256", 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    from accelerate import Accelerator

    from stapo_trl.s2t import spurious_token_mask
    from stapo_trl.trainer import STAPOTrainer

    accelerator = Accelerator(cpu=device.type == "cpu")
    trainer = stub_trainer(accelerator, STAPOTrainer)

    rows = []
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.split("x"))
        t = synthetic_batch(batch, length, args.candidate_rate, 8, device, dtype, args.seed)

        def mask_only():
            return spurious_token_mask(
                t["per_token_logps"], t["entropies"], t["advantages"], t["loss_mask"],
                prob_threshold=PROB_THRESHOLD, entropy_quantile=ENTROPY_QUANTILE,
            )  # fmt: skip

        def s2t_total():
            silenced, keep_ratio = STAPOTrainer._spurious_mask_and_log(
                trainer, None, None, t["per_token_logps"], t["entropies"], t["advantages"], t["loss_mask"], "train"
            )
            # what _compute_loss adds besides: the edited loss mask and the rescaled normaliser
            return t["loss_mask"] * ~silenced, keep_ratio * 2.0

        times = {"mask": [], "total": []}
        for index in range(args.warmup + args.repeats):
            for name, fn in (("mask", mask_only), ("total", s2t_total)):
                elapsed = time_call(fn, device)
                if index >= args.warmup:
                    times[name].append(elapsed * 1e3)
        extra_peak, _ = peak_memory_bytes(s2t_total, device)

        tokens = int(t["loss_mask"].sum())
        silenced = mask_only()
        probs = t["per_token_logps"].float().exp()
        candidates = int((t["loss_mask"].bool() & (t["advantages"] > 0) & (probs < PROB_THRESHOLD)).sum())
        mask_ms, total = summary(times["mask"])["median"], summary(times["total"])
        rows.append([
            shape, tokens, f"{candidates} ({candidates / tokens:.3%})", int(silenced.sum()),
            f"{mask_ms:.3f}", f"{1e3 * mask_ms / (tokens / 1e3):.2f}",
            f"{total['median']:.3f}", f"{1e3 * total['median'] / (tokens / 1e3):.2f}",
            f"[{total['q25']:.3f}, {total['q75']:.3f}]", f"{extra_peak / 2**20:.2f}",
        ])  # fmt: skip

    print(f"Machine: {describe_machine(device)}")
    print(
        f"{args.dtype} on {device}; τ_p = {PROB_THRESHOLD}, q = {ENTROPY_QUANTILE}, target candidate rate "
        f"{args.candidate_rate:.2%}; median of {args.repeats} calls after {args.warmup} warm-up calls\n"
    )
    print(markdown_table(COLUMNS, rows))


if __name__ == "__main__":
    main()
