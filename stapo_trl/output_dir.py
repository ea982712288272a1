"""A run's output directory: one run at a time in it, never mixed with an earlier run, the checkpoint to resume,
checked to be writable.

Everything here runs before a model is loaded, so a wrong directory costs seconds rather than a model load and a
held-out evaluation. A checkpoint is *complete* when it holds `trainer_state.json`: `Trainer._save_checkpoint`
writes that file last, so a save cut short (a kill, a full disk) leaves a folder without it.

A run holds its directory for its whole life (`hold_output_dir`): a lock file, `LOCK_FILE`, that names the process
(pid, host, start time) and that the process keeps locked (``flock``) until it exits. The kernel drops the lock when
the process dies, however it dies, so a lock file nobody holds locked is the stale trace of a run that ended.
"""

import atexit
import datetime
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path


CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
TRAINER_STATE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME
RESUME_LATEST = ("true", "latest")
_PROBE_PREFIX = ".stapo-write-check-"  # the writability probe; ignored when looking for an earlier run
# Held by the run using the directory; ignored when looking for an earlier run. Trainer.push_to_hub uploads the
# directory without its files named _*: pid and host stay on the machine.
LOCK_FILE = "_stapo-run.lock"

logger = logging.getLogger(__name__)


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of `output_dir`, by step."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if path.is_dir() and CHECKPOINT_PATTERN.match(path.name)]
    return sorted(found, key=lambda path: int(CHECKPOINT_PATTERN.match(path.name).group(1)))


