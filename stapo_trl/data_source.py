"""A data source, one notion for the math and code loaders and the command line: a local file, a directory of
files (searched recursively, hidden folders skipped), or a Hugging Face Hub dataset id.

Local files are parquet, JSON lines or JSON (a list of records, or ``{"<name>": [records]}``), read with
`datasets.load_dataset`; text that is not UTF-8 or a line that is not JSON is a `ValueError` naming the file (and the
line). A source is a Hub id only when no such local path exists and it reads ``owner/name`` without a data file
suffix, so a mistyped local file is reported as missing rather than looked up on the Hub.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import datasets
import pyarrow as pa
from datasets import Dataset


LOCAL_SUFFIXES = (".parquet", ".jsonl", ".json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(source: str | os.PathLike) -> bool:
    """A source is a Hub id when no such local path exists and it looks like ``owner/name`` (no file suffix)."""
    if os.path.exists(source) or not isinstance(source, str):
        return False
    return bool(HUB_ID.match(source)) and not source.lower().endswith(LOCAL_SUFFIXES)


def local_files(path: str | os.PathLike, suffixes: tuple[str, ...]) -> list[Path]:
    """Return the data files at `path` (a file, or a directory searched recursively), checking they exist."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: '{path}'")
    if path.is_dir():
        files = sorted(
            file
            for file in path.rglob("*")
            if file.is_file()
            and file.name.lower().endswith(suffixes)
            and not any(part.startswith(".") for part in file.relative_to(path).parts)
        )
        if not files:
            raise FileNotFoundError(f"no {' / '.join(suffixes)} files under the directory '{path}'")
        return files
    if not path.name.lower().endswith(suffixes):
        raise ValueError(f"'{path}': unsupported file type; expected one of {', '.join(suffixes)}")
    return [path]


def read_local(file: Path) -> Dataset:
    """Read one parquet, JSON-lines or JSON file (a list of records, or ``{"<name>": [records]}``)."""
    builder = "parquet" if file.suffix.lower() == ".parquet" else "json"
    try:
        dataset = datasets.load_dataset(builder, data_files=str(file), split="train")
        if builder == "json" and dataset.num_rows == 1 and len(dataset.column_names) == 1:
            (name,) = dataset.column_names
            if isinstance(dataset[0][name], list):  # {"data": [...]}: the records are in that field
                dataset = datasets.load_dataset("json", data_files=str(file), field=name, split="train")
        if builder == "json":
            dataset.data.validate(full=True)  # Arrow reads JSON text without checking that it is UTF-8
    except (UnicodeDecodeError, pa.ArrowInvalid) as error:
        raise ValueError(f"'{file}': not UTF-8 text ({error}); save the file as UTF-8") from None
    except datasets.exceptions.DatasetGenerationError as error:
        raise ValueError(f"'{file}': {_json_problem(file) or error.__cause__ or error}") from None
    return dataset


def _json_problem(file: Path) -> str | None:
    """The first line of a JSON-lines file that is not valid JSON, described (None when every line parses)."""
    if file.suffix.lower() == ".parquet":
        return None
    try:
        with open(file, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                try:
                    if line.strip():
                        json.loads(line)
                except json.JSONDecodeError as error:
                    return f"line {number} is not valid JSON: {error}"
    except UnicodeDecodeError as error:
        return f"not UTF-8 text ({error}); save the file as UTF-8"
    return None


def read_hub(hub_id: str, split: str) -> Dataset:
    """Load one split of a Hub dataset."""
    try:
        return datasets.load_dataset(hub_id, split=split)
    except Exception as error:
        raise OSError(
            f"'{hub_id}' is not a local file or directory, and loading it as a Hugging Face Hub dataset "
            f"(split {split!r}) failed: {type(error).__name__}: {error}. Pass a local path, or check the id, the "
            "split and the network (HF_HUB_OFFLINE)."
        ) from error
