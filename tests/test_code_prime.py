"""stapo_trl.code.prime: the training reward agrees with veRL's own prime_code (tests/peers/prime_code, run on the
same cases), binary and partial credit, on tricky programs, outputs and return values; the differences that remain
are the cases marked with their reason, and the test shows they are differences."""

import pytest
from peer_cases import APPS_CASES, ROOT_16, SUM, call_tests, fenced, peer_verdicts_alongside, prints, stdin_tests

from stapo_trl.code.prime import extract_program, return_matches, stdout_matches
from stapo_trl.code.reward import code_reward


# (name, completion, tests, how it differs from prime_code or None): APPS_CASES and this harness's own
CASES = [
    *APPS_CASES,
    # Program extraction: the text after the last ```python, up to the next fence or the end.
    ("unclosed_last_block", "Solution:\n```python\nprint(int(input()) // 4)\n", ROOT_16, None),
    ("bare_fence", "```\nprint(int(input()) // 4)\n```\n", ROOT_16, None),
    ("prose_then_bare_fence", "I print it:\n```\nprint(int(input()) // 4)\n```\n", ROOT_16, None),
    # Standard input as PRIME wraps the program.
    ("readlines", fenced("import sys\nprint(sum(map(int, sys.stdin.readlines()[0].split())))\n"), SUM, None),
    ("sys_exit_after_printing", fenced("import sys\nprint(int(input()) // 4)\nsys.exit(0)\n"), ROOT_16, None),
    ("reads_past_the_input", fenced("input()\ninput()\nprint(4)\n"), ROOT_16, None),
    ("stderr_only", fenced("import sys\nsys.stderr.write('4')\n"), ROOT_16, None),
    # The output comparison.
    ("float_far", prints("0.34"), stdin_tests(["x\n"], ["0.333333333\n"]), None),
    ("indented_lines", prints("  1\n  2"), stdin_tests(["x\n"], ["1\n2\n"]), None),
    (
        "expected_as_list_of_lines",
        prints("world\nhello"),
        stdin_tests(["x\n"], [["world", "hello"]]),
        "PRIME's truncatefn asserts that a test's text is a str, so a test written as a list of lines fails every "
        "program there; here the lines are joined, as its comparison then does",
    ),
    ("empty_output", prints(""), stdin_tests(["x\n"], ["\n"]), None),
    # Functional tests: PRIME's layout (one JSON argument per line, a JSON expected value).
    (
        "call_tuples_in_wrapped",
        fenced("def f(a):\n    return [(1, 2)]\n"),
        call_tests("f", ["5"], ["[[[1, 2]]]"]),
        None,
    ),
    (
        "call_always_equal",
        fenced("class A:\n    def __eq__(self, o):\n        return True\ndef f(a):\n    return A()\n"),
        call_tests("f", ["5"], ["3"]),
        None,
    ),
    (
        "call_apps_argument_lists",
        fenced("def f(a, b):\n    return a + b\n"),
        {"fn_name": "f", "inputs": [[1, 2]], "outputs": [[3]]},
        "PRIME splits each input as text, so argument lists (APPS's layout) fail every program there; here they are "
        "the arguments",
    ),
]


@pytest.fixture(scope="module")
def verdicts():
    completions = [completion for _, completion, _, _ in CASES]
    tests = [tests for _, _, tests, _ in CASES]
    peer, (binary, partial) = peer_verdicts_alongside(
        "prime",
        [{"completion": c, "tests": t} for c, t in zip(completions, tests)],
        lambda: (code_reward(completions, tests), code_reward(completions, tests, partial_credit=True)),
    )
    return dict(zip((name for name, *_ in CASES), zip(peer, binary, partial)))


@pytest.mark.parametrize("name, difference", [(name, difference) for name, _, _, difference in CASES])
def test_agrees_with_prime_code(verdicts, name, difference):
    peer, binary, partial = verdicts[name]
    peer_passes = peer is True  # veRL: True when every test passes, else the fraction of the first ten
    peer_partial = 1.0 if peer_passes else 2 * peer - 1
    if difference is None:
        assert (binary == 1.0, partial) == (peer_passes, pytest.approx(peer_partial))
    else:
        assert (binary == 1.0) != peer_passes, difference


def test_at_least_forty_cases_and_both_verdicts_among_them(verdicts):
    assert len(CASES) >= 40
    assert {binary for _, binary, _ in verdicts.values()} == {1.0, -1.0}


# Rules checked against hand-computed values, independently of the peer.


@pytest.mark.parametrize(
    "text, program",
    [
        ("```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\n", "\nprint(2)\n"),
        ("```python\nprint(1)\n", "\nprint(1)\n"),
        ("print(1)", "print(1)"),
        ("```\nprint(1)\n```", None),  # the text before the first fence: nothing
        ("```python\n   \n```", None),
    ],
)
def test_extract_program(text, program):
    assert extract_program(text) == program


@pytest.mark.parametrize(
    "output, expected, same",
    [
        ("4\n", "4", True),
        (" 4 \n\n", "4", True),
        ("1.0\n", "1", True),  # floats per line under np.allclose (rtol 1e-5) unless all lines are whole numbers
        ("100001\n", "100000", False),
        ("1.00001\n", "1.0", True),
        ("1.0001\n", "1.0", False),
        ("1 2\n", "1  2", False),
        ("a\n\nb\n", "a\nb", True),  # blank lines of the output dropped
    ],
)
def test_stdout_matches(output, expected, same):
    assert stdout_matches(output, expected) is same


@pytest.mark.parametrize(
    "value, expected, same",
    [((1, 2), [1, 2], True), (3, [3], True), ([(1, 2)], [[1, 2]], False), ({1}, [1], False), ({1: 2}, {"1": 2}, True)],
)
def test_return_matches(value, expected, same):
    assert return_matches(value, expected) is same
