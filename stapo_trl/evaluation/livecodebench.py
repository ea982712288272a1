"""LiveCodeBench's grading (``lcb_runner/evaluation/testing_util.py``), with the program in this project's sandbox.

- Program (``lcb_runner/utils/extraction_utils.extract_code``, chat models): the lines between the last two lines
  that contain a fence ```` ``` ````; fewer than two such lines: no program.
- Preamble: its ``import_string`` (``from math import *``, ``collections``, ``sys``... and
  ``sys.setrecursionlimit(50000)``); ``quit`` is ``None`` (its ``reliability_guard``), ``exit`` works; integers
  convert to and from text up to 50000 digits (``sys.set_int_max_str_digits``, set by its metrics module).
- Standard-input programs: a final ``if __name__ == '__main__':`` block unwrapped, every statement but the imports
  moved into ``wrapped_function()`` (by the syntax tree), called with ``sys.stdin`` its mock (``buffer.read()`` the
  bytes) and ``open`` returning the input, the earlier standard input patched as its ``call_method`` does (see
  `stdin_driver`); ``SystemExit`` ends it normally.
- Output comparison (`stdout_matches`): the same number of lines once the whole text and each line are stripped;
  each line equal, or equal as ``Decimal`` tokens (``2.50`` is ``2.5``, ``1.0`` is ``1``).
- Functional problems: arguments and the expected value are JSON, one argument per line; a tuple counts as a list,
  then Python's ``==`` (so ``np.int64(5)`` is ``5`` but ``[(1, 2)]`` is not ``[[1, 2]]``). ``class Solution`` in the
  program means the method of one ``Solution()``.
- 6 s per test; public and private tests. The private tests are stored as base64 of zlib of a **pickle**, which runs
  code when loaded: `decode_private_tests` loads them inside the sandbox, and only their JSON comes out.

Known differences: each test runs in its own forked process, so state a program keeps between calls (LiveCodeBench
calls one ``Solution()`` for every test) starts afresh; LiveCodeBench's whole-program limit ((6 + 1) s x tests + 5 s)
is not applied (each test has its 6 s); output written to ``sys.__stdout__`` or descriptor 1 is read here, not there.
"""

from __future__ import annotations

import ast
import json
from decimal import Decimal, InvalidOperation
from typing import Any

from ..code.reward import (
    APPS_IMPORTS,
    CodeTests,
    Harness,
    bind_solution_method,
    run_program,
    stdin_driver,
    unwrap_main_guard,
)
from ..code.sandbox import OK, LocalSandbox


#: LiveCodeBench's ``import_string``, verbatim.
PREAMBLE = APPS_IMPORTS + "sys.setrecursionlimit(50000)\n"

#: The problems of LiveCodeBench v6: released after release_v5 (to January 2025), up to release_v6 (April 2025), by
#: ``contest_date``, as ``lcb_runner --start_date 2025-02-01 --end_date 2025-05-01`` selects them (both ends are
#: midnight and included).
V6_WINDOW = ("2025-02-01", "2025-05-01")

# Its reliability_guard sets quit (not exit) to None; its metrics module lets int and str convert 50000 digits.
_GUARD = "import builtins, sys\nbuiltins.quit = None\nsys.set_int_max_str_digits(50000)\n"

# LiveCodeBench's standard input during the call (its MockStdinWithBuffer, verbatim but for the names' spelling).
_MOCK_STDIN = """\
class MockBuffer:
    def __init__(self, inputs):
        self.inputs = inputs.encode("utf-8")

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self.inputs.split(b"\\n")[0] + b"\\n"

class MockStdinWithBuffer:
    def __init__(self, inputs):
        self.inputs = inputs
        self._stringio = io.StringIO(inputs)
        self.buffer = MockBuffer(inputs)

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self._stringio.readline(*args)

    def readlines(self, *args):
        return self.inputs.split("\\n")

    def __getattr__(self, name):
        return getattr(self._stringio, name)
"""

