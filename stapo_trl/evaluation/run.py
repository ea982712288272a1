"""An evaluation run: generate the samples not done yet, grade them, append them, summarise; and regrade.

`evaluate(model_path, EvalConfig(...))` loads the problems, skips the samples already in
``<output_dir>/samples.jsonl`` (same benchmark, preset, problem id and sample index, generated with the same
decoding), generates the rest with the backend, grades each batch by the task's rules and appends its records at
once; then, when asked, sends the rule negatives to the model verifier (`grading`). An interrupted run resumes
where it stopped; a sample whose generation or grading fails is recorded with an ``error`` and retried on the next
run. `regrade(output_dir)` grades the stored completions again without generating.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .benchmarks import Benchmark
from .generation import Generation, make_backend, sample_seed
from .grading import KEEP, VerifierConfig, apply_verifier, grade_rules
from .presets import Preset, parse_preset
from .store import (
    SAMPLES_FILE,
    append_records,
    check_resumable,
    finished_samples,
    latest,
    read_run,
    read_samples,
    write_run,
    write_samples,
)
from .summary import summarize
from .task import Task
from .tasks import get_task


logger = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """What `evaluate` measures and how. The defaults (None) are the paper's protocol for the task.

    Attributes:
        output_dir: where ``samples.jsonl``, ``run.json``, ``summary.json`` and ``summary.md`` go (one model per
            directory). Rerunning with the same directory resumes.
        task: ``"math"`` (Table 2) or ``"code"`` (Table 3).
        benchmarks_dir: a directory of benchmark files named as in the task's registry; None = the files the
            package ships (math), else each benchmark's public source.
        benchmarks: registry names, ``NAME=SOURCE,...`` specs (`parse_benchmark`) or `Benchmark` objects; None =
            all of the task's.
        num_samples: samples per problem: one number for every benchmark, or ``{name: n}``; None = the registry's
            (math: 32 for AIME24/AIME25/AMC23, 4 for the others; code: 4).
        presets: `PRESETS` names, ``"T:top_p"`` specs or `Preset` objects; None = the task's (math: both
            decodings; code: T=0.7 / top-p 0.9).
        max_new_tokens: generation limit; None = the task's (math: the paper's 20,480).
        max_problems: evaluate only the first K problems of each benchmark (smoke runs).
        batch_size: requests per generation call (default: 16 with transformers, 1024 with vLLM).
        seed: the run's seed; each sample's seed derives from it (`sample_seed`).
        backend: ``"auto"`` (vLLM if installed), ``"vllm"`` or ``"transformers"``.
        dtype: model dtype (``"auto"``: the checkpoint's).
        model_name: the model's row name in tables (default: derived from the path).
        overwrite: discard the samples already in `output_dir` instead of resuming.
        retry_errors: regenerate samples recorded with an error when resuming.
        verification_timeout: seconds per answer for `math_reward` (default: its own, 5 s); per test program for
            the code sandbox (default: its own).
        verifier: math only: a `VerifierConfig` to send the rule negatives to a model verifier (off by default).
        vllm_kwargs: extra ``vllm.LLM`` arguments.
    """

    output_dir: str
    task: str = "math"
    benchmarks_dir: str | None = None
    benchmarks: Sequence[str | Benchmark] | None = None
    num_samples: int | Mapping[str, int] | None = None
    presets: Sequence[str | Preset] | None = None
    max_new_tokens: int | None = None
    max_problems: int | None = None
    batch_size: int | None = None
    seed: int = 0
    backend: str = "auto"
    dtype: str = "auto"
    model_name: str | None = None
    overwrite: bool = False
    retry_errors: bool = True
    verification_timeout: float | None = None
    verifier: VerifierConfig | None = None
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        task = get_task(self.task)
        if self.benchmarks is None:
            self.benchmarks = tuple(task.benchmarks)
        if self.presets is None:
            self.presets = task.presets
        if self.max_new_tokens is None:
            self.max_new_tokens = task.max_new_tokens
        if self.verifier is not None and task.name != "math":
            raise ValueError("verifier: the model verifier grades math answers only; drop it for the code task")

    def task_options(self) -> dict[str, Any]:
        """What the task's readers and graders are told (the per-answer timeout)."""
        return {"verification_timeout": self.verification_timeout}


def model_display_name(model_path: str) -> str:
    """A short row name: a Hub id as is, a local path as its last two components (``run/checkpoint-500``)."""
    path = Path(model_path)
    if not path.exists():
        return model_path
    parts = path.resolve().parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(path)


def model_output_dir(output_dir: str | os.PathLike, model_name: str) -> Path:
    """The directory of one model's run inside `output_dir`, named after its row name, never outside it.

    Path separators and any other character outside ``[A-Za-z0-9_.-]`` become ``__``; a name made only of dots
    (``.``, ``..``) or empty is refused, since it would name `output_dir` itself or its parent.
    """
    directory_name = re.sub(r"[^\w.-]+", "__", model_name)
    if not directory_name.strip(".") or directory_name.startswith("."):
        raise ValueError(
            f"--model: the display name {model_name!r} cannot name a directory inside the output directory "
            "(it is empty or starts with '.'); give another name, as NAME=PATH"
        )
    return Path(output_dir) / directory_name


def _num_samples(benchmark: Benchmark, num_samples: int | Mapping[str, int] | None) -> int:
    if num_samples is None:
        return benchmark.num_samples
    if isinstance(num_samples, Mapping):
        return int(num_samples.get(benchmark.name, benchmark.num_samples))
    return int(num_samples)


@dataclass
class _Request:
    benchmark: str
    preset: Preset
    problem_id: str
    sample_index: int
    prompt: list[dict]
    gold: str
    seed: int


def evaluate(model_path: str, config: EvalConfig) -> dict[str, Any]:
    """Evaluate a model (Hub id, local checkpoint or PEFT adapter directory) as the paper does; resumable.

    Generates the samples of the plan that `output_dir` does not hold finished (`store.finished_samples`: same
    decoding, no error unless `config.retry_errors` is off). Returns the summary (`summarize`), also written to
    ``summary.json`` and ``summary.md``. Raises `ValueError` when `output_dir` holds samples of another model or
    generated with another ``max_new_tokens`` / seed / prompt (`store.check_resumable`; use another directory, or
    ``overwrite=True``).
    """
    task = get_task(config.task)
    options = config.task_options()
    output_dir = Path(config.output_dir)
    samples_path = output_dir / SAMPLES_FILE
    if config.verifier is not None:
        config.verifier.check()  # before any expensive work
    benchmarks = [task.parse_benchmark(benchmark) for benchmark in config.benchmarks]
    presets = [parse_preset(preset) for preset in config.presets]
    settings = {
        "model": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        **task.settings,
    }
    check_resumable(output_dir, settings, config.overwrite)
    problems = {
        benchmark.name: task.load_benchmark(benchmark, config.benchmarks_dir, config.max_problems, options)
        for benchmark in benchmarks
    }
    plan = {
        "benchmarks": {
            benchmark.name: {
                "num_samples": _num_samples(benchmark, config.num_samples),
                "problem_ids": list(problems[benchmark.name]["id"]),
                "source": task.source(benchmark, config.benchmarks_dir),
                "benchmark": dataclasses.asdict(benchmark),
            }
            for benchmark in benchmarks
        },
        "presets": [dataclasses.asdict(preset) for preset in presets],
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    if config.overwrite and samples_path.exists():
        samples_path.unlink()
    model_name = config.model_name or model_display_name(model_path)
    run = {
        "task": task.name,
        "model_name": model_name,
        "settings": settings,
        "plan": plan,
        "options": {},
        "verifier": config.verifier.describe() if config.verifier else None,
    }
    write_run(output_dir, run)

    finished = finished_samples(output_dir, presets, config.retry_errors)
    requests = []
    for preset in presets:
        for benchmark in benchmarks:
            dataset = problems[benchmark.name]
            for problem_id, prompt, gold in zip(dataset["id"], dataset["prompt"], dataset[task.gold_column]):
                for index in range(plan["benchmarks"][benchmark.name]["num_samples"]):
                    if (benchmark.name, preset.name, str(problem_id), index) in finished:
                        continue
                    seed = sample_seed(config.seed, benchmark.name, problem_id, index)
                    requests.append(
                        _Request(
                            benchmark.name,
                            preset,
                            problem_id,
                            index,
                            prompt,
                            gold,
                            seed,
                        )
                    )
    total = len(presets) * sum(len(spec["problem_ids"]) * spec["num_samples"] for spec in plan["benchmarks"].values())
    logger.info(
        "%s: %d of %d samples to generate (%s)",
        model_name,
        len(requests),
        total,
        output_dir,
    )
    if requests:
        backend = make_backend(
            model_path,
            config.backend,
            dtype=config.dtype,
            seed=config.seed,
            **config.vllm_kwargs,
        )
        try:
            batch_size = config.batch_size or backend.default_batch_size
            _run_requests(backend, requests, batch_size, samples_path, task, config)
        finally:  # free the device for the verifier, or the next model of the same process
            del backend
            _free_memory()
    if config.verifier is not None:
        apply_verifier(output_dir, config.verifier, _problem_texts(problems))
    return summarize(output_dir)


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _problem_texts(problems) -> dict[tuple[str, str], str]:
    """(benchmark, problem id) -> the question's text, for the model verifier's prompt."""
    return {(name, pid): text for name, data in problems.items() for pid, text in zip(data["id"], data["problem"])}


def _run_requests(
    backend,
    requests: list[_Request],
    batch_size: int,
    samples_path: Path,
    task: Task,
    config,
):
    """Generate, grade and append the records of `requests`, batch by batch (one preset and benchmark per batch)."""
    batches, current = [], []
    for request in requests:
        if current and (
            len(current) == batch_size
            or (request.benchmark, request.preset) != (current[0].benchmark, current[0].preset)
        ):
            batches.append(current)
            current = []
        current.append(request)
    if current:
        batches.append(current)
    written = 0
    started = time.monotonic()
    with open(samples_path, "a", encoding="utf-8") as file:
        for batch in batches:
            records = _generate_and_grade(backend, batch, task, config)
            append_records(file, records)
            written += len(records)
            logger.info(
                "%s %s: %d/%d samples done (%.0f s)",
                batch[0].benchmark,
                batch[0].preset.name,
                written,
                len(requests),
                time.monotonic() - started,
            )


def _generate_and_grade(backend, batch: list[_Request], task: Task, config: EvalConfig) -> list[dict[str, Any]]:
    """The records of one batch. A failing batch is retried one request at a time; what still fails is recorded
    with its error instead of stopping the run."""
    preset = batch[0].preset
    try:
        generations = backend.generate(
            [request.prompt for request in batch],
            [request.seed for request in batch],
            temperature=preset.temperature,
            top_p=preset.top_p,
            max_new_tokens=config.max_new_tokens,
        )
        if len(generations) != len(batch):
            raise RuntimeError(f"the backend returned {len(generations)} completions for {len(batch)} prompts")
    except Exception as error:  # recorded with the sample; the run goes on
        if len(batch) > 1:
            logger.warning(
                "generation failed for a batch of %d (%r); retrying one by one",
                len(batch),
                error,
            )
            return [record for request in batch for record in _generate_and_grade(backend, [request], task, config)]
        logger.warning("generation failed for %s: %r", batch[0], error)
        error = f"generation: {type(error).__name__}: {error}"
        return [_record(batch[0], backend.name, task, None, error=error)]
    try:
        grades = grade_rules(
            task,
            [generation.text for generation in generations],
            [r.gold for r in batch],
            config.task_options(),
        )
    except Exception as error:  # recorded with the sample; the run goes on
        logger.warning("grading failed for a batch of %d: %r", len(batch), error)
        message = f"grading: {type(error).__name__}: {error}"
        return [_record(r, backend.name, task, g, error=message) for r, g in zip(batch, generations)]
    return [_record(r, backend.name, task, g, grade) for r, g, grade in zip(batch, generations, grades)]


def _record(
    request: _Request,
    backend: str,
    task: Task,
    generation: Generation | None,
    grade: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    return {
        "benchmark": request.benchmark,
        "preset": request.preset.name,
        "problem_id": request.problem_id,
        "sample_index": request.sample_index,
        "completion": generation.text if generation else None,
        "extracted_answer": grade["extracted_answer"] if grade else None,
        "correct": grade["correct"] if grade else None,
        "grading": grade["grading"] if grade else None,
        "gold": request.gold if task.store_gold else None,
        "num_tokens": generation.num_tokens if generation else None,
        "finish_reason": generation.finish_reason if generation else None,
        "temperature": request.preset.temperature,
        "top_p": request.preset.top_p,
        "seed": request.seed,
        "backend": backend,
        "error": error,
    }


def regrade(
    output_dir: str | os.PathLike,
    verification_timeout: float | None = None,
    verifier: VerifierConfig | str | None = KEEP,
) -> dict[str, Any]:
    """Grade every stored completion of a run again (no generation), rewrite the samples file, and summarise.

    `verifier`: ``KEEP`` (default) keeps the run's model verifier and its stored verdicts (asking it only about
    rule negatives without a verdict); a `VerifierConfig` adds (or replaces) one; None drops it (the verdicts
    are removed). Records whose grading had failed get graded; records whose generation had failed stay as they
    are. The file is rewritten atomically with one record per sample (the latest).
    """
    output_dir = Path(output_dir)
    samples_path = output_dir / SAMPLES_FILE
    run = read_run(output_dir)
    task = get_task(run.get("task", "math"))
    if isinstance(verifier, VerifierConfig):
        if task.name != "math":
            raise ValueError("verifier: the model verifier grades math answers only")
        verifier.check()
    records = list(latest(read_samples(samples_path)).values())
    options = {"verification_timeout": verification_timeout, **run.get("options", {})}
    problems = None
    if not task.store_gold or isinstance(verifier, VerifierConfig) or (verifier == KEEP and run.get("verifier")):
        problems = _reload_problems(run, task, options)
    by_benchmark: dict[str, list[dict]] = {}
    for record in records:
        if record.get("completion") is not None:
            by_benchmark.setdefault(record["benchmark"], []).append(record)
    for name, benchmark_records in by_benchmark.items():
        if task.store_gold:
            golds = [record["gold"] for record in benchmark_records]
        else:
            gold_of = dict(zip(problems[name]["id"], problems[name][task.gold_column]))
            golds = [gold_of[str(record["problem_id"])] for record in benchmark_records]
        grades = grade_rules(task, [record["completion"] for record in benchmark_records], golds, options)
        for record, grade in zip(benchmark_records, grades):
            record.update(grade)
            if (record.get("error") or "").startswith("grading"):
                record["error"] = None
    if verifier is None or isinstance(verifier, VerifierConfig):
        for record in records:  # a new verifier judges afresh; None drops the verdicts
            for key in ("verifier", "verifier_verdict", "verifier_output"):
                record.pop(key, None)
        run["verifier"] = verifier.describe() if verifier is not None else None
        write_run(output_dir, run)
    write_samples(samples_path, records)
    active = verifier if isinstance(verifier, VerifierConfig) else None
    if verifier == KEEP and run.get("verifier"):
        active = VerifierConfig.from_description(run["verifier"])
    if active is not None:
        apply_verifier(output_dir, active, _problem_texts(problems))
    return summarize(output_dir)


def _reload_problems(run: Mapping[str, Any], task: Task, options: Mapping[str, Any]):
    """The problems of the run's plan, read again from the sources it recorded."""
    problems = {}
    for name, spec in run["plan"]["benchmarks"].items():
        benchmark = Benchmark(**spec["benchmark"]) if "benchmark" in spec else task.parse_benchmark(name)
        benchmark = dataclasses.replace(benchmark, source=spec["source"])
        problems[name] = task.load_benchmark(benchmark, None, len(spec["problem_ids"]), options)
    return problems
