"""The program that runs inside the sandbox: isolates itself, then runs one untrusted program on each input.

`stapo_trl.code.sandbox.LocalSandbox` starts it as ``python -I -S sandbox_harness.py JOB_FILE`` in a new session
whose working directory is the program's temporary directory; it first bounds itself (`stapo_trl.processes.bound_self`:
death with the trainer, resource limits). Besides that module and `stapo_trl.code.values` (how return values are
written) it imports the standard library only. Everything it prints on its standard output is one JSON object per line:

- first ``{"protections": [...], "missing": {name: reason}}``: the isolation that is in place;
- then one ``{"status": ..., "output": ..., "detail": ...}`` per input, in order, until an input ends in anything
  but ``"ok"``. The outputs are compared outside the sandbox: the expected outputs never enter it.

Isolation, each step measured and reported rather than assumed:

1. New user, mount, network, PID, IPC and UTS namespaces (``unshare(2)``, unprivileged where the kernel allows it):
   no network interface but a loopback that is down; processes that see only each other; a fresh ``/proc``.
2. Every mount read-only except a size-bounded tmpfs on the working directory, the only place it can write.
3. A bounded number of processes and threads: fewer than 300 + `max_processes` by the PID namespace's own
   ``pid_max`` (Linux >= 6.14; it binds root too), and `max_processes` by RLIMIT_NPROC, which binds a user other
   than root and then counts the namespace's processes only.
4. The untrusted code runs in a forked child per input, without capabilities (none to regain by exec), under CPU
   and output limits; after each input every other process of the PID namespace is killed. When this harness dies,
   the kernel kills the whole namespace. The harness keeps its user id: the programs read what the trainer's user
   can read, but can write only to their tmpfs and send nothing anywhere.
"""

import ctypes
import gc
import json
import math
import os
import re
import resource
import selectors
import signal
import sys
import time
import traceback
from pathlib import Path


_CLONE_NEWUSER, _CLONE_NEWNS, _CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
_CLONE_NEWPID, _CLONE_NEWIPC, _CLONE_NEWUTS = 0x20000000, 0x08000000, 0x04000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1024,
    2048,
    4096,
    16384,
    1 << 18,
)
_MS_RELATIME, _MS_STRICTATIME = 1 << 21, 1 << 24
# Flags a mount inherited from a more privileged namespace keeps: a remount must repeat them.
_KEPT_FLAGS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
    "strictatime": _MS_STRICTATIME,
}
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = (
    1,
    24,
    28,
    36,
    38,
)
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED and their locks: uid 0 gains nothing by exec.
_SECUREBITS_NOROOT_LOCKED = 0x1 | 0x2 | 0x4 | 0x8 | 0x20
# The kernel adds linear pids from 300 once pid numbers have wrapped around (RESERVED_PIDS).
_RESERVED_PIDS = 300

# What PRIME's and LiveCodeBench's preambles import: loaded once, before the per-input children fork, rather than
# in each of them (about 12 ms of CPU each time, timed on a 2-core machine).
_PRELOADED = (
    "bisect", "collections", "copy", "datetime", "functools", "heapq", "io", "itertools", "json", "math",
    "operator", "random", "re", "statistics", "string", "types", "typing",
)  # fmt: skip

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    def encode(text):
        return None if text is None else os.fsencode(text)

    result = _libc.mount(
        encode(source),
        encode(target),
        encode(fstype),
        ctypes.c_ulong(flags),
        encode(data),
    )
    _check(result, f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilityData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities() -> None:
    """Clear every capability and make sure none comes back: not by exec, not as uid 0, not by a set-uid file."""
    try:
        _prctl(_PR_SET_SECUREBITS, _SECUREBITS_NOROOT_LOCKED)
        for capability in range(64):
            if _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(capability), 0, 0, 0) != 0:
                break  # past the last capability this kernel knows
    except OSError:
        pass  # without CAP_SETPCAP (an ordinary user outside a user namespace): there is nothing to regain

    header, data = (
        _CapabilityHeader(0x20080522, 0),
        (_CapabilityData * 2)(),
    )  # version 3, every set empty
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def _mount_points() -> list[tuple[str, int]]:
    """Every mount point of this mount namespace with the flags a read-only remount must keep."""
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda escape: chr(int(escape[1], 8)), fields[4])  # "\040": a space
            flags = 0
            for option in fields[5].split(","):
                flags |= _KEPT_FLAGS.get(option, 0)
            points.append((point, flags))
    return points


