"""Math datasets as TRL "conversational prompt" datasets.

Every loader returns a `datasets.Dataset` with one row per problem and the columns

- ``prompt``: ``[{"role": "user", "content": "<problem> " + MATH_INSTRUCTION}]`` (see `math_prompt`),
- ``solution``: the gold answer as a string (integers become strings, a ``\\boxed{...}`` wrapper is removed),
- ``problem``: the bare problem text,
- ``data_source``: where the row comes from (the source's ``data_source`` column, or the file / Hub id name),
- ``id``: a row identifier (``extra_info.index`` where the source has one, else ``"<data_source>-<row>"``).

TRL's `GRPOTrainer` hands the extra columns to the reward functions, so ``solution`` reaches `math_reward`.

Three loaders share one validation and prompt-building path (`_build_dataset`):

- `load_dapo_math`: DAPO-Math-17K (veRL layout, Hub id or local copy): removes DAPO's own answer-format
  wrapper from the prompt, appends the paper's instruction and de-duplicates (the Hub copy repeats each
  problem about 100 times).
- `load_verl_parquet`: veRL-layout parquet files, such as the math benchmarks (AIME24, MATH-500, ...).
- `load_math_dataset`: any jsonl / json / parquet file or Hub dataset with configurable (dotted) field names.

Rows with a missing, empty or wrongly typed problem or answer raise a `ValueError` naming the source, the row
and the field; pass ``drop_invalid=True`` to drop them instead (the count is logged as a warning).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets import Dataset

logger = logging.getLogger(__name__)

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The instruction the STAPO paper appends to every math problem (training and evaluation)."""

DAPO_MATH_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"

# DAPO-Math-17K wraps each problem as
# "<DAPO_PREFIX_MARKER> ... Answer: $Answer ...\n\n{problem}<DAPO_SUFFIX_MARKER> ...".
DAPO_PREFIX_MARKER = "Solve the following math problem"
DAPO_SUFFIX_MARKER = "\n\nRemember to put your answer"

LOCAL_SUFFIXES = (".parquet", ".jsonl", ".json")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DROP_HINT = "pass drop_invalid=True to drop such rows"


def math_prompt(problem: str) -> list[dict[str, str]]:
    """Return the chat prompt for `problem`: one user message, ``f"{problem} {MATH_INSTRUCTION}"``."""
    return [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}]


def strip_dapo_wrapper(content: str) -> str:
    """Return the bare problem inside a DAPO-Math-17K prompt.

    DAPO's prompt reads "Solve the following math problem step by step. The last line ... Answer: $Answer
    ...\\n\\n{problem}\\n\\nRemember to put your answer on its own line after "Answer:".". The prefix (from
    "Solve the following math problem" to the first blank line) and the suffix (from the last
    "\\n\\nRemember to put your answer") are removed where present; text without them is only stripped of
    surrounding whitespace.
    """
    text = content.strip()
    if text.startswith(DAPO_PREFIX_MARKER):
        blank = text.find("\n\n")
        if blank >= 0:
            text = text[blank + 2 :]
    suffix = text.rfind(DAPO_SUFFIX_MARKER)
    if suffix >= 0:
        text = text[:suffix]
    return text.strip()


def unwrap_boxed(answer: str) -> str:
    """Return `answer` without an enclosing ``\\boxed{...}`` (``"\\boxed{204}"`` -> ``"204"``).

    Only a box spanning the whole (stripped) string is removed, so ``"\\boxed{1}+\\boxed{2}"`` is kept as is;
    escaped braces (``\\{``, ``\\}``) inside the box do not count as grouping braces.
    """
    text = answer.strip()
    while text.startswith("\\boxed{") and _closing_brace(text, len("\\boxed{") - 1) == len(text) - 1:
        text = text[len("\\boxed{") : -1].strip()
    return text


