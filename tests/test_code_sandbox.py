"""LocalSandbox: hostile programs are contained, nothing is left running, the test process is unharmed."""

import errno
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zlib
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


def harness_processes(trainer: int | None = None) -> dict[int, int]:
    """The processes running this checkout's sandbox harness for `trainer` (default: this process), as {pid: parent's
    pid}: its servers and their jobs' processes (forked children keep the server's command line, which names the
    trainer)."""
    trainer = os.getpid() if trainer is None else trainer
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                arguments = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if str(HARNESS).encode() in arguments:  # python -I -S HARNESS PACKAGE_ROOT TRAINER_PID IDLE_SECONDS
                harness_at = arguments.index(str(HARNESS).encode())
                if arguments[harness_at + 2 : harness_at + 3] == [str(trainer).encode()]:
                    found[int(entry.name)] = parent
    return found


def assert_nothing_left_running():
    """Every harness process of this process left is an idle server: no job's process runs."""

    def left_running():
        return {pid for pid, parent in harness_processes().items() if parent != os.getpid()}

    deadline = time.monotonic() + 5
    while left_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left_running() == set()


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
    """This test's sandboxes get their working directories here; afterwards no job runs and none is left behind."""
    directory = tmp_path / "sandboxes"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    yield directory
    assert_nothing_left_running()
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


def server_pids(sandbox: LocalSandbox) -> list[int]:
    """The pids of `sandbox`'s idle harness servers."""
    return [server.process.pid for server in sandbox._servers]


@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "limits_only"])
def test_each_job_starts_from_the_servers_state_not_the_last_jobs(isolate):
    """One server forks every job of a thread: what a program changes in its process reaches no later job."""
    sandbox = LocalSandbox(isolate=isolate)
    tamper = (
        "import builtins, json, os\nbuiltins.seen = True\njson.dumps = None\nos.environ['SEEN'] = '1'\nprint('done')\n"
    )
    check = "import builtins, json, os\nprint(hasattr(builtins, 'seen'), json.dumps([1]), os.environ.get('SEEN'))\n"
    assert list(sandbox.execute(Job(tamper, [""]))) == [Output("ok", "done\n")]
    first_server = server_pids(sandbox)
    assert list(sandbox.execute(Job(check, [""]))) == [Output("ok", "False [1] None\n")]
    assert server_pids(sandbox) == first_server and len(first_server) == 1  # the same server ran both


def test_a_dead_server_is_replaced():
    sandbox = LocalSandbox()
    list(sandbox.execute(Job("print(1)", [""])))
    (dead,) = server_pids(sandbox)
    os.kill(dead, signal.SIGKILL)
    assert list(sandbox.execute(Job("print(2)", [""]))) == [Output("ok", "2\n")]
    assert server_pids(sandbox) != [dead]


def test_an_idle_server_exits_and_the_next_job_starts_another(monkeypatch):
    monkeypatch.setattr(sandbox_module, "SERVER_IDLE_SECONDS", 0.5)
    sandbox = LocalSandbox()
    list(sandbox.execute(Job("print(1)", [""])))
    (idle,) = server_pids(sandbox)
    deadline = time.monotonic() + 30
    while idle in harness_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle not in harness_processes()
    assert list(sandbox.execute(Job("print(2)", [""]))) == [Output("ok", "2\n")]
    assert server_pids(sandbox) not in ([], [idle])


def test_close_stops_the_servers():
    sandbox = LocalSandbox()
    list(sandbox.execute(Job("print(1)", [""])))
    servers = set(server_pids(sandbox))
    sandbox.close()
    assert servers and servers & harness_processes().keys() == set()
    assert list(sandbox.execute(Job("print(2)", [""]))) == [Output("ok", "2\n")]  # a new one serves the next job


@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "limits_only"])
def test_a_program_has_no_capabilities_no_new_privileges_and_a_seccomp_filter(isolate):
    """The kernel's own account of the program's process (/proc/self/status)."""
    program = "print(open('/proc/self/status').read())"
    (output,) = LocalSandbox(isolate=isolate).execute(Job(program, [""]))
    status = dict(line.split(":\t", 1) for line in output.value.splitlines() if ":\t" in line)
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[capabilities], 16) == 0, capabilities
    if isolate and NAMESPACES or os.getuid() == 0:  # an ordinary user outside a namespace cannot drop the bounding set
        assert int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # filter mode


