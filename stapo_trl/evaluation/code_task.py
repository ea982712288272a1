"""The code task: HumanEval+, MBPP+ and LiveCodeBench v6 (the paper's Table 3), each graded as its own harness.

The paper reports avg@4 at T = 0.7 / top-p 0.9 on the three. The problems are read from local files in their public
layouts (see `Benchmark`): nothing is downloaded here. Programs run in the code reward's sandbox; what is compared
how follows each benchmark's own tool (docs/evaluation.md has the table and the known differences):

- EvalPlus (HumanEval+, MBPP+; `stapo_trl.evaluation.evalplus_grading`): one JSON record per line (``.jsonl`` or
  ``.jsonl.gz``, the EvalPlus release files) with ``task_id, prompt, entry_point, canonical_solution, base_input,
  plus_input, atol``. The expected values and each input's time limit come from running and timing prompt +
  ``canonical_solution`` on every base and plus input in the sandbox; a program is EvalPlus's sanitized answer.
- LiveCodeBench (``code_generation_lite``; `stapo_trl.evaluation.livecodebench`): ``question_id, question_content,
  starter_code, contest_date, public_test_cases`` (a JSON list of ``{input, output, testtype}``),
  ``private_test_cases``, ``metadata`` (JSON with ``func_name`` for functional problems). Only the problems of the
  v6 window (`V6_WINDOW`, by ``contest_date``) are kept. Public and private tests grade; the private ones, stored
  pickled, are loaded inside the sandbox.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from datasets import Dataset

from ..code import values
from ..code.reward import Harness, code_reward, default_workers, parse_tests
from . import evalplus_grading, livecodebench
from .benchmarks import Benchmark
from .task import Task


#: How the problem is put to the model: the user turn of Eurus-2-RL-Data's code prompts, around the question.
CODE_PROMPT = (
    "Write Python code to solve the task:\n{question}\n\nWrite Python code to solve the problem. Present the code "
    "in \n```python\nYour code\n```\nat the end."
)

#: Tiny EvalPlus- and LiveCodeBench-shaped records written for this project (tests and smoke runs).
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"

#: Table 3's benchmarks, in its column order. Files: the EvalPlus release files and a code_generation_lite file
#: (any release holding the v6 window), placed in the benchmarks directory under these names (or given as NAME=PATH).
BENCHMARKS: dict[str, Benchmark] = {
    benchmark.name: benchmark
    for benchmark in (
        Benchmark("HumanEval+", "HumanEvalPlus.jsonl", 4, layout="evalplus"),
        Benchmark("MBPP+", "MbppPlus.jsonl", 4, layout="evalplus"),
        Benchmark("LiveCodeBench", "livecodebench_v6.jsonl", 4, layout="livecodebench"),
    )
}

#: Each row's ``tests`` names its harness.
HARNESSES: dict[str, Harness] = {
    "humaneval": evalplus_grading.HUMANEVAL_PLUS,
    "mbpp": evalplus_grading.MBPP_PLUS,
    "livecodebench": livecodebench.LIVECODEBENCH,
}

_LAYOUTS = ("evalplus", "livecodebench")


def read_code_problems(benchmark: Benchmark, source: str, options: Mapping[str, Any]) -> Dataset:
    """The problems of a local EvalPlus or LiveCodeBench file: ``id``, ``prompt``, ``problem``, ``tests`` (JSON)."""
    if benchmark.layout not in _LAYOUTS:
        raise ValueError(f"benchmark {benchmark.name}: layout must be one of {_LAYOUTS}, got {benchmark.layout!r}")
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"benchmark {benchmark.name}: no file {path}; the code benchmarks are read from local files in their "
            "public layouts (see docs/evaluation.md): give --benchmarks_dir or NAME=PATH"
        )
    records = _read_jsonl(path)
    if benchmark.layout == "evalplus":
        dataset = "mbpp" if "mbpp" in benchmark.name.lower() else "humaneval"
        rows = _evalplus_rows(records, path, dataset)
    else:
        rows = _livecodebench_rows(records, path)
    if not rows:
        raise ValueError(f"{path}: no problems")
    return Dataset.from_list(rows)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        records = []
        for number, line in enumerate(file, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as error:
                    raise ValueError(f"{path}: line {number} is not JSON ({error})") from None
    return records


def _field(record: Mapping[str, Any], name: str, path: Path, number: int) -> Any:
    if record.get(name) is None:
        raise ValueError(f"{path}: record {number}: field {name!r} is missing")
    return record[name]


def _prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": CODE_PROMPT.format(question=question)}]


def _evalplus_rows(records: list[dict], path: Path, dataset: str) -> list[dict[str, Any]]:
    """EvalPlus records with their expected values and time limits, from the canonical solutions run in the sandbox."""
    problems = []
    for number, record in enumerate(records, start=1):
        task_id = _field(record, "task_id", path, number)
        base, plus = list(record.get("base_input") or []), list(record.get("plus_input") or [])
        inputs = base + plus
        if not inputs:
            raise ValueError(f"{path}: record {number} ({task_id}): fields 'base_input' and 'plus_input' are empty")
        fields = [_field(record, name, path, number) for name in ("prompt", "canonical_solution", "entry_point")]
        problems.append((task_id, *fields, inputs, float(record.get("atol") or 0.0), len(base)))

    def expected(problem):
        task_id, prompt, solution, entry_point, inputs, _, _ = problem
        try:
            return evalplus_grading.expected_outputs(prompt, solution, entry_point, inputs, dataset)
        except ValueError as error:
            raise ValueError(f"{path}: {task_id}: {error}; the expected values cannot be computed") from None

    with ThreadPoolExecutor(default_workers()) as pool:
        oracles = list(pool.map(expected, problems))
    rows = []
    for (task_id, prompt, _, entry_point, inputs, atol, base_count), (outputs, limits) in zip(problems, oracles):
        question = f"Write the Python function `{entry_point}` below.\n\n```python\n{prompt.rstrip()}\n```"
        tests = {
            "harness": dataset,
            "inputs": inputs,
            "outputs": [values.encode(output) for output in outputs],
            "fn_name": entry_point,
            "atol": atol,
            "timeouts": limits,
            "base_count": base_count,
        }
        rows.append({"id": task_id, "prompt": _prompt(question), "problem": question, "tests": json.dumps(tests)})
    return rows


def _livecodebench_rows(records: list[dict], path: Path) -> list[dict[str, Any]]:
    """The records of the v6 window, public and private tests; the pickled private tests loaded in the sandbox."""
    start, end = (datetime.fromisoformat(day) for day in livecodebench.V6_WINDOW)
    selected = []
    for number, record in enumerate(records, start=1):
        date = str(_field(record, "contest_date", path, number))
        try:
            released = datetime.fromisoformat(date).replace(tzinfo=None)
        except ValueError:
            raise ValueError(f"{path}: record {number}: 'contest_date' is not an ISO date: {date!r:.40}") from None
        if start <= released <= end:
            selected.append((number, record))
    if records and not selected:
        raise ValueError(
            f"{path}: none of its {len(records)} problems has a contest_date in LiveCodeBench v6's window "
            f"{livecodebench.V6_WINDOW[0]} to {livecodebench.V6_WINDOW[1]}; give a code_generation_lite file that "
            "holds the v6 problems (release_v6 or test6.jsonl)"
        )
    private: dict[int, list] = {}
    pickled = []
    for number, record in selected:
        encoded = record.get("private_test_cases") or "[]"
        try:
            private[number] = json.loads(encoded)  # plain JSON in some files
        except ValueError:
            pickled.append((number, encoded))
    try:
        decoded = livecodebench.decode_private_tests([encoded for _, encoded in pickled])
    except ValueError as error:
        raise ValueError(f"{path}: {error} (counting the pickled ones of the v6 window)") from None
    private.update((number, tests) for (number, _), tests in zip(pickled, decoded))
    return [_livecodebench_row(record, path, number, private[number]) for number, record in selected]


def _livecodebench_row(record: Mapping[str, Any], path: Path, number: int, private: list) -> dict[str, Any]:
    question_id = str(_field(record, "question_id", path, number))
    content = _field(record, "question_content", path, number)
    metadata = record.get("metadata") or "{}"
    metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
    fn_name = metadata.get("func_name")
    cases = list(_json_field(record, "public_test_cases", path, number)) + list(private)
    if not cases:
        raise ValueError(f"{path}: record {number} ({question_id}): no tests")
    starter = (record.get("starter_code") or "").strip()
    if fn_name:
        question = f"{content}\n\nUse this starter code:\n```python\n{starter}\n```"
    else:
        question = f"{content}\n\nRead the input from standard input and write the answer to standard output."
    tests = {
        "harness": "livecodebench",
        "inputs": [case["input"] for case in cases],
        "outputs": [case["output"] for case in cases],
        "fn_name": fn_name,
    }
    return {"id": question_id, "prompt": _prompt(question), "problem": question, "tests": json.dumps(tests)}


def _json_field(record: Mapping[str, Any], name: str, path: Path, number: int) -> list:
    value = _field(record, name, path, number)
    try:
        value = json.loads(value) if isinstance(value, str) else value
    except ValueError as error:
        raise ValueError(f"{path}: record {number}: field {name!r} is not JSON ({error})") from None
    if not isinstance(value, list):
        raise ValueError(f"{path}: record {number}: field {name!r} must be a list of tests")
    return value


def grade_programs(
    completions: Sequence[str], tests: Sequence[str], options: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Judge each completion by its benchmark's harness (the row's ``tests`` names it): correct = passes every test.

    ``extracted_answer`` is the program the harness takes from the completion (None when it finds none).
    """
    harnesses, parsed = [], []
    for value in tests:
        fields = json.loads(value)
        harness = HARNESSES[fields["harness"]]
        row_tests = parse_tests(fields)
        if "base_count" in fields:  # EvalPlus: typed expected values; the base inputs, then the plus ones
            typed = replace(row_tests, outputs=[values.decode(output) for output in row_tests.outputs])
            parsed.append(evalplus_grading.base_and_plus(typed, fields["base_count"]))
        else:
            parsed.append([row_tests])
        harnesses.append(harness)
    correct = [True] * len(completions)
    for harness in set(harnesses):
        judged = [(row, part) for row, parts in enumerate(parsed) if harnesses[row] is harness for part in parts]
        rewards = code_reward(
            [completions[row] for row, _ in judged],
            [part for _, part in judged],
            harness=harness,
            timeout=options.get("verification_timeout"),
            time_budget=math.inf,
        )
        for (row, _), reward in zip(judged, rewards):
            correct[row] = correct[row] and reward == 1.0
    return [
        {
            "extracted_answer": harness.extract_program(completion, parts[0]),
            "correct": verdict,
            "grading": harness.name,
        }
        for completion, harness, parts, verdict in zip(completions, harnesses, parsed, correct)
    ]


CODE = Task(
    name="code",
    benchmarks=BENCHMARKS,
    table="Table 3",
    presets=("t0.7",),
    max_new_tokens=20480,
    gold_column="tests",
    store_gold=False,
    read_problems=read_code_problems,
    grade=grade_programs,
    settings={"instruction": CODE_PROMPT},
    shipped_dir=None,
)