def load_dapo_math(
    source: str | os.PathLike = DAPO_MATH_HUB_ID,
    split: str = "train",
    *,
    drop_invalid: bool = False,
    deduplicate: bool = True,
) -> Dataset:
    """Load DAPO-Math-17K as a prompt dataset with the paper's instruction.

    Args:
        source: a Hub dataset id (default: the BytedTsinghua-SIA copy) or a local ``.parquet`` / ``.jsonl`` /
            ``.json`` file, or a directory holding such files (searched recursively), in DAPO's veRL layout:
            ``prompt`` (one user message wrapping the problem in DAPO's answer-format instructions),
            ``reward_model.ground_truth`` (the answer), ``data_source``, ``extra_info.index``.
        split: the split to load from the Hub (ignored for local files).
        drop_invalid: drop rows with a missing, empty or wrongly typed problem or answer (and log their count)
            instead of raising a `ValueError`.
        deduplicate: keep only the first occurrence of each (problem, answer) pair. The Hub copy repeats each
            of its ~17.9k problems about 100 times (1.79M rows); the number of dropped rows is logged.

    DAPO's wrapper is removed with `strip_dapo_wrapper` and the prompt rebuilt with `math_prompt`.
    """
    return _load(
        [source],
        _DAPO_LAYOUT,
        split=split,
        suffixes=LOCAL_SUFFIXES,
        allow_hub=True,
        drop_invalid=drop_invalid,
        deduplicate=deduplicate,
    )


def load_verl_parquet(
    path_or_paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    drop_invalid: bool = False,
    deduplicate: bool = False,
) -> Dataset:
    """Load veRL-layout parquet files (for example the math benchmarks) as one prompt dataset.

    Args:
        path_or_paths: a parquet file, a directory of parquet files (searched recursively), or a sequence of
            them; the rows of all files are concatenated in the given (for directories: sorted) order.
        drop_invalid: drop invalid rows (and log their count) instead of raising a `ValueError`.
        deduplicate: keep only the first occurrence of each (problem, answer) pair across all files.

    The veRL layout: ``prompt`` is a list of one ``{"role": "user", "content": <problem>}`` message,
    ``reward_model.ground_truth`` the answer (a ``\\boxed{...}`` wrapper, as in AIME24, is removed),
    ``data_source`` names the benchmark (kept in the ``data_source`` column, so mixed files stay
    distinguishable) and ``extra_info.index`` identifies the row (kept as ``id`` where present).
    """
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    return _load(
        paths,
        _VERL_LAYOUT,
        split="train",
        suffixes=(".parquet",),
        allow_hub=False,
        drop_invalid=drop_invalid,
        deduplicate=deduplicate,
    )


def load_math_dataset(
    path: str | os.PathLike,
    problem_field: str = "problem",
    answer_field: str = "answer",
    *,
    split: str = "train",
    id_field: str | None = None,
    data_source: str | None = None,
    drop_invalid: bool = False,
    deduplicate: bool = False,
) -> Dataset:
    """Load a math dataset with configurable field names as a prompt dataset.

    Args:
        path: a local ``.jsonl`` / ``.json`` / ``.parquet`` file, a directory holding such files (searched
            recursively), or a Hub dataset id (used when no such local path exists).
        problem_field: the field holding the problem text; dotted paths reach into nested records and lists,
            e.g. ``"prompt.0.content"``.
        answer_field: the field holding the gold answer (a string or a number), e.g.
            ``"reward_model.ground_truth"``.
        split: the split to load from the Hub (ignored for local files).
        id_field: a field to use as the ``id`` column (default: ``"<data_source>-<row>"``).
        data_source: the ``data_source`` value of every row (default: the source's ``data_source`` column
            where it has one, else the file name without extension or the Hub id).
        drop_invalid: drop invalid rows (and log their count) instead of raising a `ValueError`.
        deduplicate: keep only the first occurrence of each (problem, answer) pair.
    """
    layout = _Layout(
        problem_field=problem_field,
        answer_field=answer_field,
        id_field=id_field,
        id_required=id_field is not None,
        data_source=data_source,
    )
    return _load(
        [path],
        layout,
        split=split,
        suffixes=LOCAL_SUFFIXES,
        allow_hub=True,
        drop_invalid=drop_invalid,
        deduplicate=deduplicate,
    )


