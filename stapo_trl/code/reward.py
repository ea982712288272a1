"""The code reward of the STAPO paper, and the machinery every code harness shares: tests, sandbox runs, verdicts.

A `Harness` is one benchmark's own grading rules: how the program is taken from a completion (`extract_program`),
what runs around it (`prepare_program`: preamble, wrapping), how an output is judged (`output_matches`) and the
time per test. The training reward uses PRIME's (`stapo_trl.code.prime.PRIME`, veRL's ``prime_code``: what
Eurus-2-RL-Data was built for); the evaluation uses EvalPlus's and LiveCodeBench's (`stapo_trl.evaluation`).

Tests are in APPS layout, a JSON object ``{"inputs": [...], "outputs": [...]}`` (`parse_tests`):

- without ``fn_name``: each input is fed to the program's standard input; the harness judges its standard output;
- with ``fn_name``: the function (or ``Solution().<fn_name>``, the LeetCode layout) is called with each input's
  arguments (a list, or a string of one JSON argument per line, the layout of PRIME's and LiveCodeBench's
  functional tests); the harness judges the return value, which keeps its Python type across the sandbox's wall
  (tuples, sets, NumPy values: `stapo_trl.code.values`).

Tests of one program run in one sandbox process (one forked child per test) and stop at the first failure. The
G x B completions of a batch are judged in parallel by `workers` threads, each waiting on one sandbox. The programs
run in `stapo_trl.code.sandbox.LocalSandbox` unless another executor is given (see that module); the expected
outputs never enter the sandbox. Judging never raises on model output and never hangs: every program has a
deadline, and whatever goes wrong scores -1.0.

Settings are keyword arguments of `code_reward`; fix them for a trainer with `functools.partial`, keeping the name
TRL logs the reward under::

    reward = functools.update_wrapper(functools.partial(code_reward, timeout=10.0, partial_credit=True), code_reward)
"""

from __future__ import annotations

import ast
import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from stapo_trl.code import values
from stapo_trl.code.sandbox import OK, Executor, Job, Output, default_executor
from stapo_trl.completions import completion_text


logger = logging.getLogger(__name__)

#: Seconds one `code_reward` call may start programs for, by default; later ones score -1.0 without running.
TIME_BUDGET_SECONDS = 300.0

#: veRL's partial credit: the first tests, each run on its own with this many seconds (``prime_code``: 10, 10 s).
PARTIAL_CREDIT_TESTS, PARTIAL_CREDIT_TIMEOUT = 10, 10.0