@needs_namespaces
def test_isolation_report_lists_the_protections():
    report = LocalSandbox().isolation()
    assert report["missing"] == {}
    for protection in ("network namespace", "PID namespace", "own root", "private /tmp", "memfd", "oom_score_adj"):
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
        assert_nothing_left_running()


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
    target = tmp_path / "escaped.txt"
    outputs, _ = run(code_programs.write_outside(str(target)))
    assert outputs[0].status == "error"
    assert not target.exists()
    host_tmp = Path("/tmp") / f"stapo-escaped-{os.getpid()}.txt"  # its /tmp is its own
    run(code_programs.write_outside(str(host_tmp)))
    assert not host_tmp.exists()


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
    assert_unix_socket_out_of_reach(Path("/run"), may_be_read_only=True)


def test_the_sandbox_dies_with_the_trainer_and_leaves_no_directory(sandbox_dir):
    trainer_code = (
        f"import tempfile; tempfile.tempdir = {str(sandbox_dir)!r}\n"
        "from stapo_trl.code.sandbox import Job, LocalSandbox\n"
        "list(LocalSandbox().execute(Job('import time\\ntime.sleep(600)', [''], timeout=600)))\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", trainer_code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        # Four with namespaces (the server, the job, the namespace's first process, the program), three without.
        expected = 4 if NAMESPACES else 3
        while len(harness_processes(trainer.pid)) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(harness_processes(trainer.pid)) == expected, "the program did not start"
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)  # the trainer's group only: the sandbox has its own session
        trainer.wait()
    deadline = time.monotonic() + 5
    while harness_processes(trainer.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert harness_processes(trainer.pid) == {}
    if not NAMESPACES:  # the program's working directory is then on the host, and nobody is left to delete it
        for leftover in sandbox_dir.iterdir():
            shutil.rmtree(leftover)


# What the host holds must be out of a program's sight: each program below cheated or escaped with the sandbox
# that hid the host by exclusion (a read-only view of the whole filesystem).


def read_file(path: Path) -> str:
    return f"print(open({str(path)!r}).read())\n"


@needs_namespaces
def test_a_unix_socket_in_the_hosts_tmp_is_out_of_reach():
    """A tmux server, an ssh-agent or an X server listens on a socket file in /tmp: connecting to one is an escape."""
    assert_unix_socket_out_of_reach(Path("/tmp"))


def assert_unix_socket_out_of_reach(directory: Path, may_be_read_only: bool = False) -> None:
    """A program cannot connect to a socket listening in the host's `directory`: it sees no such file."""
    path = directory / f"stapo-sandbox-test-{os.getpid()}.sock"
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
    except OSError:
        listener.close()
        if not may_be_read_only:
            raise
        pytest.skip(f"{directory} is not writable here")
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


@needs_namespaces
@pytest.mark.parametrize("place", ["tmp", "home"])
def test_canary_files_of_the_host_are_out_of_reach(place):
    folder = Path("/tmp") if place == "tmp" else Path.home()
    canary = folder / f"stapo-sandbox-canary-{os.getpid()}.txt"
    canary.write_text(SECRET)
    try:
        outputs, _ = run(read_file(canary))
    finally:
        canary.unlink()
    assert outputs[0].status == "error" and "FileNotFoundError" in outputs[0].detail
    assert SECRET not in (outputs[0].value or "")


@needs_namespaces
def test_reading_the_expected_outputs_of_the_sample_problems_earns_nothing():
    """A program that solves nothing but looks its input up in the package's sample problems scored +1 on all six."""
    from stapo_trl.code.data import SAMPLE_FILE
    from stapo_trl.code.reward import code_reward

    cheat = (
        "import json, sys\n"
        "given = sys.stdin.read()\n"
        f"for line in open({str(SAMPLE_FILE)!r}):\n"
        "    tests = json.loads(json.loads(line)['reward_model']['ground_truth'])\n"
        "    for test_input, expected in zip(tests['inputs'], tests['outputs']):\n"
        "        if test_input == given:\n"
        "            print(expected)\n"
        "            sys.exit(0)\n"
    )
    rows = [json.loads(line) for line in SAMPLE_FILE.read_text().splitlines()]
    stdin_rows = [row for row in rows if not json.loads(row["reward_model"]["ground_truth"]).get("fn_name")]
    assert stdin_rows, "the samples hold standard-input problems"
    tests = [row["reward_model"]["ground_truth"] for row in stdin_rows]
    rewards = code_reward([f"```python\n{cheat}```"] * len(tests), tests, executor=LocalSandbox())
    assert rewards == [-1.0] * len(tests)


@needs_namespaces
def test_a_parquet_in_the_hugging_face_cache_is_out_of_reach(tmp_path, monkeypatch):
    """Expected outputs in a cached dataset (Eurus's parquet), read with the pyarrow the trainer has installed."""
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    cache = tmp_path / "huggingface" / "datasets" / "PRIME-RL___eurus-2-rl-data"
    cache.mkdir(parents=True)
    parquet = cache / "train.parquet"
    pandas.DataFrame({"ground_truth": [json.dumps({"inputs": ["1 2\n"], "outputs": [SECRET]})]}).to_parquet(parquet)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "huggingface"))
    program = f"import pyarrow.parquet\nprint(pyarrow.parquet.read_table({str(parquet)!r}).to_pylist())\n"
    outputs, _ = run(program)
    assert outputs[0].status == "error"
    assert SECRET not in (outputs[0].value or "")
    outputs, _ = run(read_file(parquet))  # nor as bytes
    assert outputs[0].status == "error" and "FileNotFoundError" in outputs[0].detail


