"""The math reward of the STAPO paper: DAPO's rule-based outcome reward, checked with math-verify.

The paper trains on DAPO-Math-17K with DAPO's rule-based reward and no overlong shaping: a completion earns
+1.0 when its final answer is correct and -1.0 otherwise. The final answer is what the completion's last
``\\boxed{...}`` holds (the instruction asks the model to "put your final answer within \\boxed{}"), or, when the
answer comes in several boxes one right after the other (``\\boxed{2}, \\boxed{3}``), what they hold together, read
as math-verify reads it (`boxed_answers`). It is correct when math-verify finds it mathematically equivalent to the
gold answer (``0.5`` = ``\\frac{1}{2}``).

Answers come from a model in training, so judging them must never raise, never hang and never exhaust the machine.
Judging happens in persistent verifier processes, each a fresh Python interpreter running `stapo_trl.math.verifier`
(under a memory limit, with a scrubbed environment, killed if the training process dies; see `stapo_trl.processes`),
and the training process waits at most ``verification_timeout`` for each answer and ``time_budget`` for one whole
call: an answer not judged in time scores -1.0 and the verifier process working on it is killed and replaced. Unlike
math-verify's own timeouts, which rely on ``signal.alarm`` (main thread only), this works from any thread and in
every torch.distributed / accelerate process.

The settings are keyword arguments of `math_reward`; to train with others, bind them as open-r1 does:
``reward_funcs=functools.partial(math_reward, verification_timeout=2.0, verifier_processes=2)`` (TRL names the
reward after the function it wraps).
"""

import atexit
import collections
import functools
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass

from .. import processes
from ..completions import completion_text
from . import verifier as verifier_program


logger = logging.getLogger(__name__)

# The defaults of `math_reward`'s settings, which its docstring explains.
_VERIFICATION_TIMEOUT_SECONDS = 5.0
_TIME_BUDGET_SECONDS = 60.0
_VERIFIER_PROCESSES = min(4, os.cpu_count() or 1)
_VERIFIER_MEMORY_BYTES = 2 << 30

#: Longest answer (characters inside its boxes) that is parsed; a longer one scores -1.0. Real answers are short,
#: and parsing a long stretch of garbage only burns time.
MAX_ANSWER_CHARS = 1_000

#: Largest integer, in decimal digits, that an answer may write as a power or factorial of integers
#: (``9^{9^{9}}``, ``10^{100000}``, ``5000!``); a larger one scores -1.0 without being parsed, since evaluating it
#: could take sympy minutes and gigabytes.
MAX_ANSWER_DIGITS = 10_000

_BOX_OPENING = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Between two boxes of one answer, following math-verify (latex2sympy2_extended.extract_boxed_content): under 10
# characters of anything, or under 70 with one of these separators ("\boxed{1} papers and \boxed{2} bins").
_PART_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")

# A verifier process imports math-verify (sympy, ANTLR) before it says it is ready; a loaded machine is slow.
_STARTUP_TIMEOUT_SECONDS = 120.0


