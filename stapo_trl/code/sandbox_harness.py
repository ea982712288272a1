"""The program that runs inside the sandbox: isolates itself, then runs one untrusted program on each input.

`stapo_trl.code.sandbox.LocalSandbox` starts it once per judging thread as a server (`serve`:
``python -I -S sandbox_harness.py PACKAGE_ROOT TRAINER_PID``, its standard input a socket to the trainer), which
imports what programs use and then forks one child per job (`run_job`), so a job costs a fork, not an interpreter
start. Each job child first bounds itself (`stapo_trl.processes.bound_self`: death with the server, which dies with
the trainer; the job's resource limits). Besides that module and `stapo_trl.code.values` (how return values are
written) it imports the standard library only. Everything a job writes on its standard output (a pipe the trainer
reads) is one JSON object per line:

- first ``{"protections": [...], "missing": {name: reason}}``: the isolation that is in place (or ``{"error": ...}``
  when the namespaces exist but the program's filesystem cannot be built: then no program runs);
- then one ``{"status": ..., "output": ..., "detail": ...}`` per input, in order, until an input ends in anything
  but ``"ok"``. The outputs are compared outside the sandbox: the expected outputs never enter it.

Isolation, each step measured and reported rather than assumed:

1. Memory for the whole program: this process joins the memory cgroup the sandbox made for it, if any, before it
   starts another; otherwise every process has ``memory_bytes / max_processes`` of address space and RLIMIT_NPROC
   (which binds a user other than root) allows `max_processes`. ``oom_score_adj`` 1000: the program dies first.
2. New user, mount, network, PID, IPC and UTS namespaces (``unshare(2)``, unprivileged where the kernel allows it):
   no network interface but a loopback that is down; processes that see only each other.
3. A root built by inclusion (`_enter_view`): the interpreter, its libraries, the standard library and the allowed
   packages, read-only; a private tmpfs, bounded in bytes and files, as ``/tmp`` and ``/dev/shm``; the namespace's
   own ``/proc`` with the kernel's settings read-only. Nothing else of the host: no home, cache, socket or dataset.
4. A bounded number of processes and threads: fewer than 300 + `max_processes` by the PID namespace's own
   ``pid_max`` (Linux >= 6.14; it binds root too), and `max_processes` by RLIMIT_NPROC.
5. The untrusted code runs in a forked child per input, without capabilities (none to regain by exec) and without
   ``memfd_create`` (seccomp), under CPU and output limits; after each input every other process of the PID
   namespace is killed. When the job's child dies, the kernel kills the whole namespace.
"""

import ctypes
import gc
import json
import math
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback


_CLONE_NEWUSER, _CLONE_NEWNS, _CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
_CLONE_NEWPID, _CLONE_NEWIPC, _CLONE_NEWUTS = 0x20000000, 0x08000000, 0x04000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 4096, 8192, 16384, 1 << 18, 2
# Flags a bind mount keeps from its source (statvfs's names); in a user namespace a read-only remount must repeat them.
_KEPT_FLAGS = {
    os.ST_NOSUID: _MS_NOSUID,
    os.ST_NODEV: _MS_NODEV,
    os.ST_NOEXEC: _MS_NOEXEC,
    os.ST_NOATIME: 1024,
    os.ST_NODIRATIME: 2048,
    os.ST_RELATIME: 1 << 21,
}
# Parts of /proc that reach the host kernel's settings. They check the user id, not capabilities, and uid 0 in the
# sandbox is the host's root when the trainer runs as root: read-only, as container engines make them.
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
# Files and directories in /tmp and /dev/shm together: each costs kernel memory that the tmpfs size does not count.
_SCRATCH_INODES = 16384
# seccomp: memfd_create and memfd_secret fail with EPERM. Their pages belong to no process's address space, so no
# RLIMIT_AS counts them. machine: (AUDIT_ARCH_*, the system calls' numbers).
_SECCOMP_ARCHITECTURES = {"x86_64": (0xC000003E, (319, 447)), "aarch64": (0xC00000B7, (279, 447))}
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_CAP_SYS_RESOURCE = 24
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


def _lock_capabilities() -> None:
    """Make sure no capability comes back to this process's children: not by exec, not as uid 0, not by a set-uid file.

    Done once in the process that forks the programs (it never executes another program itself); each program's
    child then clears its own capabilities (`_confine`).
    """
    try:
        _prctl(_PR_SET_SECUREBITS, _SECUREBITS_NOROOT_LOCKED)
        for capability in range(64):
            if _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(capability), 0, 0, 0) != 0:
                break  # past the last capability this kernel knows
    except OSError:
        pass  # without CAP_SETPCAP (an ordinary user outside a user namespace): there is nothing to regain


