"""Benchmark 3: the extra time of S2T's cross-process gather, with 2 real processes.

    ACCELERATE_USE_CPU=true OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no benchmarks/gather_overhead.py            # 2 gloo processes on CPU
    ... benchmarks/gather_overhead.py --quick                                             # smoke-test sizes

(`accelerate launch --cpu` would start ONE process: `--multi_gpu` with `ACCELERATE_USE_CPU=true` is what starts two
gloo processes on a CPU. Without `ACCELERATE_USE_CPU`, on a machine with 2 GPUs, the same command uses NCCL.)

With more than one process, the entropy threshold τ_h is the quantile of the candidates of *all* processes, so
`spurious_token_mask` all-gathers the candidates' entropies (`STAPOTrainer._gather_entropies`: accelerate's
`pad_across_processes` then `gather`). Timed per micro-batch-sized synthetic batch of each process (same construction
as benchmarks/mask_cost.py, a different seed per process), median over `--repeats` calls, all processes released by a
barrier before every call; a call's time is the slowest process's:

* `mask, local`: `spurious_token_mask` without gather (each process's own quantile; not what the trainer does);
* `mask, pooled`: with the trainer's gather; `gather extra` is the median of the per-call differences;
* `S2T total`: the real `STAPOTrainer._spurious_mask_and_log` on a stub trainer (pooled mask + the metrics' gather +
  host reads), as benchmarks/mask_cost.py does for one process;
* `GRPO all-reduce`: one `accelerator.reduce` of 2 floats, which GRPOTrainer's metrics already do 4 times (plus 2
  gathers) per micro-batch: the unit to compare the gather extra with.

Rank 0 prints the table.
"""

import argparse
import time

import torch
from _common import describe_machine, markdown_table, summary
from mask_cost import ENTROPY_QUANTILE, PROB_THRESHOLD, stub_trainer, synthetic_batch


COLUMNS = [
    "shape per process",
    "candidates (all processes)",
    "mask, local ms",
    "mask, pooled ms",
    "gather extra ms",
    "gather extra IQR",
    "S2T total ms",
    "GRPO all-reduce ms",
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x4096,8x20480,64x4096", help="comma-separated BATCHxLENGTH per process")
    parser.add_argument("--candidate-rate", type=float, default=5e-4)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.repeats, args.warmup = "4x256", 3, 1

    from accelerate import Accelerator

    from stapo_trl.s2t import spurious_token_mask
    from stapo_trl.trainer import STAPOTrainer

    accelerator = Accelerator()
    device, rank, world = accelerator.device, accelerator.process_index, accelerator.num_processes
    if world < 2:
        raise SystemExit(
            f"gather_overhead.py needs >= 2 processes, got {world}: launch it with "
            "`accelerate launch --multi_gpu --num_processes 2 ...` (ACCELERATE_USE_CPU=true on a CPU)."
        )
    trainer = stub_trainer(accelerator, STAPOTrainer)
    trainer._gather_entropies = STAPOTrainer._gather_entropies.__get__(trainer)

    def timed(fn):
        accelerator.wait_for_everyone()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    rows = []
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.split("x"))
        t = synthetic_batch(batch, length, args.candidate_rate, 8, device, torch.float32, args.seed + rank)

        def mask(gather):
            return spurious_token_mask(
                t["per_token_logps"], t["entropies"], t["advantages"], t["loss_mask"],
                prob_threshold=PROB_THRESHOLD, entropy_quantile=ENTROPY_QUANTILE, gather=gather,
            )  # fmt: skip

        calls = {
            "local": lambda: mask(None),
            "pooled": lambda: mask(trainer._gather_entropies),
            "total": lambda: STAPOTrainer._spurious_mask_and_log(
                trainer, None, None, t["per_token_logps"], t["entropies"], t["advantages"], t["loss_mask"], "train"
            ),
            "reduce": lambda: accelerator.reduce(torch.ones(2, device=device), reduction="sum").tolist(),
        }
        times = {name: [] for name in calls}
        for index in range(args.warmup + args.repeats):
            for name, fn in calls.items():
                elapsed = timed(fn)
                if index >= args.warmup:
                    times[name].append(elapsed)
        # A call takes as long as its slowest process.
        slowest = {
            name: accelerator.gather(torch.tensor(values, device=device).unsqueeze(0)).max(0).values.tolist()
            for name, values in times.items()
        }
        extra = [(p - loc) * 1e3 for p, loc in zip(slowest["pooled"], slowest["local"], strict=True)]
        candidates = t["loss_mask"].bool() & (t["advantages"] > 0) & (t["per_token_logps"].exp() < PROB_THRESHOLD)
        num_candidates = int(accelerator.reduce(candidates.sum(), reduction="sum"))
        median = {name: summary(values)["median"] * 1e3 for name, values in slowest.items()}
        extra_summary = summary(extra)
        rows.append([
            shape, num_candidates, f"{median['local']:.3f}", f"{median['pooled']:.3f}",
            f"{extra_summary['median']:.3f}", f"[{extra_summary['q25']:.3f}, {extra_summary['q75']:.3f}]",
            f"{median['total']:.3f}", f"{median['reduce']:.3f}",
        ])  # fmt: skip

    if accelerator.is_main_process:
        print(f"Machine: {describe_machine(device)}")
        print(
            f"{world} processes ({torch.distributed.get_backend()}), {device}; τ_p = {PROB_THRESHOLD}, "
            f"q = {ENTROPY_QUANTILE}, target candidate rate {args.candidate_rate:.2%}; median over {args.repeats} "
            f"calls after {args.warmup} warm-up calls, each call timed on its slowest process\n"
        )
        print(markdown_table(COLUMNS, rows), flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
