"""What an evaluation task is: its benchmarks, its default protocol, how it reads problems and grades answers.

The core (generation, store, summaries, the CLI) is the same for every task; math (`math_task.MATH`) and code
(`code_task.CODE`) differ only in what a `Task` holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset

from .benchmarks import Benchmark, benchmark_source, parse_benchmark


@dataclass(frozen=True)
class Task:
    """One task of the evaluation: math or code.

    Attributes:
        name: ``"math"`` or ``"code"``; stored in ``run.json``.
        benchmarks: the registry, in the column order of the paper's table; ``Avg`` is over all of them.
        table: the paper's table the summary is laid out like (``"Table 2"``).
        presets: the default decodings (`presets.PRESETS` names).
        max_new_tokens: the default generation limit.
        gold_column: the column of the problems dataset that holds what an answer is graded against.
        store_gold: whether each sample record keeps its gold (math answers are short; code tests are not: the
            code task reads its problems again to regrade).
        read_problems: ``(benchmark, source, options) -> Dataset`` with columns ``id``, ``prompt`` (chat
            messages), ``problem`` (the question's text) and `gold_column`.
        grade: ``(completions, golds, options) -> [{"extracted_answer", "correct", "grading"}, ...]``; the rules.
        settings: what the samples depend on besides the model, the seed and the limit (the prompt's instruction),
            checked when a run resumes.
        shipped_dir: the directory of the benchmark files the package ships (the default source), if any.
    """

    name: str
    benchmarks: Mapping[str, Benchmark]
    table: str
    presets: tuple[str, ...]
    max_new_tokens: int
    gold_column: str
    store_gold: bool
    read_problems: Callable[[Benchmark, str, Mapping[str, Any]], Dataset]
    grade: Callable[[Sequence[str], Sequence[str], Mapping[str, Any]], list[dict[str, Any]]]
    settings: Mapping[str, Any] = field(default_factory=dict)
    shipped_dir: Path | None = None

    def parse_benchmark(self, spec: str | Benchmark) -> Benchmark:
        return parse_benchmark(spec, self.benchmarks)

    def source(self, benchmark: Benchmark, benchmarks_dir: str | os.PathLike | None) -> str:
        return benchmark_source(benchmark, benchmarks_dir, self.shipped_dir)

    def load_benchmark(
        self,
        benchmark: str | Benchmark,
        benchmarks_dir: str | os.PathLike | None = None,
        max_problems: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """The problems of a benchmark as a dataset (``id``, ``prompt``, ``problem``, `gold_column`...).

        Problem ids are made unique (a repeated id gets ``#<row>``); `max_problems` keeps the first K problems.
        """
        benchmark = self.parse_benchmark(benchmark)
        dataset = self.read_problems(benchmark, self.source(benchmark, benchmarks_dir), options or {})
        if max_problems is not None:
            dataset = dataset.select(range(min(max_problems, len(dataset))))
        ids, seen = [], set()
        for row, problem_id in enumerate(dataset["id"]):
            problem_id = str(problem_id) if problem_id not in seen else f"{problem_id}#{row}"
            seen.add(problem_id)
            ids.append(problem_id)
        return dataset.remove_columns("id").add_column("id", ids)