def _memfd_filter() -> "_SockFprog":
    """A seccomp program under which memfd_create and memfd_secret fail with EPERM (x32 calls fail too)."""
    architecture, refused = _SECCOMP_ARCHITECTURES[os.uname().machine]
    load_word, jump_equal, jump_greater_equal, ret = 0x20, 0x15, 0x35, 0x06
    errno_eperm, allow = 0x00050000 | 1, 0x7FFF0000
    refuse_at = len(refused) + 4  # the index of the "return EPERM" instruction
    program = [  # (code, jump if true, jump if false, k)
        (load_word, 0, 0, 4),  # seccomp_data.arch
        (jump_equal, 0, refuse_at - 1, architecture),  # another architecture's calls: allowed
        (load_word, 0, 0, 0),  # seccomp_data.nr
        *((jump_equal, refuse_at - index - 4, 0, number) for index, number in enumerate(refused)),
        (jump_greater_equal, 0, 1, 0x40000000),  # __X32_SYSCALL_BIT
        (ret, 0, 0, errno_eperm),
        (ret, 0, 0, allow),
    ]
    filters = (_SockFilter * len(program))(*program)
    return _SockFprog(len(program), filters)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _confine(job: dict) -> None:
    """The untrusted child's last steps before the program: its process limit, no capabilities, no memfd.

    `_lock_capabilities` ran in its parent; ``job["memfd_filter"]`` is `_memfd_filter`'s program, or None.
    """
    resource.setrlimit(resource.RLIMIT_NPROC, (job["max_processes"], job["max_processes"]))
    header, data = _CapabilityHeader(0x20080522, 0), (_CapabilityData * 2)()  # version 3, every set empty
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if job["memfd_filter"] is not None:
        _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(job["memfd_filter"]), 0, 0), "seccomp")


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, _MS_BIND | _MS_REC)
    kept = os.statvfs(target).f_flag
    flags = sum(flag for statvfs_flag, flag in _KEPT_FLAGS.items() if kept & statvfs_flag)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)


