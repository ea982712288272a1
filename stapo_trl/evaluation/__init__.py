"""Evaluation as in the STAPO paper: avg@N on the math (Table 2) and code (Table 3) benchmarks, graded like training.

One core and two task definitions:

- `benchmarks`: what a benchmark is, ``NAME=SOURCE`` specs, where its problems are read from.
- `task`: what a task holds (registry, default protocol, problem reader, rule grader); `math_task` and
  `code_task` are the two; `tasks` names them.
- `presets`: the decoding presets (plain Python, no torch).
- `generation`: per-sample seeds, the transformers and vLLM backends.
- `store`: the run directory (``samples.jsonl`` appended as samples are graded, ``run.json`` written atomically).
- `grading`: the task's rules, then, for math and only when asked, a model verifier.
- `summary`: avg@N summaries and Markdown tables laid out like the paper's.
- `run`: `evaluate` (resumable) and `regrade`.
- `callback`: `BenchmarkEvalCallback`, avg@k during training.
"""

# Loaded on first use, so that the light parts (presets, benchmark specs, summaries of stored runs) do not import torch.
_EXPORTS = {
    "Benchmark": ".benchmarks",
    "HUB_SOURCE": ".benchmarks",
    "BenchmarkEvalCallback": ".callback",
    "reshard_fsdp_modules": ".callback",
    "CODE": ".code_task",
    "grade_programs": ".code_task",
    "Generation": ".generation",
    "SeededSampler": ".generation",
    "TransformersBackend": ".generation",
    "VLLMBackend": ".generation",
    "generate_completions": ".generation",
    "generate_seeded": ".generation",
    "load_model_for_evaluation": ".generation",
    "make_backend": ".generation",
    "sample_seed": ".generation",
    "vllm_available": ".generation",
    "DEFAULT_VERIFIER": ".grading",
    "KEEP": ".grading",
    "VerifierConfig": ".grading",
    "apply_verifier": ".grading",
    "parse_verdict": ".grading",
    "verifier_prompt": ".grading",
    "BENCHMARKS": ".math_task",
    "MATH": ".math_task",
    "PAPER_BENCHMARKS": ".math_task",
    "SHIPPED_BENCHMARKS_DIR": ".math_task",
    "grade_completions": ".math_task",
    "load_benchmark": ".math_task",
    "parse_benchmark": ".math_task",
    "sampled_accuracy": ".math_task",
    "PRESETS": ".presets",
    "Preset": ".presets",
    "parse_preset": ".presets",
    "EvalConfig": ".run",
    "evaluate": ".run",
    "model_display_name": ".run",
    "model_output_dir": ".run",
    "regrade": ".run",
    "RUN_FILE": ".store",
    "SAMPLES_FILE": ".store",
    "SUMMARY_JSON": ".store",
    "SUMMARY_MD": ".store",
    "read_samples": ".store",
    "markdown_table": ".summary",
    "summarize": ".summary",
    "Task": ".task",
    "TASKS": ".tasks",
    "get_task": ".tasks",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
