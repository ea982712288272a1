"""Evaluation as in the STAPO paper: avg@N on the math (Table 2) and code (Table 3) benchmarks, graded like training.

One core and two task definitions:

- `benchmarks`: what a benchmark is, ``NAME=SOURCE`` specs, where its problems are read from.
- `task`: what a task holds (registry, default protocol, problem reader, rule grader); `math_task` and
  `code_task` are the two; `tasks` names them.
- `generation`: decoding presets, per-sample seeds, the transformers and vLLM backends.
- `store`: the run directory (``samples.jsonl`` appended as samples are graded, ``run.json`` written atomically).
- `grading`: the task's rules, then, for math and only when asked, a model verifier.
- `summary`: avg@N summaries and Markdown tables laid out like the paper's.
- `run`: `evaluate` (resumable) and `regrade`.
- `callback`: `BenchmarkEvalCallback`, avg@k during training.
"""

from .benchmarks import HUB_SOURCE, Benchmark
from .callback import BenchmarkEvalCallback, reshard_fsdp_modules
from .code_task import CODE, grade_programs
from .generation import (
    PRESETS,
    Generation,
    Preset,
    SeededSampler,
    TransformersBackend,
    VLLMBackend,
    generate_completions,
    generate_seeded,
    load_model_for_evaluation,
    make_backend,
    parse_preset,
    sample_seed,
    vllm_available,
)
from .grading import (
    DEFAULT_VERIFIER,
    KEEP,
    VerifierConfig,
    apply_verifier,
    parse_verdict,
    verifier_prompt,
)
from .math_task import (
    BENCHMARKS,
    MATH,
    PAPER_BENCHMARKS,
    SHIPPED_BENCHMARKS_DIR,
    grade_completions,
    load_benchmark,
    parse_benchmark,
    sampled_accuracy,
)
from .run import EvalConfig, evaluate, model_display_name, model_output_dir, regrade
from .store import RUN_FILE, SAMPLES_FILE, SUMMARY_JSON, SUMMARY_MD, read_samples
from .summary import markdown_table, summarize
from .task import Task
from .tasks import TASKS, get_task


__all__ = [
    "BENCHMARKS",
    "CODE",
    "DEFAULT_VERIFIER",
    "HUB_SOURCE",
    "KEEP",
    "MATH",
    "PAPER_BENCHMARKS",
    "PRESETS",
    "RUN_FILE",
    "SAMPLES_FILE",
    "SHIPPED_BENCHMARKS_DIR",
    "SUMMARY_JSON",
    "SUMMARY_MD",
    "TASKS",
    "Benchmark",
    "BenchmarkEvalCallback",
    "EvalConfig",
    "Generation",
    "Preset",
    "SeededSampler",
    "Task",
    "TransformersBackend",
    "VLLMBackend",
    "VerifierConfig",
    "apply_verifier",
    "evaluate",
    "generate_completions",
    "generate_seeded",
    "get_task",
    "grade_completions",
    "grade_programs",
    "load_benchmark",
    "load_model_for_evaluation",
    "make_backend",
    "markdown_table",
    "model_display_name",
    "model_output_dir",
    "parse_benchmark",
    "parse_preset",
    "parse_verdict",
    "read_samples",
    "regrade",
    "reshard_fsdp_modules",
    "sample_seed",
    "sampled_accuracy",
    "summarize",
    "verifier_prompt",
    "vllm_available",
]