# --------------------------------------------------------------------------------------------------------------
# Layouts and reading sources


@dataclass(frozen=True)
class _Layout:
    """Where a source keeps the fields of a row, and how its problem text is cleaned."""

    problem_field: str
    answer_field: str
    chat_prompt: bool = False  # problem_field holds a veRL chat prompt: a list of one user message
    id_field: str | None = None
    id_required: bool = False  # a missing id column is an error (else ids fall back to "<data_source>-<row>")
    data_source: str | None = None  # one data_source for every row (else the data_source column / source name)
    clean_problem: Callable[[str], str] = str.strip
    missing_column_fix: str | None = None  # the advice when a column is missing (default: set the parameter)


_VERL_LAYOUT = _Layout(
    problem_field="prompt",
    answer_field="reward_model.ground_truth",
    chat_prompt=True,
    id_field="extra_info.index",
    missing_column_fix="This loader expects the veRL layout (prompt, reward_model.ground_truth); for another "
    "layout use load_math_dataset(path, problem_field=..., answer_field=...)",
)
_DAPO_LAYOUT = replace(_VERL_LAYOUT, clean_problem=strip_dapo_wrapper)


def _load(
    sources: Sequence[str | os.PathLike],
    layout: _Layout,
    *,
    split: str,
    suffixes: tuple[str, ...],
    allow_hub: bool,
    drop_invalid: bool,
    deduplicate: bool,
) -> Dataset:
    """Read local paths (or Hub ids) in `layout` and build one prompt dataset: the body of every public loader.

    Every local path is checked before anything is read.
    """
    readers: list[tuple[Callable[[], pa.Table | list[Any]], str, str]] = []  # (read, label, default data source)
    for source in sources:
        if allow_hub and _is_hub_id(source):
            readers.append((partial(_read_hub, str(source), split), f"{source} (split {split!r})", str(source)))
        else:
            files = _local_files(source, suffixes)
            readers.extend((partial(_read_local, file), str(file), file.stem) for file in files)
    parts = [
        _extract(read(), label, layout, default_data_source=default, prededuplicate=deduplicate)
        for read, label, default in readers
    ]
    return _build_dataset(parts, layout, drop_invalid=drop_invalid, deduplicate=deduplicate)


def _is_hub_id(source: str | os.PathLike) -> bool:
    """A source is a Hub id when no such local path exists and it looks like ``owner/name`` (no file suffix)."""
    if os.path.exists(source) or not isinstance(source, str):
        return False
    return bool(_HUB_ID.match(source)) and not source.lower().endswith(LOCAL_SUFFIXES)


def _local_files(path: str | os.PathLike, suffixes: tuple[str, ...]) -> list[Path]:
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


def _read_local(file: Path) -> pa.Table | list[Any]:
    """Read a parquet file as an Arrow table, a json / jsonl file as a list of records (types kept as written)."""
    if file.name.lower().endswith(".parquet"):
        return pq.read_table(file)
    text = file.read_text(encoding="utf-8")
    if file.name.lower().endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            if not error.msg.startswith("Extra data"):  # anything but JSON lines stored as .json
                raise ValueError(f"'{file}': not valid JSON: {error}") from None
        else:
            if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
                data = next(iter(data.values()))  # {"data": [...]}
            if not isinstance(data, list):
                raise ValueError(
                    f"'{file}': expected a JSON list of records (or JSON lines), got {type(data).__name__}"
                )
            return data
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"'{file}': line {number} is not valid JSON: {error}") from None
    return records


def _read_hub(hub_id: str, split: str) -> pa.Table:
    """Load one split of a Hub dataset as an Arrow table."""
    try:
        dataset = datasets.load_dataset(hub_id, split=split)
    except Exception as error:
        raise OSError(
            f"'{hub_id}' is not a local file or directory, and loading it as a Hugging Face Hub dataset "
            f"(split {split!r}) failed: {type(error).__name__}: {error}. Pass a local path, or check the id, the "
            "split and the network (HF_HUB_OFFLINE)."
        ) from error
    return dataset.with_format("arrow")[:]


