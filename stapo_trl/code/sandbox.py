"""Running untrusted programs: the `Executor` interface and `LocalSandbox`, the default executor.

An executor runs one `Job` (a program and its inputs) and yields one `Output` per input, in order; it may stop
after the first output that is not ``"ok"``. It never sees the expected outputs: comparing is the caller's job
(`stapo_trl.code.reward`), so a program cannot learn them or influence the verdict other than by its output.

`LocalSandbox` runs each job in a fresh bounded process (`stapo_trl.processes`) running `sandbox_harness.py`:
new user, mount, network and PID namespaces where the kernel allows them, a read-only filesystem but for a
private tmpfs, no network, resource limits, a forked child per input, and the whole process group killed at the
deadline. `LocalSandbox.isolation()` says which protections this machine gives (see the README's "Code" section).

Another executor (a remote sandbox service, a container pool) plugs in by implementing ``execute(job)``::

    class MyRemoteSandbox:
        def execute(self, job: Job) -> Iterable[Output]:
            for stdout in my_service.run(job.program, job.inputs, timeout=job.timeout):
                yield Output("ok", stdout)

    code_reward(completions, tests, executor=MyRemoteSandbox())   # or set_default_executor(MyRemoteSandbox())
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stapo_trl import processes


logger = logging.getLogger(__name__)

HARNESS = Path(__file__).with_name("sandbox_harness.py")
# What programs may import besides the standard library: this interpreter's installed packages.
_SITE_PACKAGES = [path for path in sys.path if path.endswith(("site-packages", "dist-packages"))]
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where the harness imports stapo_trl.processes from

#: Statuses of an `Output`. Only ``"ok"`` carries a usable value.
OK, ERROR, TIMEOUT, OUTPUT_LIMIT, SANDBOX_ERROR = (
    "ok",
    "error",
    "timeout",
    "output_limit",
    "sandbox_error",
)

#: Seconds a sandbox may take to start (interpreter, namespaces) before it counts as failed; a loaded node is slow.
STARTUP_SECONDS = 30.0


@dataclass(frozen=True)
class Job:
    """One program to run on each of its inputs.

    Attributes:
        program: Python source.
        inputs: Standard-input texts, or (with `fn_name`) argument lists for the function.
        fn_name: ``None``: run the program as a script on each standard input. Otherwise call the function (or
            ``Solution().<fn_name>``, the LeetCode layout) with each argument list.
        timeout: Seconds of wall time (and of CPU time) for each input.
    """

    program: str
    inputs: Sequence[Any]
    fn_name: str | None = None
    timeout: float = 5.0


@dataclass(frozen=True)
class Output:
    """What a program produced for one input.

    Attributes:
        status: ``"ok"``, ``"error"`` (an exception or a non-zero exit), ``"timeout"``, ``"output_limit"``, or
            ``"sandbox_error"`` (the sandbox itself failed; the program is not to blame but gets no credit).
        value: ``"ok"``: the standard output (text), or the function's return value as JSON data with its Python
            types tagged (`stapo_trl.code.values`; `stapo_trl.code.reward` decodes it).
        detail: Why, for any status but ``"ok"``: the exception's last line, the exit code, the limit.
    """

    status: str
    value: Any = None
    detail: str = ""


class Executor(Protocol):
    """Runs jobs. `LocalSandbox` is the default; any object with this method can replace it."""

    def execute(self, job: Job) -> Iterable[Output]:
        """Yield one `Output` per input of `job`, in order; may stop after one whose status is not ``"ok"``.

        The caller stops iterating at the first failing input; a generator is then closed, which should stop the
        program.
        """
        ...


class LocalSandbox:
    """Runs each job in a fresh isolated process on this machine (see the module docstring and the harness).

    Args:
        memory_bytes: Address space of each process (``RLIMIT_AS``): a larger allocation fails.
        max_processes: Processes and threads the program may have at once (``RLIMIT_NPROC``, which never binds
            root); the PID namespace's ``pid_max`` (Linux >= 6.14) bounds them below 300 + this for any user.
        file_size_bytes: Largest file it may write (``RLIMIT_FSIZE``).
        tmpfs_bytes: Size of its private working directory (a tmpfs, where mount namespaces are available).
        max_output_bytes: Output kept per input; a program writing more is stopped and fails.
        isolate: Use namespaces (default). ``False`` keeps only the limits and the process-group kill.
    """

    def __init__(
        self,
        *,
        memory_bytes: int = 4 << 30,
        max_processes: int = 64,
        file_size_bytes: int = 64 << 20,
        tmpfs_bytes: int = 64 << 20,
        max_output_bytes: int = 16 << 20,
        isolate: bool = True,
    ):
        self.memory_bytes = memory_bytes
        self.max_processes = max_processes
        self.file_size_bytes = file_size_bytes
        self.tmpfs_bytes = tmpfs_bytes
        self.max_output_bytes = max_output_bytes
        self.isolate = isolate
        self._warned = False
        self._lock = threading.Lock()

    def isolation(self) -> dict[str, Any]:
        """Run an empty program and return ``{"protections": [...], "missing": {name: reason}}`` on this machine."""
        report = {}
        for _ in self._run(Job("", [""], timeout=5.0), report):
            pass
        return report

    def execute(self, job: Job) -> Iterator[Output]:
        return self._run(job, {})

    def _run(self, job: Job, report: dict) -> Iterator[Output]:
        workdir = tempfile.mkdtemp(prefix="stapo-sandbox-")
        process = None
        try:
            job_file = Path(workdir) / "job.json"
            job_file.write_text(
                json.dumps(
                    {
                        "program": job.program,
                        "inputs": list(job.inputs),
                        "fn_name": job.fn_name,
                        "timeout": job.timeout,
                        "max_output_bytes": self.max_output_bytes,
                        "max_processes": self.max_processes,
                        "tmpfs_bytes": self.tmpfs_bytes,
                        "isolate": self.isolate,
                        "site_packages": _SITE_PACKAGES,
                        "package_root": _PACKAGE_ROOT,
                        "parent_pid": os.getpid(),
                        "limits": {  # CPU: every input's allowance (each input's child has its own, smaller limit)
                            "cpu_seconds": int(len(job.inputs) * (job.timeout + 1)) + 10,
                            "memory_bytes": self.memory_bytes,
                            "file_size_bytes": self.file_size_bytes,
                            "open_files": 256,
                        },
                    }
                )
            )
            # The harness bounds itself first (`processes.bound_self`), so no launcher runs before it; -S skips site
            # initialisation, a third of a start's CPU time.
            process = processes.popen(
                processes.python_command("-S", str(HARNESS), str(job_file)),
                cwd=workdir,
                env=_program_env(workdir),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                binds_itself=True,
            )
            deadline = time.monotonic() + STARTUP_SECONDS + len(job.inputs) * (job.timeout + 1.0)
            frames = _frames(process.stdout, deadline)
            header = next(frames, None)
            if not isinstance(header, dict) or "protections" not in header:
                yield Output(
                    SANDBOX_ERROR,
                    detail=f"the sandbox did not start (exit code {process.poll()})",
                )
                return
            report.update(protections=header["protections"], missing=header["missing"])
            self._warn_once(header["missing"])
            produced = 0
            for frame in frames:
                produced += 1
                output = _output(frame, job.fn_name is not None)
                yield output
                if output.status != OK:
                    return
            if produced < len(job.inputs):
                timed_out = time.monotonic() >= deadline
                detail = "no result before the deadline" if timed_out else "the sandbox ended early"
                yield Output(TIMEOUT if timed_out else SANDBOX_ERROR, detail=detail)
        finally:
            if process is not None:
                processes.kill_group(process)
                process.stdout.close()
            _remove_tree(workdir)

    def _warn_once(self, missing: dict) -> None:
        with self._lock:
            if missing and not self._warned:
                self._warned = True
                logger.warning(
                    "The code sandbox runs without: %s. See the README's 'Code' section for what remains.",
                    "; ".join(f"{name} ({reason})" for name, reason in missing.items()),
                )


def _program_env(workdir: str) -> dict[str, str]:
    """Nothing of the trainer's environment: a default PATH, a locale, the working directory, one thread each."""
    single_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return processes.scrubbed_env(HOME=workdir, TMPDIR=workdir, PYTHONHASHSEED="0", **single_thread)


