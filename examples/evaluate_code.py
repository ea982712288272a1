"""Evaluate checkpoints on HumanEval+, MBPP+ and LiveCodeBench v6 as the STAPO paper does (its Table 3).

    # avg@4 at T = 0.7 / top-p 0.9 on the three benchmarks, read from a directory holding HumanEvalPlus.jsonl,
    # MbppPlus.jsonl and livecodebench_v6.jsonl (EvalPlus release files and a code_generation_lite file holding the
    # v6 problems), each graded as its own harness grades it
    python examples/evaluate_code.py --model STAPO=outputs/Qwen3-1.7B-Base-code-stapo --benchmarks_dir code_eval \\
        --output_dir eval_code

    # The tiny records shipped for tests, with the offline toy model
    python examples/evaluate_code.py --model toy --benchmarks_dir stapo_trl/evaluation/samples \\
        --output_dir eval_code_smoke --max_new_tokens 64

    # One benchmark from another file (public and private tests; the pickled private tests load in the sandbox)
    python examples/evaluate_code.py --model X --benchmarks LiveCodeBench=data/test6.jsonl

Each model gets ``<output_dir>/<name>/`` (samples.jsonl, run.json, summary.json, summary.md); rerunning the same
command resumes; --regrade runs the stored programs again without generating. See docs/evaluation.md.
"""

from stapo_trl.evaluation.cli import run


if __name__ == "__main__":
    run(task="code", description=__doc__)
