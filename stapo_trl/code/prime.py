"""PRIME's code grading (veRL's ``reward_score/prime_code``), the rule Eurus-2-RL-Data's code rewards were built for.

What veRL's ``prime_code.compute_score`` does with a completion and an APPS-layout test set, reproduced here with the
program in this project's sandbox and the comparison in the trainer:

- Program: ``completion.split("```python")[-1].split("```")[0]``: the text after the last ```` ```python ```` up to
  the next fence or the end, so an unclosed last block runs, and a completion without that fence runs whole up to its
  first bare fence.
- Preamble: its import block (``from math import *``, ``collections``, ``sys``...) and
  ``sys.setrecursionlimit(6*10**5)`` before the program; ``exit`` and ``quit`` are ``None`` there, so calling them
  fails, as under its ``reliability_guard``.
- Standard-input programs: its wrapping: lines that do not start with ``import``/``from`` go into a function
  ``code()`` (a final ``if __name__ == '__main__':`` block unwrapped first), called with ``sys.stdin`` a
  ``StringIO`` of the input, the earlier standard input (what ``from sys import stdin`` holds) patched to give the
  input's lines without their newline, and ``open`` returning the input (see `stdin_driver`); ``SystemExit`` ends
  the program normally; ``print`` output is captured.
- Output comparison (`stdout_matches`): its cascade of rules: equal after stripping the whole text (or each line),
  equal as lists of stripped non-empty lines, or, unless every line is a whole number, equal as one float per line
  under ``np.allclose``.
- Return values (`return_matches`): ``json.dumps`` must accept the value (a set or a NumPy value fails); a tuple
  counts as a list; the expected value ``[v]`` also accepts ``v``; a list of tuples also counts as a list of lists.
- 5 s per test.

Known differences, each with its reason (``tests/test_code_prime.py`` marks the first two among its agreement cases
with veRL's own code): tests in APPS's layout, argument lists for a function or a list of lines for a text, fail
every program under PRIME (it splits the arguments as text; its ``truncatefn`` asserts a str) and run here with
those arguments and the lines joined; PRIME also bounds all tests of one program together by 6 s of wall time and
makes a first dict argument's digit keys ints, which is not done here; a program writing to ``sys.__stdout__`` or
descriptor 1 directly is read here and not there.

The paper's Table 3 numbers come from training with this reward; whether veRL's partial credit was on (its default
for Eurus' code sources passes ``continuous=True``) the paper does not say. The binary form is the more likely and
is the default here: the paper's analysis sorts answers into correct ones (positive advantage) and others, its code
case study explains a positive reward by a flawed solution that "may still pass the evaluated test cases", and its
math reward is +1/-1. ``partial_credit=True`` of `code_reward` gives veRL's continuous score (see there).
"""

from __future__ import annotations

import json
from typing import Any

from stapo_trl.code.reward import (
    APPS_IMPORTS,
    CodeTests,
    Harness,
    bind_solution_method,
    stdin_driver,
    unwrap_main_guard,
)


#: PRIME's import block, verbatim (``testing_util.run_test``).
PREAMBLE = APPS_IMPORTS + "sys.setrecursionlimit(6*10**5)\n"

# Its reliability_guard: exit and quit are None.
_GUARD = "import builtins\nbuiltins.exit = builtins.quit = None\n"


def extract_program(text: str, tests: CodeTests | None = None) -> str | None:
    """PRIME's program: after the last ```` ```python ````, up to the next fence; ``None`` when that is blank."""
    program = text.split("```python")[-1].split("```")[0]
    return program if program.strip() else None


def prepare_program(program: str, tests: CodeTests) -> str:
    """The program as PRIME runs it: after its preamble, a standard-input program wrapped into ``code()``."""
    if tests.fn_name is not None:
        return _GUARD + PREAMBLE + program + bind_solution_method(program, tests.fn_name)
    return stdin_driver(PREAMBLE + _wrap_in_function(program), function="code", setup=_GUARD)


def _wrap_in_function(program: str) -> str:
    """PRIME's text transformation of a standard-input program (``testing_util.run_test``), step for step."""
    program = unwrap_main_guard(program)
    lines = [
        line + "\n" if line.startswith(("from ", "import ")) else "\t" + line + "\n" for line in program.split("\n")
    ]
    wrapped, started = "", False
    for line in lines:
        if line.startswith("\t") and not started:
            wrapped += "stdin = sys.stdin\nstdout = sys.stdout\ndef code():\n" + line
            started = True
        elif started and line.startswith(("from ", "import ")):
            wrapped += "\t" + line
        else:
            wrapped += line
    return wrapped


def output_matches(actual: Any, expected: Any, tests: CodeTests, index: int) -> bool:
    """PRIME's verdict on one test's output (`stdout_matches` or `return_matches`)."""
    if tests.fn_name is None:
        return isinstance(actual, str) and stdout_matches(actual, expected)
    return return_matches(actual, expected)


def stdout_matches(output_text: str, expected: str) -> bool:
    """PRIME's comparison of a standard-input program's output with the expected text, rule for rule."""
    import numpy as np  # the trainer's; the comparison never runs in the sandbox

    output = output_text.splitlines()
    if _stripped_equal("\n".join(output), expected) or _stripped_equal("\n".join(o.strip() for o in output), expected):
        return True
    if output == [expected]:
        return True
    expected_lines = [line.strip() for line in expected.split("\n") if line]
    if output == expected_lines:
        return True
    output = [line for line in output if line]
    if output == expected_lines:
        return True
    if len(output) == len(expected_lines) and not all(
        _whole_number(a) and _whole_number(b) for a, b in zip(output, expected_lines)
    ):
        try:
            return bool(np.allclose([float(e) for e in output], [float(e) for e in expected_lines]))
        except ValueError:
            pass
    return False  # its last rule, token sets per line, can only match what the rules above matched


def return_matches(output: Any, expected: Any) -> bool:
    """PRIME's comparison of a function's return value with the expected (JSON-decoded) value."""
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        return False  # PRIME writes the value with json.dumps before comparing: the test errs
    try:  # JSON keys are strings: PRIME makes digit keys ints again, of a dict or a list's first dict
        if isinstance(expected, dict):
            expected = [{int(k): v for k, v in expected.items()}]
    except Exception:
        pass
    try:
        if isinstance(expected[0], dict):
            expected = [{int(k): v for k, v in expected[0].items()}]
    except Exception:
        pass
    if isinstance(output, tuple):
        output = list(output)
    result = output == expected
    if isinstance(expected, list) and expected:
        result = result or output == expected[0]
    try:
        if isinstance(output[0], tuple):
            result = result or [list(x) for x in output] == expected[0]
    except Exception:
        pass
    return result is True


def _stripped_equal(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def _whole_number(value: str) -> bool:
    return value.isdigit()


PRIME = Harness(
    name="prime_code",
    extract_program=extract_program,
    prepare_program=prepare_program,
    output_matches=output_matches,
    timeout=5.0,
)
