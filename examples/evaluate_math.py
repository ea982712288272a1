"""Evaluate checkpoints as the STAPO paper does and print a table laid out like its Table 2.

    # The paper's protocol on the shared benchmark files: six benchmarks, both decodings, 20,480 new tokens
    python examples/evaluate_math.py --model outputs/Qwen3-1.7B-Base-stapo --model Qwen/Qwen3-1.7B-Base \\
        --benchmarks_dir ../shared/data/math_eval --output_dir eval_out

    # A smoke run: two benchmarks, 3 problems, 2 samples, short answers, one decoding
    python examples/evaluate_math.py --model toy --benchmarks_dir ../shared/data/math_eval --output_dir eval_smoke \\
        --benchmarks AIME24 MATH500 --max_problems 3 --num_samples 2 --max_new_tokens 64 --presets t1.0

    # Grade the stored completions again (no generation), e.g. after a verifier change
    python examples/evaluate_math.py --model outputs/Qwen3-1.7B-Base-stapo --output_dir eval_out --regrade

Each model gets ``<output_dir>/<name>/`` (samples.jsonl, run.json, summary.json, summary.md); rerunning the same
command resumes. The table of all models goes to ``<output_dir>/table.md`` and ``table.json``. See
docs/evaluation.md.
"""

import argparse
import json
import logging
import re
from pathlib import Path

from stapo_trl.evaluation import (
    PAPER_BENCHMARKS,
    PRESETS,
    EvalConfig,
    evaluate,
    markdown_table,
    model_display_name,
    regrade,
)

TOY = "toy"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="Hub id, local checkpoint, PEFT adapter directory, or 'toy'; NAME=PATH sets the table row name. "
        "Repeat for several models (one table).",
    )
    parser.add_argument("--output_dir", default="eval_out")
    parser.add_argument(
        "--benchmarks_dir", default=None, help="Directory of veRL parquet files (AIME24.parquet, ...); default: Hub."
    )
    parser.add_argument(
        "--benchmarks",
        nargs="+",
        default=list(PAPER_BENCHMARKS),
        help="Registry names, or NAME=SOURCE[,problem=F][,answer=F][,id=F][,split=S][,n=N] to override a source "
        f"or add a benchmark. Default: {' '.join(PAPER_BENCHMARKS)}.",
    )
    parser.add_argument(
        "--num_samples", nargs="+", default=None, help="N for every benchmark, and/or NAME=N (default: 32 / 4)."
    )
    parser.add_argument(
        "--presets", nargs="+", default=list(PRESETS), help="t1.0, t0.7, or T:top_p (e.g. 0.6:0.95)."
    )
    parser.add_argument("--max_new_tokens", type=int, default=20480)
    parser.add_argument("--max_problems", type=int, default=None, help="Only the first K problems of each benchmark.")
    parser.add_argument("--batch_size", type=int, default=None, help="Default: 16 (transformers), 1024 (vLLM).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["auto", "vllm", "transformers"], default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tensor_parallel_size", type=int, default=None, help="vLLM only.")
    parser.add_argument("--gpu_memory_utilization", type=float, default=None, help="vLLM only.")
    parser.add_argument("--overwrite", action="store_true", help="Discard stored samples instead of resuming.")
    parser.add_argument("--regrade", action="store_true", help="Only grade the stored completions again.")
    return parser.parse_args(argv)


def _num_samples(values):
    if not values:
        return None
    per_benchmark, default = {}, None
    for value in values:
        name, has_name, n = value.rpartition("=")
        if has_name:
            per_benchmark[name] = int(n)
        else:
            default = int(n)
    if not per_benchmark:
        return default
    if default is not None:
        from stapo_trl.evaluation import BENCHMARKS

        return {**{name: default for name in BENCHMARKS}, **per_benchmark}
    return per_benchmark


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    vllm_kwargs = {
        key: value
        for key, value in (
            ("tensor_parallel_size", args.tensor_parallel_size),
            ("gpu_memory_utilization", args.gpu_memory_utilization),
        )
        if value is not None
    }
    summaries = {}
    for spec in args.model:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        if path == TOY:
            from stapo_trl.toy import toy_checkpoint

            path, name = toy_checkpoint(), name or TOY
        name = name or model_display_name(path)
        model_dir = Path(args.output_dir) / re.sub(r"[^\w.-]+", "__", name)
        if args.regrade:
            summary = regrade(model_dir)
        else:
            config = EvalConfig(
                output_dir=str(model_dir),
                benchmarks_dir=args.benchmarks_dir,
                benchmarks=args.benchmarks,
                num_samples=_num_samples(args.num_samples),
                presets=args.presets,
                max_new_tokens=args.max_new_tokens,
                max_problems=args.max_problems,
                batch_size=args.batch_size,
                seed=args.seed,
                backend=args.backend,
                dtype=args.dtype,
                model_name=name,
                overwrite=args.overwrite,
                vllm_kwargs=vllm_kwargs,
            )
            summary = evaluate(path, config)
        summaries[name] = summary
    table = markdown_table(summaries)
    Path(args.output_dir, "table.md").write_text(table)
    Path(args.output_dir, "table.json").write_text(json.dumps(summaries, indent=2, ensure_ascii=False))
    print(table)
    return summaries


if __name__ == "__main__":
    main()
