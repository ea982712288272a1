"""How far TRL's DAPO normalizer is from each optimizer step's own token count, by simulation (no model).

    python benchmarks/normalizer_scale.py                       # the shipped recipes' batch layouts

With `loss_type="dapo"`, TRL divides every micro-batch's loss by `num_items_in_batch / num_processes x
gradient_accumulation_steps / steps_per_generation`: the generation batch's loss tokens shared equally among its
`steps_per_generation / gradient_accumulation_steps` optimizer steps. When that ratio is 1, each step is divided by its
own count: Eq. 4 (Eq. 6 with STAPOTrainer's keep ratio) exactly. Otherwise step j's gradient is Eq. 6's scaled by
L_j / mean_j(L_j), where L_j counts the loss tokens of step j; this script measures that factor.

Layout as TRL builds it: each process holds `per_device_train_batch_size x steps_per_generation` completions of
whole prompt groups (`RepeatSampler`), shuffles them (`shuffle_sequence_dict`) and splits them into
`steps_per_generation` micro-batches (`split_tensor_dict`); step j takes micro-batches j x accumulation ... on every
process. Completion lengths (an assumption, stated in the output): each prompt has a typical length drawn
log-normally (median `--median-length`, log-sd `--prompt-sigma`), its G completions vary log-normally around it
(`--completion-sigma`), capped at `max_completion_length` (a capped completion keeps its tokens, as when
`mask_truncated_completions=False`).
"""

import argparse
import math

import torch
from _common import markdown_table
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict


# name: (processes, per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation, max length)
LAYOUTS = {
    "Qwen3-1.7B recipe, 64 GPUs": (64, 2, 4, 16, 15360),
    "Qwen3-1.7B recipe, 8 GPUs": (8, 2, 32, 128, 15360),
    "one-GPU LoRA recipe": (1, 4, 8, 32, 5120),
}


def step_factors(processes, batch, accumulation, steps_per_generation, max_length, args, generator) -> list[float]:
    """L_j / mean(L) for the optimizer steps of one generation batch."""
    per_process = batch * steps_per_generation
    prompts = processes * per_process // args.num_generations
    typical = torch.exp(math.log(args.median_length) + args.prompt_sigma * torch.randn(prompts, generator=generator))
    lengths = typical.repeat_interleave(args.num_generations) * torch.exp(
        args.completion_sigma * torch.randn(prompts * args.num_generations, generator=generator)
    )
    lengths = lengths.round().clamp(1, max_length)
    steps = torch.zeros(steps_per_generation // accumulation)
    for rank in range(processes):
        local = {"length": lengths[rank * per_process : (rank + 1) * per_process]}
        micro_batches = split_tensor_dict(shuffle_sequence_dict(local), steps_per_generation)
        for index, micro_batch in enumerate(micro_batches):
            steps[index // accumulation] += micro_batch["length"].sum()
    return (steps / steps.mean()).tolist()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generations", type=int, default=500, help="generation batches simulated per layout")
    parser.add_argument("--num-generations", type=int, default=8, help="G")
    parser.add_argument("--median-length", type=float, default=2000.0)
    parser.add_argument("--prompt-sigma", type=float, default=0.8)
    parser.add_argument("--completion-sigma", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)  # shuffle_sequence_dict draws from the global generator
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for name, layout in LAYOUTS.items():
        factors = torch.tensor(
            [f for _ in range(args.generations) for f in step_factors(*layout, args, generator)], dtype=torch.float64
        )
        deviation = (factors - 1).abs()
        processes, batch, accumulation, steps_per_generation, max_length = layout
        rows.append([
            name, f"{processes} x {batch} x {accumulation}", f"{steps_per_generation // accumulation}",
            f"{(factors - 1).std().item():.4f}", f"{deviation.quantile(0.5).item():.4f}",
            f"{deviation.quantile(0.95).item():.4f}", f"{deviation.max().item():.4f}",
        ])  # fmt: skip
    print(
        f"Completion lengths: prompt median {args.median_length:g} tokens, log-sd {args.prompt_sigma} between prompts "
        f"and {args.completion_sigma} within a group of {args.num_generations}, capped at the recipe's maximum; "
        f"{args.generations} generation batches per layout; seed {args.seed}\n"
    )
    columns = ["layout", "processes x batch x accumulation", "steps per generation", "sd of factor",
               "median abs(factor - 1)", "p95 abs(factor - 1)", "max abs(factor - 1)"]  # fmt: skip
    print(markdown_table(columns, rows))


if __name__ == "__main__":
    main()
