"""Tests of stapo_trl.math.data: prompt building, the three loaders, validation, de-duplication, benchmark files."""

import os


os.environ["HF_HUB_OFFLINE"] = "1"

import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from datasets import Dataset  # noqa: E402

from stapo_trl.math import data as data_module  # noqa: E402
from stapo_trl.math.data import (  # noqa: E402
    MATH_INSTRUCTION,
    load_dapo_math,
    load_math_dataset,
    load_verl_parquet,
    math_prompt,
    strip_dapo_wrapper,
    unwrap_boxed,
)


MATH_EVAL = Path(__file__).resolve().parents[1] / "stapo_trl" / "math" / "benchmarks"  # shipped
BENCHMARK_SIZES = {
    "AIME24": 30,
    "AIME25": 30,
    "AMC23": 40,
    "MATH-500": 500,
    "Minerva": 272,
    "Olympiad-Bench": 674,
}

# DAPO-Math-17K's own wrapper, exactly as in the Hub copy.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

P1 = "Let $x+y=10$ and $x-y=2$. Find $x\\cdot y$."
P2 = "How many positive divisors does $36$ have?"
P3 = "A sequence is defined by $a_1=1$.\n\nFind $a_{10}$ if $a_{n+1}=2a_n$."  # a blank line inside the problem


def dapo_row(problem, answer, index, wrapper=(DAPO_PREFIX, DAPO_SUFFIX)):
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": wrapper[0] + problem + wrapper[1], "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def verl_row(problem, answer, source="BENCH", index=None, messages=None):
    return {
        "prompt": messages if messages is not None else [{"content": problem, "role": "user"}],
        "data_source": source,
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": index, "split": "test"},
    }


def write_parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture
def dapo_parquet(tmp_path):
    rows = [
        dapo_row(P1, "24", "a"),
        dapo_row(P2, "9", "b"),
        dapo_row(P1, "24", "c"),  # exact duplicate of row 0
        dapo_row(P1, "25", "d"),  # same problem, another answer: a distinct pair, kept
        dapo_row(P3, "512", "e"),
        dapo_row(P2, "9", "f"),  # exact duplicate of row 1
        dapo_row(P2, "9", "g", wrapper=(DAPO_PREFIX, DAPO_SUFFIX + "\n")),  # same problem once unwrapped
        dapo_row(P1, "24", "h"),  # exact duplicate of row 0
    ]
    return write_parquet(tmp_path / "dapo.parquet", rows)


# --------------------------------------------------------------------------------------------------------------
# Prompt helpers


def test_math_prompt_is_one_user_message_with_the_paper_instruction():
    assert MATH_INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    assert math_prompt("What is $1+1$?") == [
        {
            "role": "user",
            "content": "What is $1+1$? Please reason step by step, and put your final answer within \\boxed{}.",
        }
    ]


def test_strip_dapo_wrapper_keeps_blank_lines_inside_the_problem():
    assert strip_dapo_wrapper(DAPO_PREFIX + P3 + DAPO_SUFFIX) == P3
    assert strip_dapo_wrapper("  " + DAPO_PREFIX + P1 + DAPO_SUFFIX + "\n") == P1
    assert strip_dapo_wrapper(f"  {P2}\n") == P2  # no wrapper: only whitespace is stripped


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("\\boxed{204}", "204"),
        (" \\boxed{ 7 } ", "7"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{\\boxed{3}}", "3"),
        ("\\boxed{1}+\\boxed{2}", "\\boxed{1}+\\boxed{2}"),  # not one enclosing box
        ("\\boxed{1", "\\boxed{1"),  # unbalanced: left alone
        ("\\frac{1}{2}", "\\frac{1}{2}"),
    ],
)
def test_unwrap_boxed(answer, expected):
    assert unwrap_boxed(answer) == expected


# --------------------------------------------------------------------------------------------------------------
# DAPO-Math-17K