def isolate(workdir: str, tmpfs_bytes: int) -> tuple[list[str], dict[str, str], bool]:
    """Isolate this process as far as the kernel allows; return (protections, missing protections, in PID ns)."""
    protections, missing = [], {}
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    try:
        _check(_libc.unshare(flags), "unshare")
    except OSError as error:
        reason = f"unshare(user, mount, network, PID) failed: {error}"
        for name in (
            "network namespace",
            "PID namespace",
            "read-only filesystem",
            "private tmpfs",
        ):
            missing[name] = reason
        return protections, missing, False
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    protections += [
        "user namespace",
        "network namespace (no interfaces)",
        "PID namespace",
        "IPC namespace",
    ]
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        _mount(
            "tmpfs",
            workdir,
            "tmpfs",
            _MS_NOSUID | _MS_NODEV,
            f"size={tmpfs_bytes},mode=0700",
        )
        os.chdir(workdir)
        protections.append(f"private tmpfs of {tmpfs_bytes} bytes as the working directory")
    except OSError as error:
        missing["private tmpfs"] = str(error)
    failures = []
    for point, kept in _mount_points():
        if point == workdir:
            continue
        try:
            _mount(None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)
        except OSError as error:
            failures.append(f"{point} ({error.strerror})")
    if any(failure.startswith("/ (") for failure in failures):
        missing["read-only filesystem"] = "; ".join(failures)
    else:
        protections.append("read-only filesystem" + (f" except {', '.join(failures)}" if failures else ""))
    # A read-only mount does not stop connect() on a Unix socket file: hide where services keep theirs (the
    # container engine's, D-Bus, systemd), unless the working directory lives there.
    if os.path.isdir("/run") and not os.path.islink("/run") and not workdir.startswith("/run/"):
        try:
            _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY, "size=4k")
            protections.append("/run hidden (service sockets)")
        except OSError as error:
            missing["/run hidden"] = str(error)
    return protections, missing, True


def _run_input(job: dict, value, in_pid_namespace: bool) -> dict:
    """Run the program on one input in a forked child; return its frame (status, output, detail)."""
    timeout, cap = float(job["timeout"]), int(job["max_output_bytes"])
    call = job.get("fn_name") is not None
    stdin = os.memfd_create("stdin")
    if not call:
        os.write(stdin, (value if isinstance(value, str) else "").encode())
        os.lseek(stdin, 0, os.SEEK_SET)
    out_read, out_write = os.pipe()
    result_read, result_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.dup2(stdin, 0)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull if call else out_write, 1)
        os.dup2(devnull, 2)
        os.dup2(result_write, 3)
        os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        _run_untrusted(job, value)  # never returns
    for descriptor in (stdin, out_write, result_write):
        os.close(descriptor)
    deadline = time.monotonic() + timeout
    received = {out_read: bytearray(), result_read: bytearray()}
    status = None
    exited = os.pidfd_open(pid)  # readable once the program's process ends, whatever its children hold open
    with selectors.DefaultSelector() as selector:
        for descriptor in received:
            os.set_blocking(descriptor, False)
            selector.register(descriptor, selectors.EVENT_READ)
        selector.register(exited, selectors.EVENT_READ)
        while True:  # until the program's process ends, the deadline passes or the output is too long
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            ready = {key.fd for key, _ in selector.select(remaining)}
            for descriptor in ready & received.keys() if exited not in ready else received:
                if descriptor not in selector.get_map():
                    continue
                while True:  # all that is there: after the exit nothing more comes from the program itself
                    try:
                        chunk = os.read(descriptor, 1 << 16)
                    except BlockingIOError:
                        break
                    if not chunk:
                        selector.unregister(descriptor)
                        break
                    received[descriptor] += chunk
                    if len(received[descriptor]) > cap:
                        status = "output_limit"
                        break
            if status is not None or exited in ready:
                break
        # The program has ended (or is about to be killed): its leftovers go too, the PID namespace's or its group's.
        if in_pid_namespace:
            os.kill(-1, signal.SIGKILL)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for descriptor in (*received, exited):
        os.close(descriptor)
    _, wait_status = os.waitpid(pid, 0)
    _end_leftovers(in_pid_namespace)
    exit_code = os.waitstatus_to_exitcode(wait_status)
    output = bytes(received[out_read]).decode("utf-8", errors="replace")
    report = bytes(received[result_read][:cap]).decode("utf-8", errors="replace")
    if status == "timeout":
        return {
            "status": "timeout",
            "output": output,
            "detail": f"no result within {timeout:g} s",
        }
    if status == "output_limit":
        return {
            "status": "output_limit",
            "output": "",
            "detail": f"more than {cap} bytes of output",
        }
    if exit_code != 0:
        signal_name = signal.Signals(-exit_code).name if exit_code < 0 else None
        detail = report or (f"killed by {signal_name}" if signal_name else f"exit code {exit_code}")
        if signal_name == "SIGXCPU":
            detail = "CPU time limit"
        return {"status": "error", "output": output, "detail": detail[-2000:]}
    if call:
        return {"status": "ok", "output": report, "detail": ""}
    return {"status": "ok", "output": output, "detail": ""}


