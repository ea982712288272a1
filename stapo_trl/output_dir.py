"""A run's output directory: never mix two runs in it, find the checkpoint to resume, check it can be written.

Everything here runs before a model is loaded, so a wrong directory costs seconds rather than a model load and a
held-out evaluation. A checkpoint is *complete* when it holds `trainer_state.json`: `Trainer._save_checkpoint`
writes that file last, so a save cut short (a kill, a full disk) leaves a folder without it.
"""

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path


CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
TRAINER_STATE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME
RESUME_LATEST = ("true", "latest")
_PROBE_PREFIX = ".stapo-write-check-"  # the writability probe; ignored when looking for an earlier run


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
    return sorted(entry.name for entry in folder.iterdir() if not entry.name.startswith(_PROBE_PREFIX))


def prepare_output_dir(
    output_dir: str | os.PathLike, resume_from_checkpoint: str | None, overwrite: bool, is_main_process: bool = True
) -> str | None:
    """Check `output_dir` before training and return the checkpoint to resume from (None: start fresh).

    A non-empty `output_dir` is refused unless the run resumes (`resume_from_checkpoint`: a path, or `true`/`latest`
    for its last complete checkpoint) or `overwrite` is set; then its `checkpoint-*` folders are deleted first (on
    the main process), so that the new run's checkpoint rotation cannot mix them with its own. Raises `ValueError`
    naming the flag that fixes the problem.
    """
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