def test_load_dapo_math_strips_wrapper_appends_instruction_and_deduplicates(dapo_parquet, caplog):
    with caplog.at_level(logging.INFO, logger="stapo_trl.math.data"):
        dataset = load_dapo_math(str(dapo_parquet))

    assert dataset.column_names == ["prompt", "solution", "problem", "data_source", "id"]
    assert dataset["problem"] == [P1, P2, P1, P3]  # first occurrences, in order
    assert dataset["solution"] == ["24", "9", "25", "512"]
    assert dataset["id"] == ["a", "b", "d", "e"]
    assert dataset["data_source"] == ["math_dapo"] * 4
    assert dataset[3]["prompt"] == [
        {
            "role": "user",
            "content": "A sequence is defined by $a_1=1$.\n\nFind $a_{10}$ if $a_{n+1}=2a_n$. "
            "Please reason step by step, and put your final answer within \\boxed{}.",
        }
    ]
    for prompt in dataset["prompt"]:
        assert "Solve the following" not in prompt[0]["content"]
        assert "Remember to put your answer" not in prompt[0]["content"]
    assert "dropped 4 duplicate row(s)" in caplog.text
    assert "4 unique problem(s) remain" in caplog.text


def test_load_dapo_math_without_deduplication_keeps_every_row(dapo_parquet):
    dataset = load_dapo_math(dapo_parquet, deduplicate=False)
    assert len(dataset) == 8
    assert dataset["problem"] == [P1, P2, P1, P1, P3, P2, P2, P1]


def test_load_dapo_math_reads_a_local_snapshot_directory_and_jsonl(tmp_path):
    snapshot = tmp_path / "DAPO-Math-17k"
    write_parquet(snapshot / "data" / "dapo-math-17k.parquet", [dapo_row(P1, "24", "a"), dapo_row(P1, "24", "b")])
    write_parquet(snapshot / ".cache" / "stale.parquet", [dapo_row(P2, "9", "z")])  # hidden folders are skipped
    dataset = load_dapo_math(snapshot)
    assert dataset["problem"] == [P1]

    jsonl = write_jsonl(tmp_path / "dapo.jsonl", [dapo_row(P2, "9", "x"), dapo_row(P2, "9", "y")])
    assert load_dapo_math(jsonl)["solution"] == ["9"]


def test_load_dapo_math_cleans_each_distinct_row_once(tmp_path, monkeypatch):
    problems, repeats = 500, 100  # the Hub copy's shape, scaled down: each problem repeated 100 times
    rows = [dapo_row(f"Problem {i}: compute {i} + {i}.", str(2 * i), f"id-{i}") for i in range(problems)] * repeats
    path = write_parquet(tmp_path / "dapo-big.parquet", rows)
    cleaned = []
    clean_problem = data_module._clean_problem
    monkeypatch.setattr(data_module, "_clean_problem", lambda *args: cleaned.append(1) or clean_problem(*args))
    dataset = load_dapo_math(path)
    assert len(dataset) == problems
    assert dataset["solution"][:3] == ["0", "2", "4"]
    assert len(cleaned) == problems  # per-row Python work for the distinct rows only, not for all 50,000


def test_repeated_rows_are_checked_once_and_errors_name_the_first_file_row(tmp_path):
    def prompt_row(messages, index):
        return dict(dapo_row(P1, "24", index), prompt=messages)

    user = {"content": DAPO_PREFIX + P1 + DAPO_SUFFIX, "role": "user"}
    system = dict(user, role="system")  # same text, another role: not the same row
    rows = [
        dapo_row(P1, "24", "a"),
        dapo_row(P1, "24", "b"),
        dapo_row(P1, "24", "c"),
        prompt_row([system], "d"),  # the first invalid row, after two repeats of row 0
        prompt_row([user, user], "e"),
        prompt_row([system], "f"),
        dapo_row(P2, "9", "g"),
    ]
    path = write_parquet(tmp_path / "dapo.parquet", rows)
    with pytest.raises(ValueError, match=r"row 3: field 'prompt' must be a list holding one .*\['system'\]"):
        load_dapo_math(path)

    assert load_dapo_math(path, drop_invalid=True)["id"] == ["a", "g"]
    every_row = load_dapo_math(path, drop_invalid=True, deduplicate=False)
    assert every_row["id"] == ["a", "b", "c", "g"]
    assert every_row["problem"] == [P1, P1, P1, P2]


def test_answers_that_only_look_alike_stay_apart(tmp_path):
    path = write_jsonl(tmp_path / "zeros.jsonl", [{"problem": "Q", "answer": value} for value in (0.0, -0.0, 0.0)])
    dataset = load_math_dataset(path, deduplicate=True)
    assert dataset["solution"] == ["0.0", "-0.0"]  # str() of each float, as Python writes them
    assert dataset["id"] == ["zeros-0", "zeros-1"]