def _end_leftovers(in_pid_namespace: bool) -> None:
    """Kill and reap what the program left running (it was killed already in a PID namespace; see `main`)."""
    while True:
        if not in_pid_namespace:
            # A child subreaper: orphans, detached sessions included, become its children and are listed here.
            for children in Path("/proc/self/task").glob("*/children"):
                for child in children.read_text().split():
                    try:
                        os.kill(int(child), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.001)  # killed but not yet exited


def _run_untrusted(job: dict, value) -> None:
    """The forked child: limits, no capabilities, then the program; ends the process, never returns."""
    exit_code = 0
    try:
        cpu = math.ceil(float(job["timeout"])) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_NPROC, (job["max_processes"], job["max_processes"]))
        _drop_capabilities()
        # Fresh standard streams on descriptors 0 and 1, the input and the captured output.
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        fn_name = job.get("fn_name")
        namespace = {
            "__name__": "__main__" if fn_name is None else "solution",
            "__builtins__": __builtins__,
        }
        exec(job["code"], namespace)
        if fn_name is not None:
            function = namespace.get(fn_name)
            if function is None and isinstance(namespace.get("Solution"), type):
                function = getattr(namespace["Solution"](), fn_name, None)  # LeetCode layout
            if not callable(function):
                raise NameError(f"the program defines no function {fn_name!r}")
            arguments = value if isinstance(value, list) else [value]
            os.write(3, json.dumps(job["encode"](function(*arguments))).encode())
    except SystemExit as exit:
        exit_code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException as error:  # the program's failure, reported as its last traceback line
        exit_code = 1
        try:
            lines = traceback.format_exception_only(type(error), error)
            os.write(3, "".join(lines).strip().encode("utf-8", errors="replace")[-2000:])
        except BaseException:
            pass
    try:
        sys.stdout.flush()
    except BaseException:
        exit_code = exit_code or 1
    os._exit(exit_code)


def main() -> None:
    job_file = sys.argv[1]
    with open(job_file) as file:
        job = json.load(file)
    os.unlink(job_file)  # before any untrusted code: the inputs stay in memory only
    sys.path.append(job["package_root"])
    from stapo_trl.code.values import encode
    from stapo_trl.processes import Limits, bound_self

    job["encode"] = encode  # return values keep their Python types across the wall (see that module)
    sys.path.remove(job["package_root"])
    bound_self(job["parent_pid"], Limits(**job["limits"]))  # the death signal and limits `popen` would have set
    sys.path.extend(job["site_packages"])  # started with -S: the installed packages, without running .pth files
    workdir = os.getcwd()
    protections, missing, in_pid_namespace = (
        isolate(workdir, int(job["tmpfs_bytes"])) if job["isolate"] else ([], {"all": "isolate=False"}, False)
    )
    if in_pid_namespace:
        pid = os.fork()
        if pid != 0:  # wait for the namespace's first process; when it ends, the kernel kills the namespace
            _, wait_status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            protections.append("own /proc (the sandbox's processes only)")
        except OSError as error:  # a /proc partly hidden by the host refuses a second mount
            missing["own /proc"] = str(error)
        try:
            _write(
                "/proc/sys/kernel/pid_max",
                str(_RESERVED_PIDS + int(job["max_processes"])),  # the kernel's minimum is 301
            )
            limit = _RESERVED_PIDS + int(job["max_processes"])
            protections.append(f"pid_max of the PID namespace: fewer than {limit} processes and threads")
        except OSError as error:  # before Linux 6.14 pid_max is global
            missing["pid_max of the PID namespace"] = str(error)
    else:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        protections.append("child subreaper: what a program leaves running is killed after it")
    out = os.fdopen(1, "w", closefd=False)
    out.write(json.dumps({"protections": protections, "missing": missing}) + "\n")
    out.flush()
    try:
        job["code"] = compile(job["program"], "solution.py", "exec")  # once, not in every input's child
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()[-2000:]
        out.write(json.dumps({"status": "error", "output": "", "detail": detail}) + "\n")
        out.flush()
        os._exit(0)
    for name in _PRELOADED:
        __import__(name)
    gc.freeze()  # the children's garbage collector then leaves these objects (and their shared pages) alone
    for value in job["inputs"]:
        frame = _run_input(job, value, in_pid_namespace)
        out.write(json.dumps(frame) + "\n")
        out.flush()
        if frame["status"] != "ok":
            break
    os._exit(0)


if __name__ == "__main__":
    main()
