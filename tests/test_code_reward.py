"""code_reward: test layouts, the sandbox runs, verdicts and their robustness (PRIME's rules: test_code_prime.py)."""

import functools
import json
import threading
import time

import code_programs
import pytest

from stapo_trl.code import sandbox
from stapo_trl.code.data import SAMPLE_FILE
from stapo_trl.code.reward import CodeTests, code_reward, parse_tests, run_program, run_tests
from stapo_trl.code.sandbox import Job, Output


SAMPLE_TESTS = [json.loads(line)["reward_model"]["ground_truth"] for line in SAMPLE_FILE.read_text().splitlines()]


def fenced(program: str, prose: str = "Here is my solution.") -> str:
    return f"{prose}\n```python\n{program}```\n"


class RecordingExecutor:
    """Yields canned outputs and records how many were consumed and whether the run was closed."""

    def __init__(self, outputs):
        self.outputs, self.jobs, self.consumed, self.closed = outputs, [], 0, False

    def execute(self, job: Job):
        self.jobs.append(job)
        try:
            for output in self.outputs:
                self.consumed += 1
                yield output
        finally:
            self.closed = True


# --- parse_tests ------------------------------------------------------------------------------------------------


def test_parse_tests_layouts():
    stdin = parse_tests('{"inputs": ["1\\n", ["2", "3"]], "outputs": ["1", ["2", "3"]]}')
    assert stdin == CodeTests(["1\n", "2\n3"], ["1", "2\n3"])
    call = parse_tests({"fn_name": "f", "inputs": [[1, 2], "[1, 2]\n3"], "outputs": [3, "[4]"], "atol": 1e-6})
    assert call == CodeTests([[1, 2], [[1, 2], 3]], [3, [4]], "f", 1e-6)
    assert parse_tests({"fn_name": "", "inputs": ["x"], "outputs": ["y"]}).fn_name is None


@pytest.mark.parametrize(
    "value, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ({"inputs": [], "outputs": []}, "'inputs' must be a non-empty list"),
        ({"inputs": ["1"]}, "'outputs' must be a non-empty list"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
        ({"inputs": [1], "outputs": ["1"]}, r"inputs\[0\] must be a string"),
        ({"fn_name": "f", "inputs": [{"a": 1}], "outputs": [1]}, r"inputs\[0\] must be a list of arguments"),
        ({"fn_name": "f", "inputs": ["not json"], "outputs": [1]}, "one JSON argument per line"),
        ({"fn_name": "no such name", "inputs": [[1]], "outputs": [1]}, "'fn_name' must be a function name"),
        ({"inputs": ["1"], "outputs": ["1"], "atol": -1}, "'atol' must be a non-negative number"),
    ],
)
def test_parse_tests_names_what_is_wrong(value, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(value)


# --- code_reward in the sandbox ---------------------------------------------------------------------------------


def test_known_correct_programs_earn_one_and_known_wrong_ones_minus_one():
    completions = [fenced(program) for program in code_programs.CORRECT + code_programs.WRONG]
    assert code_reward(completions, SAMPLE_TESTS * 2) == [1.0] * 6 + [-1.0] * 6


def test_the_last_python_block_is_judged():
    wrong_then_right = fenced(code_programs.WRONG[0]) + "Fixed:\n" + fenced(code_programs.CORRECT[0])
    right_then_wrong = fenced(code_programs.CORRECT[0]) + "Fixed:\n" + fenced(code_programs.WRONG[0])
    assert code_reward([wrong_then_right, right_then_wrong], SAMPLE_TESTS[:1] * 2) == [1.0, -1.0]


def test_conversational_completions():
    completion = [{"role": "assistant", "content": fenced(code_programs.CORRECT[3])}]
    assert code_reward([completion], [SAMPLE_TESTS[3]]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "no code at all",
        fenced("print("),
        fenced("raise SystemExit(3)\n"),
        fenced("import sys\nsys.exit(0)\n"),  # exits before printing: wrong output
        fenced(code_programs.HOSTILE["infinite_loop"]),
        fenced(code_programs.HOSTILE["allocate_10_gb"]),
    ],
    ids=["no_block", "syntax_error", "exit_code", "early_exit", "timeout", "memory"],
)
def test_failures_score_minus_one(completion):
    assert code_reward([completion], [SAMPLE_TESTS[0]], timeout=1.0) == [-1.0]


def test_return_values_that_claim_equality_are_not_believed():
    cheat = (
        "class Anything:\n    def __eq__(self, other):\n        return True\n\ndef add(a, b):\n    return Anything()\n"
    )
    assert code_reward([fenced(cheat)], [SAMPLE_TESTS[3]]) == [-1.0]


def test_malformed_tests_score_none_with_a_warning():
    with pytest.warns(UserWarning, match="row 1: malformed tests"):
        rewards = code_reward([fenced(code_programs.CORRECT[0])] * 2, [SAMPLE_TESTS[0], '{"inputs": []}'])
    assert rewards == [1.0, None]


def test_length_mismatch_is_the_callers_error():
    with pytest.raises(ValueError, match="2 completions but 1 test sets"):
        code_reward(["a", "b"], [SAMPLE_TESTS[0]])


def test_run_program_returns_every_output_for_reference_solutions():
    outputs = run_program("def f(x):\n    return sorted({x, 1})\n", [[3], [1]], fn_name="f")
    assert outputs == [Output("ok", [1, 3]), Output("ok", [1])]


# --- with a recording executor: the order of work, and failures of the executor ---------------------------------


