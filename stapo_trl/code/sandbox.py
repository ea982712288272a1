"""Running untrusted programs: the `Executor` interface and `LocalSandbox`, the default executor.

An executor runs one `Job` (a program and its inputs) and yields one `Output` per input, in order; it may stop
after the first output that is not ``"ok"``. It never sees the expected outputs: comparing is the caller's job
(`stapo_trl.code.reward`), so a program cannot learn them or influence the verdict other than by its output.

`LocalSandbox` runs each job in a fresh bounded process, forked by a server that runs `sandbox_harness.py` (one per
judging thread, started once: `_Server`), so a job costs a fork rather than an interpreter start. The job's process has
new user, mount, network and PID namespaces where the kernel allows them, a root directory that holds only the
interpreter, its libraries, the standard library and the allowed packages (read-only) and a private tmpfs, no
network, one memory bound for the whole program, a forked child per input, and the whole process group killed at
the deadline. `LocalSandbox.isolation()` says which protections this machine gives (see the README's "Code" section).

Another executor (a remote sandbox service, a container pool) plugs in by implementing ``execute(job)``::

    class MyRemoteSandbox:
        def execute(self, job: Job) -> Iterable[Output]:
            for stdout in my_service.run(job.program, job.inputs, timeout=job.timeout):
                yield Output("ok", stdout)

    code_reward(completions, tests, executor=MyRemoteSandbox())   # or set_default_executor(MyRemoteSandbox())
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import logging
import os
import selectors
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stapo_trl import processes


logger = logging.getLogger(__name__)

HARNESS = Path(__file__).with_name("sandbox_harness.py")
#: What programs may import besides the standard library, where installed (graders' preambles import numpy).
ALLOWED_PACKAGES = ("numpy",)
#: Processes and threads of a program where no memory cgroup bounds it: its memory is then bounded by this many
#: address spaces of ``memory_bytes / PROCESSES_WITHOUT_CGROUP`` each.
PROCESSES_WITHOUT_CGROUP = 8
_SITE_DIRECTORIES = ("site-packages", "dist-packages")
# Extension modules whose libraries the root leaves out: a program has no display (here Tk, X11 and fonts were 53 of
# the 138 files and links each sandbox mounts or copies).
_WITHOUT_LIBRARIES = {"_tkinter"}
# Device files a Python program may need; nothing else of the host's /dev.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where the harness imports stapo_trl.processes from

#: Statuses of an `Output`. Only ``"ok"`` carries a usable value.
OK, ERROR, TIMEOUT, OUTPUT_LIMIT, SANDBOX_ERROR = (
    "ok",
    "error",
    "timeout",
    "output_limit",
    "sandbox_error",
)

#: Seconds a harness server waits for its next job before it exits (the next job then starts a new one): between
#: training steps no process is left waiting.
SERVER_IDLE_SECONDS = 60.0
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
        memory_bytes: Memory of the whole program, all its processes together: the limit of a memory cgroup where
            this process may create one (cgroup v1, or a v2 cgroup with the memory controller delegated), and the
            address space of each process (``RLIMIT_AS``), so that one larger allocation fails with ``MemoryError``.
            Without a cgroup each process gets ``memory_bytes / PROCESSES_WITHOUT_CGROUP`` and the program at most
            `PROCESSES_WITHOUT_CGROUP` processes and threads (``RLIMIT_NPROC``, which never binds root: then the
            bound is per process, which `isolation` reports).
        max_processes: Processes and threads the program may have at once where a memory cgroup bounds it
            (``RLIMIT_NPROC``, which never binds root); the PID namespace's ``pid_max`` (Linux >= 6.14) bounds them
            below 300 + this for any user.
        file_size_bytes: Largest file it may write (``RLIMIT_FSIZE``).
        tmpfs_bytes: Size of its private ``/tmp`` and ``/dev/shm`` together (a tmpfs; its working directory).
        max_output_bytes: Output kept per input; a program writing more is stopped and fails.
        packages: Installed packages the program may import besides the standard library (read-only).
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
        packages: Sequence[str] = ALLOWED_PACKAGES,
        isolate: bool = True,
    ):
        self.memory_bytes = memory_bytes
        self.max_processes = max_processes
        self.file_size_bytes = file_size_bytes
        self.tmpfs_bytes = tmpfs_bytes
        self.max_output_bytes = max_output_bytes
        self.packages = tuple(packages)
        self.isolate = isolate
        self._warned = False
        self._lock = threading.Lock()
        self._servers: list[_Server] = []  # idle ones; each serves one job at a time
        weakref.finalize(self, _stop_servers, self._servers)

    def isolation(self) -> dict[str, Any]:
        """Run an empty program and return ``{"protections": [...], "missing": {name: reason}}`` on this machine.

        Where the sandbox cannot start at all, ``protections`` is empty and ``missing["sandbox"]`` says why.
        """
        report = {}
        for _ in self._run(Job("", [""], timeout=5.0), report):
            pass
        return report

    def execute(self, job: Job) -> Iterator[Output]:
        return self._run(job, {})

    def close(self) -> None:
        """Stop the idle harness servers (see `_Server`); the next job starts a new one. Garbage collection and the
        end of this process stop them too."""
        with self._lock:
            _stop_servers(self._servers)

    def _run(self, job: Job, report: dict) -> Iterator[Output]:
        view, sys_path = _view(self.packages)
        workdir = tempfile.mkdtemp(prefix="stapo-sandbox-")
        cgroup, cgroup_missing = _new_memory_cgroup(self.memory_bytes)
        processes_each = self.max_processes if cgroup else min(self.max_processes, PROCESSES_WITHOUT_CGROUP)
        server = results = None
        try:
            Path(workdir, "job.json").write_text(
                json.dumps(
                    {
                        "program": job.program,
                        "inputs": list(job.inputs),
                        "fn_name": job.fn_name,
                        "timeout": job.timeout,
                        "max_output_bytes": self.max_output_bytes,
                        "max_processes": processes_each,
                        "tmpfs_bytes": self.tmpfs_bytes,
                        "isolate": self.isolate,
                        "view": view,
                        "sys_path": sys_path,
                        "memory_bytes": self.memory_bytes,
                        "memory_cgroup": cgroup,
                        "memory_cgroup_missing": cgroup_missing,
                        "limits": {  # CPU: every input's allowance (each input's child has its own, smaller limit)
                            "cpu_seconds": int(len(job.inputs) * (job.timeout + 1)) + 10,
                            "memory_bytes": self.memory_bytes if cgroup else self.memory_bytes // processes_each,
                            "file_size_bytes": self.file_size_bytes,
                            "open_files": 256,
                        },
                    }
                )
            )
            deadline = time.monotonic() + STARTUP_SECONDS + len(job.inputs) * (job.timeout + 1.0)
            for fresh in (False, True):
                server = (None if fresh else self._idle_server()) or _Server()
                results = server.start_job(workdir)
                frames = _frames(results, deadline) if results is not None else iter(())
                header = next(frames, None)
                if header is not None or fresh or server.end_job():
                    break
                # The server had died before it took the job (killed while idle): a new one takes it.
                if results is not None:
                    os.close(results)
                server.stop()
                server = results = None
            if not isinstance(header, dict) or "protections" not in header:
                reason = header.get("error") if isinstance(header, dict) else None
                exit_code = server.process.poll()
                reason = reason or "the sandbox did not start" + (
                    f" (its harness server exited with code {exit_code})" if exit_code is not None else ""
                )
                report.update(protections=[], missing={"sandbox": reason})
                yield Output(SANDBOX_ERROR, detail=reason)
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
            if results is not None:
                os.close(results)
            if server is not None:
                if server.end_job():
                    with self._lock:
                        self._servers.append(server)
                else:
                    server.stop()
            if cgroup:
                _remove_cgroup(cgroup)
            if os.path.lexists(workdir):  # with namespaces the harness removed it already
                _remove_tree(workdir)

    def _idle_server(self) -> _Server | None:
        with self._lock:
            while self._servers:
                server = self._servers.pop()
                if server.owner == os.getpid():
                    return server
                server.control.close()  # a forked parent's, which keeps serving the parent
        return None

    def _warn_once(self, missing: dict) -> None:
        with self._lock:
            if missing and not self._warned:
                self._warned = True
                logger.warning(
                    "The code sandbox runs without: %s. See the README's 'Code' section for what remains.",
                    "; ".join(f"{name} ({reason})" for name, reason in missing.items()),
                )


class _Server:
    """The harness started in serving mode: it forks one sandbox per job (see `sandbox_harness.serve`).

    One interpreter start and one round of imports serve all the jobs of a thread, instead of one per job. Its
    environment holds nothing of the trainer's: a default PATH, a locale, one thread each (each job then sets its
    working directory as HOME and TMPDIR).
    """

    def __init__(self):
        self.owner = os.getpid()
        self.job_running = self.failed = False
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control.settimeout(STARTUP_SECONDS)
        single_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        try:
            # The harness bounds itself first (`processes.bound_self`), so no launcher runs before it; -S skips site
            # initialisation, a third of a start's CPU time.
            self.process = processes.popen(
                processes.python_command(
                    "-S", str(HARNESS), _PACKAGE_ROOT, str(os.getpid()), str(SERVER_IDLE_SECONDS)
                ),
                env=processes.scrubbed_env(PYTHONHASHSEED="0", **single_thread),
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                binds_itself=True,
            )
        finally:
            theirs.close()

    def start_job(self, workdir: str) -> int | None:
        """Start the job in `workdir`; return the read end of the pipe its results come on, None if this has died."""
        results, results_for_job = os.pipe()
        try:
            socket.send_fds(self.control, [os.fsencode(workdir)], [results_for_job])
        except OSError:
            self.failed = True
            os.close(results)
            return None
        finally:
            os.close(results_for_job)
        self.job_running = True
        return results

    def end_job(self) -> bool:
        """Kill what is left of the job and wait until its processes are reaped; whether this can take another job."""
        if self.job_running:
            self.job_running = False
            try:
                self.control.send(b"end")
                self.failed |= self.control.recv(16) != b"reaped"
            except OSError:
                self.failed = True
        return not self.failed

    def stop(self) -> None:
        self.control.close()  # the server exits when it reads the end of the socket
        processes.kill_group(self.process)


def _stop_servers(servers: list[_Server]) -> None:
    for server in servers:
        server.stop()
    servers.clear()


def _frames(results: int, deadline: float) -> Iterator[Any]:
    """The harness's JSON lines as they come, until it ends or the deadline passes; a broken line ends them.

    A line is searched for its end only in what arrived since the last search, and a line that fills the buffer (as
    a long output does) is decoded without a copy: a 16 MiB output costs about its size a few times, not its square.
    """
    buffer = bytearray()
    searched = 0
    with selectors.DefaultSelector() as selector:
        selector.register(results, selectors.EVENT_READ)
        while True:
            end = buffer.find(b"\n", searched)
            while end >= 0:
                if end == len(buffer) - 1:
                    line, buffer = buffer, bytearray()
                else:
                    line = buffer[:end]
                    del buffer[: end + 1]
                try:
                    yield json.loads(line)
                except ValueError:
                    return
                del line
                end = buffer.find(b"\n")
            searched = len(buffer)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return
            chunk = os.read(results, 1 << 20)
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


@functools.cache
def _view(packages: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """What the sandbox's root shows of this machine, read-only, and the ``sys.path`` entries of `packages`.

    Returns (`_layout` of the paths plus ``"hidden"``, sys_path). The paths: the interpreter (with the symbolic
    links that lead to it and its ELF loader), the shared libraries that it and the standard library's and the
    packages' extension modules load, ``/etc/ld.so.cache``, the standard library (its site-packages directories are
    "hidden": shown empty), each package's directory (and its ``<name>.libs``, where wheels keep their libraries)
    and a few devices. Nothing else: no home, cache, dataset, checkout or other package. Found once per process (a
    Python process lists the libraries it has loaded after importing every extension module).
    """
    prefixes = tuple(os.path.join(prefix, "") for prefix in {sys.base_prefix, sys.base_exec_prefix})
    stdlib = [
        path
        for path in dict.fromkeys(sys.path)
        if path.startswith(prefixes) and os.path.isdir(path) and not path.endswith(_SITE_DIRECTORIES)
    ]
    hidden = [
        os.path.join(directory, name)
        for directory in stdlib
        for name in _SITE_DIRECTORIES
        if os.path.isdir(os.path.join(directory, name))
    ]
    package_paths, sys_path = [], []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None and not spec.submodule_search_locations:
            continue
        location = spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin
        package_paths += [path for path in (location, f"{location}.libs") if os.path.exists(path)]
        sys_path.append(os.path.dirname(location))
    extension_modules = sorted(
        {
            name.partition(".")[0]
            for directory in stdlib
            if directory.endswith("lib-dynload")
            for name in os.listdir(directory)
            if name.endswith(".so")
        }
        - _WITHOUT_LIBRARIES
    )
    listing = processes.run(
        processes.python_command(
            "-S", "-c", _LOADED_LIBRARIES, json.dumps([*extension_modules, *packages]), *sys_path
        ),
        timeout=120,
        env=processes.scrubbed_env(OPENBLAS_NUM_THREADS="1"),
    )
    try:
        libraries = json.loads(listing.stdout.splitlines()[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"listing the interpreter's libraries failed: {listing.stderr[-2000:]!r}") from None
    shown = [*stdlib, *package_paths]
    libraries = {
        path for path in libraries if os.path.isfile(path) and not path.startswith(tuple(d + "/" for d in shown))
    }
    # The loader looks libraries up by their sonames (libffi.so.8), links to the files mapped (libffi.so.8.1.2).
    for directory in {os.path.dirname(path) for path in libraries}:
        libraries |= {
            entry.path
            for entry in os.scandir(directory)
            if entry.is_symlink() and os.path.realpath(entry.path) in libraries
        }
    loader = _elf_interpreter(os.path.realpath(sys.executable))
    paths = [sys.executable, *([loader] if loader else []), "/etc/ld.so.cache", *shown, *sorted(libraries), *_DEVICES]
    return {**_layout(paths), "hidden": hidden}, sys_path


def _layout(paths: Iterable[str]) -> dict[str, Any]:
    """How to show the host's `paths` at the same places in an empty root, as the harness does it (in this order).

    ``directories`` to create, ``links`` (symbolic links copied from the host, then followed, so that every name
    that resolves on the host resolves alike: ``/lib64/ld-linux-x86-64.so.2``, a virtual environment's
    ``bin/python``), and ``binds``: each path mapped to ``"directory"`` or ``"file"``, bound read-only. A path inside
    one bound already is left out; one that does not exist too.
    """
    directories, links, binds = {}, {}, {}  # dicts as ordered sets

    def walk(path: str) -> str | None:
        """Lay `path` out up to its first symbolic link; return the path that link leads to, or None when done."""
        parts = path.strip("/").split("/")
        current = ""
        for index, part in enumerate(parts):
            current += "/" + part
            if current in binds or not os.path.lexists(current):
                return None
            if current in links or os.path.islink(current):
                links.setdefault(current, os.readlink(current))
                return os.path.normpath(os.path.join(os.path.dirname(current), links[current], *parts[index + 1 :]))
            if index < len(parts) - 1:
                directories[current] = None
            else:
                binds[current] = "directory" if os.path.isdir(current) else "file"
        return None

    for path in paths:
        for _ in range(40):  # symbolic links followed, at most, as the kernel does
            path = walk(path)
            if path is None:
                break
    return {"directories": list(directories), "links": links, "binds": binds}


# Run by `_view` as `python -I -S -c`: import the modules given (those that fail are left out), then print the files
# mapped into the process, the shared libraries among them.
_LOADED_LIBRARIES = """
import ctypes, importlib, json, sys
modules = json.loads(sys.argv[1])
sys.path.extend(sys.argv[2:])
for module in modules:
    try:
        importlib.import_module(module)
    except BaseException:
        pass
