"""stapo_trl.evaluation.code_task: EvalPlus / LiveCodeBench records, expected values and time limits from the
canonical solutions in the sandbox, private tests loaded in the sandbox, the v6 window, grading by each benchmark's
harness, and the CLI offline end to end. (The harnesses' rules: test_evaluation_evalplus.py and
test_evaluation_livecodebench.py.)"""

import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from stapo_trl.code import values
from stapo_trl.evaluation import cli, get_task, regrade
from stapo_trl.evaluation import run as run_module
from stapo_trl.evaluation.code_task import SAMPLES_DIR, grade_programs
from stapo_trl.evaluation.generation import Generation


CODE = get_task("code")

# Programs written by hand for the shipped records: a correct one per problem, and wrong ones.
CORRECT = {
    "total": "from typing import List\n\ndef total(numbers: List[int]) -> int:\n    return sum(numbers)\n",
    "mean": "def mean(xs):\n    return sum(xs) / len(xs)\n",
    "reverse_string": "def reverse_string(s):\n    return ''.join(reversed(s))\n",
    "min_max": "def min_max(items):\n    return (max(items), min(items))\n",
    "print a + b": "a, b = map(int, input().split())\nprint(a + b)\n",
    "largestGap": "class Solution:\n    def largestGap(self, nums: List[int]) -> int:\n"
    "        return max(nums[j] - nums[i] for i in range(len(nums)) for j in range(i + 1, len(nums)))\n",
}
# Wrong on a private test only: max - min ignores the order i < j (public test [1, 5, 2] -> 4 passes).
LARGEST_GAP_PUBLIC_ONLY = "class Solution:\n    def largestGap(self, nums):\n        return max(nums) - min(nums)\n"


def completion(program: str) -> str:
    return f"Here is my solution.\n```python\n{program}```\n"


def test_evalplus_expected_values_and_time_limits_come_from_the_canonical_solution_in_the_sandbox():
    problems = CODE.load_benchmark("HumanEval+", SAMPLES_DIR)
    tests = {row["id"]: json.loads(row["tests"]) for row in problems}
    assert [values.decode(value) for value in tests["Toy/0"]["outputs"]] == [3, 0, 7, 10**12 + 1]  # sums, by hand
    assert tests["Toy/0"]["fn_name"] == "total" and tests["Toy/0"]["harness"] == "humaneval"
    assert tests["Toy/1"]["outputs"] == pytest.approx([1.5, 0.2, 1.5000000005]) and tests["Toy/1"]["atol"] == 1e-6
    # EvalPlus's limit: max(1 s, 4 x the canonical time); these sums take microseconds.
    assert tests["Toy/0"]["timeouts"] == [1.0] * 4
    assert "def total(numbers: List[int]) -> int:" in problems[0]["prompt"][0]["content"]
    mbpp = CODE.load_benchmark("MBPP+", SAMPLES_DIR)
    outputs = [values.decode(value) for value in json.loads(mbpp[1]["tests"])["outputs"]]
    assert outputs == [(3, 1), (7, 7), (4, -5)] and all(type(output) is tuple for output in outputs)


def test_livecodebench_private_tests_are_loaded_in_the_sandbox_never_here(monkeypatch):
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled in the evaluating process")

    monkeypatch.setattr(pickle, "loads", refuse)
    problems = CODE.load_benchmark("LiveCodeBench", SAMPLES_DIR)
    assert json.loads(problems[0]["tests"])["outputs"] == ["3\n", "7\n", "0\n"]  # as written into the sample file
    assert json.loads(problems[1]["tests"])["inputs"] == ["[1, 5, 2]", "[5, 1]", "[3, 3, 9]"]
    assert json.loads(problems[1]["tests"])["fn_name"] == "largestGap"


def _livecodebench_file(tmp_path, records):
    path = tmp_path / "lcb.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return f"LiveCodeBench={path}"


def test_livecodebench_keeps_the_v6_window_and_names_bad_private_tests(tmp_path):
    sample = json.loads((SAMPLES_DIR / "livecodebench_v6.jsonl").read_text().splitlines()[0])
    dates = ["2025-01-31T23:00:00", "2025-02-01T00:00:00", "2025-04-30T20:00:00", "2025-05-01T12:00:00"]
    records = [dict(sample, question_id=f"q{i}", contest_date=date) for i, date in enumerate(dates)]
    problems = CODE.load_benchmark(_livecodebench_file(tmp_path, records), SAMPLES_DIR)
    assert problems["id"] == ["q1", "q2"]  # from 2025-02-01 00:00 to 2025-05-01 00:00
    with pytest.raises(ValueError, match="none of its 2 problems has a contest_date in LiveCodeBench v6's window"):
        CODE.load_benchmark(_livecodebench_file(tmp_path, [records[0], records[3]]), SAMPLES_DIR)
    not_json_text = base64.b64encode(zlib.compress(pickle.dumps([1, 2]))).decode()  # a list, not a JSON text
    bad = [records[1], dict(records[2], private_test_cases=not_json_text)]
    with pytest.raises(ValueError, match="private_test_cases of problem 2 do not load"):
        CODE.load_benchmark(_livecodebench_file(tmp_path, bad), SAMPLES_DIR)