def _frames(stream, deadline: float) -> Iterator[Any]:
    """The harness's JSON lines as they come, until it ends or the deadline passes; a broken line ends them."""
    buffer = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while True:
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                try:
                    yield json.loads(line)
                except ValueError:
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return
            chunk = os.read(stream.fileno(), 1 << 20)
            if not chunk:
                return
            buffer += chunk


def _output(frame: Any, call: bool) -> Output:
    if not isinstance(frame, dict) or frame.get("status") not in (
        OK,
        ERROR,
        TIMEOUT,
        OUTPUT_LIMIT,
    ):
        return Output(SANDBOX_ERROR, detail=f"unreadable result {frame!r:.200}")
    if frame["status"] != OK:
        return Output(frame["status"], frame.get("output"), str(frame.get("detail", "")))
    if not call:
        return Output(OK, frame.get("output", ""))
    try:
        return Output(OK, json.loads(frame.get("output", "")))
    except ValueError:
        return Output(ERROR, detail="the return value could not be read back")


def _remove_tree(path: str) -> None:
    """Delete the working directory, even where the program removed its own permissions (no namespaces)."""

    def make_writable_and_retry(function, failed_path, _):
        for directory in (os.path.dirname(failed_path), failed_path):
            try:
                os.chmod(directory, stat.S_IRWXU)
            except OSError:
                pass
        try:
            function(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def _local_sandbox() -> LocalSandbox:
    return LocalSandbox()


_default_executor: Executor | None = None


def default_executor() -> Executor:
    """The executor used when none is passed: `set_default_executor`'s, else a `LocalSandbox`."""
    return _default_executor if _default_executor is not None else _local_sandbox()


def set_default_executor(executor: Executor | None) -> None:
    """Make `executor` the default of `code_reward` and `run_tests` in this process (``None``: `LocalSandbox`)."""
    global _default_executor
    if executor is not None and not callable(getattr(executor, "execute", None)):
        raise TypeError(f"executor must have an execute(job) method, got {type(executor).__name__}")
    _default_executor = executor
