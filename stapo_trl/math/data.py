"""Math datasets as TRL "conversational prompt" datasets.

Every loader returns a `datasets.Dataset` with one row per problem and the columns

- ``prompt``: ``[{"role": "user", "content": "<problem> " + MATH_INSTRUCTION}]`` (see `math_prompt`),
- ``solution``: the gold answer as a string (integers become strings, a ``\\boxed{...}`` wrapper is removed),
- ``problem``: the bare problem text,
- ``data_source``: where the row comes from (the source's ``data_source`` column, or the file / Hub id name),
- ``id``: a row identifier (``extra_info.index`` where the source has one, else ``"<data_source>-<row>"``).

TRL's `GRPOTrainer` hands the extra columns to the reward functions, so ``solution`` reaches `math_reward`.

- `load_dapo_math`: DAPO-Math-17K (veRL layout, Hub id or local copy): removes DAPO's own answer-format
  wrapper from the prompt, appends the paper's instruction and de-duplicates (the Hub copy repeats each
  problem about 100 times).
- `load_verl_parquet`: veRL-layout parquet files, such as the math benchmarks (AIME24, MATH-500, ...).
- `load_math_dataset`: any jsonl / json / parquet file or Hub dataset with configurable (dotted) field names.

Files are read with `datasets.load_dataset`. Rows repeating an earlier row's raw problem and answer columns are
found in Arrow and checked once, at their first row (the Hub copy's 1.79M rows are ~17.9k such groups); the
de-duplication of (problem, answer) pairs is pandas'. Rows with a missing, empty or wrongly typed problem or answer
raise a `ValueError` naming the source, the row and the field; pass ``drop_invalid=True`` to drop them instead (the
count is logged as a warning). A json column that mixes strings and numbers is read by `datasets` as its ``Json``
type, which also reads a string that is valid JSON as JSON (``"1.50"`` as 1.5): write such a column's values all as
strings to keep them as written.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset

from ..data_source import LOCAL_SUFFIXES, is_hub_id, local_files, read_hub, read_local
from .reward import extract_boxed_answer


logger = logging.getLogger(__name__)

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The instruction the STAPO paper appends to every math problem (training and evaluation)."""

DAPO_MATH_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"

# DAPO-Math-17K wraps each problem as
# "<DAPO_PREFIX_MARKER> ... Answer: $Answer ...\n\n{problem}<DAPO_SUFFIX_MARKER> ...".
DAPO_PREFIX_MARKER = "Solve the following math problem"
DAPO_SUFFIX_MARKER = "\n\nRemember to put your answer"