def _enter_view(root: str, job: dict, protections: list[str], missing: dict[str, str]) -> None:
    """Build the program's filesystem on the empty directory `root` and make it the root directory.

    It holds only what a Python program needs, read-only: the interpreter, the libraries it loads, the standard
    library (its site-packages hidden) and the allowed packages, a few devices (``job["view"]``, chosen and laid out
    by the sandbox), and the namespace's own ``/proc``; a private tmpfs, bounded in bytes and in files, is ``/tmp`` and
    ``/dev/shm``. `root` itself is removed from the host as soon as nothing is mounted on it, so a killed trainer
    leaves no directory behind.
    """
    host_parent = os.open(os.path.dirname(root), os.O_PATH | os.O_DIRECTORY)
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
        view = job["view"]  # laid out by the sandbox (`stapo_trl.code.sandbox._layout`): the host's paths to show
        for directory in view["directories"]:  # parents first
            os.mkdir(root + directory)
        for link, target in view["links"].items():
            os.symlink(target, root + link)
        for path, kind in view["binds"].items():
            if kind == "directory":
                os.makedirs(root + path, exist_ok=True)
            else:
                os.close(os.open(root + path, os.O_CREAT | os.O_WRONLY, 0o600))
            _bind_read_only(path, root + path)
        for path in view["hidden"]:  # site-packages inside the standard library's directory
            _mount(
                "tmpfs", root + path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=4k,mode=0555"
            )
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"{root}/dev/{name}")
        scratch_bytes = int(job["tmpfs_bytes"])
        scratch = f"{root}/scratch"
        for directory in (scratch, f"{root}/tmp", f"{root}/dev/shm", f"{root}/proc"):
            os.mkdir(directory)
        _mount("tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={scratch_bytes},nr_inodes={_SCRATCH_INODES}")
        for name, target in (("tmp", f"{root}/tmp"), ("shm", f"{root}/dev/shm")):  # one budget for both
            os.mkdir(f"{scratch}/{name}")
            os.chmod(f"{scratch}/{name}", 0o1777)
            _mount(f"{scratch}/{name}", target, None, _MS_BIND)
        _check(_libc.umount2(scratch.encode(), _MNT_DETACH), f"umount {scratch}")
        os.rmdir(scratch)
        protections.append(
            f"private /tmp and /dev/shm: a tmpfs of {scratch_bytes} bytes and {_SCRATCH_INODES} files in all"
        )
        _mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        limit = _RESERVED_PIDS + int(job["max_processes"])
        try:
            _write(f"{root}/proc/sys/kernel/pid_max", str(limit))  # the kernel's minimum is 301
            protections.append(f"pid_max of the PID namespace: fewer than {limit} processes and threads")
        except OSError as error:  # before Linux 6.14 pid_max is global
            missing["pid_max of the PID namespace"] = str(error)
        try:  # System V shared memory: segments outlive their mappings, like memfd (the IPC namespace's own limit)
            _write(f"{root}/proc/sys/kernel/shmall", "0")
            protections.append("System V shared memory refused (shmall 0 in the IPC namespace)")
        except OSError as error:
            missing["System V shared memory refused"] = str(error)
        for name in _PROC_READ_ONLY:
            if os.path.exists(f"{root}/proc/{name}"):
                _bind_read_only(f"{root}/proc/{name}", f"{root}/proc/{name}")
        _mount(None, root, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        os.chdir(root)
        _mount(root, "/", None, _MS_MOVE)
        os.chroot(".")
        os.chdir("/tmp")
        protections += [
            "own root: the interpreter, its standard library and the allowed packages, read-only; no host file else",
            "own /proc (the sandbox's processes only; kernel settings read-only)",
        ]
        try:
            os.rmdir(os.path.basename(root), dir_fd=host_parent)
        except OSError:
            pass  # the sandbox deletes it when the run ends
    finally:
        os.close(host_parent)
    os.environ.update(HOME="/tmp", TMPDIR="/tmp")


def isolate(workdir: str, job: dict) -> tuple[list[str], dict[str, str], bool]:
    """Isolate this process as far as the kernel allows; return (protections, missing protections, in PID ns).

    In namespaces, what returns is the first process of the new PID namespace (this one waits for it and exits with
    its status: when the harness dies, the kernel kills the namespace). Raises ``OSError`` when the namespaces exist
    but the program's filesystem cannot be built: the program must not run then.
    """
    protections, missing = [], {}
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    try:
        _check(_libc.unshare(flags), "unshare")
    except OSError as error:
        reason = f"unshare(user, mount, network, PID) failed: {error}"
        for name in ("network namespace", "PID namespace", "own root"):
            missing[name] = reason
        return protections, missing, False
    _write("/proc/self/setgroups", "deny")
    # The trainer's ids become the namespace's 0: the owner of its IPC settings, which the namespace's first process
    # sets (shmall). A program gains nothing by it: it has no capabilities, and uid 0 regains none by exec.
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    protections += [
        "user namespace",
        "network namespace (no interfaces)",
        "PID namespace",
        "IPC namespace",
    ]
    pid = os.fork()
    if pid != 0:  # wait for the namespace's first process; when it ends, the kernel kills the namespace
        _, wait_status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _enter_view(workdir, job, protections, missing)
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
    """Kill and reap what the program left running (it was killed already in a PID namespace; see `_run_input`)."""
    while True:
        if not in_pid_namespace:
            # A child subreaper: orphans, detached sessions included, become its children and are listed here.
            for task in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{task}/children") as children:
                    listed = children.read().split()
                for child in listed:
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
        _confine(job)
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


def _bound_memory(job: dict) -> tuple[list[str], dict[str, str]]:
    """Bound the memory of the whole program, not of each process; make it the first to die when memory runs out."""
    protections, missing = [], {}
    _write("/proc/self/oom_score_adj", "1000")  # inherited by every process of the program
    with open("/proc/self/status") as status:
        effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    # Written with CAP_SYS_RESOURCE, 1000 is also the least the program may set; without, it may go back to 0.
    floor = 1000 if effective & (1 << _CAP_SYS_RESOURCE) else 0
    protections.append(
        f"oom_score_adj 1000 (the program may lower it to {floor}): the out-of-memory killer takes it before others"
    )
    total, each, processes = int(job["memory_bytes"]), int(job["limits"]["memory_bytes"]), int(job["max_processes"])
    if os.uname().machine in _SECCOMP_ARCHITECTURES:
        protections.append("memfd_create and memfd_secret refused (seccomp)")
    else:
        missing["memfd_create refused"] = f"no seccomp filter for {os.uname().machine}"
    if job["memory_cgroup"]:
        try:
            _write(os.path.join(job["memory_cgroup"], "cgroup.procs"), str(os.getpid()))  # before any fork
            protections.append(f"memory cgroup: {total} bytes for the whole program, tmpfs and kernel memory included")
            return protections, missing
        except OSError as error:
            reason = f"joining {job['memory_cgroup']} failed: {error}"
    else:
        reason = job["memory_cgroup_missing"]
    if os.getuid() != 0:  # RLIMIT_NPROC never binds root
        protections.append(
            f"memory bound of {total} bytes for the whole program: {processes} processes and threads of {each} bytes "
            f"of address space each (no memory cgroup: {reason})"
        )
    else:
        missing["memory bound for the whole program"] = (
            f"no memory cgroup ({reason}) and RLIMIT_NPROC does not bind root: each process has {each} bytes"
        )
    return protections, missing


def serve(trainer_pid: int, idle_seconds: float) -> None:
    """Fork one sandbox per job the trainer sends, until it closes the control socket (standard input) or sends no
    job for `idle_seconds`.

    Started once per judging thread, this process pays the interpreter's start and the imports once, not per job.
    A message is a job's working directory (holding ``job.json``) with the write end of a pipe for its results; the
    job runs in a forked child (`run_job`). The next message, ``end``, kills the job's process group and reaps it,
    answered by ``reaped``: the job's processes are gone then (a PID namespace's last ones may still be exiting).
    """
    bound_self(trainer_pid, Limits())  # dies with the trainer; each job gets its limits in its own child
    for name in _PRELOADED:
        __import__(name)
    gc.freeze()  # the children's garbage collector then leaves these objects (and their shared pages) alone
    control = socket.socket(fileno=0)
    own_pid = os.getpid()
    while True:
        control.settimeout(idle_seconds)
        try:
            message, descriptors, _, _ = socket.recv_fds(control, 1 << 16, 1)
        except OSError:  # idle too long (the trainer starts another when it needs one), or the socket broke
            os._exit(0)
        if not message or len(descriptors) != 1:
            os._exit(0)  # the trainer closed the socket (or broke the protocol): no job is running
        control.settimeout(None)  # a job may run as long as its inputs' time limits allow
        workdir = message.decode()
        pid = os.fork()
        if pid == 0:
            control.detach()  # descriptor 0 becomes /dev/null below: no job reaches the control socket
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(descriptors[0], 1)
            os.dup2(devnull, 2)
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            os.setsid()
            try:
                os.chdir(workdir)
                run_job(own_pid)
            finally:
                os._exit(1)  # never back into this loop
        os.close(descriptors[0])
        try:
            ended = control.recv(16) == b"end"
        except OSError:
            ended = False
        for kill in (os.killpg, os.kill):  # the group, or the child itself before it made its group
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(pid, 0)
        if not ended:
            os._exit(0)
        control.send(b"reaped")


def run_job(server_pid: int) -> None:
    """The forked child of `serve`: read the job, bound and isolate itself, run the program on each input; exit."""
    with open("job.json") as file:
        job = json.load(file)
    os.unlink("job.json")  # before any untrusted code: the inputs stay in memory only
    job["encode"] = encode  # return values keep their Python types across the wall (see that module)
    bound_self(server_pid, Limits(**job["limits"]))  # dies with the server, under this job's limits
    sys.path.extend(job["sys_path"])  # started with -S: the allowed packages, without running .pth files
    os.environ.update(HOME=os.getcwd(), TMPDIR=os.getcwd())
    protections, missing = _bound_memory(job)
    if job["isolate"]:
        try:
            isolated, isolation_missing, in_pid_namespace = isolate(os.getcwd(), job)
        except OSError as error:
            os.write(
                1, (json.dumps({"error": f"the sandbox's filesystem could not be built: {error}"}) + "\n").encode()
            )
            os._exit(0)
        protections, missing = isolated + protections, {**isolation_missing, **missing}
    else:
        in_pid_namespace = False
        missing["all namespaces"] = "isolate=False"
    if not in_pid_namespace:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        protections.append("child subreaper: what a program leaves running is killed after it")
    out = os.fdopen(1, "w", encoding="utf-8", closefd=False)
    out.write(json.dumps({"protections": protections, "missing": missing}) + "\n")
    out.flush()
    try:
        job["code"] = compile(job["program"], "solution.py", "exec")  # once, not in every input's child
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()[-2000:]
        out.write(json.dumps({"status": "error", "output": "", "detail": detail}) + "\n")
        out.flush()
        os._exit(0)
    _lock_capabilities()
    job["memfd_filter"] = _memfd_filter() if os.uname().machine in _SECCOMP_ARCHITECTURES else None
    for value in job["inputs"]:
        frame = _run_input(job, value, in_pid_namespace)
        out.write(json.dumps(frame, ensure_ascii=False) + "\n")  # U+FFFD: 3 bytes, not 6
        out.flush()
        if frame["status"] != "ok":
            break
    os._exit(0)


if __name__ == "__main__":  # python -I -S sandbox_harness.py PACKAGE_ROOT TRAINER_PID IDLE_SECONDS
    sys.path.append(sys.argv[1])
    from stapo_trl.code.values import encode
    from stapo_trl.processes import Limits, bound_self

    sys.path.remove(sys.argv[1])
    serve(int(sys.argv[2]), float(sys.argv[3]))