def test_judging_stops_at_the_first_failing_test():
    executor = RecordingExecutor([Output("ok", "1"), Output("ok", "wrong"), Output("ok", "3")])
    result = run_tests("print(1)", {"inputs": ["", "", ""], "outputs": ["1", "2", "3"]}, executor=executor)
    assert (result.passed, result.tests_passed, executor.consumed, executor.closed) == (False, 1, 2, True)
    assert "test 1: wrong output" in result.failure


def test_the_expected_outputs_never_reach_the_executor():
    executor = RecordingExecutor([Output("ok", "4")])
    run_tests("print(4)", {"inputs": ["2 2"], "outputs": ["secret-4"]}, executor=executor)
    assert "secret-4" not in repr(executor.jobs)


def test_a_failing_executor_costs_the_reward_not_the_step(caplog):
    class Broken:
        def execute(self, job):
            raise RuntimeError("the service is down")

    assert code_reward([fenced("print(1)")], [SAMPLE_TESTS[0]], executor=Broken()) == [-1.0]
    assert "judging a program failed" in caplog.text


def test_identical_programs_are_judged_once_and_programs_in_parallel():

    class Counting:
        def __init__(self):
            self.jobs, self.lock, self.running, self.most_running = 0, threading.Lock(), 0, 0
            self.all_started = threading.Barrier(2, timeout=10)

        def execute(self, job):
            with self.lock:
                self.jobs += 1
            self.all_started.wait()  # returns only when two programs are being judged at the same time
            yield Output("ok", "3\n")

    executor = Counting()
    tests = json.dumps({"inputs": ["1 2"], "outputs": ["3"]})
    completions = [fenced("print(3)")] * 4 + [fenced("print(1 + 2)")] * 4
    assert code_reward(completions, [tests] * 8, executor=executor, workers=2) == [1.0] * 8  # two, even on one core
    assert executor.jobs == 2


def test_set_default_executor():
    executor = RecordingExecutor([Output("ok", "3")])
    sandbox.set_default_executor(executor)
    try:
        assert code_reward([fenced("print(3)")], ['{"inputs": [""], "outputs": ["3"]}']) == [1.0]
    finally:
        sandbox.set_default_executor(None)
    assert len(executor.jobs) == 1


def test_programs_not_started_within_the_time_budget_score_minus_one(caplog):

    class Slow(RecordingExecutor):
        def execute(self, job):
            time.sleep(0.5)
            yield from super().execute(job)

    executor = Slow([Output("ok", "3")])
    tests = ['{"inputs": [""], "outputs": ["3"]}'] * 2
    completions = [fenced("print(3)"), fenced("print(2 + 1)")]
    rewards = code_reward(completions, tests, executor=executor, time_budget=0.1, workers=1)
    assert rewards == [1.0, -1.0] and len(executor.jobs) == 1
    assert "1 of 2 programs not started within the time budget" in caplog.text


# --- settings, partial credit, per-test time limits -------------------------------------------------------------


def test_settings_are_keyword_arguments_fixed_with_partial():
    executor = RecordingExecutor([Output("ok", "3")])
    reward = functools.update_wrapper(functools.partial(code_reward, timeout=2.5, executor=executor), code_reward)
    assert reward.__name__ == "code_reward"  # the name TRL logs the reward under
    assert reward([fenced("print(3)")], ['{"inputs": [""], "outputs": ["3"]}']) == [1.0]
    assert executor.jobs[0].timeout == 2.5


def test_partial_credit_is_the_fraction_of_the_first_ten_tests_each_run_alone():
    # 12 tests; the program is right on the even-numbered inputs of the first ten (5 of 10), crashes on input 3 and
    # times out on input 5: each failure ends its sandbox and the next test starts a new one.
    program = (
        "n = int(input())\n"
        "if n == 3:\n    raise ValueError\n"
        "if n == 5:\n    while True:\n        pass\n"
        "print(n if n % 2 == 0 else -1)\n"
    )
    tests = {"inputs": [f"{n}\n" for n in range(12)], "outputs": [f"{n}\n" for n in range(12)]}
    [binary] = code_reward([fenced(program)], [tests], timeout=1.0)
    [partial] = code_reward([fenced(program)], [tests], timeout=1.0, partial_credit=True)
    assert (binary, partial) == (-1.0, 2 * 5 / 10 - 1)
    [passing] = code_reward([fenced("print(input())\n")], [tests], partial_credit=True)
    assert passing == 1.0


def test_tests_with_their_own_time_limits_run_in_one_sandbox_per_limit():
    executor = RecordingExecutor([Output("ok", "1\n")] * 2)
    tests = {"inputs": ["1"] * 5, "outputs": ["1"] * 5, "timeouts": [1, 1, 4, 4, 1]}
    result = run_tests("print(1)", tests, executor=executor)
    assert [(len(job.inputs), job.timeout) for job in executor.jobs] == [(2, 1.0), (2, 4.0), (1, 1.0)]
    assert result.passed and result.tests_passed == 5
    with pytest.raises(ValueError, match="'timeouts' must be one positive number of seconds per input"):
        parse_tests(dict(tests, timeouts=[1, 1]))


def test_return_values_keep_their_python_types():
    program = "import numpy as np\ndef f():\n    return (1, [2.5, (3,)], {4}, {5: 'x'}, np.int64(6), None)\n"
    [output] = run_program(program, [[]], fn_name="f")
    assert output.value == (1, [2.5, (3,)], {4}, {5: "x"}, 6, None)
    assert type(output.value[4]).__name__ == "int64"