try:
    ctypes.CDLL("libgcc_s.so.1")  # glibc loads it when a thread exits or is cancelled
except OSError:
    pass
with open("/proc/self/maps") as maps:
    files = {fields[5] for fields in (line.split(None, 5) for line in maps) if len(fields) == 6}
print(json.dumps(sorted(name.rstrip() for name in files if name.startswith("/"))))
"""


def _elf_interpreter(path: str) -> str | None:
    """The program interpreter (``PT_INTERP``, the dynamic loader) named in the ELF file `path`, if any."""
    with open(path, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF":
            return None
        order = "<" if header[5] == 1 else ">"
        if header[4] == 2:  # 64-bit
            (table,), (entry_size, count) = (
                struct.unpack_from(order + "Q", header, 32),
                struct.unpack_from(order + "HH", header, 54),
            )
            entry_format, offset_at, size_at = order + "IIQQQQQQ", 2, 5
        else:
            (table,), (entry_size, count) = (
                struct.unpack_from(order + "I", header, 28),
                struct.unpack_from(order + "HH", header, 42),
            )
            entry_format, offset_at, size_at = order + "IIIIIIII", 1, 4
        for index in range(count):
            file.seek(table + index * entry_size)
            entry = struct.unpack(entry_format, file.read(struct.calcsize(entry_format)))
            if entry[0] == 3:  # PT_INTERP
                file.seek(entry[offset_at])
                return file.read(entry[size_at]).rstrip(b"\0").decode()
    return None


@functools.lru_cache(maxsize=1)
def _memory_cgroups() -> tuple[str | None, str]:
    """Where this process can create memory cgroups: ``(limit file, "")`` or ``(None, why not)``.

    The limit file is in the parent cgroup's directory: ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1).

    cgroup v2 where this process's cgroup has the memory controller enabled for its children and is writable (a
    delegated cgroup), else cgroup v1's memory hierarchy where writable. ``stapo-sandbox-<pid>-*`` cgroups whose
    trainer has died are removed on the way (the kernel refuses to remove one that still holds a process; a live
    trainer's may be empty for a moment, between its creation and its harness joining it).
    """
    try:
        with open("/proc/self/cgroup") as file:
            memberships = [line.rstrip("\n").split(":", 2) for line in file]
        with open("/proc/self/mountinfo") as file:
            mounts = [line.split() for line in file]
    except OSError as error:
        return None, str(error)
    candidates = []
    for fields in mounts:
        separator = fields.index("-")
        point, root, fstype, options = fields[4], fields[3], fields[separator + 1], fields[separator + 3].split(",")
        for _, controllers, path in memberships:
            version_2 = fstype == "cgroup2" and controllers == ""
            if (version_2 or fstype == "cgroup" and "memory" in controllers.split(",") and "memory" in options) and (
                path + "/"
            ).startswith(root.rstrip("/") + "/"):
                directory = point + path[len(root.rstrip("/")) :]
                candidates.append((directory, "memory.max" if version_2 else "memory.limit_in_bytes"))
    reasons = []
    for directory, limit_file in sorted(candidates, key=lambda candidate: candidate[1] != "memory.max"):
        if limit_file == "memory.max":
            try:
                with open(os.path.join(directory, "cgroup.subtree_control")) as file:
                    delegated = "memory" in file.read().split()
            except OSError:
                delegated = False
            if not delegated:
                reasons.append(f"{directory}: the memory controller is not enabled for its children")
                continue
        if not os.access(directory, os.W_OK):
            reasons.append(f"{directory}: not writable")
            continue
        for name in os.listdir(directory):
            if name.startswith("stapo-sandbox-") and not _alive(name.split("-")[2]):
                _remove_cgroup(os.path.join(directory, name), attempts=1)
        return os.path.join(directory, limit_file), ""  # the directory and the version in one path
    return None, "; ".join(reasons) or "no cgroup memory controller is mounted"


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's
        pass
    return True


_cgroup_numbers = itertools.count()


def _new_memory_cgroup(limit_bytes: int) -> tuple[str | None, str]:
    """A new memory cgroup limited to `limit_bytes` (swap included), as ``(directory, "")``, or ``(None, why not)``."""
    parent_limit_file, reason = _memory_cgroups()
    if parent_limit_file is None:
        return None, reason
    base, limit_file = os.path.split(parent_limit_file)
    directory = os.path.join(base, f"stapo-sandbox-{os.getpid()}-{next(_cgroup_numbers)}")
    settings = (
        [(limit_file, limit_bytes), ("memory.swap.max", 0), ("memory.oom.group", 1)]
        if limit_file == "memory.max"
        else [(limit_file, limit_bytes), ("memory.memsw.limit_in_bytes", limit_bytes)]
    )
    try:
        os.mkdir(directory)
        for name, value in settings:
            if name == limit_file or os.path.exists(os.path.join(directory, name)):
                Path(directory, name).write_text(str(value))
    except OSError as error:
        _remove_cgroup(directory, attempts=1)
        return None, f"creating {directory} failed: {error}"
    return directory, ""


def _remove_cgroup(directory: str, attempts: int = 200) -> None:
    """Remove an emptied cgroup; its last processes may take a moment to be gone (the kernel kills a namespace's)."""
    for _ in range(attempts):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


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