def test_grading_runs_the_last_python_block_on_every_test():
    problems = {row["id"]: row["tests"] for name in CODE.benchmarks for row in CODE.load_benchmark(name, SAMPLES_DIR)}
    cases = [
        (completion(CORRECT["total"]), problems["Toy/0"], True),
        (completion(CORRECT["total"].replace("from typing import List\n", "")), problems["Toy/0"], False),  # List?
        (completion("def total(numbers):\n    return sum(numbers[1:])\n"), problems["Toy/0"], False),
        (completion("def mean(xs):\n    return sum(xs) / len(xs) + 1e-3\n"), problems["Toy/1"], False),  # > atol
        (completion("def mean(xs):\n    return sum(xs) / len(xs) + 1e-9\n"), problems["Toy/1"], True),  # < atol
        ("no code at all", problems["Toy/10"], False),
        (completion("while True:\n    pass\n"), problems["toy-1"], False),  # killed at the deadline
        (completion(CORRECT["print a + b"]), problems["toy-1"], True),
        (completion(CORRECT["largestGap"]), problems["toy-2"], True),
    ]
    grades = grade_programs([c for c, _, _ in cases], [t for _, t, _ in cases], {"verification_timeout": 2.0})
    assert [grade["correct"] for grade in grades] == [expected for _, _, expected in cases]
    # EvalPlus's sanitizer: the imports, then the definitions the entry point needs, one after the other.
    assert (
        grades[0]["extracted_answer"]
        == "from typing import List\ndef total(numbers: List[int]) -> int:\n    return sum(numbers)"
    )
    assert [grade["grading"] for grade in grades[:1] + grades[-1:]] == ["evalplus (humaneval)", "lcb_runner"]


class ScriptedBackend:
    """Answers each prompt with a hand-written program: correct for every sample except sample seeds it is told
    to get wrong (a program returning None)."""

    name = "scripted"
    default_batch_size = 4

    def __init__(self, wrong_seeds=()):
        self.wrong_seeds = set(wrong_seeds)
        self.calls = 0

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens):
        self.calls += 1
        generations = []
        for prompt, seed in zip(prompts, seeds):
            text = prompt[-1]["content"]
            key = next(key for key in CORRECT if f"`{key}`" in text or key in text)
            program = CORRECT[key] if key != "largestGap" else LARGEST_GAP_PUBLIC_ONLY
            if seed in self.wrong_seeds:
                program = "def nothing():\n    return None\n"
            generations.append(Generation(completion(program), 10, "stop"))
        return generations


def test_cli_evaluates_the_shipped_records_like_table_3(tmp_path, monkeypatch, capsys):
    backend = ScriptedBackend()
    monkeypatch.setattr(run_module, "make_backend", lambda *args, **kwargs: backend)
    argv = ["--model", "Scripted=toy", "--benchmarks_dir", str(SAMPLES_DIR), "--output_dir", str(tmp_path)]
    summaries = cli.main(argv, task="code")
    result = summaries["Scripted"]["results"]["t0.7"]
    scores = {name: benchmark["score"] for name, benchmark in result["benchmarks"].items()}
    # Every program is right except largestGap's, which passes the public test only: LiveCodeBench 1 of 2 problems.
    expected_lcb = 50.0
    assert scores == {"HumanEval+": 100.0, "MBPP+": 100.0, "LiveCodeBench": expected_lcb}
    assert result["avg"] == pytest.approx((200 + expected_lcb) / 3)
    assert result["benchmarks"]["HumanEval+"]["metric"] == "avg@4" and (result["temperature"], result["top_p"]) == (
        0.7,
        0.9,
    )
    table = capsys.readouterr().out
    assert "| Model | HumanEval+ | MBPP+ | LiveCodeBench | Avg | Mean length |" in table
    assert "Table 3" in table
    records = [json.loads(line) for line in (tmp_path / "Scripted" / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 6 * 4 and all(record["gold"] is None for record in records)  # tests are not copied

    # Regrade: the stored programs run again, nothing is generated, the numbers stay.
    calls = backend.calls
    assert regrade(tmp_path / "Scripted") == summaries["Scripted"]
    assert backend.calls == calls


def test_cli_runs_the_toy_model_on_the_code_records(tmp_path):
    """Real generation (the toy model writes arithmetic, not Python): every sample is generated, graded wrong."""
    summaries = cli.main(
        ["--model", "toy", "--benchmarks_dir", str(SAMPLES_DIR), "--output_dir", str(tmp_path)]
        + ["--num_samples", "1", "--max_new_tokens", "8", "--backend", "transformers"],
        task="code",
    )
    result = summaries["toy"]["results"]["t0.7"]
    assert all(b["score"] == 0.0 and b["complete"] for b in result["benchmarks"].values())
    assert Path(tmp_path, "table.md").is_file()
