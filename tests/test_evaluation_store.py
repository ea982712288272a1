"""stapo_trl.evaluation.store: run.json is replaced atomically, and a damaged one gives an error saying what to do."""

import json

import pytest

from stapo_trl.evaluation import RUN_FILE, SAMPLES_FILE, EvalConfig, evaluate, summarize
from stapo_trl.evaluation.store import read_run, write_run


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
