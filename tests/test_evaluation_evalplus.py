"""stapo_trl.evaluation.evalplus_grading: HumanEval+ / MBPP+ grading agrees with EvalPlus's own (tests/peers/evalplus:
trusted_exec for the expected values and times, untrusted_check on the base and the plus inputs) on tricky
solutions; the differences that remain are marked with their reason. The sanitizer (tree-sitter in EvalPlus, not
installed here) is checked against outputs worked out from its rules."""

import random
import sys

import pytest
from peer_cases import PEERS, peer_verdicts

from stapo_trl.code.reward import CodeTests, run_tests
from stapo_trl.evaluation.evalplus_grading import HUMANEVAL_PLUS, MBPP_PLUS, base_and_plus, expected_outputs, sanitize


def problem(prompt, canonical, entry_point, base, plus, atol=0.0):
    return {
        "prompt": prompt,
        "canonical_solution": canonical,
        "entry_point": entry_point,
        "base_input": base,
        "plus_input": plus,
        "atol": atol,
    }


FIND_ZERO_PROMPT = (
    "import math\n\n\ndef poly(xs: list, x: float):\n    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])\n"
    "\n\ndef find_zero(xs: list):\n"
)
FIND_ZERO_BISECTION = (
    "    begin, end = -1.0, 1.0\n    while poly(xs, begin) * poly(xs, end) > 0:\n        begin *= 2.0\n        end *= 2.0\n"
    "    while end - begin > 1e-10:\n        center = (begin + end) / 2.0\n"
    "        if poly(xs, center) * poly(xs, begin) > 0:\n            begin = center\n        else:\n            end = center\n"
    "    return begin\n"
)

# (dataset, problem)
PROBLEMS = {
    "add": (
        "humaneval",
        problem("def add(a: int, b: int):\n", "    return a + b\n", "add", [[1, 2]], [[10**12, 1], [-5, 5]]),
    ),
    "volume": (
        "humaneval",
        problem(
            "import math\n\ndef volume(r):\n",
            "    return 4 * math.pi * r**3 / 3\n",
            "volume",
            [[1], [2]],
            [[r] for r in range(3, 40)],
        ),
    ),
    "min_max": (
        "humaneval",
        problem("def min_max(xs):\n", "    return (min(xs), max(xs))\n", "min_max", [[[3, 1, 2]]], [[[5]]]),
    ),
    "halves": (
        "humaneval",
        problem("def halves(xs):\n", "    return [x / 2 for x in xs]\n", "halves", [[[1, 3]]], [[[0.2, 5]]]),
    ),
    # A float expected on a base input, a mixed list on a plus one: the tolerance EvalPlus forces does not carry over.
    "mixed": (
        "humaneval",
        problem("def mixed(x):\n", "    return x / 2 if x < 10 else [x, x / 2]\n", "mixed", [[1]], [[20]]),
    ),
    "parity": ("humaneval", problem("def parity(n):\n", "    return n % 2 == 0\n", "parity", [[2], [3]], [[10]])),
    "find_zero": (
        "humaneval",
        problem(FIND_ZERO_PROMPT, FIND_ZERO_BISECTION, "find_zero", [[[1, 2]], [[-6, 11, -6, 1]]], [], 1e-6),
    ),
    "depth": (
        "humaneval",
        problem(
            "def depth(n):\n",
            "    d = 0\n    while n:\n        n, d = n - 1, d + 1\n    return d\n",
            "depth",
            [[10]],
            [[5000]],
        ),
    ),
    "unique": ("humaneval", problem("def unique(xs):\n", "    return set(xs)\n", "unique", [[[1, 1, 2]]], [[[3]]])),
    "similar_elements": (
        "mbpp",
        problem(
            '"""Common elements."""\n',
            "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
            "similar_elements",
            [[[3, 4, 5, 6], [5, 7, 4, 10]]],
            [],
        ),
    ),
    "check_str": (
        "mbpp",
        problem(
            '"""Starts with a vowel."""\n',
            "import re\ndef check_str(s):\n    return re.search('^[aeiouAEIOU]', s)\n",
            "check_str",
            [["annie"], ["dawood"]],
            [],
        ),
    ),
    "sum_div": (
        "mbpp",
        problem(
            '"""Sum of proper divisors."""\n',
            "def sum_div(n):\n    return sum(i for i in range(1, n) if n % i == 0)\n",
            "sum_div",
            [[8], [1]],
            [],
        ),
    ),
    "surface_Area": (
        "mbpp",
        problem(
            '"""Surface area of a square pyramid."""\n',
            "def surface_Area(b, s):\n    return 2 * b * s + b**2\n",
            "surface_Area",
            [[3, 4], [4, 5]],
            [],
            0.0,
        ),
    ),
}


