"""Code datasets as TRL "conversational prompt" datasets: the code split of Eurus-2-RL-Data.

The paper trains on Eurus-RL-Code, the code problems of PRIME's Eurus-2-RL-Data, with veRL, which feeds each row's
``prompt`` messages to the chat template as they are. The data is veRL parquet:

- ``prompt``: chat messages, PRIME's system prompt and a user message that states the problem and asks for the
  code in a ```` ```python ```` block at the end;
- ``ability``: ``"code"`` (the same files hold the ``"math"`` rows, which are skipped);
- ``reward_model.ground_truth``: the tests, a JSON string in APPS layout (see `stapo_trl.code.reward`);
- ``data_source``, ``extra_info.index``.

`load_eurus_code` returns one row per problem with the columns ``prompt`` (the messages as in the data),
``tests`` (the ground-truth JSON string, validated: `code_reward` reads this column), ``data_source`` and ``id``.
A row with a malformed prompt or tests raises a ``ValueError`` naming the source, the row and the field; pass
``drop_invalid=True`` to drop such rows instead (their count is logged as a warning).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset

from stapo_trl.code.reward import parse_tests
from stapo_trl.data_source import LOCAL_SUFFIXES, is_hub_id, local_files, read_hub, read_local


logger = logging.getLogger(__name__)

EURUS_RL_DATA_HUB_ID = "PRIME-RL/Eurus-2-RL-Data"

#: Six tiny problems written for this project in Eurus-2-RL-Data's layout (three stdin, three function problems),
#: for the offline demo and the tests.
SAMPLE_FILE = Path(__file__).resolve().parent / "samples" / "eurus_code.jsonl"

TESTS_FIELD = "reward_model.ground_truth"
_DROP_HINT = "pass drop_invalid=True to drop such rows"


def load_eurus_code(
    source: str | os.PathLike | Sequence[str | os.PathLike] = EURUS_RL_DATA_HUB_ID,
    split: str = "train",
    *,
    drop_invalid: bool = False,
    keep_system_prompt: bool = True,
) -> Dataset:
    """Load the code problems of Eurus-2-RL-Data (or files in its layout) as a prompt dataset for `code_reward`.

    Args:
        source: A Hub dataset id (default: PRIME's), or local ``.parquet`` / ``.jsonl`` / ``.json`` files or
            directories holding them (searched recursively), e.g. `SAMPLE_FILE`.
        split: The Hub split (``"train"`` or ``"validation"``); ignored for local files.
        drop_invalid: Drop rows whose prompt or tests are malformed (and log their count) instead of raising.
        keep_system_prompt: Keep the system message of each prompt (PRIME's, as the paper's veRL run does);
            ``False`` keeps the user message only, for models or templates without a system turn.
    """
    parts = [(label, _with_rows(dataset)) for label, dataset in _sources(source, split)]
    columns = ("prompt", "tests", "data_source", "id", "_row", "_error")
    kept, invalid, first_error = [], 0, None
    for label, dataset in parts:
        for column in ("prompt", "reward_model"):
            if column not in dataset.column_names:
                raise ValueError(
                    f"{label}: no column {column!r} (available: {sorted(dataset.column_names)}); "
                    "expected Eurus-2-RL-Data's veRL layout (prompt, reward_model.ground_truth, data_source)."
                )
        if "ability" in dataset.column_names:
            dataset = dataset.filter(lambda ability: ability == "code", input_columns="ability")
        rows = dataset.map(
            _row_fields,
            fn_kwargs={"label": label, "keep_system_prompt": keep_system_prompt},
            remove_columns=[name for name in dataset.column_names if name not in columns],
        )
        errors = rows.filter(lambda error: error is not None, input_columns="_error")
        if len(errors):
            first_error = first_error or errors[0]["_error"]
            if not drop_invalid:
                raise ValueError(f"{errors[0]['_error']}. Fix the data, or {_DROP_HINT}.")
            invalid += len(errors)
            rows = rows.filter(lambda error: error is None, input_columns="_error")
        kept.append(rows)
    labels = ", ".join(label for label, _ in parts)
    if invalid:
        logger.warning(
            "%s: dropped %d invalid row(s) (drop_invalid=True); the first: %s", labels, invalid, first_error
        )
    result = datasets.concatenate_datasets(kept) if len(kept) > 1 else kept[0]
    if len(result) == 0:
        raise ValueError(f"{labels}: no usable code rows (dropped {invalid} invalid row(s))")
    return result.remove_columns(["_row", "_error"])


def drop_long_prompts(dataset: Dataset, tokenizer, max_tokens: int) -> Dataset:
    """Drop the rows whose prompt is longer than `max_tokens` once rendered (veRL's ``filter_overlong_prompts``).

    A prompt's length is that of its chat-template rendering with the generation prompt, as the trainer feeds it
    to the model. The number of rows dropped is logged.
    """

    def fits(prompt: list[dict[str, str]]) -> bool:
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= max_tokens

    kept = dataset.filter(fits, input_columns="prompt")
    if len(kept) < len(dataset):
        logger.warning(
            "dropped %d of %d problems whose prompt is longer than %d tokens",
            len(dataset) - len(kept),
            len(dataset),
            max_tokens,
        )
    return kept


def _row_fields(example: dict, *, label: str, keep_system_prompt: bool) -> dict[str, Any]:
    """The output columns of one row, and ``_error`` naming the source, row and field when the row is unusable."""
    row = example["_row"]
    data_source = example.get("data_source") or label
    extra_info = example.get("extra_info") or {}
    index = extra_info.get("index") if isinstance(extra_info, dict) else None
    fields = {
        "prompt": [],
        "tests": "",
        "data_source": str(data_source),
        "id": f"{data_source}-{index if index is not None else row}",
        "_error": None,
    }
    prompt, prompt_error = _prompt(example["prompt"], keep_system_prompt)
    ground_truth = (example["reward_model"] or {}).get("ground_truth")
    if prompt_error is not None:
        fields["_error"] = f"{label}: row {row}: field 'prompt' {prompt_error}"
        return fields
    if not isinstance(ground_truth, str):
        fields["_error"] = f"{label}: row {row}: field {TESTS_FIELD!r} must be a JSON string, got {ground_truth!r:.80}"
        return fields
    try:
        parse_tests(ground_truth)
    except ValueError as error:
        fields["_error"] = f"{label}: row {row}: field {TESTS_FIELD!r}: {error}"
        return fields
    fields.update(prompt=prompt, tests=ground_truth)
    return fields


def _prompt(messages: Any, keep_system_prompt: bool) -> tuple[list[dict[str, str]], str | None]:
    """The chat prompt to train on, or why `messages` is not a usable one (a list of messages with a user turn)."""
    if not isinstance(messages, list) or not messages:
        return [], f'must be a non-empty list of {{"role", "content"}} messages, got {messages!r:.80}'
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return [], f"holds a message without text content: {message!r:.80}"
    if not any(message.get("role") == "user" and message["content"].strip() for message in messages):
        return [], f"has no user message with content (roles: {[message.get('role') for message in messages]})"
    kept = [
        {"role": message["role"], "content": message["content"]}
        for message in messages
        if keep_system_prompt or message.get("role") != "system"
    ]
    return kept, None


def _with_rows(dataset: Dataset) -> Dataset:
    """The dataset with each row's position in its source, for error messages."""
    return dataset.add_column("_row", list(range(len(dataset))))


def _sources(source, split: str) -> list[tuple[str, Dataset]]:
    """(label, dataset) per local file, or the one Hub split (`stapo_trl.data_source`)."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if len(sources) == 1 and is_hub_id(sources[0]):
        return [(f"{sources[0]} ({split})", read_hub(str(sources[0]), split))]
    files = [file for item in sources for file in local_files(item, LOCAL_SUFFIXES)]  # every path checked first
    return [(str(file), read_local(file)) for file in files]
