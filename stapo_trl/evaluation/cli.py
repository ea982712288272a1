"""The evaluation command line (``examples/evaluate_math.py``, ``examples/evaluate_code.py``): models → one table.

Each model gets ``<output_dir>/<name>/`` (samples.jsonl, run.json, summary.json, summary.md); rerunning the same
command resumes. The table of all models goes to ``<output_dir>/table.md`` and ``table.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..cli import UsageError, check_hub_repo, check_model_source
from .generation import BACKENDS
from .grading import DEFAULT_VERIFIER, KEEP, VerifierConfig
from .presets import PRESETS
from .run import EvalConfig, evaluate, model_display_name, model_output_dir, regrade
from .summary import markdown_table
from .tasks import get_task


TOY = "toy"


def parse_args(argv=None, task: str = "math", description: str | None = None) -> argparse.Namespace:
    defaults = get_task(task)
    names = " ".join(defaults.benchmarks)
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="Hub id, local checkpoint, PEFT adapter directory, or 'toy'; NAME=PATH sets the table row name (and "
        "the name of the model's directory inside --output_dir). Repeat for several models (one table).",
    )
    parser.add_argument("--output_dir", default="eval_out")
    parser.add_argument(
        "--benchmarks_dir",
        default=None,
        help="Directory of benchmark files named as in the registry. Default: "
        + (
            "the six files shipped with the package."
            if defaults.shipped_dir
            else "none: the code benchmarks are local files (docs/evaluation.md says where to get them), so give "
            "this directory or NAME=PATH for each benchmark."
        ),
    )
    parser.add_argument(
        "--benchmarks",
        nargs="+",
        default=None,
        help="Registry names, or NAME=SOURCE[,problem=F][,answer=F][,id=F][,split=S][,layout=L][,n=N] to point a "
        f"benchmark at a local file, a Hub id, or 'hub' (the registry's Hub dataset). Default: {names}.",
    )
    parser.add_argument(
        "--num_samples",
        nargs="+",
        default=None,
        help="N for every benchmark, and/or NAME=N (default: the registry's).",
    )
    parser.add_argument(
        "--presets",
        nargs="+",
        default=None,
        help=f"{', '.join(PRESETS)}, or T:top_p (e.g. 0.6:0.95). Default: {' '.join(defaults.presets)}.",
    )
    parser.add_argument("--max_new_tokens", type=int, default=None, help=f"Default: {defaults.max_new_tokens}.")
    parser.add_argument("--max_problems", type=int, default=None, help="Only the first K problems of each benchmark.")
    parser.add_argument("--batch_size", type=int, default=None, help="Default: 16 (transformers), 1024 (vLLM).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: vLLM when installed.")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tensor_parallel_size", type=int, default=None, help="vLLM only.")
    parser.add_argument("--gpu_memory_utilization", type=float, default=None, help="vLLM only.")
    parser.add_argument("--max_model_len", type=int, default=None, help="vLLM only.")
    parser.add_argument("--overwrite", action="store_true", help="Discard stored samples instead of resuming.")
    parser.add_argument("--regrade", action="store_true", help="Only grade the stored completions again.")
    parser.add_argument(
        "--verification_timeout",
        type=float,
        default=None,
        help="Seconds per answer (math-verify) or per test program (code sandbox); default: the reward's own.",
    )
    if task == "math":
        parser.add_argument(
            "--verifier",
            nargs="?",
            const=DEFAULT_VERIFIER,
            default=None,
            help="Send the answers the rules judge wrong to a model verifier (evaluation only; the table then shows "
            f"both numbers): a causal LM's Hub id or path, default {DEFAULT_VERIFIER}. Needs --verifier_prompt.",
        )
        parser.add_argument(
            "--verifier_prompt",
            default=None,
            help="Text file with the verifier's prompt, with {question}, {gold_answer} and {llm_response} (not "
            "shipped: CompassVerifier's prompt carries no license; see docs/evaluation.md).",
        )
        parser.add_argument("--verifier_max_new_tokens", type=int, default=32)
        parser.add_argument("--verifier_backend", choices=BACKENDS, default="auto")
        parser.add_argument(
            "--drop_verifier", action="store_true", help="With --regrade: remove the stored verifier verdicts."
        )
    args = parser.parse_args(argv)
    args.task = task
    return args


def _num_samples(values, registry):
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
        return {**{name: default for name in registry}, **per_benchmark}
    return per_benchmark


def _verifier(args) -> VerifierConfig | str | None:
    if args.task != "math":
        return None if not args.regrade else KEEP
    if args.drop_verifier:
        return None
    if args.verifier is None:
        return None if not args.regrade else KEEP
    config = VerifierConfig(
        prompt_file=args.verifier_prompt,
        model=args.verifier,
        backend=args.verifier_backend,
        max_new_tokens=args.verifier_max_new_tokens,
    )
    config.check()
    return config


def _models(args) -> list[tuple[str, str, Path]]:
    """(row name, model path or Hub id, its directory in --output_dir) of each --model, each checked to be loadable
    now (a local model, or a Hub id in the cache or reachable), so that a wrong one fails before anything is run."""
    models = []
    for spec in args.model:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        if path == TOY:
            from ..toy import toy_checkpoint

            path, name = toy_checkpoint(), name or TOY
        elif not args.regrade:
            check_model_source(path, flag="--model")
        name = name or model_display_name(path)
        models.append((name, path, model_output_dir(args.output_dir, name)))
    return models


def _check_benchmark_sources(args) -> None:
    """Each benchmark's source exists: a local file, or a Hub dataset in the cache or reachable."""
    task = get_task(args.task)
    for spec in args.benchmarks or task.benchmarks:
        benchmark = task.parse_benchmark(spec)
        if task.shipped_dir is None and args.benchmarks_dir is None and benchmark.source is None:
            files = ", ".join(b.file for b in task.benchmarks.values() if b.file)
            raise UsageError(
                f"--benchmarks_dir: the {task.name} benchmarks are read from local files (docs/evaluation.md says "
                f"where to get them): pass the directory holding {files}, or NAME=PATH for each of --benchmarks."
            )
        source = task.source(benchmark, args.benchmarks_dir)
        if Path(source).expanduser().exists():
            continue
        if task.shipped_dir is None:  # the code benchmarks are read from local files only
            raise UsageError(f"--benchmarks {benchmark.name}: no file {source}.")
        check_hub_repo(source, "dataset", f"--benchmarks {benchmark.name}")


