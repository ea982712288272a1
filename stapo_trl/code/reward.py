"""The code reward of the STAPO paper: PRIME/Eurus's binary test reward, the tests run in a sandbox.

The paper trains Qwen3-1.7B-Base on Eurus-RL-Code with the rule of PRIME's ``prime_code`` (as in veRL): the
program is the last fenced ```` ```python ```` block of the completion; it earns +1.0 when it passes every test
and -1.0 otherwise (no block, syntax error, wrong output, crash, timeout). Tests are in APPS layout, a JSON object
``{"inputs": [...], "outputs": [...]}``:

- without ``fn_name``: each input is fed to the program's standard input and its standard output must equal the
  expected output line by line, trailing whitespace of each line and trailing blank lines aside;
- with ``fn_name``: the function (or ``Solution().<fn_name>``, the LeetCode layout) is called with each input's
  arguments and must return the expected value (an expected ``[value]`` also accepts ``value``, as APPS wraps
  them; tuples equal lists). An input may be a list of arguments, or a string of one JSON argument per line with
  a JSON expected output (the layout of PRIME's and LiveCodeBench's functional tests). An optional ``"atol"``
  lets floats differ by that much (for evaluation sets such as EvalPlus; PRIME's training tests have none).

Tests of one program run in one sandbox process (one forked child per test) and stop at the first failure. The
G x B completions of a batch are judged in parallel by `JUDGE_WORKERS` threads, each waiting on one sandbox. The
programs run in `stapo_trl.code.sandbox.LocalSandbox` unless another executor is given (see that module); the
expected outputs never enter the sandbox. Judging never raises on model output and never hangs: every program
has a deadline, and whatever goes wrong scores -1.0.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from stapo_trl.code.sandbox import OK, Executor, Job, Output, default_executor
from stapo_trl.completions import completion_text


logger = logging.getLogger(__name__)

#: Seconds of wall (and CPU) time per test; PRIME's ``prime_code`` allows 5 s. Assign to change every later call.
TIMEOUT_SECONDS = 5.0

#: Seconds one `code_reward` call may start programs for; later ones score -1.0 without running. It bounds the
#: wait of a training step when many programs run to their time limit. Assign to change every later call.
TIME_BUDGET_SECONDS = 300.0

#: Programs judged at once by each training process: one sandbox process each.
JUDGE_WORKERS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

# The last fenced Python block: ```python (or python3, py) ... ```.
_PYTHON_BLOCK = re.compile(r"```(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeTests:
    """Tests of one problem, validated (see `parse_tests`).

    Attributes:
        inputs: Standard-input texts, or (with `fn_name`) argument lists.
        outputs: Expected standard outputs (text), or expected return values.
        fn_name: The function to call; ``None`` for standard-input programs.
        atol: Absolute tolerance for floats in return values (0: exact).
    """

    inputs: list
    outputs: list
    fn_name: str | None = None
    atol: float = 0.0


@dataclass(frozen=True)
class TestsResult:
    """The verdict on one program: `passed` iff every test passed; `failure` says how the first failing one failed."""

    passed: bool
    tests_passed: int
    tests_total: int
    failure: str | None = None


def code_reward(
    completions,
    tests,
    timeout: float | None = None,
    executor: Executor | None = None,
    time_budget: float | None = None,
    **kwargs,
) -> list[float | None]:
    """PRIME's binary code reward, as used by STAPO: +1.0 when the program passes every test, -1.0 otherwise.

    A TRL reward function: ``GRPOTrainer`` calls it with ``prompts``, ``completions``, ``completion_ids`` and every
    dataset column; it reads ``completions`` and the ``tests`` column (`stapo_trl.code.data` writes it) and ignores
    the rest.

    Args:
        completions: Plain-text completions, or conversational ones (the last assistant message is judged).
        tests: One test set per completion: the APPS-layout JSON string (as in Eurus-2-RL-Data's
            ``reward_model.ground_truth``), a dict, or a `CodeTests`.
        timeout: Seconds per test (wall and CPU); default `TIMEOUT_SECONDS` (5 s, as PRIME).
        executor: Where programs run; default `stapo_trl.code.sandbox.default_executor()` (the local sandbox).
        time_budget: Seconds after which programs not yet started score -1.0 without running (counted in a
            warning); default `TIME_BUDGET_SECONDS`. Programs already running finish within their own limit
            (tests x `timeout`), so a call ends within about the budget plus one program's limit.

    Returns:
        One reward per completion: 1.0 or -1.0; ``None`` (left out by TRL) when the row's tests are malformed,
        which is also reported with a warning naming the row.
    """
    if len(completions) != len(tests):
        raise ValueError(f"{len(completions)} completions but {len(tests)} test sets")
    programs = [extract_program(completion_text(completion)) for completion in completions]
    parsed: list[CodeTests | ValueError] = []
    for value in tests:
        try:
            parsed.append(value if isinstance(value, CodeTests) else parse_tests(value))
        except ValueError as error:
            parsed.append(error)
    # Rows with the same tests share one CodeTests, so identical (program, tests) pairs, frequent among the G
    # completions of a prompt, are judged once.
    first_row: dict[Any, int] = {}
    tests_rows = [first_row.setdefault(_tests_key(value), row) for row, value in enumerate(tests)]
    pool = _judging_pool()
    budget = TIME_BUDGET_SECONDS if time_budget is None else float(time_budget)
    deadline = time.monotonic() + budget
    verdicts = {}
    for program, row in zip(programs, tests_rows):
        if program is not None and not isinstance(parsed[row], ValueError) and (program, row) not in verdicts:
            verdicts[program, row] = pool.submit(_passes, program, parsed[row], timeout, executor, deadline)
    unjudged = sum(future.result() is None for future in verdicts.values())
    if unjudged:
        logger.warning(
            "code_reward: %d of %d programs not started within the time budget of %g s scored -1 without running; "
            "raise TIME_BUDGET_SECONDS or JUDGE_WORKERS if this recurs.",
            unjudged,
            len(verdicts),
            budget,
        )
    rewards = []
    for row, (program, tests_row) in enumerate(zip(programs, tests_rows)):
        if isinstance(parsed[row], ValueError):
            warnings.warn(
                f"code_reward: row {row}: malformed tests: {parsed[row]}; the row is scored None.",
                stacklevel=2,
            )
            rewards.append(None)
        elif program is None:
            rewards.append(-1.0)
        else:
            rewards.append(1.0 if verdicts[program, tests_row].result() else -1.0)
    return rewards


def extract_program(text: str) -> str | None:
    """The content of the last fenced ```` ```python ```` block of `text` (``python3``, ``py`` too), or ``None``.

    Only closed blocks count: a completion cut off inside its last block has no program, as PRIME's rule intends
    a finished answer. An empty block is no program.
    """
    blocks = _PYTHON_BLOCK.findall(text)
    return blocks[-1] if blocks and blocks[-1].strip() else None


def parse_tests(value: Any) -> CodeTests:
    """Validate APPS-layout tests (a JSON string or a dict) into `CodeTests`; raise ``ValueError`` saying what fails.

    Accepted: ``inputs`` and ``outputs``, lists of the same non-zero length; optional ``fn_name`` (a non-empty
    string; ``null`` or ``""`` means standard-input tests) and ``atol`` (a non-negative number). Standard-input
    tests: each input and output a string or a list of lines. Function tests: each input a list of arguments or a
    string of one JSON argument per line (then the expected output may be its JSON text).
    """
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise ValueError(f"not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f'must be a JSON object {{"inputs": [...], "outputs": [...]}}, got {type(value).__name__}')
    inputs, outputs = value.get("inputs"), value.get("outputs")
    for name, items in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(items, list) or not items:
            raise ValueError(f"{name!r} must be a non-empty list, got {_describe(items)}")
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
    fn_name = value.get("fn_name") or None
    if fn_name is not None and (not isinstance(fn_name, str) or not fn_name.isidentifier()):
        raise ValueError(f"'fn_name' must be a function name, got {fn_name!r:.80}")
    atol = value.get("atol") or 0.0
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not atol >= 0:
        raise ValueError(f"'atol' must be a non-negative number, got {atol!r:.80}")
    if fn_name is None:
        return CodeTests(
            [_text(item, "inputs", i) for i, item in enumerate(inputs)],
            [_text(item, "outputs", i) for i, item in enumerate(outputs)],
        )
    call_inputs, call_outputs = [], []
    for i, (arguments, expected) in enumerate(zip(inputs, outputs)):
        if isinstance(arguments, str):  # one JSON argument per line, and then a JSON expected value
            try:
                arguments = [json.loads(line) for line in arguments.split("\n") if line.strip()]
            except ValueError:
                raise ValueError(f"inputs[{i}] must hold one JSON argument per line, got {arguments!r:.80}") from None
            if isinstance(expected, str):
                try:
                    expected = json.loads(expected)
                except ValueError:
                    pass  # a plain string return value
        elif not isinstance(arguments, list):
            raise ValueError(f"inputs[{i}] must be a list of arguments for {fn_name!r}, got {_describe(arguments)}")
        call_inputs.append(arguments)
        call_outputs.append(expected)
    return CodeTests(call_inputs, call_outputs, fn_name, float(atol))


def run_tests(
    program: str,
    tests: Any,
    *,
    timeout: float | None = None,
    executor: Executor | None = None,
) -> TestsResult:
    """Run `program` on `tests` (`CodeTests`, or what `parse_tests` accepts) until the first failing test.

    Raises ``ValueError`` for malformed tests only; whatever the program does ends in a `TestsResult`.
    """
    tests = tests if isinstance(tests, CodeTests) else parse_tests(tests)
    job = Job(program, tests.inputs, tests.fn_name, _timeout(timeout))
    passed = 0
    outputs = iter((executor or default_executor()).execute(job))
    try:
        for expected, output in zip(tests.outputs, outputs):
            if output.status != OK:
                return TestsResult(
                    False,
                    passed,
                    len(tests.inputs),
                    f"test {passed}: {output.status}: {output.detail}",
                )
            if not output_matches(output.value, expected, call=tests.fn_name is not None, atol=tests.atol):
                return TestsResult(
                    False,
                    passed,
                    len(tests.inputs),
                    f"test {passed}: wrong output {output.value!r:.200}",
                )
            passed += 1
    finally:
        close = getattr(outputs, "close", None)
        if close is not None:
            close()
    if passed < len(tests.inputs):
        return TestsResult(False, passed, len(tests.inputs), f"test {passed}: no output")
    return TestsResult(True, passed, len(tests.inputs))


def run_program(
    program: str,
    inputs: Sequence[Any],
    *,
    fn_name: str | None = None,
    timeout: float | None = None,
    executor: Executor | None = None,
) -> list[Output]:
    """Run `program` on each input and return its `Output` per input (stdout text, or with `fn_name` the return value).

    For computing expected outputs from a reference solution (EvalPlus's ``canonical_solution``). The list ends
    early, with the failing input's `Output`, when an input ends in anything but ``"ok"``.
    """
    return list((executor or default_executor()).execute(Job(program, list(inputs), fn_name, _timeout(timeout))))


def output_matches(actual: Any, expected: Any, *, call: bool, atol: float = 0.0) -> bool:
    """Whether a program's output counts as the expected one (see the module docstring for the rules)."""
    if not call:
        return isinstance(actual, str) and _lines(actual) == _lines(_text(expected, "outputs", 0))
    if _same_value(actual, expected, atol):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _same_value(actual, expected[0], atol)


def _passes(
    program: str, tests: CodeTests, timeout: float | None, executor: Executor | None, deadline: float
) -> bool | None:
    """Whether `program` passes `tests`; ``None`` when the time budget ran out before it could start."""
    if time.monotonic() > deadline:
        return None
    try:
        return run_tests(program, tests, timeout=timeout, executor=executor).passed
    except Exception:  # a failing executor costs the program its reward, never the training step
        logger.exception("code_reward: judging a program failed; scored -1")
        return False


def _tests_key(value: Any) -> Any:
    return value if isinstance(value, (str, CodeTests)) else json.dumps(value, sort_keys=True, default=repr)


def _same_value(actual: Any, expected: Any, atol: float) -> bool:
    if isinstance(expected, tuple):
        expected = list(expected)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(_same_value(a, e, atol) for a, e in zip(actual, expected))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(_same_value(actual[k], expected[k], atol) for k in actual)
    if atol and float in (type(actual), type(expected)) and all(type(x) in (int, float) for x in (actual, expected)):
        return math.isclose(actual, expected, rel_tol=0.0, abs_tol=atol)
    return actual == expected  # plain JSON values on both sides: Python's equality (1 == 1.0, True == 1)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def _text(value: Any, field: str, index: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise ValueError(f"{field}[{index}] must be a string (or a list of lines), got {_describe(value)}")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _timeout(timeout: float | None) -> float:
    timeout = TIMEOUT_SECONDS if timeout is None else float(timeout)
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _judging_pool() -> ThreadPoolExecutor:
    """This process's `JUDGE_WORKERS` judging threads (a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (
                os.getpid(),
                ThreadPoolExecutor(JUDGE_WORKERS, thread_name_prefix="stapo-code-judge"),
            )
        return _pool[1]
