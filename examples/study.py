"""A small-scale study anyone can rerun on a CPU: STAPO against its baselines on the offline toy task.

Every run is `examples/train_math.py` with the offline recipe (examples/recipes/toy/stapo_cpu.yaml) and another
`--method` / `--seed`, so the study exercises the same code paths as a real run. Results (per run and per method,
mean ± std over seeds) and overlaid training curves (averaged over seeds) go to `--report_dir`.

    python examples/study.py                                  # 7 methods x 3 seeds, 150 steps each
    python examples/study.py --max_steps 20 --seeds 0 --methods stapo justrl --report_dir /tmp/study   # a smoke run

Runs are ordered seed by seed, so a study stopped by `--budget_minutes` still has every method at the seeds it
finished. A finished run (its results.json exists) is not run again.
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


HERE = Path(__file__).resolve().parent
RECIPE = HERE / "recipes" / "toy" / "stapo_cpu.yaml"
METHODS = ["stapo", "justrl", "justrl_fullmask", "20_entropy", "grpo", "high_entropy_mask", "random_mask"]
# Per-run summaries taken from the training logs.
LOG_SUMMARIES = {
    "final_entropy": "entropy",
    "final_reward": "reward",
    "mean_silenced_ratio": "spurious/silenced_ratio",
    "mean_candidate_ratio": "spurious/candidate_ratio",
    "final_mean_length": "completions/mean_length",
}
# Table 1 per run (stapo_trl.diagnostics.mechanism_report.run_table): the low-probability quadrants and the
# high-probability, high-entropy one, where the gradient goes and how the entropy moves.
TABLE_1_COLUMNS = [
    (group, column)
    for group in ("low_prob_low_entropy", "low_prob_high_entropy", "high_prob_low_entropy", "high_prob_high_entropy")
    for column in ("token_share", "grad_norm_share", "entropy_change")
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max_steps", type=int, default=150)
    parser.add_argument("--runs_dir", default="outputs/study", help="Where the runs (checkpoints, logs) go.")
    parser.add_argument("--report_dir", default="docs/study", help="Where the small CSV/JSON/PNG results go.")
    parser.add_argument("--workers", type=int, default=2, help="Runs at a time, one CPU thread each.")
    parser.add_argument("--budget_minutes", type=float, default=None, help="Start no run after this much time.")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="After --: more train_math.py arguments.")
    return parser.parse_args(argv)


def run_one(method, seed, args, deadline):
    output_dir = Path(args.runs_dir) / f"{method}-seed{seed}"
    if (output_dir / "results.json").is_file():
        return output_dir
    if deadline is not None and time.monotonic() > deadline:
        return None
    command = [
        sys.executable, str(HERE / "train_math.py"), "--config", str(RECIPE), "--method", method,
        "--seed", str(seed), "--max_steps", str(args.max_steps), "--output_dir", str(output_dir),
        "--save_strategy", "no", "--logging_steps", "10", "--disable_tqdm", "true",
        "--overwrite_output_dir", "true",  # the folder holds train.log; an unfinished run starts over
        "--spurious_mechanism_metrics", "true",  # the paper's Table 1, logged for every method
        *[a for a in args.extra if a != "--"],
    ]  # fmt: skip
    environment = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / "train.log", "w") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"{method} seed {seed} failed (exit {result.returncode}); see {output_dir / 'train.log'}")
    print(f"done: {method} seed {seed} -> {output_dir}", flush=True)
    return output_dir


def log_history(run_dir):
    return json.loads((Path(run_dir) / "trainer_state.json").read_text())["log_history"]


def summarize_run(run_dir):
    from stapo_trl.diagnostics.mechanism_report import run_table

    results = json.loads((Path(run_dir) / "results.json").read_text())
    history = [entry for entry in log_history(run_dir) if "loss" in entry]
    tail = history[-max(1, len(history) // 10) :]  # "final": the last 10% of the logged steps
    for name, key in LOG_SUMMARIES.items():
        values = [e[key] for e in (history if name.startswith("mean_") else tail) if e.get(key) is not None]
        results[name] = statistics.fmean(values) if values else None
    table = run_table(history)  # the paper's Table 1 over the whole run
    for group, column in TABLE_1_COLUMNS:
        results[f"{group}/{column}"] = table[group][column]
    return results


def mean_logs(run_dirs, output_dir):
    """Average the logged metrics of several seeds step by step, written as a trainer_state.json for plotting."""
    by_step = {}
    for run_dir in run_dirs:
        for entry in log_history(run_dir):
            if "loss" in entry:
                by_step.setdefault(entry["step"], []).append(entry)
    averaged = []
    for step, entries in sorted(by_step.items()):
        keys = {k for e in entries for k, v in e.items() if isinstance(v, (int, float))}
        mean = {k: statistics.fmean([e[k] for e in entries if e.get(k) is not None]) for k in keys}
        averaged.append(dict(mean, step=step))
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / "trainer_state.json").write_text(json.dumps({"log_history": averaged}))
    return output_dir


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def write_report(runs, args):
    from stapo_trl.diagnostics.mechanism_report import write_mechanism_report
    from stapo_trl.diagnostics.plots import plot_runs

    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = [summarize_run(run_dir) for run_dir in runs]
    columns = [
        "method",
        "seed",
        "steps",
        "heldout_accuracy_before",
        "heldout_accuracy_after",
        *LOG_SUMMARIES,
        *(f"{group}/{column}" for group, column in TABLE_1_COLUMNS),
        "seconds",
    ]
    with open(report_dir / "runs.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)

    summary, curves = {}, {}
    table_keys = [f"{group}/{column}" for group, column in TABLE_1_COLUMNS]
    for method in args.methods:
        method_rows = [r for r in rows if r["method"] == method]
        if not method_rows:
            continue
        summary[method] = {"seeds": len(method_rows)}
        for key in ["heldout_accuracy_before", "heldout_accuracy_after", *LOG_SUMMARIES, *table_keys]:
            summary[method][key] = mean_std([r.get(key) for r in method_rows])
        method_runs = [run for run in runs if run.name.startswith(f"{method}-seed")]
        curves[method] = mean_logs(method_runs, Path(args.runs_dir) / "mean" / method)
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def cell(value, scale=1.0, digits=3):
        mean, std = value
        return "–" if mean is None else f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"

    lines = [
        "| method | seeds | held-out acc. before | held-out acc. after | final entropy | silenced ratio (%) | "
        "candidate ratio (%) | final mean length |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, values in summary.items():
        lines.append(
            f"| {method} | {values['seeds']} | {cell(values['heldout_accuracy_before'])} | "
            f"{cell(values['heldout_accuracy_after'])} | {cell(values['final_entropy'])} | "
            f"{cell(values['mean_silenced_ratio'], 100, 4)} | {cell(values['mean_candidate_ratio'], 100, 4)} | "
            f"{cell(values['final_mean_length'], 1, 1)} |"
        )
    # Table 1 per method: share of the positive-advantage tokens, of their gradient norm, and mean entropy change
    # per unit step, for each quadrant (P vs τ_p, H vs τ_h).
    lines += [
        "",
        "| method | quadrant | token share (%) | gradient-norm share (%) | entropy change per token |",
        "|---|---|---|---|---|",
    ]
    for method, values in summary.items():
        for group, _ in TABLE_1_COLUMNS[::3]:
            lines.append(
                f"| {method} | {group} | {cell(values[f'{group}/token_share'], 100, 4)} | "
                f"{cell(values[f'{group}/grad_norm_share'], 100, 3)} | "
                f"{cell(values[f'{group}/entropy_change'], 1, 5)} |"
            )
    table = "\n".join(lines) + "\n"
    (report_dir / "results.md").write_text(table)
    runs_by_method = {method: str(path) for method, path in curves.items()}
    plots = plot_runs(runs_by_method, report_dir)
    mechanism = write_mechanism_report(runs_by_method, report_dir / "table1.md")
    print(table)
    print("Plots:", ", ".join(str(p) for p in plots), "; Table 1:", mechanism)


def main(argv=None):
    args = parse_args(argv)
    start = time.monotonic()
    deadline = None if args.budget_minutes is None else start + 60 * args.budget_minutes
    jobs = [(method, seed) for seed in args.seeds for method in args.methods]
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        runs = [run for run in pool.map(lambda job: run_one(*job, args, deadline), jobs) if run is not None]
    print(f"{len(runs)} of {len(jobs)} runs in {(time.monotonic() - start) / 60:.1f} min")
    write_report(runs, args)


if __name__ == "__main__":
    main()