# --------------------------------------------------------------------------------------------------------------
# Extracting the fields of every row


@dataclass
class _Extracted:
    """The raw fields of one source, after the optional pre-pass over exact duplicates."""

    label: str  # names the source in messages
    problems: list  # raw problem values (None where missing)
    answers: list  # raw answer values (None where missing)
    data_sources: list
    ids: list
    rows: list[int]  # row index in the source of each entry
    counts: list[int]  # how many source rows each entry stands for (identical raw problem and answer)
    problem_issue: Callable[[int], str | None]  # why a row's problem is unusable beyond "missing", if known


def _extract(
    data: pa.Table | list[Any],
    label: str,
    layout: _Layout,
    *,
    default_data_source: str,
    prededuplicate: bool,
) -> _Extracted:
    """Pull the problem, answer, data source and id of every row out of a table or list of records.

    With `prededuplicate`, rows repeating an earlier row's raw problem and answer are collapsed into it
    (vectorised, for the 1.79M-row DAPO copy); `counts` keeps how many rows each entry stands for.
    """
    columns = _column_names(data)
    required = [("problem_field", layout.problem_field), ("answer_field", layout.answer_field)]
    if layout.id_required:
        required.append(("id_field", layout.id_field))
    for parameter, field in required:
        if field.split(".")[0] not in columns:
            fix = layout.missing_column_fix or (
                f"Set {parameter} to the field that holds it (dotted paths reach nested fields)"
            )
            raise ValueError(
                f"{label}: no column {field.split('.')[0]!r} (for {parameter}={field!r}); "
                f"available columns: {sorted(columns)}. {fix}."
            )
    num_rows = data.num_rows if isinstance(data, pa.Table) else len(data)

    bad_prompt_rows: set[int] = set()
    if layout.chat_prompt:
        problems, bad_prompt_rows = _chat_content(data, layout.problem_field)
    else:
        problems = _field(data, layout.problem_field)
    answers = _field(data, layout.answer_field)
    has_ids = layout.id_field is not None and layout.id_field.split(".")[0] in columns
    ids = _field(data, layout.id_field) if has_ids else None
    data_sources = _field(data, "data_source") if layout.data_source is None and "data_source" in columns else None

    rows = list(range(num_rows))
    counts = [1] * num_rows
    if prededuplicate and isinstance(problems, pa.ChunkedArray) and isinstance(answers, pa.ChunkedArray):
        firsts = _first_of_exact_duplicates(problems, answers)
        if firsts is not None:
            rows, counts = firsts
            keep = np.zeros(num_rows, dtype=bool)
            keep[rows] = True
            keep = pa.array(keep)  # a filter works chunk by chunk, where a take would first concatenate the chunks

            def first_rows(values: Any) -> Any:
                return values.filter(keep) if isinstance(values, pa.ChunkedArray) else values

            problems, answers, ids, data_sources = map(first_rows, (problems, answers, ids, data_sources))

    def as_list(values: Any) -> list:
        if values is None:
            return [None] * len(rows)
        values = values.to_pylist() if isinstance(values, pa.ChunkedArray) else values
        return values if len(values) == len(rows) else [values[row] for row in rows]

    def problem_issue(row: int) -> str | None:
        if row not in bad_prompt_rows:
            return None
        return _describe_chat_prompt(_python_field(_row(data, row), layout.problem_field.split(".")))

    fallback_source = layout.data_source or default_data_source
    return _Extracted(
        label=label,
        problems=as_list(problems),
        answers=as_list(answers),
        data_sources=[fallback_source if source is None else str(source) for source in as_list(data_sources)],
        ids=as_list(ids),
        rows=rows,
        counts=counts,
        problem_issue=problem_issue,
    )