def test_load_dapo_math_rejects_a_prompt_that_is_not_one_user_message(tmp_path):
    messages = [{"content": "You are helpful.", "role": "system"}, {"content": P1, "role": "user"}]
    row = dapo_row(P1, "24", "a")
    row["prompt"] = messages
    path = write_parquet(tmp_path / "dapo.parquet", [dapo_row(P2, "9", "b"), row])
    with pytest.raises(ValueError, match=r"row 1: field 'prompt' must be a list holding one .*'system', 'user'"):
        load_dapo_math(path)
    assert load_dapo_math(path, drop_invalid=True)["problem"] == [P2]


def test_hub_id_goes_through_datasets_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, split=None, **kwargs):
        calls.append((path, split))
        return Dataset.from_list([dapo_row(P1, "24", "a"), dapo_row(P1, "24", "b"), dapo_row(P2, "9", "c")])

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    dataset = load_dapo_math(split="train")
    assert calls == [("BytedTsinghua-SIA/DAPO-Math-17k", "train")]
    assert dataset["problem"] == [P1, P2]
    assert dataset["id"] == ["a", "c"]


def test_hub_id_offline_fails_with_a_message_naming_the_id():
    with pytest.raises(OSError, match="BytedTsinghua-SIA/DAPO-Math-17k"):
        load_dapo_math()


# --------------------------------------------------------------------------------------------------------------
# veRL parquet


def test_load_verl_parquet_unwraps_boxed_answers_and_keeps_ids(tmp_path):
    rows = [
        verl_row("Find $x$.", "\\boxed{204}", "AIME24", "AIME24-0"),
        verl_row("Find $y$.", "\\boxed{\\frac{1}{2}}", "AIME24", "AIME24-1"),
        verl_row("Find $z$.", " 17 ", "AIME24", None),
    ]
    path = write_parquet(tmp_path / "AIME24.parquet", rows)
    dataset = load_verl_parquet(path)
    assert dataset["solution"] == ["204", "\\frac{1}{2}", "17"]
    assert dataset["id"] == ["AIME24-0", "AIME24-1", "AIME24-2"]  # a missing index falls back to source-row
    assert dataset[0]["prompt"] == [{"role": "user", "content": f"Find $x$. {MATH_INSTRUCTION}"}]


def test_load_verl_parquet_needs_only_prompt_and_answer_columns(tmp_path):
    rows = [{"prompt": [{"content": "Q0", "role": "user"}], "reward_model": {"ground_truth": "1"}}]
    dataset = load_verl_parquet(write_parquet(tmp_path / "minimal.parquet", rows))
    assert dataset[0] == {
        "prompt": [{"role": "user", "content": f"Q0 {MATH_INSTRUCTION}"}],
        "solution": "1",
        "problem": "Q0",
        "data_source": "minimal",
        "id": "minimal-0",
    }


def test_load_verl_parquet_concatenates_files_and_keeps_their_data_source(tmp_path):
    first = write_parquet(tmp_path / "a.parquet", [verl_row("Q1", "1", "A", "A-0")])
    second = write_parquet(tmp_path / "b.parquet", [verl_row("Q2", "2", "B", "B-0"), verl_row("Q1", "1", "B", "B-1")])
    dataset = load_verl_parquet([first, second])
    assert dataset["data_source"] == ["A", "B", "B"]
    assert dataset["problem"] == ["Q1", "Q2", "Q1"]
    assert load_verl_parquet([first, second], deduplicate=True)["id"] == ["A-0", "B-0"]
    assert len(load_verl_parquet(tmp_path)) == 3  # a directory: its parquet files, sorted


def test_load_verl_parquet_checks_every_path_before_reading(tmp_path, monkeypatch):
    existing = write_parquet(tmp_path / "a.parquet", [verl_row("Q1", "1")])

    def fail(*args, **kwargs):
        raise AssertionError("read a file before checking that every path exists")

    monkeypatch.setattr("datasets.load_dataset", fail)
    missing = tmp_path / "missing" / "b.parquet"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_verl_parquet([existing, missing])


