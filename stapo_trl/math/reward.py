"""The math reward of the STAPO paper: DAPO's rule-based outcome reward, checked with math-verify.

The paper trains on DAPO-Math-17K with DAPO's rule-based reward and no overlong shaping: a completion earns
+1.0 when its final answer is correct and -1.0 otherwise. The final answer is the content of the completion's
last ``\\boxed{...}`` (the instruction asks the model to "put your final answer within \\boxed{}"); it is
correct when math-verify finds it mathematically equivalent to the gold answer (``0.5`` = ``\\frac{1}{2}``).

Answers come from a model in training, so judging one must never raise and never hang. Judging happens in
persistent verifier processes (fresh Python interpreters that run only this file), and the trainer's process
waits at most `VERIFICATION_TIMEOUT_SECONDS` for each answer: an answer that takes longer scores -1.0 and its
verifier process is killed and replaced. Unlike math-verify's own timeouts, which rely on ``signal.alarm``
(main thread only), this works from any thread and in every torch.distributed / accelerate process.
"""

import atexit
import collections
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: Seconds the judging of one answer (parsing it and comparing it with the gold) may take before it scores -1.0;
#: parsing a gold answer gets the same allowance. Assign a new value to change it for every later call, or pass
#: ``verification_timeout=`` to `math_reward`.
VERIFICATION_TIMEOUT_SECONDS = 5.0

#: Verifier processes each training process runs at most; they judge different prompts in parallel.
VERIFIER_PROCESSES = min(4, os.cpu_count() or 1)

#: Longest answer (characters inside the box) that is parsed; a longer one scores -1.0. Real answers are short,
#: and parsing a long stretch of garbage only burns time.
MAX_ANSWER_CHARS = 1_000

_BOX_OPENING = re.compile(r"\\(?:boxed|fbox)\s*\{")

# A verifier process imports math-verify (sympy, ANTLR) before it says it is ready; a loaded machine is slow.
_STARTUP_TIMEOUT_SECONDS = 120.0
_READY = "ready"
# Runs this file, and only this file, in the new interpreter: see `_VerifierProcess`.
_VERIFIER_PROGRAM = "import runpy, sys; runpy.run_path(sys.argv[1])['_serve_verifier'](int(sys.argv[2]))"


def math_reward(completions, solution, verification_timeout: float | None = None, **kwargs) -> list[float | None]:
    """DAPO's rule-based reward, as used by STAPO: +1.0 for a correct final ``\\boxed{}`` answer, -1.0 otherwise.

    A TRL reward function: ``GRPOTrainer`` calls it with ``prompts``, ``completions``, ``completion_ids``,
    ``trainer_state`` and every dataset column; it reads ``completions`` and the ``solution`` column and ignores
    the rest. No overlong shaping: the length of a completion does not matter.

    Args:
        completions: Plain-text completions (``list[str]``) or conversational ones (a list of messages each);
            for the latter the content of the last assistant message is judged.
        solution: The gold answers, one per completion: ``"34"``, ``"\\frac{1}{2}"``, ``"(3,4)"``; a gold that
            contains a ``\\boxed{...}`` (as AIME24's do, or a worked solution) is represented by its last box.
        verification_timeout: Seconds allowed to judge one distinct answer of one prompt, and to parse one gold
            answer; an answer that takes longer scores -1.0, a gold that takes longer counts as unparseable.
            Defaults to `VERIFICATION_TIMEOUT_SECONDS` (5 s). The calling process enforces it by killing the
            verifier process, so it holds on any thread, in any process, whatever sympy is doing.

    Returns:
        One reward per completion: 1.0 when math-verify finds the last ``\\boxed{}`` / ``\\fbox{}`` answer
        equivalent to the gold; -1.0 when there is no such box, its braces are unbalanced, the answer is longer
        than `MAX_ANSWER_CHARS`, cannot be parsed, is wrong, or takes too long to judge; ``None`` (left out by
        TRL) when the gold answer itself cannot be parsed, which is also reported with a warning naming the row.
    """
    timeout = VERIFICATION_TIMEOUT_SECONDS if verification_timeout is None else float(verification_timeout)
    if timeout <= 0:
        raise ValueError(f"verification_timeout must be positive, got {timeout}")
    answers = [extract_boxed_answer(_completion_text(completion)) for completion in completions]
    golds = [_gold_latex(gold) for gold in solution]
    if len(answers) != len(golds):
        raise ValueError(f"{len(answers)} completions but {len(golds)} solutions")

    # One job per distinct gold, holding its distinct answers: the G completions of a prompt share their gold,
    # which is then parsed once, and often their answer.
    answers_by_gold = collections.defaultdict(dict)
    for gold, answer in zip(golds, answers):
        answers_by_gold[gold][answer] = None
    jobs = [(gold, list(distinct_answers)) for gold, distinct_answers in answers_by_gold.items()]
    with _POOL_LOCK:
        correct_pairs, unparseable_golds = _verifier_pool().judge(jobs, timeout, VERIFIER_PROCESSES)

    rewards = []
    for row, (gold, answer, raw_gold) in enumerate(zip(golds, answers, solution)):
        if gold in unparseable_golds:
            warnings.warn(
                f"math_reward: row {row}: math-verify cannot parse the gold answer {raw_gold!r} into an expression "
                f"(within {timeout:g} s); the row is scored None.",
                stacklevel=2,
            )
            rewards.append(None)
        else:
            rewards.append(1.0 if (gold, answer) in correct_pairs else -1.0)
    return rewards


