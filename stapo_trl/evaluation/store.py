"""A run directory on disk: the samples appended as they are graded, the run's plan, written so nothing is lost.

- ``samples.jsonl``: one JSON record per line, appended and flushed batch by batch; a sample is named by
  ``(benchmark, preset, problem_id, sample_index)`` and the last record written for it wins, so updating a sample
  (a verifier verdict, a retried generation) is one more line, and an interrupted run loses at most a torn line.
- ``run.json``: the model, the settings the samples depend on and the plan; replaced atomically (written to a
  temporary file, then renamed), so a crash leaves the old or the new file, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
RUN_FILE = "run.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

SampleKey = tuple[str, str, str, int]


def sample_key(record: Mapping[str, Any]) -> SampleKey:
    """What names a sample: (benchmark, preset, problem id, sample index)."""
    return (
        record["benchmark"],
        record["preset"],
        str(record["problem_id"]),
        int(record["sample_index"]),
    )


def read_samples(path: str | os.PathLike, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a samples file, in order; a torn (half-written) line is skipped with a warning.

    With `repair`, a torn last line is cut off the file (or completed with its newline when it is whole JSON), so
    that the next append starts on a fresh line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    if repair and data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
            with open(path, "ab") as file:
                file.write(b"\n")
        except ValueError:
            logger.warning(
                "%s: dropping a half-written last line (%d bytes)",
                path,
                len(data) - cut,
            )
            with open(path, "r+b") as file:
                file.truncate(cut)
            data = data[:cut]
    records = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            sample_key(record)
        except (ValueError, KeyError, TypeError):
            logger.warning("%s: line %d is not a sample record; skipped", path, number)
            continue
        records.append(record)
    return records


def latest(records: Iterable[dict[str, Any]]) -> dict[SampleKey, dict[str, Any]]:
    """One record per sample: the last one written."""
    return {sample_key(record): record for record in records}


def append_records(file, records: Iterable[Mapping[str, Any]]) -> None:
    """Append records to an open samples file and make them durable before returning."""
    file.write("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    file.flush()
    os.fsync(file.fileno())


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` in one step: a reader (or a crash) sees the old file or the new one."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def write_samples(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
    """Rewrite a samples file (one record per sample), atomically."""
    write_atomic(
        path,
        "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records),
    )


def write_run(output_dir: str | os.PathLike, run: Mapping[str, Any]) -> None:
    write_atomic(Path(output_dir) / RUN_FILE, json.dumps(run, indent=2, ensure_ascii=False))


def read_run(output_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's ``run.json``, with an error that says what to do when it is missing or damaged."""
    path = Path(output_dir) / RUN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {output_dir} is not an evaluation run directory")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
        run["plan"], run["settings"], run["model_name"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is damaged ({type(error).__name__}: {error}), so the settings of the samples in {SAMPLES_FILE} "
            "cannot be checked. Restore the file, or evaluate into another output directory (overwrite, "
            "--overwrite, discards these samples)."
        ) from None
    return run