def test_load_verl_parquet_names_the_layout_when_a_column_is_missing(tmp_path):
    path = write_parquet(tmp_path / "plain.parquet", [{"problem": "Q", "answer": "1"}])
    with pytest.raises(ValueError, match=r"no column 'prompt'.*\['answer', 'problem'\].*load_math_dataset"):
        load_verl_parquet(path)


# --------------------------------------------------------------------------------------------------------------
# Generic files, custom fields


def test_load_math_dataset_with_custom_and_dotted_fields(tmp_path):
    records = [
        {"question": "What is $6 \\times 7$?", "meta": {"gold": 42, "uid": "q-1"}},
        {"question": "Simplify $\\frac{2}{4}$.", "meta": {"gold": "\\boxed{\\frac{1}{2}}", "uid": "q-2"}},
        {"question": "Half of 5?", "meta": {"gold": 2.5, "uid": "q-3"}},
    ]
    path = write_jsonl(tmp_path / "custom.jsonl", records)
    dataset = load_math_dataset(path, problem_field="question", answer_field="meta.gold", id_field="meta.uid")
    assert dataset["solution"] == ["42", "\\frac{1}{2}", "2.5"]
    assert dataset["id"] == ["q-1", "q-2", "q-3"]
    assert dataset["data_source"] == ["custom"] * 3  # the file name, without extension
    assert dataset[0]["prompt"] == [
        {
            "role": "user",
            "content": "What is $6 \\times 7$? Please reason step by step, and put your final answer within \\boxed{}.",
        }
    ]
    named = load_math_dataset(path, "question", "meta.gold", data_source="mine")
    assert named["data_source"] == ["mine"] * 3
    assert named["id"] == ["mine-0", "mine-1", "mine-2"]


def test_load_math_dataset_reaches_into_lists_and_reads_parquet_and_json(tmp_path):
    rows = [verl_row("Q1", "\\boxed{3}", "S", "S-0"), verl_row("Q2", "4", "S", "S-1")]
    parquet = write_parquet(tmp_path / "verl.parquet", rows)
    dataset = load_math_dataset(parquet, "prompt.0.content", "reward_model.ground_truth", id_field="extra_info.index")
    assert dataset["problem"] == ["Q1", "Q2"]
    assert dataset["solution"] == ["3", "4"]
    assert dataset["id"] == ["S-0", "S-1"]
    assert dataset["data_source"] == ["S", "S"]  # the source's data_source column

    records = [{"problem": "Q1", "answer": "1"}, {"problem": "Q2", "answer": "2"}]
    (tmp_path / "list.json").write_text(json.dumps(records))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": records}))
    write_jsonl(tmp_path / "lines.json", records)  # JSON lines stored as .json
    for name in ("list.json", "wrapped.json", "lines.json"):
        assert load_math_dataset(tmp_path / name)["problem"] == ["Q1", "Q2"], name


BAD_ROWS = [
    ({"answer": "1"}, "problem", "is missing"),
    ({"problem": "   ", "answer": "1"}, "problem", "is empty"),
    ({"problem": 12, "answer": "1"}, "problem", "must be a string, got int"),
    ({"problem": "Q", "answer": None}, "answer", "is missing"),
    ({"problem": "Q", "answer": ""}, "answer", "is empty"),
    ({"problem": "Q", "answer": [1, 2]}, "answer", "must be a string or a number, got list"),
    ({"problem": "Q", "answer": True}, "answer", "must be a string or a number, got bool"),
    ({"problem": "Q", "answer": "\\boxed{}"}, "answer", "is empty"),
]


@pytest.mark.parametrize(("bad", "field", "reason"), BAD_ROWS)
def test_bad_row_raises_naming_source_row_and_field(tmp_path, bad, field, reason):
    good = [{"problem": "Q0", "answer": "0"}, {"problem": "Q1", "answer": "1"}]
    path = write_jsonl(tmp_path / "bad.jsonl", good + [bad])
    with pytest.raises(ValueError) as error:
        load_math_dataset(path)
    message = str(error.value)
    assert str(path) in message
    assert f"row 2: field '{field}' {reason}" in message
    assert "drop_invalid=True" in message