def is_complete(checkpoint: str | os.PathLike) -> bool:
    """Whether a checkpoint folder was saved to the end (its trainer state exists and parses)."""
    try:
        json.loads((Path(checkpoint) / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    complete = [path for path in checkpoints(output_dir) if is_complete(path)]
    return complete[-1] if complete else None


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str | os.PathLike) -> str | None:
    """The checkpoint to resume from: a path as given (checked), or for `true`/`latest` the last complete one."""
    if resume_from_checkpoint is None:
        return None
    if str(resume_from_checkpoint).lower() in RESUME_LATEST:
        latest = last_complete_checkpoint(output_dir)
        if latest is None:
            raise ValueError(
                f"--resume_from_checkpoint {resume_from_checkpoint}: no complete checkpoint in '{output_dir}' (a "
                f"complete one holds {TRAINER_STATE}). Start over with --overwrite_output_dir true, or pass the "
                "right --output_dir."
            )
        return str(latest)
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise ValueError(f"--resume_from_checkpoint {resume_from_checkpoint}: no such directory.")
    if not is_complete(path):
        latest = last_complete_checkpoint(path.parent)
        hint = f" The last complete one is '{latest}'." if latest else ""
        raise ValueError(
            f"--resume_from_checkpoint {resume_from_checkpoint}: incomplete checkpoint (no {TRAINER_STATE}: its save "
            f"was cut short).{hint}"
        )
    return str(path)


def earlier_run(output_dir: str | os.PathLike) -> list[str]:
    """Names of the entries of `output_dir` (empty when it does not exist or is empty)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if not entry.name.startswith(_PROBE_PREFIX) and entry.name != LOCK_FILE
    )


def prepare_output_dir(
    output_dir: str | os.PathLike, resume_from_checkpoint: str | None, overwrite: bool, is_main_process: bool = True
) -> str | None:
    """Check `output_dir` before training and return the checkpoint to resume from (None: start fresh).

    The main process first takes hold of `output_dir` for the rest of its life (`hold_output_dir`), so that a second
    run started on it is refused before it reads or deletes anything. A non-empty `output_dir` is refused unless the
    run resumes (`resume_from_checkpoint`: a path, or `true`/`latest` for its last complete checkpoint) or
    `overwrite` is set; then its `checkpoint-*` folders are deleted first (on the main process), so that the new
    run's checkpoint rotation cannot mix them with its own. Raises `ValueError` naming the flag that fixes the
    problem.
    """
    if is_main_process:
        hold_output_dir(output_dir)
    resume = resolve_resume(resume_from_checkpoint, output_dir)
    entries = earlier_run(output_dir)
    if entries and resume is None:
        if not overwrite:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise ValueError(
                f"--output_dir '{output_dir}' already holds files ({shown}). Pass --resume_from_checkpoint latest "
                "to continue that run, --overwrite_output_dir true to start over in it (its checkpoints are "
                "deleted), or another --output_dir."
            )
        if is_main_process:
            for checkpoint in checkpoints(output_dir):
                shutil.rmtree(checkpoint)
    check_writable(output_dir)
    return resume


def check_writable(output_dir: str | os.PathLike) -> None:
    """Create `output_dir` if needed and write a file in it, or raise `ValueError` saying why."""
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=_PROBE_PREFIX):
            pass
    except OSError as error:
        raise ValueError(
            f"--output_dir '{output_dir}' is not writable ({error.strerror or error}); choose another --output_dir."
        ) from None


def describe_save_failure(checkpoint: str | os.PathLike, error: BaseException) -> str:
    """One message for a failed checkpoint save: which folder, why (disk full, permission, ...), what to do."""
    reason = f"{type(error).__name__}: {error}"
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        reason = f"the file system refused to write more: {error.strerror}"
    elif isinstance(error, PermissionError):
        reason = f"permission denied: {error.filename or error}"
    try:
        free = shutil.disk_usage(Path(checkpoint).parent).free
        reason += f"; {free / 2**30:.2f} GiB free there"
    except OSError:
        pass
    return (
        f"Saving the checkpoint '{checkpoint}' failed ({reason}). The partial folder was removed, so it cannot be "
        "mistaken for a checkpoint; free space (or fix the permission) and rerun with --resume_from_checkpoint latest "
        "to continue from the last complete checkpoint."
    )


# ---- the lock of the run using the directory ----------------------------------------------------------------------

_held: dict[Path, tuple[int, int]] = {}  # output directory -> (pid, lock file descriptor) held by this process


def hold_output_dir(output_dir: str | os.PathLike) -> None:
    """Hold `output_dir` for this process until it exits, or raise `ValueError` when a live run holds it.

    Writes `LOCK_FILE` (pid, host, start time) in `output_dir` (created if needed) and keeps it locked with ``flock``;
    at exit the file is removed, and when the process dies without that, the kernel drops the lock all the same. A
    lock file that nobody holds locked is left by a run that has ended: it is taken over, with a warning naming that
    run. On a file system without ``flock``, the recorded pid and host tell instead (a pid on another host cannot be
    checked, so it counts as live). Holding a directory this process already holds does nothing.
    """
    folder = Path(os.path.realpath(output_dir))
    if _held.get(folder, (None,))[0] == os.getpid():
        return
    existed = folder.is_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        descriptor, stale_holder = _lock(folder / LOCK_FILE)
    except OSError as error:
        raise ValueError(
            f"--output_dir '{output_dir}' is not writable ({error.strerror or error}); choose another --output_dir."
        ) from None
    if stale_holder is not None:
        logger.warning(
            "--output_dir '%s': taking over the lock left by a run that has ended (%s).",
            output_dir,
            _describe(stale_holder),
        )
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)
    _held[folder] = (os.getpid(), descriptor)
    atexit.register(_release, folder, remove_folder=not existed)


def _lock(path: Path) -> tuple[int, dict | None]:
    """Lock `path` (created if needed) for this process: its descriptor and, when the file recorded a run that has
    ended, that run. Raises `ValueError` when a live run holds it."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _in_use(path, _read_holder(descriptor), checked=True) from None
            except OSError as error:  # no flock on this file system: the recorded pid and host tell
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                holder = _read_holder(descriptor)
                if holder is not None and _may_be_alive(holder):
                    raise _in_use(path, holder, checked=False) from None
            try:
                same_file = os.path.samestat(os.fstat(descriptor), os.stat(path))
            except FileNotFoundError:
                same_file = False
            if same_file:  # not the file of a run that removed it (ending) while we waited for its lock
                return descriptor, _read_holder(descriptor)
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)


def _read_holder(descriptor: int) -> dict | None:
    """The run a lock file records, or None when it is empty or unreadable (a run cut short while writing it)."""
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0))
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _may_be_alive(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid")), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True
    return True


def _describe(holder: dict | None) -> str:
    if holder is None:
        return "its pid and host are not recorded"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"


def _in_use(path: Path, holder: dict | None, checked: bool) -> ValueError:
    """The refusal of a second run; `checked`: the lock is held (else only the recorded pid and host tell)."""
    hint = "" if checked else f" If that run has ended, delete {path}."
    return ValueError(
        f"--output_dir '{path.parent}' is in use by a run that is still going ({_describe(holder)}): two runs in one "
        f"folder would overwrite each other's checkpoints. Wait for it to end, or choose another --output_dir.{hint}"
    )


def _release(folder: Path, remove_folder: bool) -> None:
    """Remove this process's lock file of `folder` (then the folder, if the lock created it and it is still empty)."""
    pid, descriptor = _held.get(folder, (None, None))
    if pid != os.getpid():  # a forked child inherited the table, not the lock
        return
    del _held[folder]
    path = folder / LOCK_FILE
    try:
        if os.path.samestat(os.fstat(descriptor), os.stat(path)):
            path.unlink()
        if remove_folder:
            folder.rmdir()
    except OSError:
        pass
    os.close(descriptor)
