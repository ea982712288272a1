"""Throughput of code_reward: completions judged per second, and what one sandbox start costs.

    python benchmarks/code_reward_throughput.py            # 512 completions x 10 tests, as in one optimizer step
    python benchmarks/code_reward_throughput.py --quick    # 16 x 3, a smoke test

Method. The problem reads two integers and prints their sum; its 10 tests are fast (each run of the program takes
well under a millisecond of its own work), so the figures are the sandbox's overhead. Every completion holds a
correct program made distinct by a comment (`code_reward` judges identical programs once), so every completion
runs all its tests: the worst case for a batch of fast programs. Measured in one process, one setting after the
other:

- "start": the wall time of one sandbox that runs an empty program on one input, one after the other (median of
  `--starts`; each a fork of the harness server this thread started for its first job); "per test": the extra wall
  time of each further input, from a 1-input and a 21-input job (median of the differences / 20);
- "judging": `code_reward` (PRIME's harness: preamble, standard input wrapped) on all completions with its default
  number of threads (the CPU cores): the wall time of the whole call (the harness servers start within it),
  completions per second, and the CPU time used in all processes, the servers' included ("CPU s": on a busy machine
  the wall time mostly measures the other load; CPU s / cores is the wall time the same work needs on idle cores
  when it keeps them all busy).

Settings: the default sandbox (namespaces, where the kernel allows them), the sandbox with `isolate=False`
(limits and the process-group kill only), and the default sandbox started from a process holding `--ballast-gb`
of resident memory, as a trainer does (harness servers are started without forking the caller, see
`stapo_trl.processes.bound_self`, so this row should match the first).
"""

import argparse
import collections
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace


sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import describe_machine, markdown_table  # noqa: E402

from stapo_trl.code import sandbox  # noqa: E402
from stapo_trl.code.reward import code_reward, default_workers  # noqa: E402
from stapo_trl.code.sandbox import Job, LocalSandbox  # noqa: E402


PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def tests(count: int) -> str:
    pairs = [(index, 3 * index - 7) for index in range(count)]
    return json.dumps({"inputs": [f"{a} {b}\n" for a, b in pairs], "outputs": [f"{a + b}\n" for a, b in pairs]})


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its ended children (the sandboxes, reaped when they end)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def wall(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def measure(executor: LocalSandbox, completions: int, tests_each: int, starts: int) -> dict:
    start_times = [wall(lambda: list(executor.execute(Job("", [""])))) for _ in range(starts)]
    per_test = []
    for _ in range(max(3, starts // 4)):
        one = wall(lambda: list(executor.execute(Job(PROGRAM, ["1 2\n"]))))
        many = wall(lambda: list(executor.execute(Job(PROGRAM, ["1 2\n"] * 21))))
        per_test.append((many - one) / 20)
    batch = [f"```python\n# completion {index}\n{PROGRAM}```" for index in range(completions)]
    batch_tests = [tests(tests_each)] * completions
    failures = collections.Counter()

    def recording(job: Job):  # the executor, counting how failed tests ended (on a loaded machine: time-outs)
        for output in executor.execute(job):
            failures[f"{output.status}: {output.detail:.100}"] += output.status != "ok"
            yield output

    executor.close()  # the batch starts its own harness servers, as a trainer's first batch does
    started, cpu_started = time.perf_counter(), cpu_seconds()
    rewards = code_reward(batch, batch_tests, executor=SimpleNamespace(execute=recording), time_budget=float("inf"))
    seconds = time.perf_counter() - started
    executor.close()  # its harness servers end, so that their CPU time (and their sandboxes') is counted
    cpu = cpu_seconds() - cpu_started
    if rewards != [1.0] * completions:
        raise SystemExit(f"{rewards.count(-1.0)} of {completions} completions failed: {dict(+failures)}")
    return {
        "start ms": 1000 * statistics.median(start_times),
        "per test ms": 1000 * statistics.median(per_test),
        "seconds": seconds,
        "completions/s": completions / seconds,
        "CPU s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 completions x 3 tests, 5 starts: a smoke test")
    parser.add_argument("--completions", type=int, default=512)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--ballast-gb", type=float, default=2.0, help="resident memory of the 'large parent' row")
    args = parser.parse_args()
    if args.quick:
        args.completions, args.tests, args.starts, args.ballast_gb = 16, 3, 5, 0.1
    print(describe_machine(torch.device("cpu")))
    isolation = LocalSandbox().isolation()
    print(f"Sandbox protections here: {isolation['protections']}; missing: {isolation['missing'] or 'none'}")
    print(f"{args.completions} completions x {args.tests} tests, {default_workers()} judging threads\n")

    settings = [("namespaces", LocalSandbox()), ("limits only (isolate=False)", LocalSandbox(isolate=False))]
    results = [(name, measure(executor, args.completions, args.tests, args.starts)) for name, executor in settings]
    ballast = bytearray(int(args.ballast_gb * (1 << 30)))
    for offset in range(0, len(ballast), 4096):  # touch every page: resident, as a trainer's memory is
        ballast[offset] = 1
    results.append(
        (
            f"namespaces, parent holding {args.ballast_gb:g} GB",
            measure(LocalSandbox(), args.completions, args.tests, args.starts),
        )
    )
    del ballast

    header = ["setting", "start ms", "per test ms", "completions", "tests each", "threads", "seconds", "completions/s",
              "CPU s"]  # fmt: skip
    rows = [
        [
            name,
            result["start ms"],
            result["per test ms"],
            args.completions,
            args.tests,
            default_workers(),
            result["seconds"],
            result["completions/s"],
            result["CPU s"],
        ]
        for name, result in results
    ]
    print(markdown_table(header, rows))
    sandbox.set_default_executor(None)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