# (name, problem, solution, how it differs from EvalPlus or None)
CASES = [
    ("add_right", "add", "def add(a, b):\n    return a + b\n", None),
    ("add_wrong_on_plus", "add", "def add(a, b):\n    return a + b if a < 10**6 else 0\n", None),
    ("add_prints", "add", "def add(a, b):\n    print('noise')\n    return a + b\n", None),
    ("add_raises", "add", "def add(a, b):\n    raise ValueError\n", None),
    ("add_float", "add", "def add(a, b):\n    return float(a + b)\n", None),
    ("add_bool_plus", "add", "def add(a, b):\n    return a + b + (a == 1) * 0\n", None),
    ("add_numpy", "add", "import numpy as np\ndef add(a, b):\n    return np.int64(a) + np.int64(b)\n", None),
    ("add_sleeps_half_a_second", "add", "import time\ndef add(a, b):\n    time.sleep(0.5)\n    return a + b\n", None),
    ("add_sleeps_past_the_limit", "add", "import time\ndef add(a, b):\n    time.sleep(1.5)\n    return a + b\n", None),
    ("add_missing_name", "add", "def add(a: Number, b):\n    return a + b\n", None),
    ("add_wrong_name", "add", "def plus(a, b):\n    return a + b\n", None),
    ("add_exit", "add", "def add(a, b):\n    exit()\n", None),
    (
        "add_always_equal",
        "add",
        "class A:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return A()\n",
        "a return value crosses the sandbox's wall as data: an object that claims to equal anything is a repr here, "
        "equal to nothing; EvalPlus believes its __eq__",
    ),
    (
        "add_state_between_calls",
        "add",
        "calls = []\ndef add(a, b):\n    calls.append(1)\n    return a + b if len(calls) == 1 else -1\n",
        "each input runs in a fresh process here; EvalPlus calls the function on one input after the other in one",
    ),
    ("volume_reordered_formula", "volume", "import math\ndef volume(r):\n    return (4 / 3) * math.pi * r**3\n", None),
    ("volume_rounded_pi", "volume", "def volume(r):\n    return 4 * 3.14159265 * r**3 / 3\n", None),
    ("volume_close_pi", "volume", "def volume(r):\n    return 4 * 3.14159265358979 * r**3 / 3\n", None),
    ("volume_as_int", "volume", "import math\ndef volume(r):\n    return int(4 * math.pi * r**3 / 3)\n", None),
    ("volume_no_import", "volume", "def volume(r):\n    return 4 * math.pi * r**3 / 3\n", None),
    ("min_max_tuple", "min_max", "def min_max(xs):\n    return min(xs), max(xs)\n", None),
    ("min_max_list", "min_max", "def min_max(xs):\n    return [min(xs), max(xs)]\n", None),
    ("min_max_swapped", "min_max", "def min_max(xs):\n    return (max(xs), min(xs))\n", None),
    ("halves_exact", "halves", "def halves(xs):\n    return [x * 0.5 for x in xs]\n", None),
    ("halves_close", "halves", "def halves(xs):\n    return [x / 2 + 1e-9 for x in xs]\n", None),
    ("halves_far", "halves", "def halves(xs):\n    return [x / 2 + 1e-3 for x in xs]\n", None),
    ("halves_tuple", "halves", "def halves(xs):\n    return tuple(x / 2 for x in xs)\n", None),
    ("halves_numpy_array", "halves", "import numpy as np\ndef halves(xs):\n    return np.array(xs) / 2\n", None),
    ("halves_generator", "halves", "def halves(xs):\n    return (x / 2 for x in xs)\n", None),
    ("mixed_exact", "mixed", "def mixed(x):\n    return x / 2 if x < 10 else [x, x / 2]\n", None),
    ("mixed_close_on_plus", "mixed", "def mixed(x):\n    return x / 2 if x < 10 else [x, x / 2 + 1e-9]\n", None),
    ("parity_bool", "parity", "def parity(n):\n    return not n % 2\n", None),
    ("parity_int", "parity", "def parity(n):\n    return int(n % 2 == 0)\n", None),
    ("parity_str", "parity", "def parity(n):\n    return str(n % 2 == 0)\n", None),
    (
        "find_zero_other_root",
        "find_zero",
        FIND_ZERO_PROMPT + "    return 3.0 if len(xs) == 4 else -0.5\n",
        "EvalPlus 0.3.1's find_zero branch continues to the next input before recording this one as passed, so "
        "every program fails HumanEval/32 there, its canonical solution included; here its oracle decides",
    ),
    ("find_zero_not_a_root", "find_zero", FIND_ZERO_PROMPT + "    return 0.0\n", None),
    (
        "find_zero_newton",
        "find_zero",
        FIND_ZERO_PROMPT + "    x = 0.5\n    for _ in range(100):\n"
        "        d = sum(i * c * x ** (i - 1) for i, c in enumerate(xs) if i)\n        x -= poly(xs, x) / d\n    return x\n",
        "EvalPlus 0.3.1's find_zero branch continues to the next input before recording this one as passed, so "
        "every program fails HumanEval/32 there, its canonical solution included; here its oracle decides",
    ),
    ("depth_recursive", "depth", "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n", None),
    (
        "depth_recursion_limit_raised",
        "depth",
        "import sys\nsys.setrecursionlimit(10**5)\ndef depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n",
        None,
    ),
    ("unique_set", "unique", "def unique(xs):\n    return {*xs}\n", None),
    ("unique_frozenset", "unique", "def unique(xs):\n    return frozenset(xs)\n", None),
    ("unique_sorted_list", "unique", "def unique(xs):\n    return sorted(set(xs))\n", None),
    (
        "similar_elements_list_any_order",
        "similar_elements",
        "def similar_elements(a, b):\n    return [x for x in b if x in a]\n",
        None,
    ),
    ("similar_elements_wrong", "similar_elements", "def similar_elements(a, b):\n    return (4,)\n", None),
    (
        "check_str_match_object",
        "check_str",
        "import re\ndef check_str(s):\n    return re.match('[aeiou]', s, re.I)\n",
        None,
    ),
    ("check_str_bool", "check_str", "def check_str(s):\n    return s[0].lower() in 'aeiou'\n", None),
    ("check_str_always_something", "check_str", "def check_str(s):\n    return s\n", None),
    (
        "sum_div_zero_for_one",
        "sum_div",
        "def sum_div(n):\n    return sum(i for i in range(1, n) if n % i == 0) if n > 1 else 0\n",
        None,
    ),
    (
        "sum_div_one_for_one",
        "sum_div",
        "def sum_div(n):\n    return sum(i for i in range(1, n) if n % i == 0) or 1\n",
        None,
    ),
    ("surface_Area_slant", "surface_Area", "def surface_Area(b, s):\n    return 2 * b * s + b * b\n", None),
    (
        "surface_Area_perpendicular",
        "surface_Area",
        "import math\ndef surface_Area(b, h):\n    return round(b * b + 2 * b * math.sqrt((b / 2) ** 2 + h * h))\n",
        None,
    ),
    ("surface_Area_wrong", "surface_Area", "def surface_Area(b, s):\n    return b * s\n", None),
]


