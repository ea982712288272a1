"""What the agreement tests share: running a peer's own grading code (tests/peers) on cases, and case helpers."""

import json
import os
import sys
import tempfile
from pathlib import Path

from conftest import started_commands


PEERS = Path(__file__).resolve().parent / "peers"


def peer_verdicts(peer: str, cases: list[dict], timeout: float = 900) -> list:
    """The peer's verdict on each case (see tests/peers/verdicts.py), from one process (its whole group killed on
    timeout)."""
    return peer_verdicts_alongside(peer, cases, lambda: None, timeout)[0]


def peer_verdicts_alongside(peer: str, cases: list[dict], work, timeout: float = 900) -> tuple[list, object]:
    """`peer_verdicts`, and what `work()` returns: `work` runs in this process while the peer's process judges the
    cases."""
    with tempfile.TemporaryDirectory() as directory:
        cases_file, out = Path(directory) / "cases.json", Path(directory) / "verdicts.json"
        cases_file.write_text(json.dumps(cases))
        # The peers run the programs in their working directory: a scratch one.
        with started_commands(
            [[sys.executable, str(PEERS / "verdicts.py"), peer, str(cases_file), str(out)]],
            timeout=timeout,
            cwd=directory,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ) as finish:
            result = work()
            [process] = finish()
        assert process.returncode == 0, process.stderr[-3000:]
        return json.loads(out.read_text()), result


def stdin_tests(inputs: list[str], outputs: list[str]) -> dict:
    return {"inputs": inputs, "outputs": outputs}


def call_tests(fn_name: str, arguments: list[str], outputs: list[str]) -> dict:
    """Functional tests in PRIME's and LiveCodeBench's layout: one JSON argument per line, a JSON expected value."""
    return {"fn_name": fn_name, "inputs": arguments, "outputs": outputs}


def fenced(program: str, prose: str = "Here is my solution.") -> str:
    return f"{prose}\n```python\n{program}```\n"