def test_drop_invalid_drops_bad_rows_and_warns_the_count(tmp_path, caplog):
    records = [{"problem": "Q0", "answer": "0"}] + [bad for bad, _, _ in BAD_ROWS] + [{"problem": "Q9", "answer": 9}]
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with caplog.at_level(logging.WARNING, logger="stapo_trl.math.data"):
        dataset = load_math_dataset(path, drop_invalid=True)
    assert dataset["problem"] == ["Q0", "Q9"]
    assert dataset["solution"] == ["0", "9"]
    assert dataset["id"] == ["bad-0", "bad-9"]  # ids keep the source row
    assert f"dropped {len(BAD_ROWS)} invalid row(s)" in caplog.text


def test_drop_invalid_counts_repeated_bad_rows_once_each(tmp_path, caplog):
    rows = [dapo_row(P1, "24", "a")] + [dapo_row(P2, "", "b")] * 3 + [dapo_row(P1, "24", "c")]
    path = write_parquet(tmp_path / "dapo.parquet", rows)
    with pytest.raises(ValueError, match=r"row 1: field 'reward_model.ground_truth' is empty"):
        load_dapo_math(path)
    with caplog.at_level(logging.INFO, logger="stapo_trl.math.data"):
        dataset = load_dapo_math(path, drop_invalid=True)
    assert dataset["problem"] == [P1]
    assert "dropped 3 invalid row(s)" in caplog.text
    assert "dropped 1 duplicate row(s)" in caplog.text


def test_only_invalid_rows_is_an_error_even_when_dropping(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "", "answer": "1"}])
    with pytest.raises(ValueError, match="no usable rows"):
        load_math_dataset(path, drop_invalid=True)


def test_missing_column_lists_the_available_columns_and_the_parameter(tmp_path):
    path = write_jsonl(tmp_path / "custom.jsonl", [{"question": "Q", "gold": "1"}])
    expected = r"no column 'problem' \(for problem_field='problem'\); available columns: \['gold', 'question'\]"
    with pytest.raises(ValueError, match=expected):
        load_math_dataset(path)
    with pytest.raises(ValueError, match=r"no column 'answer' \(for answer_field='answer'\).*Set answer_field"):
        load_math_dataset(path, problem_field="question")


def test_missing_local_file_fails_before_any_loading(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("tried to load a path that does not exist")

    monkeypatch.setattr("datasets.load_dataset", fail)
    missing = tmp_path / "nope" / "train.jsonl"
    for load in (load_math_dataset, load_dapo_math):
        with pytest.raises(FileNotFoundError, match=str(missing)):
            load(str(missing))
    with pytest.raises(FileNotFoundError, match="train.parquet"):
        load_math_dataset("data/train.parquet")  # relative and missing: a path, not a Hub id


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"problem": "Q", "answer": "1"}\n{"problem": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl'?: line 2 is not valid JSON"):
        load_math_dataset(path)


def test_a_file_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        '{"problem": "Combien font 2+2 ? \u00c9crire le r\u00e9sultat.", "answer": "4"}\n'.encode("latin-1")
    )
    with pytest.raises(ValueError, match=r"latin1.jsonl'?: not UTF-8 .*save the file as UTF-8"):
        load_math_dataset(path)


# --------------------------------------------------------------------------------------------------------------
# The shared benchmark files


@pytest.mark.parametrize(("name", "size"), sorted(BENCHMARK_SIZES.items()))
def test_benchmark_files_load_completely(name, size):
    dataset = load_verl_parquet(MATH_EVAL / f"{name}.parquet")
    assert len(dataset) == size
    assert set(dataset["data_source"]) == {name}
    assert len(set(dataset["id"])) == size
    for prompt, problem, solution in zip(dataset["prompt"], dataset["problem"], dataset["solution"]):
        assert problem.strip() and solution.strip()
        assert not solution.startswith("\\boxed")
        assert prompt == math_prompt(problem)


def test_aime24_golds_are_bare_integers():
    solutions = load_verl_parquet(MATH_EVAL / "AIME24.parquet")["solution"]
    assert solutions[0] == "204"
    assert all(solution.isdigit() for solution in solutions)


def test_benchmark_directory_loads_as_one_dataset():
    dataset = load_verl_parquet(MATH_EVAL)
    assert len(dataset) == sum(BENCHMARK_SIZES.values())
    assert set(dataset["data_source"]) == set(BENCHMARK_SIZES)