def extract_boxed_answer(text: str) -> str | None:
    """Return the content of the last ``\\boxed{...}`` (or ``\\boxed {...}``, ``\\fbox{...}``) in `text`, stripped.

    Braces are matched by a scan that skips escaped characters (``\\{``, ``\\}``), so nested groups such as
    ``\\boxed{\\frac{1}{2}}`` come out whole. Returns ``None`` when there is no box, when the last box's braces do
    not close within `MAX_ANSWER_CHARS` characters, or when it is empty. "Last" means the last box to open: in
    ``\\boxed{\\boxed{5}}`` it is the inner one.
    """
    last_opening = None
    for last_opening in _BOX_OPENING.finditer(text):
        pass
    if last_opening is None:
        return None
    opening_brace = last_opening.end() - 1
    depth = 0
    position = opening_brace
    scan_end = min(len(text), opening_brace + MAX_ANSWER_CHARS + 2)
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
                return text[opening_brace + 1 : position].strip() or None
        position += 1
    return None


def _completion_text(completion) -> str:
    """The text to judge: a plain completion itself, or the content of a conversation's last assistant message."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
                content = "".join(part.get("text") or "" for part in content if part.get("type") == "text")
            return content
    return ""


def _gold_latex(gold) -> str:
    """The gold answer as LaTeX to parse: its last box's content when it has one, else the whole text."""
    text = "" if gold is None else str(gold).strip()
    boxed = extract_boxed_answer(text)
    return text if boxed is None else boxed


# ---------------------------------------------------------------------------------------------------------------
# The calling process's side: a pool of verifier processes and the deadlines of the jobs they run.
# ---------------------------------------------------------------------------------------------------------------


class _VerifierProcess:
    """One persistent verifier: a fresh Python interpreter running `_serve_verifier`, reached over a socket pair.

    A fresh interpreter (``subprocess`` running this file by path) rather than ``multiprocessing``: the 'spawn' and
    'forkserver' start methods re-import the training script in the child, and importing this module by name
    imports the ``stapo_trl`` package with torch and TRL; 'fork' would copy CUDA and NCCL state. This child
    imports math-verify only and inherits nothing from the trainer but its environment variables.
    """

    def __init__(self):
        self.connection, child_end = multiprocessing.Pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _VERIFIER_PROGRAM, os.path.abspath(__file__), str(child_end.fileno())],
            pass_fds=[child_end.fileno()],
            stdin=subprocess.DEVNULL,
        )
        child_end.close()

    def wait_until_ready(self) -> None:
        try:
            ready = self.connection.poll(_STARTUP_TIMEOUT_SECONDS) and self.connection.recv() == _READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(
                "math_reward: a math-verify verifier process did not start (is math-verify installed for "
                f"{sys.executable}?); its error output, if any, is above."
            )

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.connection.close()


@dataclass
class _RunningJob:
    gold: str
    answers: list
    deadline: float
    gold_parsed: bool = False
    answers_judged: int = 0