def _tests(name):
    dataset, record = PROBLEMS[name]
    inputs = record["base_input"] + record["plus_input"]
    expected, limits = expected_outputs(
        record["prompt"], record["canonical_solution"], record["entry_point"], inputs, dataset
    )
    tests = CodeTests(inputs, expected, record["entry_point"], record["atol"], tuple(limits))
    return base_and_plus(tests, len(record["base_input"]))


@pytest.fixture(scope="module")
def verdicts():
    peer = peer_verdicts(
        "evalplus",
        [
            {"solution": solution, "problem": PROBLEMS[key][1], "dataset": PROBLEMS[key][0]}
            for _, key, solution, _ in CASES
        ],
    )
    tests = {key: _tests(key) for key in PROBLEMS}
    harness = {"humaneval": HUMANEVAL_PLUS, "mbpp": MBPP_PLUS}
    ours = [
        all(run_tests(solution, part, harness=harness[PROBLEMS[key][0]]).passed for part in tests[key])
        for _, key, solution, _ in CASES
    ]
    return dict(zip((name for name, *_ in CASES), zip(peer, ours)))


@pytest.mark.parametrize("name, difference", [(name, difference) for name, _, _, difference in CASES])
def test_agrees_with_evalplus(verdicts, name, difference):
    peer_passes, ours = verdicts[name]
    if difference is None:
        assert ours == peer_passes
    else:
        assert ours != peer_passes, difference


