"""One notion of a data source (stapo_trl.data_source) for the math and code loaders and the command line: the
same file layouts are read, and the same mistakes are refused with the same message, by every one of them."""

import json

import pytest

from stapo_trl.cli import UsageError, check_data_source
from stapo_trl.code.data import SAMPLE_FILE, load_eurus_code
from stapo_trl.data_source import is_hub_id
from stapo_trl.math.data import load_math_dataset


CODE_RECORDS = [json.loads(line) for line in SAMPLE_FILE.read_text().splitlines()]
MATH_RECORDS = [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "What is 2+3?", "answer": "5"}]


def load_code(path):
    return load_eurus_code(path)


def load_math(path):
    return load_math_dataset(path, "problem", "answer")


@pytest.mark.parametrize("load, records", [(load_code, CODE_RECORDS), (load_math, MATH_RECORDS)])
def test_both_loaders_read_a_json_file_whose_records_are_in_one_field(load, records, tmp_path):
    path = tmp_path / "problems.json"
    path.write_text(json.dumps({"data": records}))
    assert len(load(path)) == len(records)


@pytest.mark.parametrize("load, records", [(load_code, CODE_RECORDS), (load_math, MATH_RECORDS)])
def test_both_loaders_refuse_text_that_is_not_utf8_naming_the_file(load, records, tmp_path):
    path = tmp_path / "latin1.jsonl"
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    path.write_bytes(("\n".join(lines) + "\n").replace("1", "\u00b9", 1).encode("latin-1"))  # ¹ is one byte in latin-1
    with pytest.raises(ValueError, match=r"latin1\.jsonl': not UTF-8 text"):
        load(path)
    path.write_bytes(path.read_bytes() + b"\xb9 and a line that is not JSON\n")  # both faults: the encoding is named
    with pytest.raises(ValueError, match=r"latin1\.jsonl': not UTF-8 text"):
        load(path)


@pytest.mark.parametrize("load", [load_code, load_math])
def test_a_mistyped_local_file_is_missing_not_looked_up_on_the_hub(load, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        load(tmp_path / "problem.jsonl")
    with pytest.raises(UsageError, match="no such file or directory"):
        check_data_source(str(tmp_path / "problem.jsonl"))


def test_what_counts_as_a_hub_id():
    assert is_hub_id("BytedTsinghua-SIA/DAPO-Math-17k") and is_hub_id("PRIME-RL/Eurus-2-RL-Data")
    assert not is_hub_id("data/train.parquet") and not is_hub_id("train.jsonl") and not is_hub_id("a/b/c")