def main(argv=None, task: str = "math", description: str | None = None) -> dict:
    """Evaluate every --model and print the table. A wrong model, benchmark, verifier or output name raises
    `UsageError` (a `ValueError`) before any model is loaded or anything is written."""
    args = parse_args(argv, task, description)
    try:
        verifier = _verifier(args)
        models = _models(args)
        if not args.regrade:
            _check_benchmark_sources(args)
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    vllm_kwargs = {
        key: getattr(args, key)
        for key in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len")
        if getattr(args, key) is not None
    }
    summaries = {}
    for name, path, model_dir in models:
        if args.regrade:
            summary = regrade(model_dir, args.verification_timeout, verifier)
        else:
            config = EvalConfig(
                output_dir=str(model_dir),
                task=args.task,
                benchmarks_dir=args.benchmarks_dir,
                benchmarks=args.benchmarks,
                num_samples=_num_samples(args.num_samples, get_task(args.task).benchmarks),
                presets=args.presets,
                max_new_tokens=args.max_new_tokens,
                max_problems=args.max_problems,
                batch_size=args.batch_size,
                seed=args.seed,
                backend=args.backend,
                dtype=args.dtype,
                model_name=name,
                overwrite=args.overwrite,
                verification_timeout=args.verification_timeout,
                verifier=verifier,
                vllm_kwargs=vllm_kwargs,
            )
            summary = evaluate(path, config)
        summaries[name] = summary
    table = markdown_table(summaries)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    Path(args.output_dir, "table.md").write_text(table)
    Path(args.output_dir, "table.json").write_text(json.dumps(summaries, indent=2, ensure_ascii=False))
    print(table)
    return summaries


def run(task: str, description: str | None = None) -> None:
    """The evaluation scripts' entry point: `main`, with a `UsageError` printed as one line (status 2)."""
    try:
        main(task=task, description=description)
    except UsageError as error:
        print(f"{Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
