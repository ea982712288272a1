"""EvalPlus's grading of HumanEval+ and MBPP+ (``evalplus`` 0.3.1: ``sanitize.py``, ``eval/__init__.py``), with the
programs in this project's sandbox.

- Program (`sanitize`, EvalPlus's ``sanitize(code, entrypoint)``): the longest run of lines that parses, then of it
  the imports and the top-level definitions the entry point reaches (classes, functions that return something,
  assignments to a name), in order; decorated definitions and statements are dropped. Fences need no rule: they do
  not parse. Nothing is put before the program: a ``List`` annotation needs the program's own import.
- Expected values: the canonical solution (prompt + ``canonical_solution``) run on the base and plus inputs, timed
  (`expected_outputs`); for the tasks whose output only needs to be "not None", that fact.
- Time per input: ``max(1 s, 4 x the canonical solution's time)``. The base inputs, then the plus inputs, each
  list judged on its own (`base_and_plus`); correct when both pass (EvalPlus's "plus" verdict).
- Comparison (`output_matches`): Python's ``==`` (a tuple is not a list); its special oracles (HumanEval/32
  ``find_zero`` by the polynomial's value, MBPP tasks compared as sets, not-None tasks, Mbpp/164, 295, 558, 581);
  otherwise, with a tolerance (the record's ``atol``, or 1e-6 once an expected value was a float), the same type and
  length and ``np.allclose(rtol=1e-7)``.

Known differences (the agreement tests in ``tests/test_evaluation_evalplus.py`` show them): EvalPlus 0.3.1's
``find_zero`` branch moves to the next input before recording the current one as passed, so every program fails
HumanEval/32 there, its canonical solution included; here its oracle decides. Inputs run each in a forked process
(EvalPlus calls them one after another in one process, so state a function keeps between calls starts afresh
here). A returned object whose ``__eq__`` says yes to anything crosses the sandbox's wall as its ``repr`` and
equals nothing. Its per-problem cap (60 s + 3 s for all inputs
together) is not applied, and the time limit here also covers loading the program, not only the call. The syntax
tree is Python's ``ast`` where EvalPlus uses tree-sitter, which reads the same for the run of lines that parses.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from ..code.reward import CodeTests, Harness, run_program


#: EvalPlus's per-input time limit: max(`MIN_TIME_LIMIT`, `TIME_LIMIT_FACTOR` x the canonical solution's time).
MIN_TIME_LIMIT, TIME_LIMIT_FACTOR = 1.0, 4.0

# EvalPlus's special oracles (evalplus/eval/_special_oracle.py).
MBPP_OUTPUT_NOT_NONE_TASKS = ["check_str", "text_match_three", "text_starta_endb"]
MBPP_OUTPUT_SET_EQ_TASKS = [
    "similar_elements",  # Mbpp/2
    "find_char_long",  # Mbpp/7
    "common_in_nested_lists",  # Mbpp/111
    "extract_singly",  # Mbpp/140
    "larg_nnum",  # Mbpp/232
    "intersection_array",  # Mbpp/249
    "find_dissimilar",  # Mbpp/579
    "Diff",  # Mbpp/769
]


def _surface_area(base_edge, height):  # Mbpp/581: the height is the pyramid's perpendicular height
    slant_height = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant_height) / 2)


def _digit_distance_nums(num1, num2):  # Mbpp/558: the numbers padded to the same length with zeros
    first, second = str(num1), str(num2)
    width = max(len(first), len(second))
    return sum(abs(int(a) - int(b)) for a, b in zip(first.zfill(width), second.zfill(width)))


def _poly(xs: list, x: float):  # HumanEval/32: the polynomial with coefficients xs at x
    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))


def sanitize(text: str, entry_point: str | None = None) -> str:
    """EvalPlus's ``sanitize``: the entry point and what it needs, from the longest run of lines that parses."""
    code = _longest_valid_code(text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code
    imports, definitions, names = [], [], set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
            continue
        if isinstance(node, ast.ClassDef) and not node.decorator_list:
            name = node.name
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            if not any(isinstance(child, ast.Return) for child in ast.walk(node)):
                continue
            name = node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = target.id if isinstance(target, ast.Name) else None  # tree-sitter's first identifier child
        else:
            continue
        if name not in names:
            definitions.append((name, node))
            names.add(name)
    if entry_point:
        reachable = _reachable(entry_point, {name: _identifiers(node) for name, node in definitions})
        definitions = [(name, node) for name, node in definitions if name in reachable]
    kept = [ast.get_source_segment(code, node) for node in imports + [node for _, node in definitions]]
    return "\n".join(kept).strip() or code


def _longest_valid_code(text: str) -> str:
    """EvalPlus's ``code_extract``: the run of at least two lines that parses with the most non-blank lines (the
    first such run). Same result as its loop over every pair of lines, without parsing the runs too short to win."""
    lines = text.split("\n")
    counts = [0]
    for line in lines:
        counts.append(counts[-1] + bool(line.strip()))
    best, best_pair = 0, (0, 0)
    for i in range(len(lines)):
        if counts[-1] - counts[i] <= best:
            break
        for j in range(len(lines) - 1, i, -1):
            count = counts[j + 1] - counts[i]
            if count <= best:
                break
            if _parses("\n".join(lines[i : j + 1])):
                while j > i + 1 and not lines[j].strip() and _parses("\n".join(lines[i:j])):
                    j -= 1  # the first j of the best count, as its loop over increasing j finds
                best, best_pair = count, (i, j)
                break
    return "\n".join(lines[best_pair[0] : best_pair[1] + 1])


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


def _identifiers(node: ast.AST) -> set[str]:
    """Every identifier in the definition, as tree-sitter's identifier leaves."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
        elif isinstance(child, ast.keyword) and child.arg:
            names.add(child.arg)
        elif isinstance(child, ast.alias):
            names.update((child.asname or child.name).split("."))
    return names


def _reachable(entry_point: str, dependencies: dict[str, set[str]]) -> set[str]:
    reached, queue = {entry_point}, [entry_point]
    while queue:
        for name in dependencies.get(queue.pop(0), ()):
            if name not in reached:
                reached.add(name)
                queue.append(name)
    return reached


def expected_outputs(
    prompt: str, canonical_solution: str, entry_point: str, inputs: list, dataset: str
) -> tuple[list, list[float]]:
    """The canonical solution's return value on each input (``is not None`` for the not-None tasks) and its time limit.

    Raises ``ValueError`` when the canonical solution fails on an input: the problem cannot be graded.
    """
    timed = (
        prompt
        + canonical_solution
        + "\n\nimport copy as _stapo_copy, time as _stapo_time\n\n"
        + "def _stapo_timed(*args):\n"
        + "    args = _stapo_copy.deepcopy(args)\n"
        + "    start = _stapo_time.time()\n"
        + f"    result = {entry_point}(*args)\n"
        + "    return [result, _stapo_time.time() - start]\n"
    )
    outputs = run_program(timed, inputs, fn_name="_stapo_timed", timeout=60.0)
    failed = next((output for output in outputs if output.status != "ok"), None)
    if failed is not None or len(outputs) != len(inputs):
        reason = f"{failed.status}: {failed.detail}" if failed else "no output"
        raise ValueError(f"the canonical solution did not run on every input ({reason})")
    not_none = dataset == "mbpp" and entry_point in MBPP_OUTPUT_NOT_NONE_TASKS
    expected = [(value is not None) if not_none else value for value, _ in (output.value for output in outputs)]
    limits = [max(MIN_TIME_LIMIT, TIME_LIMIT_FACTOR * seconds) for _, seconds in (output.value for output in outputs)]
    return expected, limits


def output_matches(out: Any, exp: Any, tests: CodeTests, index: int, dataset: str) -> bool:
    """EvalPlus's verdict on one return value (``unsafe_execute``), special oracles included."""
    import numpy as np

    inp, entry_point = tests.inputs[index], tests.fn_name
    atol = tests.atol
    exact_match = out == exp
    if dataset == "mbpp":
        if entry_point == "are_equivalent":  # Mbpp/164
            exact_match = exact_match or True
        elif entry_point == "sum_div":  # Mbpp/295
            exact_match = exact_match or out == 0
        elif entry_point == "surface_Area":  # Mbpp/581
            exact_match = exact_match or abs(out - _surface_area(*inp)) <= atol
        elif entry_point == "digit_distance_nums":  # Mbpp/558
            exact_match = exact_match or out == _digit_distance_nums(*inp)
        elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
            exact_match = set(out) == set(exp)
        elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
            exact_match = out == exp if isinstance(out, bool) else exp == (out is not None)
    if dataset == "humaneval" and entry_point == "find_zero":
        return bool(abs(_poly(*inp, out)) <= atol)
    # EvalPlus forces a tolerance for floats; the variable it sets stays set for the inputs after.
    if atol == 0 and any(_is_floats(value) for value in tests.outputs[: index + 1]):
        atol = 1e-6
    if not exact_match and atol != 0:
        if type(out) is not type(exp) or (isinstance(exp, (list, tuple)) and len(out) != len(exp)):
            return False
        return bool(np.allclose(out, exp, rtol=1e-07, atol=atol))
    return bool(exact_match)


def base_and_plus(tests: CodeTests, base_count: int) -> list[CodeTests]:
    """The tests of the base inputs and of the plus inputs, judged one list after the other as EvalPlus judges them
    (each in its own process there, and the tolerance it forces restarts with each)."""
    parts = [slice(0, base_count), slice(base_count, len(tests.inputs))]
    return [
        CodeTests(
            tests.inputs[part],
            tests.outputs[part],
            tests.fn_name,
            tests.atol,
            tests.timeouts[part] if tests.timeouts else None,
        )
        for part in parts
        if part.start < part.stop
    ]


def _is_floats(x) -> bool:
    import numpy as np

    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def _harness(dataset: str) -> Harness:
    return Harness(
        name=f"evalplus ({dataset})",
        extract_program=lambda text, tests: sanitize(text, tests.fn_name) or None,
        prepare_program=lambda program, tests: program,
        output_matches=lambda out, exp, tests, index: output_matches(out, exp, tests, index, dataset),
        timeout=MIN_TIME_LIMIT,
    )


HUMANEVAL_PLUS, MBPP_PLUS = _harness("humaneval"), _harness("mbpp")
