"""Synthetic arithmetic problems for the toy world, and a writer for the DAPO-Math-17K (veRL) parquet layout.

A problem is `a op b` with small non-negative integers (`+`, `-` with `a >= b`, `*` with a one-digit factor), so
every answer is a non-negative integer. The text the model reads is short ("What is 23+45?") and the completion it
is taught is a line of worked steps followed by the boxed answer ("23+45=60+8=68. \\boxed{68}", at most 29
characters); `Problem.unboxed_completion` is the same line without the box, the bad habit the pretrained model is
given for RL to remove.

Which split a problem belongs to is a property of the problem itself (a stable hash of `a op b`), so the train and
held-out sets are disjoint whatever the seeds and sizes asked for.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..math.data import MATH_INSTRUCTION, math_prompt
from ..math.reward import extract_boxed_answer


# The instruction the paper appends to every problem: the prompt the policy sees during RL.
INSTRUCTION = MATH_INSTRUCTION

# DAPO-Math-17K wraps each problem in this prompt (veRL layout, column `prompt`).
DAPO_PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
DATA_SOURCE = "toy_arithmetic"
REWARD_STYLE = "rule-lighteval/MATH_v2"

SPLITS = ("train", "heldout")
HELDOUT_FRACTION = 0.1

# How often each kind of problem is drawn, and the operand ranges (inclusive).
OPERATIONS = {
    # op: (weight, (a_min, a_max), (b_min, b_max))
    "+": (0.4, (0, 99), (0, 99)),
    "-": (0.4, (0, 99), (0, 99)),  # b is drawn <= a: answers stay non-negative
    "*": (0.2, (2, 9), (2, 49)),
}


@dataclass(frozen=True, order=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def answer(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        if self.op == "*":
            return self.a * self.b
        raise ValueError(f"unknown operation {self.op!r}")

    @property
    def text(self) -> str:
        """The problem statement, e.g. `What is 23+45?`."""
        return f"What is {self.expression}?"

    @property
    def completion(self) -> str:
        """The answer the model is taught: worked steps, then the boxed answer.

        Two-digit operands are split into tens and units: `23+45=60+8=68. \\boxed{68}`,
        `52-17=40-5=35. \\boxed{35}`, `7*23=140+21=161. \\boxed{161}`; one-digit ones take a single step,
        `7*8=56. \\boxed{56}`.
        """
        return f"{self.expression}={self.steps}. \\boxed{{{self.answer}}}"

    @property
    def unboxed_completion(self) -> str:
        """The worked steps without the boxed answer, e.g. `23+45=60+8=68.`: a habit that earns no reward."""
        return f"{self.expression}={self.steps}."

    @property
    def steps(self) -> str:
        """The worked steps after `=`: `60+8=68`, `40-5=35`, `140+21=161`, or just the answer."""
        if self.op == "+" and max(self.a, self.b) >= 10:
            tens, units = 10 * (self.a // 10 + self.b // 10), self.a % 10 + self.b % 10
            return f"{tens}+{units}={self.answer}"
        if self.op == "-" and max(self.a, self.b) >= 10:
            tens, units = 10 * (self.a // 10 - self.b // 10), self.a % 10 - self.b % 10
            return f"{tens}{'-' if units < 0 else '+'}{abs(units)}={self.answer}"
        if self.op == "*" and self.b >= 10:
            tens, units = self.a * (self.b // 10) * 10, self.a * (self.b % 10)
            return f"{tens}+{units}={self.answer}"
        return str(self.answer)

    @property
    def split(self) -> str:
        return split_of(self)


def split_of(problem: Problem) -> str:
    """`"heldout"` for a fixed ~10% of all problems (a stable hash of the expression), `"train"` for the rest."""
    digest = hashlib.sha256(problem.expression.encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < HELDOUT_FRACTION else "train"


def sample_problem(rng: random.Random) -> Problem:
    """Draw one problem (any split) with `rng`."""
    ops = list(OPERATIONS)
    op = rng.choices(ops, weights=[OPERATIONS[o][0] for o in ops])[0]
    _, (a_lo, a_hi), (b_lo, b_hi) = OPERATIONS[op]
    a = rng.randint(a_lo, a_hi)
    b = rng.randint(b_lo, min(b_hi, a) if op == "-" else b_hi)
    return Problem(a, op, b)


def all_problems(split: str | None = None) -> list[Problem]:
    """Every problem the generator can draw (about 16k), sorted, optionally only those of one split."""
    problems = []
    for op, (_, (a_lo, a_hi), (b_lo, b_hi)) in OPERATIONS.items():
        for a in range(a_lo, a_hi + 1):
            for b in range(b_lo, (min(b_hi, a) if op == "-" else b_hi) + 1):
                problems.append(Problem(a, op, b))
    if split is not None:
        _check_split(split)
        problems = [p for p in problems if split_of(p) == split]
    return sorted(problems)


def generate_problems(n: int, seed: int = 0, split: str = "train", unique: bool = True) -> list[Problem]:
    """`n` problems of `split` drawn with `random.Random(seed)`; deterministic. `unique=False` allows repeats."""
    _check_split(split)
    if unique and n > len(all_problems(split)):
        raise ValueError(f"only {len(all_problems(split))} distinct {split} problems exist, {n} asked for")
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[Problem] = set()
    while len(problems) < n:
        problem = sample_problem(rng)
        if split_of(problem) != split or (unique and problem in seen):
            continue
        seen.add(problem)
        problems.append(problem)
    return problems


def rl_prompt(problem: Problem | str) -> list[dict[str, str]]:
    """The conversation the policy sees: the problem followed by the paper's instruction."""
    return math_prompt(problem.text if isinstance(problem, Problem) else problem)