# Loads LiveCodeBench's private tests inside the sandbox: the input is the stored text, the output the tests' JSON.
_PRIVATE_TESTS_DECODER = """\
import base64, json, pickle, sys, zlib
tests = pickle.loads(zlib.decompress(base64.b64decode(sys.stdin.read().encode("utf-8"))))
json.loads(tests)
sys.stdout.write(tests)
"""


def extract_program(text: str, tests: CodeTests | None = None) -> str | None:
    """LiveCodeBench's program of a chat model's answer: between the last two lines holding a fence."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    program = "\n".join(lines[fences[-2] + 1 : fences[-1]])
    return program if program.strip() else None


def prepare_program(program: str, tests: CodeTests) -> str:
    """The program as LiveCodeBench runs it: after its preamble; a standard-input one inside ``wrapped_function``."""
    if tests.fn_name is not None:
        return _GUARD + PREAMBLE + "\n\n" + program + bind_solution_method(program, tests.fn_name)
    return stdin_driver(
        _make_function(unwrap_main_guard(program)),
        function="wrapped_function",
        setup=_GUARD,
        stdin_class=_MOCK_STDIN,
        stdin_factory="MockStdinWithBuffer",
    )


def _make_function(code: str) -> str:
    try:
        tree = ast.parse(code)
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        others = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
        function = ast.FunctionDef(
            name="wrapped_function",
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=others,
            decorator_list=[],
            lineno=-1,
        )
        return PREAMBLE + "\n" + ast.unparse(imports) + "\n" + ast.unparse(function)
    except Exception:  # as LiveCodeBench: a program that does not parse runs as it is, and fails
        return code


def output_matches(actual: Any, expected: Any, tests: CodeTests, index: int) -> bool:
    """LiveCodeBench's verdict on one test's output."""
    if tests.fn_name is None:
        return isinstance(actual, str) and stdout_matches(actual, expected)
    if isinstance(actual, tuple):
        actual = list(actual)
    return bool(actual == expected)


def stdout_matches(prediction: str, expected: str) -> bool:
    """LiveCodeBench's ``grade_stdio`` comparison: stripped lines, each equal or equal as ``Decimal`` tokens."""
    predicted_lines, expected_lines = _stripped_lines(prediction), _stripped_lines(expected)
    if len(predicted_lines) != len(expected_lines):
        return False
    for predicted, wanted in zip(predicted_lines, expected_lines):
        if predicted == wanted:
            continue
        try:
            if [Decimal(token) for token in predicted.split()] != [Decimal(token) for token in wanted.split()]:
                return False
        except (InvalidOperation, ValueError):
            return False
    return True


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def decode_private_tests(encoded: list[str], timeout: float = 60.0) -> list[list[dict[str, Any]]]:
    """Each problem's private tests, loaded from their stored form (base64, zlib, pickle) inside the sandbox.

    Raises ``ValueError`` naming the problem (by position) whose text does not load as a JSON list of tests.
    """
    if not encoded:
        return []
    sandbox = LocalSandbox(max_output_bytes=1 << 30)  # a few problems hold hundreds of MB of tests
    outputs = run_program(_PRIVATE_TESTS_DECODER, encoded, timeout=timeout, executor=sandbox)
    decoded = []
    for number, output in enumerate(outputs):
        if output.status != OK:
            raise ValueError(
                f"private_test_cases of problem {number + 1} do not load as LiveCodeBench stores them "
                f"(base64 of zlib of a pickled JSON text): {output.status}: {output.detail[-300:]}"
            )
        decoded.append(_json_list(output.value, number))
    if len(decoded) < len(encoded):
        raise ValueError(f"private_test_cases of problem {len(decoded) + 1}: the sandbox gave no result")
    return decoded


def _json_list(text: str, number: int) -> list:
    tests = json.loads(text)
    if not isinstance(tests, list):
        raise ValueError(f"private_test_cases of problem {number + 1} must be a list of tests")
    return tests


LIVECODEBENCH = Harness(
    name="lcb_runner",
    extract_program=extract_program,
    prepare_program=prepare_program,
    output_matches=output_matches,
    timeout=6.0,
)