_BOX_COMMAND = re.compile(r"\\(?=boxed|fbox)")
_DROP_HINT = "pass drop_invalid=True to drop such rows"
_COLUMNS = ["prompt", "solution", "problem", "data_source", "id"]
_LIST_TYPES = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)  # the lists datasets writes


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
    braces are matched as `math_reward` matches them (`extract_boxed_answer`: escaped braces do not group).
    """
    text = answer.strip()
    while text.startswith("\\boxed{") and text.endswith("}"):
        inside = text[len("\\boxed{") : -1]
        # extract_boxed_answer reads the last box; with the inner boxes renamed (same brace structure) the outer
        # box is the last one, and it spans the answer when it holds everything up to the final brace.
        renamed = _BOX_COMMAND.sub(r"\\_", inside)
        if (extract_boxed_answer(f"\\boxed{{{renamed}}}") or "") != renamed.strip():
            break
        text = inside.strip()
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
        [source], _DAPO_LAYOUT, split=split, suffixes=LOCAL_SUFFIXES, allow_hub=True, drop_invalid=drop_invalid,
        deduplicate=deduplicate,
    )  # fmt: skip


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
        paths, _VERL_LAYOUT, split="train", suffixes=(".parquet",), allow_hub=False, drop_invalid=drop_invalid,
        deduplicate=deduplicate,
    )  # fmt: skip


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
        [path], layout, split=split, suffixes=LOCAL_SUFFIXES, allow_hub=True, drop_invalid=drop_invalid,
        deduplicate=deduplicate,
    )  # fmt: skip


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
    readers: list[tuple[str, str, Callable[[], Dataset]]] = []  # (label, default data source, read)
    for source in sources:
        if allow_hub and is_hub_id(source):
            readers.append((f"{source} (split {split!r})", str(source), partial(read_hub, str(source), split)))
        else:
            readers += [(str(file), file.stem, partial(read_local, file)) for file in local_files(source, suffixes)]
    rows = pd.concat(
        [_rows(read(), label, layout, default, drop_invalid, deduplicate) for label, default, read in readers],
        ignore_index=True,
    )
    sources_label = ", ".join(label for label, _, _ in readers)
    invalid = rows["error"].notna()
    invalid_count = rows["count"][invalid].sum()
    if invalid.any():
        logger.warning(
            "%s: dropped %d invalid row(s) (drop_invalid=True); the first: %s",
            sources_label, invalid_count, rows["error"][invalid].iloc[0],
        )  # fmt: skip
        rows = rows[~invalid]
    if deduplicate:
        unique = rows.drop_duplicates(["problem", "solution"])
        logger.info(
            "%s: dropped %d duplicate row(s) (same problem and answer); %d unique problem(s) remain",
            sources_label, rows["count"].sum() - len(unique), len(unique),
        )  # fmt: skip
        rows = unique
    if rows.empty:
        raise ValueError(f"{sources_label}: no usable rows (dropped {invalid_count} invalid row(s))")
    rows = rows.assign(prompt=rows["problem"].map(math_prompt))
    return Dataset.from_pandas(rows[_COLUMNS], preserve_index=False)


# --------------------------------------------------------------------------------------------------------------
# Validating rows (shared by every loader)


def _rows(
    dataset: Dataset, label: str, layout: _Layout, default_data_source: str, drop_invalid: bool, deduplicate: bool
) -> pd.DataFrame:
    """The problem, solution, data source and id of the rows of one source, and why a row is unusable (``error``).

    Rows holding the same raw values in the problem and answer columns get the same problem, solution and error, so
    each such group is cleaned once, at its first row (the row an error names): DAPO-Math-17K's 1.79M rows are ~17.9k
    groups. With `deduplicate` only the first row of each group is returned, ``count`` saying how many rows it stands
    for (1 for every row otherwise). Raises on the first unusable row unless `drop_invalid`.
    """
    required = [("problem_field", layout.problem_field), ("answer_field", layout.answer_field)]
    if layout.id_required:
        required.append(("id_field", layout.id_field))
    for parameter, field in required:
        if field.split(".")[0] not in dataset.column_names:
            fix = layout.missing_column_fix or (
                f"Set {parameter} to the field that holds it (dotted paths reach nested fields)"
            )
            raise ValueError(
                f"{label}: no column {field.split('.')[0]!r} (for {parameter}={field!r}); "
                f"available columns: {sorted(dataset.column_names)}. {fix}."
            )
    raw = dataset.select_columns(
        sorted({field.split(".")[0] for field in (layout.problem_field, layout.answer_field)})
    )
    # a group: the rows holding the same raw values, numbered in order of appearance
    group, _ = pd.factorize(_value_codes(raw.with_format("arrow")[:].to_struct_array()))
    firsts = np.unique(group, return_index=True)[1]  # the first row of each group, in order

    values = _fields(dataset.select(firsts), {"problem": layout.problem_field, "answer": layout.answer_field})
    groups: dict[str, list] = {"problem": [], "solution": [], "error": []}
    for row, problem, answer in zip(firsts, values["problem"], values["answer"]):
        problem_error = _describe_chat_prompt(problem) if layout.chat_prompt else None
        if problem_error is None:
            problem, problem_error = _clean_problem(
                problem[0].get("content") if layout.chat_prompt else problem, layout
            )
        answer, answer_error = _clean_answer(answer)
        field, error = (layout.problem_field, problem_error) if problem_error else (layout.answer_field, answer_error)
        if error is not None:
            error = f"{label}: row {row}: field {field!r} {error}"
            if not drop_invalid:
                raise ValueError(f"{error}. Fix the data, or {_DROP_HINT}.")
        groups["problem"].append(problem)
        groups["solution"].append(answer)
        groups["error"].append(error)

    kept = firsts if deduplicate else np.arange(dataset.num_rows)
    fields = {}
    if layout.id_field is not None and layout.id_field.split(".")[0] in dataset.column_names:
        fields["id"] = layout.id_field
    if layout.data_source is None and "data_source" in dataset.column_names:
        fields["data_source"] = "data_source"
    values = _fields(dataset.select(kept), fields)
    none = [None] * len(kept)
    data_sources = [
        layout.data_source or (default_data_source if data_source is None else str(data_source))
        for data_source in values.get("data_source", none)
    ]
    ids = [
        f"{data_source}-{row}" if row_id is None else str(row_id)
        for data_source, row, row_id in zip(data_sources, kept, values.get("id", none))
    ]
    rows = pd.DataFrame(groups).iloc[group[kept]].reset_index(drop=True)
    return rows.assign(data_source=data_sources, id=ids, count=np.bincount(group) if deduplicate else 1)


def _value_codes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A number per value, equal for two values only where they are the same (records and lists element by element).

    Arrow hashes flat values (a null: -1; floats by their bits, as ``0.0`` and ``-0.0`` print differently). A record
    or list becomes the bytes of its children's numbers, hashed in turn, and doubled plus one where it is null.
    """
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.ExtensionArray):  # datasets' Json column: JSON text
        values = values.storage
    kind = values.type
    if pa.types.is_struct(kind) or any(is_list(kind) for is_list in _LIST_TYPES):
        if pa.types.is_struct(kind):
            children = [_value_codes(child) for child in values.flatten()]
            data = np.stack(children, axis=1) if children else np.zeros((len(values), 0), np.int64)
            offsets = np.arange(len(values) + 1) * data.shape[1]
        else:
            data = _value_codes(values.flatten())  # the items of the non-null lists, in order
            offsets = np.concatenate([[0], np.cumsum(pc.list_value_length(values).fill_null(0).to_numpy())])
        as_bytes = pa.Array.from_buffers(
            pa.large_binary(), len(values), [None, pa.py_buffer(offsets.astype(np.int64) * 8), pa.py_buffer(data)]
        )
        return _value_codes(as_bytes) * 2 + values.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_floating(kind):
        values = values.view({16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[kind.bit_width])
    return pc.dictionary_encode(values).indices.fill_null(-1).to_numpy().astype(np.int64)


def _fields(dataset: Dataset, fields: dict[str, str]) -> dict[str, list]:
    """Named (dotted) fields of every row of `dataset`, as Python values."""
    columns = dataset.select_columns(list({field.split(".")[0] for field in fields.values()})).to_dict()
    return {name: _field(columns, field) for name, field in fields.items()}


def _field(columns: dict[str, list], field: str) -> list:
    """A (dotted) field of every row: ``"meta.gold"`` is a key of a record, ``"prompt.0"`` an item of a list."""
    column, *path = field.split(".")
    values = columns[column]
    for key in path:
        values = [_item(value, key) for value in values]
    return values


def _item(value: Any, key: str) -> Any:
    """``value[key]`` (a list index when `key` is a number), None where there is no such item."""
    try:
        return value[int(key)] if isinstance(value, list) else value[key]
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _describe_chat_prompt(prompt: Any) -> str | None:
    """Why `prompt` is not a list of one user message (None when it is)."""
    expected = 'a list holding one {"role": "user", "content": <problem>} message'
    if prompt is None:
        return "is missing"
    if not isinstance(prompt, list):
        return f"must be {expected}, got a {type(prompt).__name__}"
    roles = [message.get("role") if isinstance(message, dict) else type(message).__name__ for message in prompt]
    if len(prompt) != 1 or roles != ["user"]:
        return f"must be {expected}, got {len(prompt)} message(s) with roles {roles}"
    return None


def _clean_problem(value: Any, layout: _Layout) -> tuple[str, str | None]:
    """Return the cleaned problem text, or an error describing why `value` is not a usable problem."""
    if value is None:
        return "", "is missing"
    if not isinstance(value, str):
        return "", f"must be a string, got {type(value).__name__} {value!r:.60}"
    problem = layout.clean_problem(value)
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
