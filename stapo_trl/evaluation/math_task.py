"""The math task: the paper's six benchmarks (Table 2), graded by the training reward.

The paper (§5.1) reports avg@32 on AIME24, AIME25 and AMC23 and avg@4 on MATH500, Minerva and OlympiadBench, under
two decodings (T=1.0 / top-p 1.0 and T=0.7 / top-p 0.9), with at most 20,480 new tokens and the training prompt
``{problem} Please reason step by step, and put your final answer within \\boxed{}.`` as one user turn. The six
files ship with the package (`stapo_trl.math.benchmarks`) and are the default source.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..math.data import MATH_INSTRUCTION, load_math_dataset, load_verl_parquet
from ..math.reward import extract_boxed_answer, gold_answer, math_reward
from .benchmarks import Benchmark
from .generation import generate_completions
from .task import Task


#: The directory of the six shipped veRL-layout parquet files (see its SOURCES.md).
SHIPPED_BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "math" / "benchmarks"

#: The paper's six benchmarks, in Table 2's column order. Files: the veRL-layout parquet files shipped with the
#: package. The Hub ids and field mappings are the common public copies (the paper does not name its copies); they
#: could not be checked offline: prefer the shipped files, or override them.
BENCHMARKS: dict[str, Benchmark] = {
    benchmark.name: benchmark
    for benchmark in (
        Benchmark(
            "AIME24",
            "AIME24.parquet",
            32,
            "HuggingFaceH4/aime_2024",
            "train",
            id_field="id",
        ),
        Benchmark("AIME25", "AIME25.parquet", 32, "math-ai/aime25", "test", id_field="id"),
        Benchmark(
            "AMC23",
            "AMC23.parquet",
            32,
            "math-ai/amc23",
            "test",
            problem_field="question",
            id_field="id",
        ),
        Benchmark(
            "MATH500",
            "MATH-500.parquet",
            4,
            "HuggingFaceH4/MATH-500",
            "test",
            id_field="unique_id",
        ),
        Benchmark(
            "Minerva",
            "Minerva.parquet",
            4,
            "math-ai/minervamath",
            "test",
            problem_field="question",
        ),
        Benchmark(
            "OlympiadBench",
            "Olympiad-Bench.parquet",
            4,
            "math-ai/olympiadbench",
            "test",
            problem_field="question",
            answer_field="final_answer.0",
            id_field="id",
        ),
    )
}

#: Table 2's benchmark columns, in order; "Avg" is their mean.
PAPER_BENCHMARKS = tuple(BENCHMARKS)

_LAYOUTS = ("auto", "verl", "fields")


def read_math_problems(benchmark: Benchmark, source: str, options: Mapping[str, Any]) -> Dataset:
    """A local ``.parquet`` file or directory in the veRL layout (unless `layout` is ``"fields"``); anything else
    (jsonl, Hub) through the benchmark's field mapping."""
    if benchmark.layout not in _LAYOUTS:
        raise ValueError(f"benchmark {benchmark.name}: layout must be one of {_LAYOUTS}, got {benchmark.layout!r}")
    layout = benchmark.layout
    if layout == "auto":
        local = Path(source).expanduser()
        is_parquet = local.is_dir() or local.name.lower().endswith(".parquet")
        layout = "verl" if local.exists() and is_parquet else "fields"
    if layout == "verl":
        return load_verl_parquet(source)
    return load_math_dataset(
        source,
        benchmark.problem_field,
        benchmark.answer_field,
        split=benchmark.split,
        id_field=benchmark.id_field,
        data_source=benchmark.name,
    )


def grade_completions(
    completions: Sequence[str],
    golds: Sequence[str],
    verification_timeout: float | None = None,
) -> list[dict[str, Any]]:
    """Grade completions against gold answers with `math_reward`, the training reward (+1.0 = correct).

    Returns one dict per completion: ``extracted_answer`` (the last ``\\boxed{}``'s content, or None), ``correct``
    (bool) and ``grading``: ``"math_verify"``, or ``"exact_match"`` for the few golds math-verify cannot parse
    (``math_reward`` scores those None; here the boxed answer must then equal the gold up to whitespace and ``$``,
    so that every problem stays gradable and no problem leaves the denominator).
    """
    if not completions:
        return []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="math_reward: row")  # unparseable golds: handled below
        # A whole benchmark in one call: only each answer is bounded, not the call (its budget is for training).
        rewards = math_reward(
            list(completions), list(golds), verification_timeout=verification_timeout, time_budget=math.inf
        )
    results = []
    for completion, gold, reward in zip(completions, golds, rewards):
        answer = extract_boxed_answer(completion)
        if reward is None:
            correct = answer is not None and _normalized(answer) == _normalized(gold_answer(gold))
            results.append(
                {
                    "extracted_answer": answer,
                    "correct": correct,
                    "grading": "exact_match",
                }
            )
        else:
            results.append(
                {
                    "extracted_answer": answer,
                    "correct": reward == 1.0,
                    "grading": "math_verify",
                }
            )
    return results


def _normalized(answer: str) -> str:
    return re.sub(r"\s+", "", answer).strip("$").rstrip(".")


def _grade(completions: Sequence[str], golds: Sequence[str], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    return grade_completions(completions, golds, verification_timeout=options.get("verification_timeout"))


def sampled_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    num_samples: int = 1,
    **generation,
) -> float:
    """Mean correctness (avg@num_samples) over a prompt dataset with `prompt` and `solution` columns.

    Graded with `grade_completions` (the training reward, `math_reward`): +1 counts as correct. `generation` goes
    to `generate_completions`.
    """
    completions = generate_completions(model, tokenizer, dataset["prompt"], num_samples=num_samples, **generation)
    flat_completions = [text for samples in completions for text in samples]
    solutions = [solution for solution in dataset["solution"] for _ in range(num_samples)]
    grades = grade_completions(flat_completions, solutions)
    return sum(grade["correct"] for grade in grades) / len(grades) if grades else math.nan


MATH = Task(
    name="math",
    benchmarks=BENCHMARKS,
    table="Table 2",
    presets=("t1.0", "t0.7"),
    max_new_tokens=20480,
    gold_column="solution",
    store_gold=True,
    read_problems=read_math_problems,
    grade=_grade,
    settings={"instruction": MATH_INSTRUCTION},
    shipped_dir=SHIPPED_BENCHMARKS_DIR,
)


def load_benchmark(
    benchmark: str | Benchmark,
    benchmarks_dir: str | None = None,
    max_problems: int | None = None,
) -> Dataset:
    """The problems of a math benchmark (`Task.load_benchmark` of `MATH`)."""
    return MATH.load_benchmark(benchmark, benchmarks_dir, max_problems)


def parse_benchmark(spec: str | Benchmark) -> Benchmark:
    """A math benchmark by registry name or ``NAME=SOURCE[,key=value...]`` (`benchmarks.parse_benchmark`)."""
    return MATH.parse_benchmark(spec)