@dataclass(frozen=True)
class CodeTests:
    """Tests of one problem, validated (see `parse_tests`).

    Attributes:
        inputs: Standard-input texts, or (with `fn_name`) argument lists.
        outputs: Expected standard outputs (text), or expected return values.
        fn_name: The function to call; ``None`` for standard-input programs.
        atol: Absolute tolerance for floats in return values, for harnesses that use one (EvalPlus).
        timeouts: Seconds for each test, where a harness derives them per test (EvalPlus); else the harness's.
    """

    inputs: list
    outputs: list
    fn_name: str | None = None
    atol: float = 0.0
    timeouts: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Harness:
    """One benchmark's grading rules.

    Attributes:
        name: What the rules are (a peer tool's name).
        extract_program: ``(text, tests) -> program`` of a completion's text, or ``None`` when it has none.
        prepare_program: ``(program, tests) -> source`` the sandbox runs: the program with the harness's preamble
            and wrapping.
        output_matches: ``(actual, expected, tests, index) -> bool``: whether test `index` passed; `actual` is the
            standard output (text) or the decoded return value.
        timeout: Seconds of wall (and CPU) time per test, unless the tests carry their own.
    """

    name: str
    extract_program: Callable[[str, CodeTests], str | None]
    prepare_program: Callable[[str, CodeTests], str]
    output_matches: Callable[[Any, Any, CodeTests, int], bool]
    timeout: float


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
    *,
    harness: Harness | None = None,
    partial_credit: bool = False,
    timeout: float | None = None,
    time_budget: float = TIME_BUDGET_SECONDS,
    workers: int | None = None,
    executor: Executor | None = None,
    **kwargs,
) -> list[float | None]:
    """The code reward: +1.0 when the program passes every test, -1.0 otherwise, as PRIME grades by default.

    A TRL reward function: ``GRPOTrainer`` calls it with ``prompts``, ``completions``, ``completion_ids`` and every
    dataset column; it reads ``completions`` and the ``tests`` column (`stapo_trl.code.data` writes it) and ignores
    the rest. Fix the settings with ``functools.partial`` (see the module docstring).

    Args:
        completions: Plain-text completions, or conversational ones (the last assistant message is judged).
        tests: One test set per completion: the APPS-layout JSON string (as in Eurus-2-RL-Data's
            ``reward_model.ground_truth``), a dict, or a `CodeTests`.
        harness: The grading rules; default `stapo_trl.code.prime.PRIME` (veRL's ``prime_code``).
        partial_credit: veRL's continuous score instead of the binary one: 1.0 when every test passes, otherwise
            the fraction f of the first 10 tests that pass, each run on its own with 10 s, as ``2 f - 1``
            (veRL returns f; the affine map keeps the binary scale, and group-normalized advantages do not see it).
        timeout: Seconds per test (wall and CPU); default the harness's (PRIME: 5 s).
        time_budget: Seconds after which programs not yet started score -1.0 without running (counted in a
            warning). Programs already running finish within their own limit (tests x `timeout`), so a call ends
            within about the budget plus one program's limit.
        workers: Programs judged at once (one sandbox process each); default the CPU cores of this process.
        executor: Where programs run; default `stapo_trl.code.sandbox.default_executor()` (the local sandbox).

    Returns:
        One reward per completion in [-1.0, 1.0]; ``None`` (left out by TRL) when the row's tests are malformed,
        which is also reported with a warning naming the row.
    """
    if len(completions) != len(tests):
        raise ValueError(f"{len(completions)} completions but {len(tests)} test sets")
    harness = harness or _prime()
    parsed: list[CodeTests | ValueError] = []
    for value in tests:
        try:
            parsed.append(value if isinstance(value, CodeTests) else parse_tests(value))
        except ValueError as error:
            parsed.append(error)
    programs = [
        None if isinstance(row_tests, ValueError) else harness.extract_program(completion_text(completion), row_tests)
        for completion, row_tests in zip(completions, parsed)
    ]
    # Rows with the same tests share one CodeTests, so identical (program, tests) pairs, frequent among the G
    # completions of a prompt, are judged once.
    first_row: dict[Any, int] = {}
    tests_rows = [first_row.setdefault(_tests_key(value), row) for row, value in enumerate(tests)]
    pool = _judging_pool(workers or default_workers())
    deadline = time.monotonic() + float(time_budget)
    scores = {}
    for program, row in zip(programs, tests_rows):
        if program is not None and not isinstance(parsed[row], ValueError) and (program, row) not in scores:
            scores[program, row] = pool.submit(
                _score, program, parsed[row], harness, partial_credit, timeout, executor, deadline
            )
    unjudged = sum(future.result() is None for future in scores.values())
    if unjudged:
        logger.warning(
            "code_reward: %d of %d programs not started within the time budget of %g s scored -1 without running; "
            "raise time_budget or workers if this recurs.",
            unjudged,
            len(scores),
            time_budget,
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
            score = scores[program, tests_row].result()
            rewards.append(-1.0 if score is None else score)
    return rewards


def default_workers() -> int:
    """Programs judged at once by default: the CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def parse_tests(value: Any) -> CodeTests:
    """Validate APPS-layout tests (a JSON string or a dict) into `CodeTests`; raise ``ValueError`` saying what fails.

    Accepted: ``inputs`` and ``outputs``, lists of the same non-zero length; optional ``fn_name`` (a non-empty
    string; ``null`` or ``""`` means standard-input tests), ``atol`` (a non-negative number) and ``timeouts`` (seconds
    per input). Standard-input
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
    timeouts = value.get("timeouts")
    if timeouts is not None:
        if not isinstance(timeouts, list) or len(timeouts) != len(inputs) or not all(_positive(t) for t in timeouts):
            raise ValueError(f"'timeouts' must be one positive number of seconds per input, got {timeouts!r:.80}")
        timeouts = tuple(float(t) for t in timeouts)
    if fn_name is None:
        return CodeTests(
            [_text(item, "inputs", i) for i, item in enumerate(inputs)],
            [_text(item, "outputs", i) for i, item in enumerate(outputs)],
            timeouts=timeouts,
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
    return CodeTests(call_inputs, call_outputs, fn_name, float(atol), timeouts)


def run_tests(
    program: str,
    tests: Any,
    *,
    harness: Harness | None = None,
    timeout: float | None = None,
    executor: Executor | None = None,
    first_failure_ends: bool = True,
) -> TestsResult:
    """Run `program` (as extracted, before the harness prepares it) on `tests` and judge it by `harness` (PRIME's).

    `tests` is a `CodeTests` or what `parse_tests` accepts. The run stops at the first failing test, unless
    `first_failure_ends` is false: then every test runs (a crash or timeout starts a new sandbox for the rest) and
    `tests_passed` counts them all. Raises ``ValueError`` for malformed tests only; whatever the program does ends
    in a `TestsResult`.
    """
    harness = harness or _prime()
    tests = tests if isinstance(tests, CodeTests) else parse_tests(tests)
    source = harness.prepare_program(program, tests)
    limit = _timeout(timeout, harness)
    limits = tests.timeouts if timeout is None and tests.timeouts else (limit,) * len(tests.inputs)
    passed, failure, index = 0, None, 0
    while index < len(tests.inputs):
        # One sandbox for the following tests with the same time limit (EvalPlus gives each test its own).
        end = index + 1
        while end < len(tests.inputs) and limits[end] == limits[index]:
            end += 1
        job = Job(source, tests.inputs[index:end], tests.fn_name, limits[index])
        outputs = iter((executor or default_executor()).execute(job))
        ended_early = False
        try:
            for output in outputs:
                if output.status != OK:
                    verdict = f"test {index}: {output.status}: {output.detail}"
                else:
                    actual = output.value if tests.fn_name is None else values.decode(output.value)
                    try:
                        matched = harness.output_matches(actual, tests.outputs[index], tests, index)
                    except Exception as error:  # a comparison the value breaks: a failed test, as in the peers
                        matched, actual = False, f"{actual!r:.200} ({type(error).__name__} when compared)"
                    verdict = None if matched else f"test {index}: wrong output {actual!r:.200}"
                index += 1
                if verdict is None:
                    passed += 1
                else:
                    failure = failure or verdict
                    if first_failure_ends:
                        return TestsResult(False, passed, len(tests.inputs), failure)
                if output.status != OK or index == end:
                    break  # a sandbox stops after a failing status: the remaining tests get a new one
            else:
                ended_early = index < end
        finally:
            close = getattr(outputs, "close", None)
            if close is not None:
                close()
        if ended_early:  # the executor yielded fewer outputs than tests
            failure = failure or f"test {index}: no output"
            if first_failure_ends:
                return TestsResult(False, passed, len(tests.inputs), failure)
            index += 1
    return TestsResult(failure is None, passed, len(tests.inputs), failure)


def run_program(
    program: str,
    inputs: Sequence[Any],
    *,
    fn_name: str | None = None,
    timeout: float = 5.0,
    executor: Executor | None = None,
) -> list[Output]:
    """Run `program` as it is on each input; return its `Output` per input (stdout, or the decoded return value).

    For reference solutions (EvalPlus's ``canonical_solution``) and for decoding untrusted data in the sandbox. The
    list ends early, with the failing input's `Output`, when an input ends in anything but ``"ok"``.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    outputs = (executor or default_executor()).execute(Job(program, list(inputs), fn_name, float(timeout)))
    if fn_name is None:
        return list(outputs)
    return [
        replace(output, value=values.decode(output.value)) if output.status == OK else output for output in outputs
    ]


# Runs a standard-input program the way PRIME's and LiveCodeBench's `call_method` and `Capturing` do (APPS's
# harness, which both derive from). The module loads with standard input empty (their multiprocessing child has
# /dev/null there, descriptor 0 included, so open(0) reads nothing: ``from io import *`` in their preamble makes open
# the real one). Their stacked unittest.mock patches take effect innermost first: readline (the input's lines
# without their newline), readlines and read are set on the standard-input object of the time, the one the
# program's module-level names (``from sys import *``, ``from sys import stdin``) hold, and only then is sys.stdin
# replaced by a fresh object over the input, and open made to return the input. SystemExit ends the program
# normally; print output is captured. The patches are plain assignments here: importing unittest.mock in every
# test's child would cost more than the test.
#: The import block PRIME and LiveCodeBench both put before a program (from APPS' harness), verbatim; each adds its
#: own recursion limit.
APPS_IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\nfrom heapq import *\n"
    "from bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\nfrom statistics import *\n"
    "from itertools import *\nfrom functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n"
    "from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\nimport statistics\n"
    "import itertools\nimport functools\nimport operator\nimport io\nimport sys\nimport json\n"
)

_STDIN_DRIVER = """\
import builtins, io, os, sys, types
{stdin_class}
def call_method(method, inputs):
    inputs_line_iterator = iter(inputs.split("\\n"))
    sys.stdin.readline = lambda *args: next(inputs_line_iterator)
    sys.stdin.readlines = lambda *args: inputs.split("\\n")
    sys.stdin.read = lambda *args: inputs
    sys.stdin = {stdin_factory}(inputs)
    builtins.open = lambda *args, **kwargs: io.StringIO(inputs)
    try:
        return method()
    except SystemExit:
        pass

inputs = sys.stdin.read()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.stdin = open(0, closefd=False)
{setup}
module = types.ModuleType("tmp_sol")
exec(compile(SOURCE, "<string>", "exec"), module.__dict__)
captured, real_stdout = io.StringIO(), sys.stdout
sys.stdout = captured
try:
    call_method(module.{function}, inputs)
finally:
    sys.stdout = real_stdout
real_stdout.write(captured.getvalue())
"""


def stdin_driver(
    source: str, *, function: str, setup: str = "", stdin_class: str = "", stdin_factory: str = "io.StringIO"
) -> str:
    """A program that runs `source`'s `function` on its standard input as APPS-derived harnesses do (see above).

    Args:
        source: The wrapped program (a module defining `function`).
        function: The function that holds the program's statements.
        setup: Statements run before the program loads (their ``reliability_guard``: builtins set to ``None``).
        stdin_class: Source of a class the standard-input object is made of, when not a ``StringIO``.
        stdin_factory: What makes the standard-input object from the input text.
    """
    driver = _STDIN_DRIVER.format(stdin_class=stdin_class, stdin_factory=stdin_factory, setup=setup, function=function)
    return f"SOURCE = {source!r}\n{driver}"


def unwrap_main_guard(program: str) -> str:
    """APPS's first step with a standard-input program, kept by PRIME and LiveCodeBench: a last statement
    ``if __name__ == '__main__':`` is replaced by its body; a program that does not parse (or is empty) is left as it
    is."""
    try:
        tree = ast.parse(program)
        last_block = tree.body[-1]
        if isinstance(last_block, ast.If) and ast.unparse(last_block.test).strip() == "__name__ == '__main__'":
            program = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last_block.body)
    except Exception:
        pass
    return program


def bind_solution_method(program: str, fn_name: str) -> str:
    """What PRIME and LiveCodeBench call when the program mentions ``class Solution``: the method of one instance.

    Appended to the program, it makes `fn_name` that method, before the harness looks up a function of that name.
    """
    return f"\n{fn_name} = Solution().{fn_name}\n" if "class Solution" in program else ""


def _score(
    program: str,
    tests: CodeTests,
    harness: Harness,
    partial_credit: bool,
    timeout: float | None,
    executor: Executor | None,
    deadline: float,
) -> float | None:
    """The reward of `program` on `tests`; ``None`` when the time budget ran out before it could start."""
    if time.monotonic() > deadline:
        return None
    try:
        if run_tests(program, tests, harness=harness, timeout=timeout, executor=executor).passed:
            return 1.0
        if not partial_credit:
            return -1.0
        first = CodeTests(
            tests.inputs[:PARTIAL_CREDIT_TESTS], tests.outputs[:PARTIAL_CREDIT_TESTS], tests.fn_name, tests.atol
        )
        each = run_tests(
            program,
            first,
            harness=harness,
            timeout=PARTIAL_CREDIT_TIMEOUT if timeout is None else timeout,
            executor=executor,
            first_failure_ends=False,
        )
        return 2.0 * each.tests_passed / each.tests_total - 1.0
    except Exception:  # a failing executor costs the program its reward, never the training step
        logger.exception("code_reward: judging a program failed; scored -1")
        return -1.0


def _prime() -> Harness:
    from stapo_trl.code.prime import PRIME  # that module builds on this one

    return PRIME


def _tests_key(value: Any) -> Any:
    if isinstance(value, CodeTests):
        return id(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)


def _text(value: Any, field: str, index: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise ValueError(f"{field}[{index}] must be a string (or a list of lines), got {_describe(value)}")


def _positive(value: Any) -> bool:
    return type(value) in (int, float) and value > 0


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _timeout(timeout: float | None, harness: Harness) -> float:
    timeout = harness.timeout if timeout is None else float(timeout)
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout


_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _judging_pool(workers: int) -> ThreadPoolExecutor:
    """This process's pool of `workers` judging threads (a forked child makes its own)."""
    with _pools_lock:
        key = (os.getpid(), workers)
        if key not in _pools:
            _pools[key] = ThreadPoolExecutor(workers, thread_name_prefix="stapo-code-judge")
        return _pools[key]
