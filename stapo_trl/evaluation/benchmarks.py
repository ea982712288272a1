"""Benchmarks: what a benchmark is, how a command line names one, and where its problems are read from.

A task (`stapo_trl.evaluation.task.Task`) holds a registry of `Benchmark` entries; the reading of a source's rows
into problems is the task's (veRL parquet for math, EvalPlus / LiveCodeBench records for code).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


#: ``NAME=hub``: the benchmark's registry Hub dataset instead of its shipped (or local) file.
HUB_SOURCE = "hub"


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark's problems come from and how many samples per problem it gets by default.

    The source is, in this order: `source` when set (a local file / directory, a Hub id, or ``"hub"`` for
    `hub_id`); else `file` inside the `benchmarks_dir` of the run, when a directory is given; else `file` among the
    files the package ships for its task; else the Hub dataset `hub_id`. `layout` says how the source's rows are
    read (the task's layouts; ``"auto"`` lets the task decide from the source); `problem_field`, `answer_field`
    and `id_field` map the fields of a ``"fields"`` layout (dotted paths allowed: ``"final_answer.0"``).
    """

    name: str
    file: str | None = None
    num_samples: int = 4
    hub_id: str | None = None
    split: str = "test"
    problem_field: str = "problem"
    answer_field: str = "answer"
    id_field: str | None = None
    source: str | None = None
    layout: str = "auto"

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"benchmark {self.name}: num_samples must be >= 1, got {self.num_samples}")


_SPEC_KEYS = {
    "problem": "problem_field",
    "answer": "answer_field",
    "id": "id_field",
    "split": "split",
    "layout": "layout",
}


def parse_benchmark(spec: str | Benchmark, registry: Mapping[str, Benchmark]) -> Benchmark:
    """A `Benchmark`, a registry name, or ``NAME=SOURCE[,key=value...]`` overriding (or defining) one.

    ``SOURCE`` is a local file / directory, a Hub id, or ``hub`` (the registry's Hub dataset); the keys are
    `Benchmark` fields: ``problem``, ``answer``, ``id``, ``split``, ``layout``, ``n`` (num_samples). Examples:
    ``MATH500=hub``, ``MATH500=HuggingFaceH4/MATH-500`` (the registry's field mapping applies),
    ``Minerva=data/minerva.jsonl,problem=question,answer=answer``,
    ``GSM8K=openai/gsm8k,problem=question,answer=answer,split=test,n=4`` (a new benchmark).
    """
    if isinstance(spec, Benchmark):
        return spec
    name, has_source, rest = spec.partition("=")
    name = name.strip()
    base = registry.get(name) or _by_alias(name, registry)
    if not has_source:
        if base is None:
            raise ValueError(f"unknown benchmark {name!r}: use one of {list(registry)} or NAME=SOURCE")
        return base
    source, *options = [part.strip() for part in rest.split(",")]
    changes: dict[str, Any] = {"source": source}
    for option in options:
        key, _, value = option.partition("=")
        if key in _SPEC_KEYS:
            changes[_SPEC_KEYS[key]] = value
        elif key in ("n", "num_samples"):
            changes["num_samples"] = int(value)
        else:
            raise ValueError(f"{spec!r}: unknown option {key!r} (problem, answer, id, split, layout, n)")
    if source == HUB_SOURCE and (base is None or base.hub_id is None):
        raise ValueError(f"{spec!r}: {name} has no Hub dataset in the registry; give its Hub id (NAME=ORG/NAME)")
    return dataclasses.replace(base or Benchmark(name), **changes)


def _by_alias(name: str, registry: Mapping[str, Benchmark]) -> Benchmark | None:
    """Registry lookup ignoring case and punctuation: "math-500", "olympiad-bench", "aime24", "humaneval+"."""
    key = _alias_key(name)
    for benchmark in registry.values():
        aliases = {
            benchmark.name,
            Path(benchmark.file).name.split(".")[0] if benchmark.file else benchmark.name,
        }
        if key in {_alias_key(alias) for alias in aliases}:
            return benchmark
    return None


def _alias_key(name: str) -> str:
    return re.sub(r"[^a-z0-9+]", "", name.lower()).replace("plus", "+")


def benchmark_source(
    benchmark: Benchmark,
    benchmarks_dir: str | os.PathLike | None,
    shipped_dir: Path | None = None,
) -> str:
    """The local path or Hub id the problems of `benchmark` are read from (see `Benchmark` for the order)."""
    if benchmark.source == HUB_SOURCE:
        return benchmark.hub_id
    if benchmark.source is not None:
        return benchmark.source
    if benchmarks_dir is not None:
        if benchmark.file is None:
            raise ValueError(f"benchmark {benchmark.name} has no file name; give it a source (NAME=PATH_OR_HUB_ID)")
        path = Path(benchmarks_dir).expanduser() / benchmark.file
        if not path.exists():
            raise FileNotFoundError(
                f"benchmark {benchmark.name}: no file {path}. Set the benchmarks directory to the one holding "
                f"{benchmark.file}, or give the benchmark a source (NAME=PATH_OR_HUB_ID)."
            )
        return str(path)
    if shipped_dir is not None and benchmark.file is not None and (shipped_dir / benchmark.file).is_file():
        return str(shipped_dir / benchmark.file)
    if benchmark.hub_id is not None:
        return benchmark.hub_id
    raise ValueError(
        f"benchmark {benchmark.name}: no source, no benchmarks directory, no shipped file and no Hub id; "
        "give it a source (NAME=PATH_OR_HUB_ID)"
    )
