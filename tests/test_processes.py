"""Bounded subprocesses: deadlines, output caps, resource limits, death with the parent, isolated start."""

import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import is_gone

from stapo_trl.processes import (
    Limits,
    kill_group,
    popen,
    python_command,
    run,
    scrubbed_env,
)


# Prints the pid of a grandchild (in the same group) that sleeps, then sleeps itself.
SPAWN_GRANDCHILD = (
    "import subprocess, sys, time\n"
    "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(grandchild.pid, flush=True)\n"
)


def wait_until_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def force_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_quick_command_runs_to_completion_with_its_input():
    got = run(
        python_command("-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"),
        input=b"abc",
        timeout=30,
    )
    assert (
        got.returncode,
        got.stdout,
        got.stderr,
        got.timed_out,
        got.output_truncated,
    ) == (0, b"ABC", b"", False, False)


def test_large_input_and_output_do_not_deadlock():
    data = os.urandom(3 << 20)  # larger than any pipe buffer, both ways
    got = run(["cat"], input=data, timeout=30, max_output_bytes=4 << 20)
    assert got.stdout == data and got.returncode == 0 and not got.output_truncated


def test_the_deadline_kills_the_whole_group_grandchild_included():
    started = time.monotonic()
    got = run(python_command("-c", SPAWN_GRANDCHILD + "time.sleep(120)"), timeout=2)
    assert got.timed_out and got.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 30
    grandchild = int(got.stdout)
    try:
        assert wait_until_gone(grandchild)
    finally:
        force_kill(grandchild)


def test_what_a_finished_command_left_running_is_killed_and_does_not_hold_up_the_result():
    started = time.monotonic()
    got = run(python_command("-c", SPAWN_GRANDCHILD), timeout=60)  # exits at once; its grandchild holds the pipes
    grandchild = int(got.stdout)
    try:
        assert got.returncode == 0 and not got.timed_out
        assert time.monotonic() - started < 30
        assert wait_until_gone(grandchild)
    finally:
        force_kill(grandchild)


def test_output_over_the_cap_is_cut_and_the_writer_killed():
    flood = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    got = run(python_command("-c", flood), timeout=60, max_output_bytes=1000)
    assert got.output_truncated and not got.timed_out
    assert got.stdout == b"x" * 1000
    assert got.returncode == -signal.SIGKILL


def test_memory_limit():
    allocate = "x = bytearray(2 * 1024**3); x[::4096] = b'1' * len(x[::4096]); print('allocated')"
    got = run(
        python_command("-c", allocate),
        timeout=60,
        limits=Limits(memory_bytes=512 << 20),
    )
    assert got.returncode != 0 and b"MemoryError" in got.stderr and b"allocated" not in got.stdout


def test_cpu_limit_ends_a_busy_loop_before_the_deadline():
    got = run(
        python_command("-c", "while True: pass"),
        timeout=60,
        limits=Limits(cpu_seconds=1),
    )
    assert not got.timed_out and got.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_file_size_and_open_file_limits(tmp_path):
    write = f"open({str(tmp_path / 'big')!r}, 'wb').write(b'0' * 100_000)"
    got = run(python_command("-c", write), timeout=30, limits=Limits(file_size_bytes=10_000))
    assert got.returncode == 1 and b"File too large" in got.stderr  # Python ignores SIGXFSZ: the write fails
    assert (tmp_path / "big").stat().st_size <= 10_000

    many = "import os; [os.open(os.devnull, os.O_RDONLY) for _ in range(100)]"
    got = run(python_command("-c", many), timeout=30, limits=Limits(open_files=20))
    assert got.returncode == 1 and b"Too many open files" in got.stderr
    assert run(python_command("-c", many), timeout=30, limits=Limits(open_files=200)).returncode == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="RLIMIT_NPROC does not apply to root")
def test_process_limit():
    fork = "import os; print(os.fork())"
    got = run(python_command("-c", fork), timeout=30, limits=Limits(max_processes=1))
    assert got.returncode == 1 and b"BlockingIOError" in got.stderr


def test_children_die_with_a_sigkilled_parent():
    # A parent (as a trainer would) starts a child through `popen`; the parent is then SIGKILLed.
    parent_program = (
        "import time\n"
        "from stapo_trl.processes import popen, python_command\n"
        "child = popen(python_command('-c', 'import time; time.sleep(120)'))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_program],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    child = None
    try:
        assert select.select([parent.stdout], [], [], 60)[0], "the parent did not report its child"
        child = int(parent.stdout.readline())
        assert not is_gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert wait_until_gone(child)
    finally:
        os.killpg(parent.pid, signal.SIGKILL) if parent.poll() is None else None
        parent.wait()
        parent.stdout.close()
        if child is not None:
            force_kill(child)


def test_a_child_outlives_the_thread_that_started_it():
    # Linux ties the parent-death signal to the starting thread; a child must not die when a worker thread ends.
    started = []
    thread = threading.Thread(
        target=lambda: started.append(popen(python_command("-c", "import time; time.sleep(60)")))
    )
    thread.start()
    thread.join()
    child = started[0]
    try:
        time.sleep(0.5)
        assert child.poll() is None
    finally:
        kill_group(child)
    assert child.returncode == -signal.SIGKILL
    kill_group(child)  # again: harmless


def test_isolated_start_ignores_modules_in_the_working_directory(tmp_path):
    (tmp_path / "stray_module.py").write_text("print('stray code ran')")
    importing = "import stray_module"
    # The reference: a plain interpreter started in that directory imports it.
    plain = subprocess.run(
        [sys.executable, "-c", importing], check=False, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert plain.stdout == b"stray code ran\n"
    for cwd in (tmp_path, None):
        got = run(python_command("-c", importing), timeout=30, cwd=cwd)
        assert b"stray code ran" not in got.stdout and b"ModuleNotFoundError" in got.stderr


def test_default_directory_and_scrubbed_environment(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAPO_TEST_SECRET", "hunter2")
    show = "import os; print(os.getcwd()); print(os.environ.get('STAPO_TEST_SECRET'))"
    assert run(python_command("-c", show), timeout=30).stdout.split() == [
        b"/",
        b"hunter2",
    ]
    got = run(python_command("-c", show), timeout=30, env=scrubbed_env(EXTRA="1"))
    assert got.stdout.split() == [b"/", b"None"]


def test_a_slow_steady_writer_is_stopped_at_the_deadline():
    drip = "import sys, time\nwhile True:\n    sys.stdout.write('x'); sys.stdout.flush(); time.sleep(0.001)"
    started = time.monotonic()
    got = run(python_command("-c", drip), timeout=2)
    assert got.timed_out and not got.output_truncated and got.stdout
    assert time.monotonic() - started < 2 + 10


def test_bad_timeout_is_a_caller_error():
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            run(["true"], timeout=bad)


def test_no_python_runs_between_fork_and_exec(monkeypatch):
    # A preexec_fn runs Python in a child forked from a process with other threads, where a lock another thread
    # held at the fork can never be released: the child, and the popen waiting for it, hang (seen with the verifier).
    started = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(kwargs)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    result = run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"],
                 timeout=30, limits=Limits(memory_bytes=1 << 30))  # fmt: skip
    assert [kwargs.get("preexec_fn") for kwargs in started] == [None]
    assert result.returncode == 0 and int(result.stdout) == 1 << 30  # the limit still reaches the command
