"""The math reward of the STAPO paper: DAPO's rule-based outcome reward, checked with math-verify.

The paper trains on DAPO-Math-17K with DAPO's rule-based reward and no overlong shaping: a completion earns
+1.0 when its final answer is correct and -1.0 otherwise. The final answer is what the completion's last
``\\boxed{...}`` holds (the instruction asks the model to "put your final answer within \\boxed{}"), or, when the
answer comes in several boxes one right after the other (``\\boxed{2}, \\boxed{3}``), what they hold together, read
as math-verify reads it (`boxed_answers`). It is correct when math-verify finds it mathematically equivalent to the
gold answer (``0.5`` = ``\\frac{1}{2}``).

Answers come from a model in training, so judging them must never raise, never hang and never exhaust the machine.
Judging happens in persistent verifier processes (fresh, isolated Python interpreters that run only this file,
under a memory limit, killed if the training process dies; see `stapo_trl.processes`), and the training process
waits at most `VERIFICATION_TIMEOUT_SECONDS` for each answer and `TIME_BUDGET_SECONDS` for one whole call: an answer
not judged in time scores -1.0 and the verifier process working on it is killed and replaced. Unlike math-verify's
own timeouts, which rely on ``signal.alarm`` (main thread only), this works from any thread and in every
torch.distributed / accelerate process.
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
import signal
import threading
import time
import warnings
from dataclasses import dataclass


logger = logging.getLogger(__name__)

#: Seconds the judging of one answer (parsing it and comparing it with the gold) may take before it scores -1.0;
#: parsing a gold answer gets the same allowance. Assign a new value to change it for every later call, or pass
#: ``verification_timeout=`` to `math_reward`.
VERIFICATION_TIMEOUT_SECONDS = 5.0

#: Seconds one `math_reward` call may take in all; answers not judged by then score -1.0. It bounds the wait of a
#: training step (and of every other process of a multi-GPU run, which waits for the slowest). Assign a new value
#: to change it for every later call, or pass ``time_budget=`` to `math_reward`.
TIME_BUDGET_SECONDS = 60.0

#: Verifier processes each training process runs at most; they judge different answers in parallel.
VERIFIER_PROCESSES = min(4, os.cpu_count() or 1)

#: Address space of one verifier process (``RLIMIT_AS``). An idle verifier takes about 0.1 GiB; an answer that needs
#: more than the limit fails to allocate and scores -1.0. Applies to verifier processes started after a change.
VERIFIER_MEMORY_BYTES = 2 << 30

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
_READY = "ready"
# Runs this file, and only this file, in the new interpreter: see `_VerifierProcess`.
_VERIFIER_PROGRAM = "import runpy, sys; runpy.run_path(sys.argv[1])['_serve_verifier'](int(sys.argv[2]))"


def math_reward(
    completions,
    solution,
    verification_timeout: float | None = None,
    time_budget: float | None = None,
    **kwargs,
) -> list[float | None]:
    """DAPO's rule-based reward, as used by STAPO: +1.0 for a correct final ``\\boxed{}`` answer, -1.0 otherwise.

    A TRL reward function: ``GRPOTrainer`` calls it with ``prompts``, ``completions``, ``completion_ids``,
    ``trainer_state`` and every dataset column; it reads ``completions`` and the ``solution`` column and ignores
    the rest. No overlong shaping: the length of a completion does not matter.

    Args:
        completions: Plain-text completions (``list[str]``) or conversational ones (a list of messages each);
            for the latter the content of the last assistant message is judged.
        solution: The gold answers, one per completion: ``"34"``, ``"\\frac{1}{2}"``, ``"(3,4)"``; a gold that
            contains boxes (as AIME24's do, or a worked solution) is represented by its final boxed answer
            (`gold_answer`).
        verification_timeout: Seconds allowed to judge one distinct answer of one prompt, and to parse one gold
            answer; an answer that takes longer scores -1.0, a gold that takes longer counts as unparseable.
            Defaults to `VERIFICATION_TIMEOUT_SECONDS` (5 s). The calling process enforces it by killing the
            verifier process, so it holds on any thread, in any process, whatever sympy is doing.
        time_budget: Seconds this call may take in all, starting verifier processes included; answers not judged
            by then score -1.0 (and a warning is logged). Defaults to `TIME_BUDGET_SECONDS` (60 s), meant for a
            training batch; grading a whole benchmark in one call wants ``math.inf``, then only each answer is
            bounded.

    Returns:
        One reward per completion: 1.0 when math-verify finds the final boxed answer (`boxed_answers`) equivalent
        to the gold; -1.0 when there is no such box, its braces are unbalanced, the answer is longer than
        `MAX_ANSWER_CHARS` or writes an integer of over `MAX_ANSWER_DIGITS` digits, cannot be parsed, is wrong, or
        is not judged in time; ``None`` (left out by TRL) when the gold answer itself cannot be parsed, which is
        also reported with a warning naming the row.
    """
    timeout = VERIFICATION_TIMEOUT_SECONDS if verification_timeout is None else float(verification_timeout)
    budget = TIME_BUDGET_SECONDS if time_budget is None else float(time_budget)
    if not timeout > 0:
        raise ValueError(f"verification_timeout must be a positive number of seconds, got {verification_timeout}")
    if not budget > 0:
        raise ValueError(f"time_budget must be a positive number of seconds, got {time_budget}")
    deadline = time.monotonic() + budget
    from stapo_trl.completions import completion_text  # here: a verifier process runs this file outside the package

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
            VERIFIER_PROCESSES,
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
    """One persistent verifier: a fresh Python interpreter running `_serve_verifier`, reached over a socket pair.

    A fresh interpreter (this file run by path, ``python -I`` in the root directory, so no module of the working
    directory can be imported) rather than ``multiprocessing``: the 'spawn' and 'forkserver' start methods re-import
    the training script in the child, and importing this module by name imports the ``stapo_trl`` package; 'fork'
    would copy CUDA and NCCL state. This child imports math-verify only, runs under `VERIFIER_MEMORY_BYTES`, dies
    with the training process, and inherits nothing from it but its environment variables.
    """

    def __init__(self):
        from stapo_trl import processes  # here, not at the top: a verifier process runs this file outside the package

        self.connection, child_end = multiprocessing.Pipe()
        self.process = processes.popen(
            processes.python_command("-c", _VERIFIER_PROGRAM, os.path.abspath(__file__), str(child_end.fileno())),
            limits=processes.Limits(memory_bytes=VERIFIER_MEMORY_BYTES),
            pass_fds=[child_end.fileno()],
        )
        child_end.close()
        self.ready_by: float | None = time.monotonic() + _STARTUP_TIMEOUT_SECONDS  # None once it said it is ready

    def take_ready_message(self) -> None:
        """Read its first message, which says it is ready; if it died or lied, the installation is broken."""
        try:
            ready = self.connection.recv() == _READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.fail_to_start()
        self.ready_by = None

    def fail_to_start(self):
        self.kill()
        raise RuntimeError(
            "math_reward: a math-verify verifier process did not start (is math-verify installed for this Python? "
            f"does it fit in VERIFIER_MEMORY_BYTES = {VERIFIER_MEMORY_BYTES}?); its error output, if any, is above."
        )

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        from stapo_trl import processes

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

    def judge(self, answers_by_gold: dict[str, list[str]], timeout: float, deadline: float, max_processes: int):
        """Parse each gold, then judge its answers; return ``{gold: parses}`` and the correct ``(gold, answer)`` pairs.

        Each gold, then each ``(gold, answer)`` pair of a gold that parses, is one job, so that one prompt's answers
        are spread over the verifiers. A job must be done within `timeout`, all of them by `deadline` (a monotonic
        time); a verifier that misses either, or dies, is killed, and its answer counts as wrong (its gold as
        unparseable). Golds not parsed by `deadline` are left out of the returned dict.
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
                self._start_verifiers(min(max_processes, len(running) + len(queue)) - len(running))
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

    def _start_verifiers(self, wanted: int) -> None:
        """Have `wanted` verifiers idle or starting, dropping dead idle ones and starting new ones (in parallel)."""
        for verifier in [verifier for verifier in self.idle if not verifier.is_alive()]:
            verifier.kill()
            self.idle.remove(verifier)
        for _ in range(wanted - len(self.idle) - len(self.starting)):
            self.starting.append(_VerifierProcess())

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


# ---------------------------------------------------------------------------------------------------------------
# The verifier's side: runs in the verifier process only.
# ---------------------------------------------------------------------------------------------------------------


def _serve_verifier(connection_fd: int) -> None:
    """Do ``(gold, answer)`` jobs until the calling process hangs up: with no answer, reply whether the gold parses;
    with one, whether it is equivalent to the gold."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which then kills us or hangs up
    # math-verify warns that its own (signal-based) timeouts are off: the calling process enforces ours.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    connection = multiprocessing.connection.Connection(connection_fd)
    # Loading sympy's and ANTLR's lazy parts takes about a second, which must not count towards the first answer.
    _is_equivalent(_parse_gold("\\frac{1}{2}"), "0.5")
    connection.send(_READY)
    try:
        while True:
            gold, answer = connection.recv()
            parsed_gold = _parse_gold(gold)
            if answer is None:
                connection.send(parsed_gold is not None)
            else:
                connection.send(parsed_gold is not None and _is_equivalent(parsed_gold, answer))
    except (EOFError, OSError):  # the calling process hung up, or died
        return


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list | None:
    """The parsed gold, or ``None`` when math-verify finds no mathematical expression in it.

    Cached: the same gold comes with every completion of its prompt, and again whenever the prompt does.
    """
    try:
        parsed = _parse_answer(gold)
    except Exception:
        return None
    return parsed if _has_expression(parsed) else None


def _is_equivalent(parsed_gold: list, answer: str) -> bool:
    from math_verify import verify

    try:
        return bool(verify(parsed_gold, _parse_answer(answer), timeout_seconds=None))
    except Exception:  # math-verify catches its own errors; this guards the verifier against anything else
        return False


def _parse_answer(latex: str) -> list:
    """math-verify's parse of one answer (or gold); retried after `_rewrite_for_parser` if it finds no expression.

    The answer is parsed as the content of a ``\\boxed{}``, so math-verify's LaTeX extraction takes all of it.
    Its plain-expression extraction is left out: on LaTeX it fails on, it picks a fragment (``-1./3`` -> ``-1``).
    """
    from math_verify import LatexExtractionConfig, parse

    def parse_boxed(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)

    parsed = parse_boxed(latex)
    if not _has_expression(parsed):
        rewritten = _rewrite_for_parser(latex)
        if rewritten != latex and _has_expression(reparsed := parse_boxed(rewritten)):
            return reparsed
    return parsed


def _has_expression(parsed: list) -> bool:
    """Whether math-verify parsed a mathematical expression; when it cannot, it returns only the raw text."""
    return any(not isinstance(expression, str) for expression in parsed)


_POINT_ENDING_NUMBER = re.compile(r"(?<=\d)\.(?![\d.])")
_SUBSCRIPT = re.compile(r"_\{((?:[^{}]|\{[^{}]*\})*)\}")


def _rewrite_for_parser(latex: str) -> str:
    """Rewrite two forms math-verify's LaTeX parser rejects, both met in benchmark golds (Minerva, OlympiadBench).

    A number ending in a point, Python style: ``-1./3`` becomes ``-1/3``. Commands in a subscript, which only names
    a variable: ``m_{\\max}``, ``L_{\\odot}``, ``x_{\\mathrm{a}}`` become ``m_{max}``, ``L_{odot}``, ``x_{a}``.
    """
    without_points = _POINT_ENDING_NUMBER.sub("", latex)
    return _SUBSCRIPT.sub(lambda subscript: "_{" + _plain_name(subscript.group(1)) + "}", without_points)


def _plain_name(subscript: str) -> str:
    without_wrappers = re.sub(r"\\[a-zA-Z]+(?=\s*\{)", "", subscript)  # \text{max} -> {max}
    without_backslashes = re.sub(r"\\([a-zA-Z]+)", r"\1", without_wrappers)  # \max -> max
    return re.sub(r"[{}\s]", "", without_backslashes)
