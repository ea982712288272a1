"""stapo_trl.evaluation.livecodebench: the LiveCodeBench grading agrees with lcb_runner's own (tests/peers/lcb_runner,
run on the same cases) on tricky programs, outputs and return values; the differences that remain are the cases
marked with their reason, and the test shows they are differences."""

import pytest
from peer_cases import APPS_CASES, ROOT_16, call_tests, fenced, peer_verdicts_alongside, prints, stdin_tests

from stapo_trl.code.reward import code_reward
from stapo_trl.evaluation.livecodebench import LIVECODEBENCH, extract_program, stdout_matches


def expects(output: str) -> dict:
    return stdin_tests(["x\n"], [output])


# (name, completion, tests, how it differs from lcb_runner or None): APPS_CASES and this harness's own
CASES = [
    *APPS_CASES,
    # Program extraction: between the last two lines holding a fence.
    ("unclosed_last_block", fenced("print(0)\n") + "Better:\n```python\nprint(int(input()) // 4)\n", ROOT_16, None),
    ("bare_fence", "I print it:\n```\nprint(int(input()) // 4)\n```\n", ROOT_16, None),
    # The preamble, the recursion limit, the digit limit.
    ("5000_digits", fenced("print(int(input()) * 10**4999)\n"), stdin_tests(["1\n"], ["1" + "0" * 4999 + "\n"]), None),
    # Standard input as lcb_runner wraps the program.
    ("stdin_buffer_readline", fenced("import sys\nprint(int(sys.stdin.buffer.readline()) // 4)\n"), ROOT_16, None),
    # The output comparison.
    ("comma_separated", prints("1,2"), expects("1 2\n"), None),
    ("infinity_spellings", prints("inf"), expects("Infinity\n"), None),
    ("negative_zero", prints("-0"), expects("0\n"), None),
    # Functional problems.
    (
        "call_always_equal",
        fenced("class A:\n    def __eq__(self, o):\n        return True\ndef f(a):\n    return A()\n"),
        call_tests("f", ["5"], ["3"]),
        "a return value crosses the sandbox's wall as data: an object that claims to equal anything is a repr here, "
        "equal to nothing; lcb_runner believes its __eq__",
    ),
    (
        "call_state_between_tests",
        fenced(
            "class Solution:\n    calls = 0\n    def f(self, a):\n        Solution.calls += 1\n        return Solution.calls\n"
        ),
        call_tests("f", ["5", "5"], ["1", "2"]),
        "each test runs in a fresh process here; lcb_runner calls one Solution() for every test",
    ),
]


@pytest.fixture(scope="module")
def verdicts():
    completions = [completion for _, completion, _, _ in CASES]
    tests = [tests for _, _, tests, _ in CASES]
    peer, ours = peer_verdicts_alongside(
        "livecodebench",
        [{"completion": c, "tests": t} for c, t in zip(completions, tests)],
        lambda: code_reward(completions, tests, harness=LIVECODEBENCH),
    )
    return dict(zip((name for name, *_ in CASES), zip(peer, ours)))


@pytest.mark.parametrize("name, difference", [(name, difference) for name, _, _, difference in CASES])
def test_agrees_with_lcb_runner(verdicts, name, difference):
    peer_passes, ours = verdicts[name]
    if difference is None:
        assert (ours == 1.0) == peer_passes
    else:
        assert (ours == 1.0) != peer_passes, difference


def test_at_least_forty_cases_and_both_verdicts_among_them(verdicts):
    assert len(CASES) >= 40
    assert {ours for _, ours in verdicts.values()} == {1.0, -1.0}


# Rules checked against hand-computed values, independently of the peer.


@pytest.mark.parametrize(
    "text, program",
    [
        ("a\n```python\nprint(1)\n```\nb", "print(1)"),
        ("```python\nprint(1)\n```\n```python\nprint(2)\n", None),  # the prose between the last two fences: none
        ("```\nprint(1)\n```", "print(1)"),
        ("print(1)", None),
    ],
)
def test_extract_program(text, program):
    assert extract_program(text) == program


@pytest.mark.parametrize(
    "output, expected, same",
    [("4\n", " 4 ", True), ("2.50", "2.5", True), ("0.33333", "0.333333", False), ("1 2", "1\n2", False)],
)
def test_stdout_matches(output, expected, same):
    assert stdout_matches(output, expected) is same


def test_six_seconds_per_test():
    assert LIVECODEBENCH.timeout == 6.0