@needs_namespaces
def test_the_checkout_and_other_installed_packages_are_out_of_reach():
    repository = Path(__file__).resolve().parents[1]
    outputs, _ = run(read_file(repository / "pyproject.toml"))
    assert outputs[0].status == "error" and "FileNotFoundError" in outputs[0].detail
    outputs, _ = run("import torch\n")
    assert outputs[0].status == "error" and "ModuleNotFoundError" in outputs[0].detail


@needs_namespaces
def test_the_standard_library_numpy_multiprocessing_and_a_new_interpreter_work():
    program = (
        "import decimal, multiprocessing, sqlite3, ssl, subprocess, sys, zlib\n"
        "import numpy\n"
        "with multiprocessing.Pool(2) as pool:\n"  # POSIX semaphores in /dev/shm
        "    print(sum(pool.map(abs, range(-3, 4))), int(numpy.arange(4).sum()))\n"
        "print(decimal.Decimal('0.1') + decimal.Decimal('0.2'), zlib.crc32(b'sandbox'), flush=True)\n"
        "subprocess.run([sys.executable, '-c', 'import json; print(json.dumps([1]))'], check=True)\n"
    )
    if importlib.util.find_spec("numpy") is None:
        program = program.replace("import numpy\n", "").replace("int(numpy.arange(4).sum())", "6")
    expected = f"12 6\n0.3 {zlib.crc32(b'sandbox')}\n[1]\n"
    assert run(program, timeout=30.0)[0] == [Output("ok", expected)]


@needs_namespaces
def test_host_kernel_settings_cannot_be_written():
    """As root (uid 0 maps to the host's root) /proc/sys and /proc/sysrq-trigger would otherwise be writable."""
    for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"):
        outputs, _ = run(f"open({path!r}, 'w').close()\nprint('writable')\n")  # opened, nothing written
        assert outputs[0].status == "error", path


# Memory is bounded for the whole program, not per process.

FORKED_ALLOCATIONS = (
    "import os, select, time\n"
    "read_end, write_end = os.pipe()\n"
    "for _ in range(6):\n"
    "    if os.fork() == 0:\n"
    "        os.close(read_end)\n"
    "        try:\n"
    "            block = b'\\x01' * (200 << 20)\n"  # resident: every page written
    "            os.write(write_end, b'%08d' % os.getpid())\n"
    "        finally:\n"
    "            time.sleep(30)\n"
    "os.close(write_end)\n"
    "reported, deadline = b'', time.monotonic() + 8\n"
    "while time.monotonic() < deadline and select.select([read_end], [], [], deadline - time.monotonic())[0]:\n"
    "    chunk = os.read(read_end, 64)\n"
    "    if not chunk:\n"
    "        break\n"
    "    reported += chunk\n"
    "holding = [int(reported[i : i + 8]) for i in range(0, len(reported), 8)]\n"
    "print(sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in holding))\n"  # alive now, its block resident
)