def chat_prompt(tokenizer, problem: Problem | str) -> str:
    """`rl_prompt(problem)` rendered with the tokenizer's chat template, ready for the assistant's turn."""
    return tokenizer.apply_chat_template(rl_prompt(problem), tokenize=False, add_generation_prompt=True)


def dapo_row(problem: Problem, index: str) -> dict:
    """One row in the DAPO-Math-17K veRL layout."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"content": DAPO_PROMPT_PREFIX + problem.text + DAPO_PROMPT_SUFFIX, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(problem.answer), "style": REWARD_STYLE},
        "extra_info": {"index": index},
    }


def layout_fingerprint() -> str:
    """A short hash of everything that decides the rows `write_dapo_layout` writes (for naming cached files)."""
    spec = repr((OPERATIONS, HELDOUT_FRACTION, DAPO_PROMPT_PREFIX, DAPO_PROMPT_SUFFIX, DATA_SOURCE, REWARD_STYLE))
    return hashlib.sha256(spec.encode()).hexdigest()[:10]


def write_dapo_layout(path: str | Path, n: int, seed: int = 0, split: str = "train") -> Path:
    """Write `n` distinct problems of `split` as a parquet file in the DAPO-Math-17K veRL layout; return its path.

    Columns: `data_source`, `prompt` (a one-message user conversation in DAPO's "Answer:" wrapper), `ability`,
    `reward_model` (`ground_truth`, `style`) and `extra_info` (`index`, a UUID derived from the seed and row).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    problems = generate_problems(n, seed=seed, split=split)
    index_rng = random.Random(f"dapo-index-{seed}-{split}")
    rows = [dapo_row(p, str(uuid.UUID(int=index_rng.getrandbits(128), version=4))) for p in problems]
    schema = pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
            ("extra_info", pa.struct([("index", pa.string())])),
        ]
    )
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    tmp.replace(path)
    return path


def is_correct(completion: str, answer: int | str) -> bool:
    """Exact match of the last boxed answer with `answer`: a quick check for measuring, not the RL reward."""
    return extract_boxed_answer(completion) == str(answer).strip()


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