def _column_names(data: pa.Table | list[Any]) -> set[str]:
    """The top-level columns of a table, or the keys found in any of the records."""
    if isinstance(data, pa.Table):
        return set(data.column_names)
    return {key for record in data if isinstance(record, dict) for key in record}


def _row(data: pa.Table | list[Any], row: int) -> Any:
    return data.slice(row, 1).to_pylist()[0] if isinstance(data, pa.Table) else data[row]


def _field(data: pa.Table | list[Any], field: str) -> pa.ChunkedArray | list:
    """Return a (dotted) field of every row: an Arrow array where it can be computed vectorised, else a list.

    Missing values (null, absent key, list index out of range) come back as None.
    """
    path = field.split(".")
    if isinstance(data, pa.Table):
        values = data.column(path[0])
        try:
            for key in path[1:]:
                if pa.types.is_struct(values.type):
                    values = pc.struct_field(values, key)
                elif (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)) and key.isdigit():
                    values = pc.list_element(values, int(key))
                else:
                    raise TypeError(f"cannot take {key!r} from {values.type}")
            return values
        except (pa.ArrowException, KeyError, TypeError, ValueError):  # irregular rows: walk them one by one
            return [_python_field(value, path[1:]) for value in data.column(path[0]).to_pylist()]
    return [_python_field(record, path) for record in data]


def _python_field(value: Any, path: Sequence[str]) -> Any:
    """Walk `path` (keys of dicts, indices of lists) into `value`; None where a step is missing."""
    for key in path:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, (list, tuple)) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
        if value is None:
            return None
    return value


def _chat_content(data: pa.Table | list[Any], field: str) -> tuple[pa.ChunkedArray | list, set[int]]:
    """Return the content of a veRL chat prompt for every row, and the rows not holding exactly one user message.

    The content of such rows is None. The common case (every row a list of one message) is zero-copy in Arrow.
    """
    if isinstance(data, pa.Table) and "." not in field:
        prompts = data.column(field)
        if (
            (pa.types.is_list(prompts.type) or pa.types.is_large_list(prompts.type))
            and pa.types.is_struct(prompts.type.value_type)
            and {"role", "content"} <= {child.name for child in prompts.type.value_type}
            and prompts.null_count == 0
            and len(prompts) > 0
            and pc.all(pc.equal(pc.list_value_length(prompts), 1)).as_py()
        ):
            messages = pc.list_flatten(prompts)  # one message per row: aligned with the rows
            is_user = pc.fill_null(pc.equal(pc.struct_field(messages, "role"), "user"), False)
            bad_rows = set(pc.indices_nonzero(pc.invert(is_user)).to_pylist())
            content = pc.struct_field(messages, "content")
            if bad_rows:
                content = pc.if_else(is_user, content, pa.scalar(None, type=content.type))
            return content, bad_rows
    prompts = _field(data, field)
    prompts = prompts.to_pylist() if isinstance(prompts, pa.ChunkedArray) else prompts
    contents, bad_rows = [], set()
    for row, prompt in enumerate(prompts):
        if _describe_chat_prompt(prompt) is None:
            contents.append(prompt[0].get("content"))
        else:
            contents.append(None)
            bad_rows.add(row)
    return contents, bad_rows


def _describe_chat_prompt(prompt: Any) -> str | None:
    """Why `prompt` is not a list of one user message (None when it is)."""
    expected = 'a list holding one {"role": "user", "content": <problem>} message'
    if prompt is None:
        return "is missing"
    if not isinstance(prompt, (list, tuple)):
        return f"must be {expected}, got a {type(prompt).__name__}"
    roles = [message.get("role") if isinstance(message, dict) else type(message).__name__ for message in prompt]
    if len(prompt) != 1 or roles != ["user"]:
        return f"must be {expected}, got {len(prompt)} message(s) with roles {roles}"
    return None


