"""Bounded subprocesses: what the math verifier and the code sandbox start, and how nothing is left running.

Every child started here
- runs in a new session, so that it and everything it starts form one process group, killed as a whole;
- starts in the directory it is given, the root directory otherwise, never the caller's working directory
  (start Python with `python_command`: ``python -I`` does not put the working directory on ``sys.path``);
- dies with the process that started it (Linux: a parent-death ``SIGKILL``; see `popen` for what that covers);
- runs under the resource `Limits` it is given, set in the child before the command starts.

No Python code runs between fork and exec (``preexec_fn`` can deadlock a child forked from a process with other
threads, and makes ``subprocess`` fork rather than ``vfork`` a large trainer): the child binds itself, either through
this file run as a launcher that then executes the command (`popen`), or as its own first step (`bound_self`).

`run` adds a wall-clock deadline and bounded output capture for one-shot commands.
"""

import ctypes
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


#: Output `run` keeps of each of stdout and stderr by default; a child writing more is killed.
MAX_OUTPUT_BYTES = 1 << 20

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


@dataclass(frozen=True)
class Limits:
    """Resource limits of a child (``setrlimit`` in the child before its command starts); ``None`` = inherited.

    Attributes:
        cpu_seconds: CPU time (``RLIMIT_CPU``); the child gets ``SIGXCPU`` at the limit and ``SIGKILL`` a second
            later.
        memory_bytes: Address space (``RLIMIT_AS``); an allocation beyond it fails (``MemoryError`` in Python).
        file_size_bytes: Largest file the child may write (``RLIMIT_FSIZE``); writing past it fails (``EFBIG``) or, unless
            ignored as Python does, kills it (``SIGXFSZ``).
        max_processes: Processes and threads of the child's *user*, all of them, that may exist before the child
            can create more (``RLIMIT_NPROC``, counted per user by Linux, not per child; root is exempt).
        open_files: Highest file descriptor number plus one the child may open (``RLIMIT_NOFILE``).
    """

    cpu_seconds: int | None = None
    memory_bytes: int | None = None
    file_size_bytes: int | None = None
    max_processes: int | None = None
    open_files: int | None = None

    def _rlimits(self) -> list[tuple[int, int, int]]:
        pairs = [
            (
                resource.RLIMIT_CPU,
                None if self.cpu_seconds is None else (self.cpu_seconds, self.cpu_seconds + 1),
            ),
            (resource.RLIMIT_AS, self.memory_bytes),
            (resource.RLIMIT_FSIZE, self.file_size_bytes),
            (resource.RLIMIT_NPROC, self.max_processes),
            (resource.RLIMIT_NOFILE, self.open_files),
        ]
        return [
            (kind, *(value if isinstance(value, tuple) else (value, value)))
            for kind, value in pairs
            if value is not None
        ]


