"""load_eurus_code: Eurus-2-RL-Data's code rows as prompt datasets, errors naming the file, row and field."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stapo_trl.code.data import SAMPLE_FILE, drop_long_prompts, load_eurus_code
from stapo_trl.code.reward import parse_tests
from stapo_trl.toy.tokenizer import build_tokenizer


RECORDS = [json.loads(line) for line in SAMPLE_FILE.read_text().splitlines()]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_loads_the_sample_file():
    dataset = load_eurus_code(SAMPLE_FILE)
    assert set(dataset.column_names) == {"prompt", "tests", "data_source", "id"}
    assert len(dataset) == len(RECORDS) == 6
    for row, record in zip(dataset, RECORDS, strict=True):
        assert row["prompt"] == record["prompt"]  # the messages as in the data, system prompt included
        assert row["tests"] == record["reward_model"]["ground_truth"]
        assert row["data_source"] == record["data_source"]
        assert row["id"] == f"{record['data_source']}-{record['extra_info']['index']}"
    styles = [parse_tests(tests).fn_name is None for tests in dataset["tests"]]
    assert styles == [True, True, True, False, False, False]


def test_keep_system_prompt_false_keeps_the_user_message():
    dataset = load_eurus_code(SAMPLE_FILE, keep_system_prompt=False)
    assert [[message["role"] for message in prompt] for prompt in dataset["prompt"]] == [["user"]] * 6
    assert dataset[0]["prompt"][0] == RECORDS[0]["prompt"][1]


def test_parquet_and_directories_and_math_rows(tmp_path):
    math_row = dict(RECORDS[0], ability="math", reward_model={"style": "rule", "ground_truth": "42"})
    table = pa.Table.from_pylist([math_row, *RECORDS[:2]])
    pq.write_table(table, tmp_path / "part-0.parquet")
    (tmp_path / "rest").mkdir()
    write_jsonl(tmp_path / "rest" / "part-1.jsonl", RECORDS[2:3])
    dataset = load_eurus_code(tmp_path)
    assert dataset["tests"] == [record["reward_model"]["ground_truth"] for record in RECORDS[:3]]


@pytest.mark.parametrize(
    "change, field, message",
    [
        (lambda r: r["reward_model"].update(ground_truth="{broken"), "reward_model.ground_truth", "not valid JSON"),
        (
            lambda r: r["reward_model"].update(ground_truth='{"inputs": ["1"], "outputs": []}'),
            "reward_model.ground_truth",
            "'outputs' must be a non-empty list",
        ),
        (lambda r: r.update(prompt=[{"role": "system", "content": "x"}]), "prompt", "no user message"),
    ],
    ids=["json", "tests", "prompt"],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, change, field, message):
    records = json.loads(json.dumps(RECORDS))
    change(records[3])
    path = write_jsonl(tmp_path / "code.jsonl", records)
    with pytest.raises(ValueError, match=f"row 3: field '{field}'.*{message}.*drop_invalid=True") as error:
        load_eurus_code(path)
    assert str(path) in str(error.value)


def test_drop_invalid_drops_and_counts(tmp_path, caplog):
    records = json.loads(json.dumps(RECORDS))
    records[1]["reward_model"]["ground_truth"] = "{broken"
    records[4]["reward_model"]["ground_truth"] = '{"inputs": [1], "outputs": [1]}'
    path = write_jsonl(tmp_path / "code.jsonl", records)
    with caplog.at_level(logging.WARNING, logger="stapo_trl.code.data"):
        dataset = load_eurus_code(path, drop_invalid=True)
    kept = [record for row, record in enumerate(RECORDS) if row not in (1, 4)]
    assert dataset["id"] == [f"{record['data_source']}-{record['extra_info']['index']}" for record in kept]
    assert "dropped 2 invalid row(s)" in caplog.text and "row 1" in caplog.text


def test_missing_column_and_missing_source(tmp_path):
    path = write_jsonl(tmp_path / "code.jsonl", [{"question": "x", "answer": "y"}])
    with pytest.raises(ValueError, match="no column 'prompt'"):
        load_eurus_code(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_eurus_code(tmp_path / "absent.parquet")


def test_drop_long_prompts_counts_the_rendered_prompt():
    tokenizer = build_tokenizer()  # one token per character; the chat template adds 3 special tokens and
    # "user\n", "\n" and "assistant\n" around the user message: 19 tokens besides its content
    dataset = load_eurus_code(SAMPLE_FILE, keep_system_prompt=False)
    lengths = [len(prompt[0]["content"]) + 19 for prompt in dataset["prompt"]]
    limit = sorted(lengths)[2]
    kept = drop_long_prompts(dataset, tokenizer, limit)
    assert kept["id"] == [row_id for row_id, length in zip(dataset["id"], lengths) if length <= limit]
    assert len(drop_long_prompts(dataset, tokenizer, limit - 1)) == len(kept) - lengths.count(limit)