def _first_of_exact_duplicates(
    problems: pa.ChunkedArray, answers: pa.ChunkedArray
) -> tuple[list[int], list[int]] | None:
    """Group rows with identical raw (problem, answer): each group's first row and size, in row order.

    Returns None where Arrow cannot group these types (the caller then handles every row in Python).
    """
    table = pa.table({"problem": problems, "answer": answers, "row": pa.array(range(len(problems)), pa.int64())})
    try:
        groups = table.group_by(["problem", "answer"], use_threads=False).aggregate([("row", "min"), ("row", "count")])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid):
        return None
    groups = groups.sort_by("row_min")
    return groups.column("row_min").to_pylist(), groups.column("row_count").to_pylist()


# --------------------------------------------------------------------------------------------------------------
# Validating rows and building the prompt dataset (shared by every loader)


def _build_dataset(parts: list[_Extracted], layout: _Layout, *, drop_invalid: bool, deduplicate: bool) -> Dataset:
    """Validate every row, build its prompt, drop invalid rows / duplicates as asked, and make the Dataset."""
    columns: dict[str, list] = {"prompt": [], "solution": [], "problem": [], "data_source": [], "id": []}
    seen: set[tuple[str, str]] = set()
    invalid = duplicates = 0
    first_invalid = ""
    for part in parts:
        for problem, answer, data_source, row_id, row, count in zip(
            part.problems, part.answers, part.data_sources, part.ids, part.rows, part.counts
        ):
            problem, problem_error = _clean_problem(problem, layout.clean_problem)
            if problem_error is not None:
                problem_error = part.problem_issue(row) or problem_error
            answer, answer_error = _clean_answer(answer)
            if problem_error is not None:
                field, error = layout.problem_field, problem_error
            else:
                field, error = layout.answer_field, answer_error
            if error is not None:
                message = f"{part.label}: row {row}: field {field!r} {error}"
                if not drop_invalid:
                    raise ValueError(f"{message}. Fix the data, or {_DROP_HINT}.")
                invalid += count
                first_invalid = first_invalid or message
                continue
            if deduplicate:
                key = (problem, answer)
                if key in seen:
                    duplicates += count
                    continue
                seen.add(key)
            duplicates += count - 1
            columns["prompt"].append(math_prompt(problem))
            columns["solution"].append(answer)
            columns["problem"].append(problem)
            columns["data_source"].append(data_source)
            columns["id"].append(str(row_id) if row_id is not None else f"{data_source}-{row}")
    sources = ", ".join(part.label for part in parts)
    if invalid:
        logger.warning(
            "%s: dropped %d invalid row(s) (drop_invalid=True); the first: %s", sources, invalid, first_invalid
        )
    if deduplicate:
        logger.info(
            "%s: dropped %d duplicate row(s) (same problem and answer); %d unique problem(s) remain",
            sources,
            duplicates,
            len(columns["prompt"]),
        )
    if not columns["prompt"]:
        raise ValueError(f"{sources}: no usable rows (dropped {invalid} invalid row(s))")
    return Dataset.from_dict(columns)


def _clean_problem(value: Any, clean: Callable[[str], str]) -> tuple[str, str | None]:
    """Return the cleaned problem text, or an error describing why `value` is not a usable problem."""
    if value is None:
        return "", "is missing"
    if not isinstance(value, str):
        return "", f"must be a string, got {type(value).__name__} {value!r:.60}"
    problem = clean(value)
    return problem, None if problem else "is empty"


def _clean_answer(value: Any) -> tuple[str, str | None]:
    """Return the answer as a string without an enclosing ``\\boxed{}``, or an error describing why it is unusable."""
    if value is None:
        return "", "is missing"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return "", f"must be a string or a number, got {type(value).__name__} {value!r:.60}"
    if isinstance(value, float) and not math.isfinite(value):
        return "", f"must be a finite number, got {value!r}"
    answer = unwrap_boxed(str(value))
    return answer, None if answer else "is empty"


def _closing_brace(text: str, opening: int) -> int:
    """Index of the brace closing the one at `opening` (-1 if unbalanced); backslash-escaped braces are skipped."""
    depth = 0
    index = opening
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return -1
