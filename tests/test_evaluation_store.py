"""stapo_trl.evaluation.store: run.json is replaced atomically, and a damaged one gives an error saying what to do;
sample records of wrong types are skipped with a warning naming the line; the resume rule."""

import json
import logging

import pytest

from stapo_trl.evaluation import RUN_FILE, SAMPLES_FILE, EvalConfig, evaluate, summarize
from stapo_trl.evaluation.presets import Preset
from stapo_trl.evaluation.store import check_resumable, finished_samples, read_run, read_samples, write_run


def test_run_json_is_written_whole_or_not_at_all(tmp_path):
    write_run(tmp_path, {"plan": {}, "settings": {}, "model_name": "m"})
    assert json.loads((tmp_path / RUN_FILE).read_text())["model_name"] == "m"
    assert [path.name for path in tmp_path.iterdir()] == [RUN_FILE]  # no temporary file left behind


@pytest.mark.parametrize("content", ['{"plan": {"benchmarks": {', "", '{"plan": {}}'])
def test_a_damaged_run_json_gives_a_clear_error(tmp_path, content):
    (tmp_path / RUN_FILE).write_text(content)
    (tmp_path / SAMPLES_FILE).write_text("")
    with pytest.raises(ValueError, match=r"run\.json is damaged .* Restore the file, or evaluate into another"):
        read_run(tmp_path)
    with pytest.raises(ValueError, match="damaged"):
        summarize(tmp_path)
    with pytest.raises(ValueError, match="damaged"):  # before any model is loaded ("unused" is no model)
        evaluate("unused", EvalConfig(output_dir=str(tmp_path), benchmarks=["AMC23"], max_problems=1))
    assert (tmp_path / RUN_FILE).read_text() == content  # nothing overwritten


def test_a_missing_run_json_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an evaluation run directory"):
        summarize(tmp_path)


# --- sample records: types checked on read ----------------------------------------------------------------------

PRESET = {"name": "t1", "temperature": 1.0, "top_p": 1.0}


def sample(index: int, correct, **fields) -> dict:
    record = {"benchmark": "AMC23", "preset": "t1", "problem_id": "0", "sample_index": index, "correct": correct}
    return {**record, "completion": "...", "num_tokens": 10, "temperature": 1.0, "top_p": 1.0, **fields}


def write_samples_file(output_dir, lines: list[str]) -> None:
    plan = {"benchmarks": {"AMC23": {"num_samples": 2, "problem_ids": ["0"]}}, "presets": [PRESET]}
    write_run(output_dir, {"task": "math", "model_name": "m", "settings": {"model": "m"}, "plan": plan})
    (output_dir / SAMPLES_FILE).write_text("".join(line + "\n" for line in lines))


BAD_RECORDS = {  # the three, and their kin; each one is appended after sample 0 (right) and 1 (wrong)
    "the string 'false' as correct": (sample(1, "false"), '"correct" is "false", not true/false or null'),
    "a float sample index": (sample(0.0, False), '"sample_index" is 0.0, not an integer'),
    "a string token count": (sample(1, False, num_tokens="12"), '"num_tokens" is "12", not an integer or null'),
    "a negative sample index": (sample(-1, False), '"sample_index" is -1, not >= 0'),
    "a boolean index": (sample(True, False), '"sample_index" is true, not an integer'),
    "no preset": ({"benchmark": "AMC23", "problem_id": "0", "sample_index": 0}, 'no "preset"'),
    "a list": ([1, 2], "a JSON list, not an object"),
    "a string temperature": (sample(1, False, temperature="1.0"), '"temperature" is "1.0", not a number'),
}


@pytest.mark.parametrize("case", BAD_RECORDS)
def test_a_record_of_wrong_types_is_skipped_with_a_warning_naming_its_line(tmp_path, caplog, case):
    bad_record, problem = BAD_RECORDS[case]
    write_samples_file(tmp_path, [json.dumps(sample(0, True)), json.dumps(sample(1, False)), json.dumps(bad_record)])
    with caplog.at_level(logging.WARNING, logger="stapo_trl.evaluation.store"):
        records = read_samples(tmp_path / SAMPLES_FILE)
        summary = summarize(tmp_path)
    assert [record["sample_index"] for record in records] == [0, 1]
    assert f"line 3 is not a sample record ({problem}); skipped" in caplog.text
    result = summary["results"]["t1"]["benchmarks"]["AMC23"]
    assert (result["score"], result["num_done"], result["mean_response_length"]) == (50.0, 2, 10)  # 1 of 2 right


def test_records_of_the_right_types_are_read_as_written(tmp_path):
    records = [
        sample(0, True, problem_id=7, error=None, grading="math_verify", finish_reason="length", verifier_verdict="A"),
        sample(1, None, temperature=1, completion=None, num_tokens=None, error="generation: OSError: x", extra=[1]),
    ]
    write_samples_file(tmp_path, [json.dumps(record) for record in records])
    assert read_samples(tmp_path / SAMPLES_FILE) == records


# --- the resume rule ----------------------------------------------------------------------------------------------


def test_finished_samples_are_those_of_the_preset_decoding_without_errors(tmp_path):
    preset = Preset(**PRESET)
    write_samples_file(
        tmp_path,
        [
            json.dumps(sample(0, True)),
            json.dumps(sample(1, None, error="generation: RuntimeError: out of memory")),
            json.dumps({**sample(0, True, temperature=0.6), "problem_id": "1"}),  # another decoding
            json.dumps({**sample(0, True), "preset": "other"}),  # a preset this run does not have
        ],
    )
    assert set(finished_samples(tmp_path, [preset], retry_errors=True)) == {("AMC23", "t1", "0", 0)}
    assert set(finished_samples(tmp_path, [preset], retry_errors=False)) == {
        ("AMC23", "t1", "0", 0),
        ("AMC23", "t1", "0", 1),
    }


def test_samples_of_other_settings_are_refused_unless_overwritten(tmp_path):
    write_samples_file(tmp_path, [json.dumps(sample(0, True))])
    with pytest.raises(ValueError, match="holds samples of another run .*model: 'm' there, 'n' now"):
        check_resumable(tmp_path, {"model": "n"}, overwrite=False)
    check_resumable(tmp_path, {"model": "m"}, overwrite=False)
    check_resumable(tmp_path, {"model": "n"}, overwrite=True)