@needs_namespaces
def test_forked_children_share_one_memory_bound():
    """6 children x 200 MiB under a 512 MiB bound: at most 2 hold theirs at once (all 6 did with a bound per process).

    Counted at the end, among the children still alive: one killed for memory may have reported before it died.
    """
    outputs, _ = run(FORKED_ALLOCATIONS, LocalSandbox(memory_bytes=512 << 20), timeout=20.0)
    assert outputs[0].status != "ok" or int(outputs[0].value) <= 2, outputs[0]


@needs_namespaces
def test_memfd_is_refused():
    """memfd pages written with write() belong to no process's address space: no per-process limit sees them."""
    outputs, _ = run("import os\nos.memfd_create('pages')\nprint('created')\n")
    assert outputs[0].status == "error" and "PermissionError" in outputs[0].detail


@needs_namespaces
def test_memfd_secret_and_system_v_shared_memory_are_refused():
    program = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "secret = libc.syscall(447, 0)\n"  # memfd_secret, the same number on x86_64 and aarch64
        "print(secret, ctypes.get_errno() if secret < 0 else 0)\n"
        "segment = libc.shmget(0, 1 << 20, 0o1600)\n"  # IPC_PRIVATE, IPC_CREAT | 0600
        "print(segment, ctypes.get_errno() if segment < 0 else 0)\n"
    )
    outputs, _ = run(program)
    assert outputs[0].status == "ok"
    (secret, secret_errno), (segment, segment_errno) = (
        map(int, line.split()) for line in outputs[0].value.split("\n")[:2]
    )
    assert secret == -1 and secret_errno == errno.EPERM
    assert segment == -1 and segment_errno == errno.ENOSPC


@needs_namespaces
def test_the_sandbox_dies_before_the_trainer():
    outputs, _ = run("print(open('/proc/self/oom_score_adj').read())")
    assert outputs == [Output("ok", "1000\n\n")]


@needs_namespaces
def test_an_inode_flood_stops_early():
    """Empty files cost kernel memory that the tmpfs size does not count: the number of files is bounded."""
    program = (
        "import os\n"
        "count = 0\n"
        "try:\n"
        "    for count in range(200_000):\n"
        "        os.close(os.open(f'/tmp/{count}', os.O_CREAT | os.O_WRONLY))\n"
        "except OSError as error:\n"
        "    print(count, error.errno)\n"
    )
    outputs, _ = run(program, timeout=20.0)
    assert outputs[0].status == "ok"
    created, errno_code = map(int, outputs[0].value.split())
    assert created < 20_000 and errno_code == errno.ENOSPC


