"""stapo_trl.evaluation.livecodebench: the LiveCodeBench grading agrees with lcb_runner's own (tests/peers/lcb_runner,
run on the same cases) on tricky programs, outputs and return values; the differences that remain are the cases
marked with their reason, and the test shows they are differences."""

import pytest
from peer_cases import call_tests, fenced, peer_verdicts_alongside, stdin_tests

from stapo_trl.code.reward import code_reward
from stapo_trl.evaluation.livecodebench import LIVECODEBENCH, extract_program, stdout_matches


ROOT_16 = stdin_tests(["16\n"], ["4\n"])
SUM = stdin_tests(["1 2\n", "10 -3\n"], ["3\n", "7\n"])


def prints(text: str) -> str:
    return fenced(f"input()\nprint({text!r}, end='')\n")


def expects(output: str) -> dict:
    return stdin_tests(["x\n"], [output])


# (name, completion, tests, how it differs from lcb_runner or None)
CASES = [
    # Program extraction: between the last two lines holding a fence.
    ("fenced", fenced("print(int(input()) // 4)\n"), ROOT_16, None),
    ("unclosed_last_block", fenced("print(0)\n") + "Better:\n```python\nprint(int(input()) // 4)\n", ROOT_16, None),
    ("no_fence_at_all", "print(int(input()) // 4)\n", ROOT_16, None),
    ("bare_fence", "I print it:\n```\nprint(int(input()) // 4)\n```\n", ROOT_16, None),
    ("python3_fence", "```python3\nprint(int(input()) // 4)\n```\n", ROOT_16, None),
    ("last_of_two_blocks", fenced("print(0)\n") + fenced("print(int(input()) // 4)\n"), ROOT_16, None),
    (
        "function_then_usage_block",
        fenced("def solve(n):\n    return n // 4\n") + fenced("print(solve(int(input())))\n", "Usage:"),
        ROOT_16,
        None,
    ),
    # The preamble, the recursion limit, the digit limit.
    ("sqrt_without_import", fenced("print(int(sqrt(int(input()))))\n"), ROOT_16, None),
    ("counter_without_import", fenced("print(Counter(input())['1'])\n"), stdin_tests(["1121\n"], ["3\n"]), None),
    (
        "recursion_depth_5000",
        fenced("def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\nprint(depth(int(input())))\n"),
        stdin_tests(["5000\n"], ["5000\n"]),
        None,
    ),
    ("5000_digits", fenced("print(int(input()) * 10**4999)\n"), stdin_tests(["1\n"], ["1" + "0" * 4999 + "\n"]), None),
    # Standard input as lcb_runner wraps the program.
    ("readline_then_int", fenced("import sys\nprint(int(sys.stdin.readline()) // 4)\n"), ROOT_16, None),
    ("readline_alias", fenced("import sys\ninput = sys.stdin.readline\nprint(int(input()) // 4)\n"), ROOT_16, None),
    ("read_split", fenced("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"), SUM, None),
    ("stdin_buffer", fenced("import sys\nprint(int(sys.stdin.buffer.read()) // 4)\n"), ROOT_16, None),
    ("stdin_buffer_readline", fenced("import sys\nprint(int(sys.stdin.buffer.readline()) // 4)\n"), ROOT_16, None),
    (
        "for_line_in_stdin",
        fenced("import sys\nfor line in sys.stdin:\n    print(sum(map(int, line.split())))\n"),
        SUM,
        None,
    ),
    ("from_sys_import_stdin", fenced("from sys import stdin\nprint(int(stdin.readline()) // 4)\n"), ROOT_16, None),
    ("open_0", fenced("print(int(open(0).read()) // 4)\n"), ROOT_16, None),
    ("open_a_file", fenced("print(int(open('input.txt').read()) // 4)\n"), ROOT_16, None),
    # The standard input of load time, which the preamble's `from sys import *` holds, is the patched one.
    ("preamble_stdin_readline", fenced("print(repr(stdin.readline()))\n"), stdin_tests(["16\n"], ["'16'\n"]), None),
    (
        "sys_stdin_readline_keeps_newline",
        fenced("import sys\nprint(repr(sys.stdin.readline()))\n"),
        stdin_tests(["16\n"], ["'16\\n'\n"]),
        None,
    ),
    (
        "main_guard_last",
        fenced("def main():\n    print(int(input()) // 4)\nif __name__ == '__main__':\n    main()\n"),
        ROOT_16,
        None,
    ),
    (
        "main_guard_not_last",
        fenced("def main():\n    print(int(input()) // 4)\nif __name__ == '__main__':\n    main()\nx = 1\n"),
        ROOT_16,
        None,
    ),
    (
        "global_statement",
        fenced("total = 0\ndef add(n):\n    global total\n    total += n\nadd(int(input()))\nprint(total // 4)\n"),
        ROOT_16,
        None,
    ),
    ("exit_after_printing", fenced("print(int(input()) // 4)\nexit()\n"), ROOT_16, None),
    ("quit_after_printing", fenced("print(int(input()) // 4)\nquit()\n"), ROOT_16, None),
    ("runtime_error", fenced("print(1 // 0)\n"), ROOT_16, None),
    ("syntax_error", fenced("print(\n"), ROOT_16, None),
    ("wrong_answer", fenced("print(5)\n"), ROOT_16, None),
    ("two_tests_second_wrong", fenced("a, b = map(int, input().split())\nprint(3)\n"), SUM, None),
    # The output comparison.
    ("leading_space", prints(" 4"), ROOT_16, None),
    ("leading_blank_line", prints("\n4"), ROOT_16, None),
    ("trailing_spaces_and_lines", prints("4  \n\n\n"), ROOT_16, None),
    ("float_for_int", prints("4.0"), ROOT_16, None),
    ("trailing_zero", prints("2.50"), expects("2.5\n"), None),
    ("float_precision", prints("0.3333333"), expects("0.333333333\n"), None),
    ("exponent", prints("1e3"), expects("1000\n"), None),
    ("big_integers_differ_by_one", prints("50000000000000001"), expects("50000000000000000\n"), None),
    ("inner_spaces", prints("1  2"), expects("1 2\n"), None),
    ("tokens_on_other_lines", prints("1\n2"), expects("1 2\n"), None),
    ("case_differs", prints("yes"), expects("YES\n"), None),
    ("blank_line_inside", prints("1\n\n2"), expects("1\n2\n"), None),
    ("comma_separated", prints("1,2"), expects("1 2\n"), None),
    ("nan", prints("nan"), expects("nan\n"), None),
    ("infinity_spellings", prints("inf"), expects("Infinity\n"), None),
    ("negative_zero", prints("-0"), expects("0\n"), None),
    # Functional problems.
    ("call_plain", fenced("def f(a, b):\n    return a + b\n"), call_tests("f", ["1\n2"], ["3"]), None),
    ("call_tuple_for_list", fenced("def f(a):\n    return (a, a)\n"), call_tests("f", ["1"], ["[1, 1]"]), None),
    ("call_value_for_wrapped", fenced("def f(a):\n    return a\n"), call_tests("f", ["5"], ["[5]"]), None),
    ("call_tuples_in_list", fenced("def f(a):\n    return [(1, 2)]\n"), call_tests("f", ["5"], ["[[1, 2]]"]), None),
    ("call_set", fenced("def f(a):\n    return {1, 2}\n"), call_tests("f", ["5"], ["[1, 2]"]), None),
    (
        "call_numpy_int",
        fenced("import numpy as np\ndef f(a):\n    return np.int64(a)\n"),
        call_tests("f", ["5"], ["5"]),
        None,
    ),
    ("call_float_error", fenced("def f(a):\n    return 0.1 + 0.2\n"), call_tests("f", ["5"], ["0.3"]), None),
    ("call_bool_for_int", fenced("def f(a):\n    return True\n"), call_tests("f", ["5"], ["1"]), None),
    ("call_int_keys", fenced("def f(a):\n    return {1: 'x'}\n"), call_tests("f", ["5"], ['{"1": "x"}']), None),
    ("call_exit", fenced("def f(a):\n    exit()\n"), call_tests("f", ["5"], ["3"]), None),
    (
        "call_solution_class",
        fenced("class Solution:\n    def f(self, a: List[int]) -> int:\n        return max(a)\n"),
        call_tests("f", ["[3, 9, 2]"], ["9"]),
        None,
    ),
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
