"""The code task: HumanEval+, MBPP+ and LiveCodeBench v6 (the paper's Table 3), graded by the code reward's tests.

The paper reports avg@4 at T = 0.7 / top-p 0.9 on the three. The problems are read from local files in their public
layouts (see `Benchmark`): nothing is downloaded here.

- EvalPlus (HumanEval+, MBPP+): one JSON record per line (``.jsonl`` or ``.jsonl.gz``, the EvalPlus release files)
  with ``task_id, prompt, entry_point, canonical_solution, base_input, plus_input, atol``. The expected outputs
  are not in the file: they come from running ``canonical_solution`` on every input in the same sandbox that runs
  the model's programs (`stapo_trl.code.reward.run_program`), and a return value counts within ``atol``.
- LiveCodeBench (``code_generation_lite``): ``question_id, question_title, question_content, starter_code,
  public_test_cases`` (a JSON list of ``{input, output, testtype}``), ``private_test_cases``, ``metadata`` (JSON
  with ``func_name`` for functional problems). The private tests are stored as base64 + zlib + **pickle**;
  unpickling runs whatever code the file holds, so they are decoded only with ``private_tests=True``
  (``--private_tests``); by default only the public tests grade (the problem's ``private_tests_skipped`` says
  when some were left out).

A completion's program is its last ```` ```python ```` block (`extract_program`), run by `code_reward`: correct
when it passes every test. For EvalPlus problems the import lines of the problem's prompt (``from typing import
List``...) are put before the program, as the prompt gives them to the model; for LiveCodeBench's functional
problems ``from typing import *`` (`LIVECODEBENCH_PREAMBLE`), for the starter code's annotations.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import pickle
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from datasets import Dataset

from ..code.reward import JUDGE_WORKERS, code_reward, extract_program, run_program
from .benchmarks import Benchmark
from .task import Task


#: How the problem is put to the model: the user turn of Eurus-2-RL-Data's code prompts, around the question.
CODE_PROMPT = (
    "Write Python code to solve the task:\n{question}\n\nWrite Python code to solve the problem. Present the code "
    "in \n```python\nYour code\n```\nat the end."
)

#: Put before the programs of LiveCodeBench's functional problems: their starter code annotates with typing names
#: (``List[int]``) that it does not import.
LIVECODEBENCH_PREAMBLE = "from typing import *"

#: Tiny EvalPlus- and LiveCodeBench-shaped records written for this project (tests and smoke runs).
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"

#: Table 3's benchmarks, in its column order. Files: the EvalPlus release files and a code_generation_lite file
#: of the v6 problems, placed in the benchmarks directory under these names (or given as NAME=PATH).
BENCHMARKS: dict[str, Benchmark] = {
    benchmark.name: benchmark
    for benchmark in (
        Benchmark("HumanEval+", "HumanEvalPlus.jsonl", 4, layout="evalplus"),
        Benchmark("MBPP+", "MbppPlus.jsonl", 4, layout="evalplus"),
        Benchmark("LiveCodeBench", "livecodebench_v6.jsonl", 4, layout="livecodebench"),
    )
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
        rows = _evalplus_rows(records, path, options.get("verification_timeout"))
    else:
        rows = [
            _livecodebench_row(record, path, number, options.get("private_tests", False))
            for number, record in enumerate(records, start=1)
        ]
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


def _evalplus_rows(records: list[dict], path: Path, timeout: float | None) -> list[dict[str, Any]]:
    """EvalPlus records with their expected outputs, from the canonical solutions run in the sandbox."""
    problems = []
    for number, record in enumerate(records, start=1):
        task_id = _field(record, "task_id", path, number)
        prompt = _field(record, "prompt", path, number)
        entry_point = _field(record, "entry_point", path, number)
        solution = _field(record, "canonical_solution", path, number)
        inputs = list(record.get("base_input") or []) + list(record.get("plus_input") or [])
        if not inputs:
            raise ValueError(f"{path}: record {number} ({task_id}): fields 'base_input' and 'plus_input' are empty")
        # HumanEval's canonical solution is the body under the prompt's signature; MBPP+'s is the whole program.
        program = solution if f"def {entry_point}" in solution else prompt + solution
        preamble = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
        problems.append((task_id, prompt, entry_point, program, inputs, float(record.get("atol") or 0.0), preamble))
    with ThreadPoolExecutor(JUDGE_WORKERS) as pool:
        runs = list(pool.map(lambda p: run_program(p[3], p[4], fn_name=p[2], timeout=timeout), problems))
    rows = []
    for (task_id, prompt, entry_point, _, inputs, atol, preamble), outputs in zip(problems, runs):
        if len(outputs) != len(inputs) or any(output.status != "ok" for output in outputs):
            failed = next((output for output in outputs if output.status != "ok"), None)
            raise ValueError(
                f"{path}: {task_id}: the canonical solution did not run on every input "
                f"({failed.status + ': ' + failed.detail if failed else 'no output'}); the expected outputs cannot "
                "be computed"
            )
        question = f"Write the Python function `{entry_point}` below.\n\n```python\n{prompt.rstrip()}\n```"
        tests = {
            "inputs": inputs,
            "outputs": [output.value for output in outputs],
            "fn_name": entry_point,
            "atol": atol,
            "preamble": preamble,
        }
        rows.append({"id": task_id, "prompt": _prompt(question), "problem": question, "tests": json.dumps(tests)})
    return rows


def _livecodebench_row(record: Mapping[str, Any], path: Path, number: int, private_tests: bool) -> dict[str, Any]:
    question_id = str(_field(record, "question_id", path, number))
    content = _field(record, "question_content", path, number)
    metadata = record.get("metadata") or "{}"
    metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
    fn_name = metadata.get("func_name")
    public = _json_field(record, "public_test_cases", path, number)
    private, skipped = [], False
    encoded = record.get("private_test_cases")
    if encoded:
        try:
            private = json.loads(encoded)  # plain JSON in some files: no unpickling needed
        except ValueError:
            if private_tests:
                private = json.loads(pickle.loads(zlib.decompress(base64.b64decode(encoded.encode()))))
            else:
                skipped = True
    cases = list(public) + list(private)
    if not cases:
        raise ValueError(f"{path}: record {number} ({question_id}): no tests")
    starter = (record.get("starter_code") or "").strip()
    if fn_name:
        question = f"{content}\n\nUse this starter code:\n```python\n{starter}\n```"
    else:
        question = f"{content}\n\nRead the input from standard input and write the answer to standard output."
    tests = {
        "inputs": [case["input"] for case in cases],
        "outputs": [case["output"] for case in cases],
        "fn_name": fn_name,
        "preamble": LIVECODEBENCH_PREAMBLE if fn_name else "",
    }
    return {
        "id": question_id,
        "prompt": _prompt(question),
        "problem": question,
        "tests": json.dumps(tests),
        "private_tests_skipped": skipped,
    }


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
    """Run each completion's program on its problem's tests with `code_reward`: correct = passes every test.

    ``extracted_answer`` is the program (None when the completion has no closed ```` ```python ```` block).
    """
    programs = [extract_program(completion) for completion in completions]
    judged = []
    for program, value in zip(programs, tests):
        preamble = json.loads(value).get("preamble")
        judged.append("" if program is None else f"```python\n{preamble + chr(10) if preamble else ''}{program}```")
    rewards = code_reward(judged, list(tests), timeout=options.get("verification_timeout"), time_budget=math.inf)
    return [
        {"extracted_answer": program, "correct": reward == 1.0, "grading": "tests"}
        for program, reward in zip(programs, rewards)
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