def test_16_mib_of_invalid_utf8_costs_bounded_memory():
    """Each invalid byte becomes U+FFFD, 3 bytes of UTF-8 and 2 of a Python string: the cost must stay near the cap.

    Measured peaks of the trainer's Python allocations: 18.5 x the cap when the result was sent as ASCII JSON and
    searched for its end from the start at each read, 12.2 x now (mostly decoding the UTF-8 line).
    """
    cap = 16 << 20
    program = f"import os\nchunk = b'\\xff' * (1 << 20)\nfor _ in range({cap >> 20}):\n    os.write(1, chunk)\n"
    tracemalloc.start()
    try:
        outputs = list(LocalSandbox(max_output_bytes=cap).execute(Job(program, [""], timeout=20.0)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outputs[0].status == "ok" and len(outputs[0].value) == cap and set(outputs[0].value) == {"\ufffd"}
    assert peak < 14 * cap, f"peak {peak / cap:.1f} x the output cap"


FORK_COUNT = (
    "import os, time\n"
    "count = 0\n"
    "for _ in range(100):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "    except OSError:\n"
    "        break\n"
    "    count += 1\n"
    "print(count)\n"
)


@needs_namespaces
def test_without_a_cgroup_root_is_told_the_bound_is_per_process(monkeypatch):
    """RLIMIT_NPROC never binds root: the whole-program bound cannot hold there, and the report says so."""
    monkeypatch.setattr(sandbox_module, "_memory_cgroups", lambda: (None, "none in this test"))
    sandbox = LocalSandbox(memory_bytes=512 << 20)
    report = sandbox.isolation()
    if os.getuid() == 0:
        assert "none in this test" in report["missing"]["memory bound for the whole program"]
    else:
        assert any("memory bound of 536870912 bytes for the whole program" in item for item in report["protections"])
    # Each process gets 512 MiB / PROCESSES_WITHOUT_CGROUP: one 200 MiB block is too much for any of them.
    outputs, _ = run("block = bytearray(200 << 20)\nprint('allocated')\n", sandbox)
    assert outputs[0].status == "error" and "MemoryError" in outputs[0].detail


def unprivileged_python() -> list[str] | None:
    """A command that runs Python with this checkout as uid/gid 65534 (nobody), where this machine allows one."""
    setpriv = shutil.which("setpriv")
    if os.getuid() != 0 or setpriv is None or not NAMESPACES:
        return None
    for interpreter in dict.fromkeys([sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"]):
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", interpreter, "-I", "-c"]
        probe = subprocess.run(  # it can also start itself again, as the sandbox does
            [*command, "import subprocess, sys; subprocess.run([sys.executable, '-c', ''], check=True)"],
            capture_output=True,
            timeout=30,
        )
        if probe.returncode == 0:
            return command
    return None


@pytest.mark.skipif(unprivileged_python() is None, reason="needs root, setpriv and a Python that uid 65534 can run")
def test_without_a_cgroup_an_unprivileged_program_is_bounded_as_a_whole():
    """As an ordinary user (no memory cgroup writable: the fallback) the program has 8 processes of 64 MiB at most."""
    repository = Path(__file__).resolve().parents[1]
    workspace = tempfile.mkdtemp(dir="/tmp", prefix="stapo-sandbox-test-")
    os.chmod(workspace, 0o777)
    trainer = (
        f"import json, sys, tempfile\n"
        f"sys.path.insert(0, {str(repository)!r})\n"
        f"tempfile.tempdir = {workspace!r}\n"
        "from stapo_trl.code.sandbox import Job, LocalSandbox\n"
        "sandbox = LocalSandbox(memory_bytes=512 << 20)\n"
        "results = {'report': sandbox.isolation()}\n"
        "for name, program in json.loads(sys.argv[1]).items():\n"
        "    output = list(sandbox.execute(Job(program, [''], timeout=20.0)))[0]\n"
        "    results[name] = [output.status, output.value, output.detail]\n"
        "print(json.dumps(results))\n"
    )
    programs = json.dumps({"forks": FORK_COUNT, "allocations": FORKED_ALLOCATIONS})
    try:
        completed = subprocess.run(
            [*unprivileged_python(), trainer, programs], capture_output=True, timeout=300, start_new_session=True
        )
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    results = json.loads(completed.stdout.decode().splitlines()[-1])
    assert results["report"]["missing"] == {}, results["report"]
    assert any("for the whole program: 8 processes" in item for item in results["report"]["protections"])
    status, value, _ = results["forks"]
    assert status == "ok" and 0 < int(value) < 8  # the namespace's first process and the program count too
    status, value, _ = results["allocations"]
    assert status != "ok" or int(value) == 0  # no process may hold 200 MiB


def test_memory_cgroups_left_by_a_killed_trainer_are_removed():
    parent_limit_file, reason = sandbox_module._memory_cgroups()
    if parent_limit_file is None:
        pytest.skip(f"no memory cgroup can be made here: {reason}")
    killed_trainer = subprocess.Popen(["true"])
    killed_trainer.wait()
    leftover = Path(parent_limit_file).parent / f"stapo-sandbox-{killed_trainer.pid}-0"
    live_trainers = Path(parent_limit_file).parent / f"stapo-sandbox-{os.getpid()}-test"  # made, not yet joined
    leftover.mkdir()
    live_trainers.mkdir()
    try:
        sandbox_module._memory_cgroups.cache_clear()
        assert sandbox_module._memory_cgroups() == (parent_limit_file, "")
        assert not leftover.exists()
        assert live_trainers.exists()
    finally:
        for directory in (leftover, live_trainers):
            if directory.exists():
                directory.rmdir()
