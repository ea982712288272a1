"""The math verifier: the program each verifier process of `stapo_trl.math.reward` runs, judging answers with
math-verify.

`math_reward` starts it as ``python -I verifier.py FD`` (this file run by path, in the root directory, with the
scrubbed environment of `stapo_trl.processes.scrubbed_env`, under a memory limit), so that it imports the standard
library and math-verify only: nothing of the working directory, nothing of ``stapo_trl``. Over the connection whose
file descriptor is FD it first sends `READY`, then answers ``(gold, answer)`` jobs until the other end hangs up:
with no answer, whether the gold parses; with one, whether it is equivalent to the gold. Time is bounded from the
outside: `math_reward` kills a verifier that takes too long.
"""

import functools
import logging
import multiprocessing.connection
import re
import signal
import sys


READY = "ready"


def serve(connection_fd: int) -> None:
    """Do ``(gold, answer)`` jobs until the calling process hangs up: with no answer, reply whether the gold parses;
    with one, whether it is equivalent to the gold."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which then kills us or hangs up
    # math-verify warns that its own (signal-based) timeouts are off: the calling process enforces ours.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    connection = multiprocessing.connection.Connection(connection_fd)
    # Loading sympy's and ANTLR's lazy parts takes about a second, which must not count towards the first answer.
    is_equivalent(parse_gold("\\frac{1}{2}"), "0.5")
    connection.send(READY)
    try:
        while True:
            gold, answer = connection.recv()
            parsed_gold = parse_gold(gold)
            if answer is None:
                connection.send(parsed_gold is not None)
            else:
                connection.send(parsed_gold is not None and is_equivalent(parsed_gold, answer))
    except (EOFError, OSError):  # the calling process hung up, or died
        return


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> list | None:
    """The parsed gold, or ``None`` when math-verify finds no mathematical expression in it.

    Cached: the same gold comes with every completion of its prompt, and again whenever the prompt does.
    """
    try:
        parsed = parse_answer(gold)
    except Exception:
        return None
    return parsed if has_expression(parsed) else None


def is_equivalent(parsed_gold: list, answer: str) -> bool:
    from math_verify import verify

    try:
        return bool(verify(parsed_gold, parse_answer(answer), timeout_seconds=None))
    except Exception:  # math-verify catches its own errors; this guards the verifier against anything else
        return False


def parse_answer(latex: str) -> list:
    """math-verify's parse of one answer (or gold), its numbers in e-notation read as powers of ten
    (`read_e_notation`); retried after `rewrite_for_parser` if it finds no expression.

    The answer is parsed as the content of a ``\\boxed{}``, so math-verify's LaTeX extraction takes all of it.
    Its plain-expression extraction is left out: on LaTeX it fails on, it picks a fragment (``-1./3`` -> ``-1``).
    """
    from math_verify import LatexExtractionConfig, parse

    def parse_boxed(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)

    latex = read_e_notation(latex)
    parsed = parse_boxed(latex)
    if not has_expression(parsed):
        rewritten = rewrite_for_parser(latex)
        if rewritten != latex and has_expression(reparsed := parse_boxed(rewritten)):
            return reparsed
    return parsed


def has_expression(parsed: list) -> bool:
    """Whether math-verify parsed a mathematical expression; when it cannot, it returns only the raw text."""
    return any(not isinstance(expression, str) for expression in parsed)


# A number in e-notation, standing alone: not part of a name (x1e5), a command or a longer number.
_E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")


def read_e_notation(latex: str) -> str:
    """Write numbers in e-notation as LaTeX powers of ten: ``4.5e33`` becomes ``(4.5 \\times 10^{33})``, ``1e-8``
    ``(1 \\times 10^{-8})``.

    math-verify's parser reads ``4.5e33`` as 4.5·e·33 and ``1e-8`` as e − 8 (``e`` is Euler's number), which puts
    58 of Minerva's 272 golds at the wrong value; written as powers of ten they are read as the numbers they are.
    """
    return _E_NOTATION.sub(
        lambda number: f"({number.group(1)} \\times 10^{{{number.group(2).removeprefix('+')}}})", latex
    )


_POINT_ENDING_NUMBER = re.compile(r"(?<=\d)\.(?![\d.])")
_SUBSCRIPT = re.compile(r"_\{((?:[^{}]|\{[^{}]*\})*)\}")


def rewrite_for_parser(latex: str) -> str:
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


if __name__ == "__main__":  # python -I verifier.py CONNECTION_FD
    serve(int(sys.argv[1]))
