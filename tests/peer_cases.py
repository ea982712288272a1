"""What the agreement tests share: running a peer's own grading code (tests/peers) on cases, and case helpers."""

import json
import os
import sys
import tempfile
from pathlib import Path

from conftest import started_commands


PEERS = Path(__file__).resolve().parent / "peers"


def peer_verdicts(peer: str, cases: list[dict], timeout: float = 900) -> list:
    """The peer's verdict on each case (see tests/peers/verdicts.py), from one process (its whole group killed on
    timeout)."""
    return peer_verdicts_alongside(peer, cases, lambda: None, timeout)[0]


def peer_verdicts_alongside(peer: str, cases: list[dict], work, timeout: float = 900) -> tuple[list, object]:
    """`peer_verdicts`, and what `work()` returns: `work` runs in this process while the peer's process judges the
    cases."""
    with tempfile.TemporaryDirectory() as directory:
        cases_file, out = Path(directory) / "cases.json", Path(directory) / "verdicts.json"
        cases_file.write_text(json.dumps(cases))
        # The peers run the programs in their working directory: a scratch one.
        with started_commands(
            [[sys.executable, str(PEERS / "verdicts.py"), peer, str(cases_file), str(out)]],
            timeout=timeout,
            cwd=directory,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ) as finish:
            result = work()
            [process] = finish()
        assert process.returncode == 0, process.stderr[-3000:]
        return json.loads(out.read_text()), result


def stdin_tests(inputs: list[str], outputs: list[str]) -> dict:
    return {"inputs": inputs, "outputs": outputs}


def call_tests(fn_name: str, arguments: list[str], outputs: list[str]) -> dict:
    """Functional tests in PRIME's and LiveCodeBench's layout: one JSON argument per line, a JSON expected value."""
    return {"fn_name": fn_name, "inputs": arguments, "outputs": outputs}


def fenced(program: str, prose: str = "Here is my solution.") -> str:
    return f"{prose}\n```python\n{program}```\n"


ROOT_16 = stdin_tests(["16\n"], ["4\n"])
SUM = stdin_tests(["1 2\n", "10 -3\n"], ["3\n", "7\n"])


def prints(text: str) -> str:
    return fenced(f"input()\nprint({text!r}, end='')\n")


#: (name, completion, tests, None): cases for both APPS-derived harnesses, PRIME's and LiveCodeBench's (extraction,
#: preamble, standard-input wrapping, comparisons). Each agreement test judges them against its own peer, beside its
#: own cases; the two peers' verdicts on a case may differ.
APPS_CASES = [
    # Program extraction, where both rules find the same program.
    ("fenced", fenced("print(int(input()) // 4)\n"), ROOT_16, None),
    ("no_fence_at_all", "print(int(input()) // 4)\n", ROOT_16, None),
    ("python3_fence", "```python3\nprint(int(input()) // 4)\n```\n", ROOT_16, None),
    ("last_of_two_blocks", fenced("print(0)\n") + fenced("print(int(input()) // 4)\n"), ROOT_16, None),
    (
        "function_then_usage_block",
        fenced("def solve(n):\n    return n // 4\n") + fenced("print(solve(int(input())))\n", "Usage:"),
        ROOT_16,
        None,
    ),
    # The preamble and the recursion limit.
    ("sqrt_without_import", fenced("print(int(sqrt(int(input()))))\n"), ROOT_16, None),
    ("counter_without_import", fenced("print(Counter(input())['1'])\n"), stdin_tests(["1121\n"], ["3\n"]), None),
    (
        "recursion_depth_5000",
        fenced("def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\nprint(depth(int(input())))\n"),
        stdin_tests(["5000\n"], ["5000\n"]),
        None,
    ),
    # Standard input as both wrap the program (APPS's call_method).
    ("readline_then_int", fenced("import sys\nprint(int(sys.stdin.readline()) // 4)\n"), ROOT_16, None),
    ("readline_alias", fenced("import sys\ninput = sys.stdin.readline\nprint(int(input()) // 4)\n"), ROOT_16, None),
    ("read_split", fenced("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"), SUM, None),
    (
        "for_line_in_stdin",
        fenced("import sys\nfor line in sys.stdin:\n    print(sum(map(int, line.split())))\n"),
        SUM,
        None,
    ),
    ("from_sys_import_stdin", fenced("from sys import stdin\nprint(int(stdin.readline()) // 4)\n"), ROOT_16, None),
    ("stdin_buffer", fenced("import sys\nprint(int(sys.stdin.buffer.read()) // 4)\n"), ROOT_16, None),
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
    ("trailing_zero", prints("2.50"), stdin_tests(["x\n"], ["2.5\n"]), None),
    ("float_precision", prints("0.3333333"), stdin_tests(["x\n"], ["0.333333333\n"]), None),
    ("exponent", prints("1e3"), stdin_tests(["x\n"], ["1000\n"]), None),
    ("big_integers_differ_by_one", prints("50000000000000001"), stdin_tests(["x\n"], ["50000000000000000\n"]), None),
    ("inner_spaces", prints("1  2"), stdin_tests(["x\n"], ["1 2\n"]), None),
    ("tokens_on_other_lines", prints("1\n2"), stdin_tests(["x\n"], ["1 2\n"]), None),
    ("case_differs", prints("yes"), stdin_tests(["x\n"], ["YES\n"]), None),
    ("blank_line_inside", prints("1\n\n2"), stdin_tests(["x\n"], ["1\n2\n"]), None),
    ("nan", prints("nan"), stdin_tests(["x\n"], ["nan\n"]), None),
    # Functional tests (one JSON argument per line, a JSON expected value).
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
    (
        "call_solution_class",
        fenced("class Solution:\n    def f(self, a: List[int]) -> int:\n        return max(a)\n"),
        call_tests("f", ["[3, 9, 2]"], ["9"]),
        None,
    ),
    ("call_exit", fenced("def f(a):\n    exit()\n"), call_tests("f", ["5"], ["3"]), None),
]