def test_at_least_forty_cases_and_both_verdicts_among_them(verdicts):
    assert len(CASES) >= 40
    assert {ours for _, ours in verdicts.values()} == {True, False}


def test_time_limits_follow_the_canonical_solution():
    # 4 x the canonical time, at least 1 s: a canonical solution of about 0.5 s gives about 2 s.
    _, limits = expected_outputs(
        "import time\ndef slow(x):\n", "    time.sleep(x)\n    return x\n", "slow", [[0.0], [0.5]], "humaneval"
    )
    assert limits[0] == 1.0 and 2.0 <= limits[1] < 2.5


# EvalPlus's sanitizer, by its rules (evalplus/sanitize.py): the longest run of at least two lines that parses;
# of it the imports, then the definitions the entry point reaches (classes, functions with a return, assignments
# to a name), undecorated, in order.
@pytest.mark.parametrize(
    "text, entry_point, program",
    [
        (
            "Here:\n```python\ndef f(x):\n    return g(x)\n\ndef g(x):\n    return x\n```\n",
            "f",
            "def f(x):\n    return g(x)\ndef g(x):\n    return x",
        ),
        (
            "```python\ndef f(x):\n    return x + 1\n```\nUsage:\n```python\nprint(f(1))\n```\n",
            "f",
            "def f(x):\n    return x + 1",
        ),
        (
            "```python\nimport math\nK = 2\ndef f(x):\n    return K * math.pi\nprint(f(1))\n```",
            "f",
            "import math\nK = 2\ndef f(x):\n    return K * math.pi",
        ),
        ("```python\ndef helper():\n    return 1\ndef f(x):\n    return x\n```", "f", "def f(x):\n    return x"),
        # Nothing kept (f returns nothing; a decorated f): EvalPlus falls back to the longest run that parses.
        (
            "```python\ndef f(x):\n    print(x)\ndef g():\n    return 1\n```",
            "f",
            "def f(x):\n    print(x)\ndef g():\n    return 1",
        ),
        ("```python\n@cache\ndef f(x):\n    return x\n```", "f", "@cache\ndef f(x):\n    return x"),
        (
            "```python\nclass Solution:\n    def f(self):\n        return 1\ndef f():\n    return Solution().f()\n```",
            "f",
            "class Solution:\n    def f(self):\n        return 1\ndef f():\n    return Solution().f()",
        ),
        ("```python\ndef f(x):\n    return x\n", "f", "def f(x):\n    return x"),  # unclosed fence
        ("def f(x):\n    return x", "f", "def f(x):\n    return x"),  # no fence
    ],
)
def test_sanitize(text, entry_point, program):
    assert sanitize(text, entry_point) == program


SANITIZE_CASES = test_sanitize.pytestmark[0].args[1]


def test_sanitize_agrees_with_evalplus_tree_sitter_sanitizer():
    """Where tree-sitter is installed (not a dependency): EvalPlus's own sanitizer on the cases above, every
    agreement case bare and inside a chat answer, and 300 random mixes of code, prose and fence lines."""
    pytest.importorskip("tree_sitter_python")
    sys.path.insert(0, str(PEERS))
    try:
        from evalplus.sanitize import sanitize as evalplus_sanitize
    finally:
        sys.path.remove(str(PEERS))
    texts = [(text, entry_point) for text, entry_point, _ in SANITIZE_CASES]
    for _, key, solution, _ in CASES:
        entry_point = PROBLEMS[key][1]["entry_point"]
        texts += [
            (solution, entry_point),
            (f"Sure:\n```python\n{solution}```\nA test:\n```python\nprint(1)\n```\n", entry_point),
        ]
    pool = [
        "def f(x):",
        "    return g(x)",
        "def g(y):",
        "    return y * 2",
        "import os",
        "x = 1",
        "Some prose.",
        "```python",
    ]
    pool += [
        "```",
        "",
        "class A:",
        "    def m(self):",
        "        return 1",
        "@dec",
        "a, b = 1, 2",
        "print(f(1))",
        "if True:",
    ]
    pool += ["    pass", "K: int = 3", "async def f(x):", "    return await x"]
    generator = random.Random(0)
    texts += [("\n".join(generator.choices(pool, k=generator.randint(2, 14))), "f") for _ in range(300)]
    assert [sanitize(text, entry) for text, entry in texts] == [
        evalplus_sanitize(text, entry) for text, entry in texts
    ]
