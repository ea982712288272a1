"""A run directory on disk: the samples appended as they are graded, the run's plan, written so nothing is lost; and
the rule by which a run resumes in it.

- ``samples.jsonl``: one JSON record per line, appended and flushed batch by batch; a sample is named by
  ``(benchmark, preset, problem_id, sample_index)`` and the last record written for it wins, so updating a sample
  (a verifier verdict, a retried generation) is one more line, and an interrupted run loses at most a torn line.
  A line that is not a record of the right types (`SAMPLE_FIELDS`) is skipped with a warning naming it.
- ``run.json``: the model, the settings the samples depend on and the plan; replaced atomically (written to a
  temporary file, then renamed), so a crash leaves the old or the new file, never half of one.

Resuming (`check_resumable`, `finished_samples`): a run goes on in a directory whose ``run.json`` records the same
settings (model, ``max_new_tokens``, seed and the task's own), and is refused in one that records others unless it
overwrites them. A sample is finished when its latest record was generated with the preset's decoding (temperature,
top-p) and, when errors are retried, holds no error; every other sample of the plan is generated (again).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .presets import Preset


logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
RUN_FILE = "run.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

SampleKey = tuple[str, str, str, int]


# The JSON types of a sample record's fields; the first four name the sample and are required, the others may be
# absent. Other fields are kept as they are.
SAMPLE_FIELDS: dict[str, tuple[type | None, ...]] = {
    "benchmark": (str,),
    "preset": (str,),
    "problem_id": (str, int),
    "sample_index": (int,),
    "completion": (str, None),
    "extracted_answer": (str, None),
    "correct": (bool, None),
    "grading": (str, None),
    "num_tokens": (int, None),
    "finish_reason": (str, None),
    "temperature": (float,),
    "top_p": (float,),
    "error": (str, None),
    "verifier_verdict": (str, None),
}
_REQUIRED = ("benchmark", "preset", "problem_id", "sample_index")
_NON_NEGATIVE = ("sample_index", "num_tokens")
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true/false", None: "null"}


def sample_key(record: Mapping[str, Any]) -> SampleKey:
    """What names a sample: (benchmark, preset, problem id, sample index)."""
    return (record["benchmark"], record["preset"], str(record["problem_id"]), record["sample_index"])


def record_problem(record: Any) -> str | None:
    """What is wrong with a sample record's types, or None: a missing name field, a field of another JSON type
    (``"correct": "false"``, a float ``sample_index``), a negative index or token count."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for field in _REQUIRED:
        if field not in record:
            return f'no "{field}"'
    for field, allowed in SAMPLE_FIELDS.items():
        if field in record and not _has_type(record[field], allowed):
            expected = " or ".join(_TYPE_NAMES[kind] for kind in allowed)
            return f'"{field}" is {json.dumps(record[field])[:40]}, not {expected}'
    for field in _NON_NEGATIVE:
        if (record.get(field) or 0) < 0:
            return f'"{field}" is {record[field]}, not >= 0'
    return None


def _has_type(value: Any, allowed: tuple[type | None, ...]) -> bool:
    if value is None:
        return None in allowed
    if isinstance(value, bool):  # JSON true/false, which Python's int would also accept
        return bool in allowed
    if isinstance(value, int):  # a whole number is a number too
        return int in allowed or float in allowed
    return any(kind is not None and isinstance(value, kind) for kind in allowed)


def read_samples(path: str | os.PathLike, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a samples file, in order; a torn (half-written) line, or a record of wrong types
    (`record_problem`), is skipped with a warning naming its line.

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
        except ValueError:
            logger.warning("%s: line %d is not a sample record (not JSON); skipped", path, number)
            continue
        problem = record_problem(record)
        if problem is not None:
            logger.warning("%s: line %d is not a sample record (%s); skipped", path, number, problem)
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


def check_resumable(output_dir: str | os.PathLike, settings: Mapping[str, Any], overwrite: bool) -> None:
    """Refuse to add samples generated with `settings` to a directory whose samples were generated with others
    (unless `overwrite`, which discards them); `ValueError` naming the settings that differ."""
    output_dir = Path(output_dir)
    if overwrite or not (output_dir / SAMPLES_FILE).is_file():
        return
    previous = read_run(output_dir).get("settings", {})
    different = {key: (previous.get(key), value) for key, value in settings.items() if previous.get(key) != value}
    if different:
        details = ", ".join(f"{key}: {old!r} there, {new!r} now" for key, (old, new) in different.items())
        raise ValueError(
            f"{output_dir} holds samples of another run ({details}). Use another output directory, or overwrite it."
        )


def is_finished(record: Mapping[str, Any], preset: Preset, retry_errors: bool) -> bool:
    """Whether a stored record is a finished sample of `preset`: generated with its decoding and, when errors are
    retried, without an error."""
    same_decoding = record.get("temperature") == preset.temperature and record.get("top_p") == preset.top_p
    return same_decoding and not (retry_errors and record.get("error"))


def finished_samples(
    output_dir: str | os.PathLike, presets: Sequence[Preset], retry_errors: bool
) -> dict[SampleKey, dict[str, Any]]:
    """The samples of `output_dir` a resumed run keeps, by name: the latest record of each, when it is finished
    (`is_finished`) for its preset. Repairs a torn last line first, since the run appends after it."""
    by_name = {preset.name: preset for preset in presets}
    return {
        key: record
        for key, record in latest(read_samples(Path(output_dir) / SAMPLES_FILE, repair=True)).items()
        if key[1] in by_name and is_finished(record, by_name[key[1]], retry_errors)
    }
