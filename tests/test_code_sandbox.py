"""LocalSandbox: hostile programs are contained, nothing is left running, the test process is unharmed."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import code_programs
import pytest

from stapo_trl.code import sandbox as sandbox_module
from stapo_trl.code.sandbox import HARNESS, Job, LocalSandbox, Output


SECRET = "stapo-sandbox-test-secret-7f3a"


def namespaces_available() -> bool:
    """Whether this kernel lets this user create user + network + PID namespaces (what the sandbox uses)."""
    try:
        result = subprocess.run(
            ["unshare", "--user", "--net", "--pid", "--fork", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


NAMESPACES = namespaces_available()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="this kernel refuses unprivileged namespaces")


def harness_processes(marker: str) -> list[int]:
    """The processes running the sandbox harness on a job under `marker` (forked children keep its command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command_line = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(HARNESS).encode() in command_line and marker.encode() in command_line:
                found.append(int(entry.name))
    return found


def assert_nothing_left_running(marker: str):
    deadline = time.monotonic() + 5
    while harness_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert harness_processes(marker) == []


def run(program: str, sandbox: LocalSandbox | None = None, timeout: float = 2.0) -> tuple[list[Output], float]:
    started = time.monotonic()
    outputs = list((sandbox or LocalSandbox()).execute(Job(program, [""], timeout=timeout)))
    return outputs, time.monotonic() - started


def assert_process_healthy():
    """The test process can still start processes and open sockets: it has not been killed, starved or limited."""
    assert subprocess.run(["true"], timeout=10).returncode == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))


@pytest.fixture(autouse=True)
def sandbox_dir(tmp_path, monkeypatch):
    """This test's sandboxes get their working directories here, which marks their processes as this test's."""
    directory = tmp_path / "sandboxes"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    yield directory
    assert_nothing_left_running(str(directory))
    assert_process_healthy()
    assert list(directory.iterdir()) == []  # every working directory was deleted


def test_runs_a_program_on_each_input():
    outputs = list(LocalSandbox().execute(Job("print(int(input()) * 2)", ["1\n", "21\n"])))
    assert outputs == [Output("ok", "2\n"), Output("ok", "42\n")]


def test_calls_a_function_and_returns_plain_values():
    program = "def f(a, b):\n    return (a + b, {b, a}, None, 0.5)\n"
    outputs = list(LocalSandbox().execute(Job(program, [[1, 2]], fn_name="f")))
    assert outputs == [Output("ok", {"__tuple__": [3, {"__set__": [1, 2]}, None, 0.5]})]  # stapo_trl.code.values


def test_a_failing_input_ends_the_run_with_its_exception():
    outputs = list(LocalSandbox().execute(Job("x = int(input())\nprint(10 // x)\n", ["1\n", "0\n", "2\n"])))
    assert [output.status for output in outputs] == ["ok", "error"]
    assert "ZeroDivisionError" in outputs[1].detail


def test_a_syntax_error_fails_the_first_input():
    outputs = list(LocalSandbox().execute(Job("print(", ["", ""])))
    assert [output.status for output in outputs] == ["error"]
    assert "SyntaxError" in outputs[0].detail


def test_each_input_starts_from_a_fresh_process():
    program = "import builtins\nprint(hasattr(builtins, 'seen'))\nbuiltins.seen = True\n"
    outputs = list(LocalSandbox().execute(Job(program, ["", ""])))
    assert [output.value for output in outputs] == ["False\n", "False\n"]


@needs_namespaces
def test_isolation_report_lists_the_protections():
    report = LocalSandbox().isolation()
    assert report["missing"] == {}
    for protection in ("network namespace", "PID namespace", "read-only filesystem", "private tmpfs"):
        assert any(protection in item for item in report["protections"]), protection


@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "limits_only"])
def test_infinite_loop_is_stopped_at_the_deadline(isolate):
    outputs, seconds = run(code_programs.HOSTILE["infinite_loop"], LocalSandbox(isolate=isolate), timeout=1.0)
    assert outputs[0].status == "timeout"
    assert seconds < 30


@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "limits_only"])
def test_sleeping_and_detached_processes_are_killed(isolate):
    for name in ("sleep_forever", "detached_sleeper"):
        outputs, _ = run(code_programs.HOSTILE[name], LocalSandbox(isolate=isolate), timeout=1.0)
        assert outputs[0].status in ("timeout", "ok")
        assert_nothing_left_running(tempfile.gettempdir())