def math_reward(
    completions,
    solution,
    verification_timeout: float | None = None,
    time_budget: float | None = None,
    verifier_processes: int = _VERIFIER_PROCESSES,
    verifier_memory_bytes: int = _VERIFIER_MEMORY_BYTES,
    **kwargs,
) -> list[float | None]:
    """DAPO's rule-based reward, as used by STAPO: +1.0 for a correct final ``\\boxed{}`` answer, -1.0 otherwise.

    A TRL reward function: ``GRPOTrainer`` calls it with ``prompts``, ``completions``, ``completion_ids``,
    ``trainer_state`` and every dataset column; it reads ``completions`` and the ``solution`` column and ignores
    the rest. No overlong shaping: the length of a completion does not matter. The settings (every argument after
    `solution`) are bound with ``functools.partial`` to train with values other than the defaults.

    Args:
        completions: Plain-text completions (``list[str]``) or conversational ones (a list of messages each);
            for the latter the content of the last assistant message is judged.
        solution: The gold answers, one per completion: ``"34"``, ``"\\frac{1}{2}"``, ``"(3,4)"``; a gold that
            contains boxes (as AIME24's do, or a worked solution) is represented by its final boxed answer
            (`gold_answer`).
        verification_timeout: Seconds allowed to judge one distinct answer of one prompt, and to parse one gold
            answer; an answer that takes longer scores -1.0, a gold that takes longer counts as unparseable.
            ``None``: 5 s. The calling process enforces it by killing the verifier process, so it holds on any
            thread, in any process, whatever sympy is doing.
        time_budget: Seconds this call may take in all, starting verifier processes included; answers not judged
            by then score -1.0 (and a warning is logged). ``None``: 60 s, meant for a training batch; grading a
            whole benchmark in one call wants ``math.inf``, then only each answer is bounded.
        verifier_processes: Verifier processes judging different answers in parallel (default: 4, or the number
            of CPUs when fewer); each training process runs its own.
        verifier_memory_bytes: Address space of one verifier process (``RLIMIT_AS``, default 2 GiB). An idle
            verifier takes about 0.1 GiB; an answer that needs more than the limit fails to allocate and scores
            -1.0. Verifiers started under another limit are replaced.

    Returns:
        One reward per completion: 1.0 when math-verify finds the final boxed answer (`boxed_answers`) equivalent
        to the gold; -1.0 when there is no such box, its braces are unbalanced, the answer is longer than
        `MAX_ANSWER_CHARS` or writes an integer of over `MAX_ANSWER_DIGITS` digits, cannot be parsed, is wrong, or
        is not judged in time; ``None`` (left out by TRL) when the gold answer itself cannot be parsed, which is
        also reported with a warning naming the row. Numbers in e-notation (``4.5e33``, ``1e-8``), in the gold or
        the answer, are read as powers of ten (`stapo_trl.math.verifier.read_e_notation`).
    """
    timeout = _VERIFICATION_TIMEOUT_SECONDS if verification_timeout is None else float(verification_timeout)
    budget = _TIME_BUDGET_SECONDS if time_budget is None else float(time_budget)
    if not timeout > 0:
        raise ValueError(f"verification_timeout must be a positive number of seconds, got {verification_timeout}")
    if not budget > 0:
        raise ValueError(f"time_budget must be a positive number of seconds, got {time_budget}")
    for name, value in (("verifier_processes", verifier_processes), ("verifier_memory_bytes", verifier_memory_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    deadline = time.monotonic() + budget
    answers = [extract_boxed_answer(completion_text(completion)) for completion in completions]
    golds = [gold_answer(gold) for gold in solution]
    if len(answers) != len(golds):
        raise ValueError(f"{len(answers)} completions but {len(golds)} solutions")

    refused = {answer for answer in set(answers) - {None} if _writes_too_large_an_integer(answer)}
    for answer in refused:
        logger.warning(
            "math_reward: answer %.200r writes an integer of over %d digits: scored -1", answer, MAX_ANSWER_DIGITS
        )
    # The G completions of a prompt share their gold, which is then parsed once, and often their answer.
    answers_by_gold = {gold: {} for gold in golds}
    for gold, answer in zip(golds, answers):
        if answer is not None and answer not in refused:
            answers_by_gold[gold][answer] = None
    with _POOL_LOCK:
        gold_parses, correct_pairs = _verifier_pool().judge(
            {gold: list(distinct_answers) for gold, distinct_answers in answers_by_gold.items()},
            timeout,
            deadline,
            verifier_processes,
            verifier_memory_bytes,
        )

    rewards = []
    for row, (gold, answer, raw_gold) in enumerate(zip(golds, answers, solution)):
        if gold_parses.get(gold) is False:
            warnings.warn(
                f"math_reward: row {row}: math-verify cannot parse the gold answer {raw_gold!r} into an expression "
                f"(within {timeout:g} s); the row is scored None.",
                stacklevel=2,
            )
            rewards.append(None)
        else:
            rewards.append(1.0 if (gold, answer) in correct_pairs else -1.0)
    return rewards


def boxed_answers(text: str) -> list[str]:
    """The parts of the final boxed answer of `text`, in order: the content of its last ``\\boxed{...}`` (or
    ``\\boxed {...}``, ``\\fbox{...}``), stripped, preceded by that of each box right before it, as math-verify
    groups boxes.

    A box belongs to the answer when the text between it and the next box is under 10 characters, or under 70 and
    holds a separator ("and", "or", ",", ";") and the two contents differ; a repeated content counts once.
    ``\\boxed{1}, \\boxed{2}`` is the two-part answer ``["1", "2"]``; in ``\\boxed{3} ... (a paragraph) ...
    \\boxed{4}`` only the final ``["4"]`` counts. Braces are matched by a scan that skips escaped characters
    (``\\{``, ``\\}``), so nested groups such as ``\\boxed{\\frac{1}{2}}`` come out whole; in
    ``\\boxed{\\boxed{5}}`` the answer is the inner box. Returns ``[]`` when there is no box, when the last box's
    braces do not close, when it is empty, or when the parts hold over `MAX_ANSWER_CHARS` characters together.
    """
    parts: list[str] = []
    next_box_start = len(text)
    for opening in reversed(list(_BOX_OPENING.finditer(text))):
        brace = opening.end() - 1
        closing = _closing_brace(text, brace, min(next_box_start, brace + MAX_ANSWER_CHARS + 2))
        content = None if closing is None else text[brace + 1 : closing].strip()
        if not parts:
            if not content:
                return []
        else:
            between = "" if closing is None else text[closing + 1 : next_box_start]
            joined = len(between) < 10 or (
                content != parts[-1] and len(between) < 70 and _PART_SEPARATOR.search(between) is not None
            )
            if not content or not joined:
                break
        if not parts or content != parts[-1]:
            parts.append(content)
        if sum(map(len, parts)) > MAX_ANSWER_CHARS:
            return []
        next_box_start = opening.start()
    return parts[::-1]


def extract_boxed_answer(text: str) -> str | None:
    """The final boxed answer of `text` as one LaTeX string: its `boxed_answers` joined by ``", "`` (math-verify
    reads a list of several parts as a set), or ``None`` when there is none.

    ``\\boxed{34}`` gives ``"34"``; ``\\boxed{2}, \\boxed{3}`` gives ``"2, 3"``; ``\\boxed{34`` gives ``None``.
    """
    return ", ".join(boxed_answers(text)) or None


def gold_answer(gold) -> str:
    """The gold answer of a dataset row as the LaTeX `math_reward` judges against: the final boxed answer
    (`extract_boxed_answer`) of a gold that has one (AIME24's ``\\boxed{204}``, a worked solution, several parts
    ``\\boxed{1} and \\boxed{2}``), else the whole text, stripped (``""`` for ``None``)."""
    text = "" if gold is None else str(gold).strip()
    return extract_boxed_answer(text) or text


def _closing_brace(text: str, opening_brace: int, scan_end: int) -> int | None:
    """Position of the brace closing the group opened at `opening_brace`, looking before `scan_end` only."""
    depth = 0
    position = opening_brace
    while position < scan_end:
        character = text[position]
        if character == "\\":
            position += 2  # an escaped character, \{ and \} included, neither opens nor closes a group
            continue
        if character == "{":
            depth += 1
        elif character == "}":
            depth -= 1
            if depth == 0:
                return position
        position += 1
    return None


# ---------------------------------------------------------------------------------------------------------------
# The cheap refusal of answers that cannot be judged quickly, before any verifier process sees them.
# ---------------------------------------------------------------------------------------------------------------

_INTEGER = re.compile(r"\d+")
# An integer, maybe as the last thing in brackets: "9", "(9)", "{9}", "\left(9\right)".
_LAST_INTEGER = r"(\d+)\s*(?:\\right\)|[)}])?\s*"
_INTEGER_BEFORE = re.compile(_LAST_INTEGER + "$")
_FACTORIAL = re.compile(_LAST_INTEGER + "!")
_CARET = re.compile(r"\^\s*")


def _writes_too_large_an_integer(answer: str) -> bool:
    """Whether `answer` writes a power of an integer (``a^{b}``, ``a^b``, towers ``a^{b^{c}}`` included) or a
    factorial (``n!``) with over `MAX_ANSWER_DIGITS` decimal digits. A rough, cheap scan: a base or factorial is the
    integer right before ``^`` or ``!``, also when it ends a bracket (``(5000)!``, but also ``(x+2)^{10^5}``); other
    powers are left to the verifier and its timeout."""
    for factorial in _FACTORIAL.finditer(answer):
        if _factorial_digits(int(factorial.group(1))) > MAX_ANSWER_DIGITS:
            return True
    for caret in _CARET.finditer(answer):
        base = _INTEGER_BEFORE.search(answer, 0, caret.start())
        if base is None or int(base.group(1)) < 2:
            continue
        exponent = _log10_of_integer(_exponent_text(answer, caret.end()))
        if exponent is not None and math.log10(int(base.group(1))) * 10.0 ** min(exponent, 300.0) > MAX_ANSWER_DIGITS:
            return True
    return False


def _exponent_text(answer: str, start: int) -> str:
    """The exponent starting at `start` (just after ``^``): a brace group's content, else one character."""
    if answer.startswith("{", start):
        closing = _closing_brace(answer, start, len(answer))
        return answer[start + 1 : closing] if closing is not None else ""
    return answer[start : start + 1]


@functools.lru_cache(maxsize=1024)  # a tower's exponents are met again as the exponents of its inner powers
def _log10_of_integer(latex: str) -> float | None:
    """log10 of the integer `latex` writes as a literal, a power of literals or a factorial; ``None`` otherwise."""
    latex = latex.strip()
    if _INTEGER.fullmatch(latex):
        return math.log10(max(1, int(latex)))
    if factorial := re.fullmatch(r"(\d+)\s*!", latex):
        return _factorial_digits(int(factorial.group(1)))
    if power := re.fullmatch(r"(\d+)\s*\^\s*(\{.*\}|\d)", latex, flags=re.DOTALL):
        base, exponent_text = int(power.group(1)), power.group(2).removeprefix("{").removesuffix("}")
        exponent = _log10_of_integer(exponent_text)
        if exponent is None:
            return None
        return math.log10(max(1, base)) * 10.0 ** min(exponent, 300.0)
    return None


def _factorial_digits(n: int) -> float:
    return math.lgamma(min(n, 10**12) + 1) / math.log(10)


# ---------------------------------------------------------------------------------------------------------------
# The calling process's side: a pool of verifier processes and the deadlines of the jobs they run.
# ---------------------------------------------------------------------------------------------------------------


class _VerifierProcess:
    """One persistent verifier: a fresh Python interpreter running `stapo_trl.math.verifier`, reached over a pipe.

    A fresh interpreter (that file run by path, ``python -I`` in the root directory, so no module of the working
    directory can be imported) rather than ``multiprocessing``: the 'spawn' and 'forkserver' start methods re-import
    the training script in the child, and importing a module of the package by name imports ``stapo_trl``; 'fork'
    would copy CUDA and NCCL state. This child imports math-verify only, runs under `memory_bytes`, dies with the
    training process, and inherits nothing from it: its environment is `processes.scrubbed_env` (no tokens).
    """

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        self.connection, child_end = multiprocessing.Pipe()
        self.process = processes.popen(
            processes.python_command(verifier_program.__file__, str(child_end.fileno())),
            limits=processes.Limits(memory_bytes=memory_bytes),
            env=processes.scrubbed_env(),
            pass_fds=[child_end.fileno()],
        )
        child_end.close()
        self.ready_by: float | None = time.monotonic() + _STARTUP_TIMEOUT_SECONDS  # None once it said it is ready

    def take_ready_message(self) -> None:
        """Read its first message, which says it is ready; if it died or lied, the installation is broken."""
        try:
            ready = self.connection.recv() == verifier_program.READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.fail_to_start()
        self.ready_by = None

    def fail_to_start(self):
        self.kill()
        raise RuntimeError(
            "math_reward: a math-verify verifier process did not start (is math-verify installed for this Python? "
            f"does it fit in verifier_memory_bytes = {self.memory_bytes}?); its error output, if any, is above."
        )

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        processes.kill_group(self.process)
        self.connection.close()


@dataclass
class _Job:
    gold: str
    answer: str | None  # None: parse the gold only
    deadline: float


class _VerifierPool:
    """The verifier processes of one process, started on first use and replaced when they hang or die."""

    def __init__(self):
        self.owner_pid = os.getpid()
        self.idle: list[_VerifierProcess] = []
        self.starting: list[_VerifierProcess] = []

    def judge(
        self,
        answers_by_gold: dict[str, list[str]],
        timeout: float,
        deadline: float,
        max_processes: int,
        memory_bytes: int,
    ):
        """Parse each gold, then judge its answers; return ``{gold: parses}`` and the correct ``(gold, answer)`` pairs.

        Each gold, then each ``(gold, answer)`` pair of a gold that parses, is one job, so that one prompt's answers
        are spread over the verifiers. A job must be done within `timeout`, all of them by `deadline` (a monotonic
        time); a verifier that misses either, or dies, is killed, and its answer counts as wrong (its gold as
        unparseable). Golds not parsed by `deadline` are left out of the returned dict. The verifiers run under
        `memory_bytes`; those started under another limit are replaced.
        """
        queue = collections.deque((gold, None) for gold in answers_by_gold)
        running: dict[_VerifierProcess, _Job] = {}
        gold_parses: dict[str, bool] = {}
        correct_pairs: set[tuple[str, str]] = set()

        def record(verifier: _VerifierProcess, job: _Job, reply: bool) -> None:
            del running[verifier]
            self.idle.append(verifier)
            if job.answer is None:
                gold_parses[job.gold] = reply
                if reply:
                    queue.extend((job.gold, answer) for answer in answers_by_gold[job.gold])
            elif reply:
                correct_pairs.add((job.gold, job.answer))

        def give_up(verifier: _VerifierProcess, job: _Job, what_happened: str) -> None:
            del running[verifier]
            verifier.kill()
            if job.answer is None:
                gold_parses[job.gold] = False
                logger.warning("math_reward: parsing gold %.200r %s: unparseable", job.gold, what_happened)
            else:
                logger.warning("math_reward: judging answer %.200r %s: scored -1", job.answer, what_happened)

        try:
            while (queue or running) and time.monotonic() < deadline:
                self._start_verifiers(min(max_processes, len(running) + len(queue)) - len(running), memory_bytes)
                while queue and self.idle:
                    verifier, (gold, answer) = self.idle.pop(), queue.popleft()
                    running[verifier] = _Job(gold, answer, min(deadline, time.monotonic() + timeout))
                    try:
                        verifier.connection.send((gold, answer))
                    except OSError:
                        pass  # it has just died: the wait below sees the end of its pipe and gives up on it

                waiting_for = list(running) + self.starting
                earliest = min([job.deadline for job in running.values()] + [v.ready_by for v in self.starting])
                ready = multiprocessing.connection.wait(
                    [verifier.connection for verifier in waiting_for],
                    timeout=max(0.0, min(earliest, deadline) - time.monotonic()),
                )
                for verifier in list(self.starting):
                    if verifier.connection in ready:
                        self.starting.remove(verifier)
                        verifier.take_ready_message()
                        self.idle.append(verifier)
                    elif time.monotonic() >= verifier.ready_by:
                        self.starting.remove(verifier)
                        verifier.fail_to_start()
                for verifier, job in list(running.items()):
                    if verifier.connection in ready:
                        try:
                            reply = verifier.connection.recv()
                        except (EOFError, OSError):
                            give_up(verifier, job, "killed its verifier")
                            continue
                        record(verifier, job, reply)
                    elif time.monotonic() >= job.deadline:
                        give_up(verifier, job, f"took over {timeout:g} s")
        finally:
            # At the deadline, or interrupted (Ctrl-C, ...): the running verifiers have replies in flight, so they
            # cannot be reused; the starting ones can, and are kept.
            for verifier in running:
                verifier.kill()
        unjudged = len(queue) + len(running)
        if unjudged:
            logger.warning(
                "math_reward: the call's time budget ran out with %d of its golds and answers not judged: their "
                "completions score -1",
                unjudged,
            )
        return gold_parses, correct_pairs

    def _start_verifiers(self, wanted: int, memory_bytes: int) -> None:
        """Have `wanted` verifiers idle or starting under `memory_bytes`, dropping dead idle ones and those under
        another limit, and starting new ones (in parallel). A starting one that dies says so when it should be ready."""
        for verifier in [v for v in self.idle if v.memory_bytes != memory_bytes or not v.is_alive()]:
            verifier.kill()
            self.idle.remove(verifier)
        for verifier in [v for v in self.starting if v.memory_bytes != memory_bytes]:
            verifier.kill()
            self.starting.remove(verifier)
        for _ in range(wanted - len(self.idle) - len(self.starting)):
            self.starting.append(_VerifierProcess(memory_bytes))

    def close(self) -> None:
        # A forked child (a DataLoader worker, say) inherits this pool but must not kill its parent's verifiers.
        if os.getpid() == self.owner_pid:
            for verifier in self.idle + self.starting:
                verifier.kill()
            self.idle.clear()
            self.starting.clear()


_POOL_LOCK = threading.Lock()
_pool: _VerifierPool | None = None


def _verifier_pool() -> _VerifierPool:
    """This process's pool; a forked child starts its own rather than talking over its parent's pipes."""
    global _pool
    if _pool is None or _pool.owner_pid != os.getpid():
        _pool = _VerifierPool()
        atexit.register(_pool.close)
    return _pool


def _reset_after_fork() -> None:
    """In a forked child: a new pool lock, since another thread of the parent may have held it (inside
    `math_reward`) at the fork, and that thread does not exist in the child to release it."""
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