class _VerifierPool:
    """The verifier processes of one process, started on first use and replaced when they hang or die."""

    def __init__(self):
        self.owner_pid = os.getpid()
        self.idle: list[_VerifierProcess] = []

    def judge(self, jobs: list[tuple[str, list]], timeout: float, max_processes: int):
        """Judge ``(gold, answers)`` jobs; return the correct ``(gold, answer)`` pairs and the unparseable golds.

        A job goes to an idle verifier, which replies whether the gold parses, then whether each answer is correct.
        Each reply must come within `timeout` of the previous one; a verifier that misses its deadline, or dies,
        is killed, its current answer counts as wrong (or its gold as unparseable), and the job's remaining
        answers go back to the queue.
        """
        max_processes = max(1, max_processes)
        queue = collections.deque(jobs)
        running: dict[_VerifierProcess, _RunningJob] = {}
        correct_pairs: set[tuple[str, str | None]] = set()
        unparseable_golds: set[str] = set()

        def record(verifier: _VerifierProcess, job: _RunningJob, reply: bool) -> None:
            job.deadline = time.monotonic() + timeout
            if not job.gold_parsed:
                job.gold_parsed = reply
                if not reply:
                    unparseable_golds.add(job.gold)
            else:
                if reply:
                    correct_pairs.add((job.gold, job.answers[job.answers_judged]))
                job.answers_judged += 1
            if not job.gold_parsed or job.answers_judged == len(job.answers):
                del running[verifier]
                self.idle.append(verifier)

        def give_up(verifier: _VerifierProcess, job: _RunningJob, what_happened: str) -> None:
            verifier.kill()
            del running[verifier]
            if not job.gold_parsed:
                unparseable_golds.add(job.gold)
                logger.warning("math_reward: parsing gold %.200r %s: unparseable", job.gold, what_happened)
                return
            answer = job.answers[job.answers_judged]
            logger.warning("math_reward: judging answer %.200r %s: scored -1", answer, what_happened)
            remaining_answers = job.answers[job.answers_judged + 1 :]
            if remaining_answers:
                queue.appendleft((job.gold, remaining_answers))

        try:
            while queue or running:
                self._provide_idle(min(max_processes, len(running) + len(queue)) - len(running))
                while queue and len(running) < max_processes:
                    verifier, (gold, answers) = self.idle.pop(), queue.popleft()
                    running[verifier] = _RunningJob(gold, answers, deadline=time.monotonic() + timeout)
                    try:
                        verifier.connection.send((gold, answers))
                    except OSError:
                        pass  # it has just died: the wait below sees the end of its pipe and gives up on it

                seconds_to_earliest_deadline = min(job.deadline for job in running.values()) - time.monotonic()
                ready = multiprocessing.connection.wait(
                    [verifier.connection for verifier in running], timeout=max(0.0, seconds_to_earliest_deadline)
                )
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
        except BaseException:
            # Interrupted (Ctrl-C, ...): the running verifiers have replies in flight, so they cannot be reused.
            for verifier in running:
                verifier.kill()
            raise
        return correct_pairs, unparseable_golds

    def _provide_idle(self, wanted: int) -> None:
        """Make `wanted` idle verifiers available, dropping dead ones and starting new ones in parallel."""
        for verifier in [verifier for verifier in self.idle if not verifier.is_alive()]:
            verifier.kill()
            self.idle.remove(verifier)
        new_verifiers = [_VerifierProcess() for _ in range(wanted - len(self.idle))]
        for verifier in new_verifiers:
            verifier.wait_until_ready()
        self.idle.extend(new_verifiers)

    def close(self) -> None:
        # A forked child (a DataLoader worker, say) inherits this pool but must not kill its parent's verifiers.
        if os.getpid() == self.owner_pid:
            for verifier in self.idle:
                verifier.kill()
            self.idle.clear()


_POOL_LOCK = threading.Lock()
_pool: _VerifierPool | None = None


def _verifier_pool() -> _VerifierPool:
    """This process's pool; a forked child starts its own rather than talking over its parent's pipes."""
    global _pool
    if _pool is None or _pool.owner_pid != os.getpid():
        _pool = _VerifierPool()
        atexit.register(_pool.close)
    return _pool


# ---------------------------------------------------------------------------------------------------------------
# The verifier's side: runs in the verifier process only.
# ---------------------------------------------------------------------------------------------------------------


def _serve_verifier(connection_fd: int) -> None:
    """Judge ``(gold, answers)`` jobs until the calling process hangs up: reply whether the gold parses, then
    whether each answer is equivalent to it (``None``, no boxed answer, is not)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which then kills us or hangs up
    # math-verify warns that its own (signal-based) timeouts are off: the calling process enforces ours.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    connection = multiprocessing.connection.Connection(connection_fd)
    # Loading sympy's and ANTLR's lazy parts takes about a second, which must not count towards the first answer.
    _is_equivalent(_parse_gold("\\frac{1}{2}"), "0.5")
    connection.send(_READY)
    try:
        while True:
            gold, answers = connection.recv()
            parsed_gold = _parse_gold(gold)
            connection.send(parsed_gold is not None)
            if parsed_gold is not None:
                for answer in answers:
                    connection.send(answer is not None and _is_equivalent(parsed_gold, answer))
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