@needs_namespaces
def test_fork_bomb_is_contained():
    sandbox = LocalSandbox(max_processes=32)
    outputs, seconds = run(code_programs.HOSTILE["fork_bomb"], sandbox, timeout=2.0)
    assert outputs[0].status == "timeout"
    assert seconds < 30


@needs_namespaces
def test_processes_are_bounded():
    program = (
        "import os, time\n"
        "count = 0\n"
        "for _ in range(5000):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    count += 1\n"
        "print(count)\n"
    )
    outputs, _ = run(program, LocalSandbox(max_processes=64), timeout=20.0)
    assert outputs[0].status == "ok"
    assert 0 < int(outputs[0].value) < 300 + 64  # the PID namespace's pid_max (RLIMIT_NPROC: 64, unless root)


@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "limits_only"])
def test_10_gb_allocation_fails(isolate):
    outputs, _ = run(code_programs.HOSTILE["allocate_10_gb"], LocalSandbox(isolate=isolate))
    assert outputs[0].status == "error"
    assert "MemoryError" in outputs[0].detail


@pytest.mark.parametrize("name", ["print_1_gb", "write_1_gb_raw"])
@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "limits_only"])
def test_1_gb_of_output_is_cut_off(name, isolate):
    sandbox = LocalSandbox(isolate=isolate, max_output_bytes=1 << 20)
    outputs, _ = run(code_programs.HOSTILE[name], sandbox, timeout=10.0)
    assert outputs[0].status == "output_limit"


@needs_namespaces
def test_writing_outside_its_directory_fails(tmp_path):
    for target in (tmp_path / "escaped.txt", Path("/tmp") / f"stapo-escaped-{os.getpid()}.txt"):
        outputs, _ = run(code_programs.write_outside(str(target)))
        assert outputs[0].status == "error"
        assert not target.exists()


def test_writing_inside_its_directory_works():
    program = "open('scratch.txt', 'w').write('kept')\nprint(open('scratch.txt').read())\n"
    assert run(program)[0] == [Output("ok", "kept\n")]


@needs_namespaces
def test_sockets_reach_nothing():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        outputs, _ = run(code_programs.connect_to(listener.getsockname()[1]))
        assert outputs[0].status == "error"
        assert "escaped" not in (outputs[0].value or "")
        with pytest.raises(TimeoutError):
            listener.accept()


@needs_namespaces
def test_killing_its_parent_or_the_trainer_fails():
    outputs, _ = run(code_programs.kill(os.getpid()))
    assert outputs == [Output("ok", "still here\n")]  # and this test process is still running


@needs_namespaces
def test_the_trainers_environment_is_out_of_reach(monkeypatch):
    monkeypatch.setenv("STAPO_TEST_SECRET", SECRET)
    outputs, _ = run(code_programs.read_environment(os.getpid()))
    assert outputs[0].status == "ok"
    assert SECRET not in outputs[0].value
    assert "STAPO_TEST_SECRET" not in outputs[0].value


def test_a_sandbox_that_cannot_start_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(sandbox_module, "HARNESS", Path("/nonexistent/harness.py"))
    assert [output.status for output in run("print(1)")[0]] == ["sandbox_error"]


def test_set_default_executor_refuses_objects_without_execute():
    with pytest.raises(TypeError, match="execute"):
        sandbox_module.set_default_executor(object())


@needs_namespaces
def test_service_sockets_under_run_are_hidden():
    path = Path("/run") / f"stapo-sandbox-test-{os.getpid()}.sock"
    try:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
    except OSError:
        pytest.skip("/run is not writable here")
    try:
        listener.listen()
        listener.settimeout(0.5)
        program = f"import socket\nsocket.socket(socket.AF_UNIX).connect({str(path)!r})\nprint('escaped')\n"
        outputs, _ = run(program)
        assert outputs[0].status == "error" and "FileNotFoundError" in outputs[0].detail
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
        path.unlink()


def test_the_sandbox_dies_with_the_trainer(sandbox_dir):
    trainer_code = (
        f"import tempfile; tempfile.tempdir = {str(sandbox_dir)!r}\n"
        "from stapo_trl.code.sandbox import Job, LocalSandbox\n"
        "list(LocalSandbox().execute(Job('import time\\ntime.sleep(600)', [''], timeout=600)))\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", trainer_code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(harness_processes(str(sandbox_dir))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert harness_processes(str(sandbox_dir)), "the sandbox did not start"
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)  # the trainer's group only: the sandbox has its own session
        trainer.wait()
    assert_nothing_left_running(str(sandbox_dir))
    for leftover in sandbox_dir.iterdir():  # a killed trainer cannot delete its sandboxes' (empty) directories
        shutil.rmtree(leftover)
