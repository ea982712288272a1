"""Evaluate checkpoints on the math benchmarks as the STAPO paper does; print a table laid out like its Table 2.

    # The paper's protocol: six benchmarks (shipped with the package), both decodings, 20,480 new tokens
    python examples/evaluate_math.py --model STAPO=outputs/Qwen3-1.7B-Base-stapo --model Base=Qwen/Qwen3-1.7B-Base \\
        --output_dir eval_out

    # A smoke run: two benchmarks, 3 problems, 2 samples, short answers, one decoding
    python examples/evaluate_math.py --model toy --output_dir eval_smoke \\
        --benchmarks AIME24 MATH500 --max_problems 3 --num_samples 2 --max_new_tokens 64 --presets t1.0

    # Grade the stored completions again (no generation); add a model verifier to the rules, or drop it
    python examples/evaluate_math.py --model STAPO=outputs/Qwen3-1.7B-Base-stapo --output_dir eval_out --regrade \\
        --verifier --verifier_prompt compassverifier_prompt.txt

Each model gets ``<output_dir>/<name>/`` (samples.jsonl, run.json, summary.json, summary.md); rerunning the same
command resumes. The table of all models goes to ``<output_dir>/table.md`` and ``table.json``. See
docs/evaluation.md.
"""

from stapo_trl.evaluation.cli import run


if __name__ == "__main__":
    run(task="math", description=__doc__)