@dataclass(frozen=True)
class Completed:
    """What `run` saw: the exit status (negative: killed by that signal), the captured output, and why it ended."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool  # the command had not exited at the deadline and was killed
    output_truncated: bool  # it wrote more than the cap to stdout or stderr, and was killed


def python_command(*arguments: str) -> list[str]:
    """The argv of this interpreter in isolated mode (``-I``): no working directory or script directory on
    ``sys.path``, no ``PYTHON*`` environment variables, no user site-packages; so a stray ``sympy.py`` in the
    working directory is never imported."""
    return [sys.executable, "-I", *arguments]


def scrubbed_env(**variables: str) -> dict[str, str]:
    """An environment that holds nothing of the caller's (no tokens, no paths) but a default ``PATH`` and
    ``LC_ALL``, plus `variables`."""
    return {"PATH": os.defpath, "LC_ALL": "C.UTF-8", **variables}


def popen(
    argv,
    *,
    limits: Limits = Limits(),
    cwd=None,
    env=None,
    pass_fds=(),
    stdin=subprocess.DEVNULL,
    stdout=None,
    stderr=None,
    binds_itself: bool = False,
) -> subprocess.Popen:
    """Start `argv` in a new session, under `limits`, in `cwd` (default: the root directory), dying with this process.

    `env` ``None`` passes this process's environment on; pass `scrubbed_env` (or any dict) to pass only that.
    Standard streams are as for ``subprocess.Popen``, except that stdin defaults to ``/dev/null``.

    The limits and the death signal are set by a launcher (this file, run by the same interpreter) that then executes
    `argv`. `binds_itself=True` starts `argv` directly, for a Python child that calls `bound_self` as its first step
    (one interpreter start less; `limits` then travel with the child's own arguments, not here).

    The parent-death ``SIGKILL`` (Linux) fires when this *process* dies, however it dies (``SIGKILL``, OOM killer,
    a crash): the child is started from one long-lived thread, because Linux ties the signal to the thread that
    started the child, which would otherwise kill a child when a short-lived caller thread ends. What the child
    starts in turn is not covered by it: end the group with `kill_group`. On other systems there is no
    parent-death signal.
    """
    if binds_itself:
        command = list(argv)
    else:
        command = [sys.executable, "-I", "-S", __file__, str(os.getpid()), json.dumps(limits._rlimits()), *argv]
    starting = _spawner().submit(
        subprocess.Popen,
        command,
        cwd=os.path.abspath(os.sep) if cwd is None else cwd,
        env=env,
        pass_fds=tuple(pass_fds),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )
    try:
        return starting.result()
    except BaseException:  # interrupted while waiting (Ctrl-C): end the child once it has started
        starting.add_done_callback(lambda started: started.exception() or kill_group(started.result()))
        raise


def kill_group(process: subprocess.Popen) -> None:
    """``SIGKILL`` the process group of `process` (started by `popen`), then reap `process`. Safe to repeat.

    Call it before anything else reaps `process` (``wait``/``poll``): once reaped, its number may be reused, so the
    group is then left alone and only the reaping is done.
    """
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone already
            pass
    process.wait()


def run(
    argv,
    *,
    input: bytes = b"",
    timeout: float,
    limits: Limits = Limits(),
    cwd=None,
    env=None,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
) -> Completed:
    """Run `argv` like `popen`, feed it `input`, and capture its output within `timeout` seconds of wall time.

    The whole process group is killed, always before returning: at the deadline, as soon as stdout or stderr
    exceeds `max_output_bytes` (what was captured up to the cap is kept), and when the command exits (ending
    whatever it left running in its group). Output is read as it comes, so memory stays within the cap.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    deadline = time.monotonic() + timeout
    process = popen(
        argv,
        limits=limits,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    exit_notice = os.pidfd_open(process.pid)  # readable once the command exits, without reaping it
    outputs = {
        process.stdout.fileno(): bytearray(),
        process.stderr.fileno(): bytearray(),
    }
    exited = truncated = False
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(exit_notice, selectors.EVENT_READ)
            for fd in outputs:
                selector.register(fd, selectors.EVENT_READ)
            pending_input = memoryview(input)
            if pending_input:
                os.set_blocking(process.stdin.fileno(), False)
                selector.register(process.stdin, selectors.EVENT_WRITE)
            else:
                process.stdin.close()
            while not exited or any(fd in selector.get_map() for fd in outputs):
                seconds_left = deadline - time.monotonic()
                if seconds_left <= 0:
                    break
                events = selector.select(timeout=seconds_left)
                for key, _ in events:
                    if key.fd == exit_notice:
                        exited = True
                        selector.unregister(exit_notice)
                        kill_group(process)  # ends what it left running, which may hold the pipes open
                    elif key.fileobj is process.stdin:
                        try:
                            pending_input = pending_input[os.write(key.fd, pending_input) :]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # it stopped reading: the rest of the input is not needed
                            pending_input = pending_input[:0]
                        if not pending_input:
                            selector.unregister(process.stdin)
                            process.stdin.close()
                    else:
                        chunk = os.read(key.fd, 1 << 16)
                        if not chunk:
                            selector.unregister(key.fd)
                        outputs[key.fd] += chunk
                        if len(outputs[key.fd]) > max_output_bytes:
                            del outputs[key.fd][max_output_bytes:]
                            truncated = True
                if truncated:
                    break
    finally:
        kill_group(process)
        os.close(exit_notice)
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
    stdout, stderr = outputs.values()
    return Completed(
        process.returncode,
        bytes(stdout),
        bytes(stderr),
        timed_out=not exited and not truncated,
        output_truncated=truncated,
    )


def bound_self(parent_pid: int, limits: Limits) -> None:
    """What `popen`'s launcher does before executing the command, done by a Python child to itself as its first step.

    For a caller that starts many children and wants no launcher in between: start the child with
    ``popen(..., binds_itself=True)`` and have it call this with the caller's pid before anything else.
    """
    _bind(parent_pid, limits._rlimits())


def _bind(parent_pid: int, rlimits: list) -> None:
    """Arm the parent-death SIGKILL (and die now if the parent is already gone), then set the resource limits."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
    for kind, soft, hard in rlimits:
        resource.setrlimit(kind, (soft, hard))


_spawner_pid_and_thread: tuple[int, ThreadPoolExecutor] | None = None


def _spawner() -> ThreadPoolExecutor:
    """This process's one long-lived thread that starts children (see `popen`); a forked child makes its own.

    Two threads racing to make it at first use each get a working one; the unused one's thread then ends.
    """
    global _spawner_pid_and_thread
    if _spawner_pid_and_thread is None or _spawner_pid_and_thread[0] != os.getpid():
        _spawner_pid_and_thread = (
            os.getpid(),
            ThreadPoolExecutor(1, thread_name_prefix="stapo-process-spawner"),
        )
    return _spawner_pid_and_thread[1]


if __name__ == "__main__":  # `popen`'s launcher: python -I -S processes.py PARENT_PID RLIMITS COMMAND...
    _bind(int(sys.argv[1]), json.loads(sys.argv[2]))
    os.execvp(sys.argv[3], sys.argv[3:])
