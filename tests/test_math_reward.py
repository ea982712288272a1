"""math_reward (DAPO's +1/-1 rule via math-verify) and extract_boxed_answer: correctness, robustness, time bounds."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import logging  # noqa: E402
import random  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from stapo_trl.math import reward as rewards  # noqa: E402
from stapo_trl.math.reward import MAX_ANSWER_CHARS, extract_boxed_answer, math_reward  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
MATH_EVAL_DIR = REPO_ROOT / ".." / "shared" / "data" / "math_eval"  # the six benchmarks' veRL parquet files

# (gold, answer) pairs that keep sympy busy for minutes (measured: over 40 s each without a time limit).
SLOW_TO_VERIFY = [
    (r"\frac{\log 2}{\log 2-\log 3}", "123456789"),
    ("2", "(x+1)^{10000}-(x-1)^{10000}"),
    ("34", "9^{9^{9^{9^{9^{9^{9^{9^{9^{9^{9}}}}}}}}}}"),
]


def reward(answer_text: str, gold: str, **kwargs) -> float | None:
    return math_reward([answer_text], [gold], **kwargs)[0]


# --- extract_boxed_answer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the answer is \boxed{34}.", "34"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\left\{1, 2\right\}}", r"\left\{1, 2\right\}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not groups
        (r"\boxed{a\}}", r"a\}"),
        (r"\boxed {7}", "7"),
        (r"\fbox{7}", "7"),
        (r"\boxed{ 7 }", "7"),
        (r"first \boxed{1}, then \boxed{2}", "2"),
        (r"\boxed{2} but finally \fbox{1}", "1"),
        (r"\boxed{\boxed{5}}", "5"),
        (r"\boxed{34}}", "34"),  # a stray brace after the box does not matter
        ("", None),
        ("the answer is 34", None),
        (r"\boxed 34", None),
        (r"\boxed{}", None),
        (r"\boxed{  }", None),
        (r"\boxed{34", None),
        (r"\boxed{\frac{1}{2}", None),
        (r"\boxed{1} and \boxed{2", None),  # the last box is broken: no answer, not the earlier one
        (r"\boxed{a\}", None),
    ],
)
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


def test_extract_boxed_answer_caps_the_answer_length():
    longest = "1" * MAX_ANSWER_CHARS
    assert extract_boxed_answer(r"\boxed{" + longest + "}") == longest
    assert extract_boxed_answer(r"\boxed{" + longest + "1}") is None


def test_extract_boxed_answer_is_fast_on_100kb():
    texts = [r"\boxed{" * 15_000, "{" * 100_000, "\\" * 100_000, r"\boxed{" + "{" * 100_000]
    started = time.monotonic()
    assert [extract_boxed_answer(text) for text in texts] == [None] * len(texts)
    assert time.monotonic() - started < 1.0


# --- math_reward: verdicts --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("0.5", r"\frac{1}{2}"),
        ("1/2", r"\frac{1}{2}"),
        (r"\frac{1}{2}", "0.5"),
        (r"\frac{\sqrt2}{2}", r"\sqrt{2}/2"),
        (r"\sqrt{2}/2", r"\frac{\sqrt2}{2}"),
        ("(3, 4)", "(3,4)"),
        ("34", "34"),
        ("34", r"\boxed{34}"),
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\dfrac{3}{4}", "0.75"),
        (r"\left\{1, 2\right\}", r"\{1,2\}"),
        (r"-\frac{1}{3}", "-1./3"),  # Python-style float in a Minerva gold
        ("5.", "5"),
    ],
)
def test_equivalent_answers_score_plus_one(answer, gold):
    assert reward(rf"Reasoning... so the answer is \boxed{{{answer}}}.", gold) == 1.0


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("35", "34"),
        ("-34", "34"),
        ("(4, 3)", "(3,4)"),
        (r"\frac{1}{3}", "0.5"),
        (r"\sqrt{3}/2", r"\frac{\sqrt2}{2}"),
        ("x", "y"),
        (r"\text{hello}", "34"),
        ("@@", "34"),  # unparseable answer
    ],
)
def test_wrong_answers_score_minus_one(answer, gold):
    assert reward(rf"\boxed{{{answer}}}", gold) == -1.0


@pytest.mark.parametrize(
    "completion",
    [
        "The answer is 34.",  # right number, but DAPO's rule wants it boxed
        "",
        r"\boxed 34",
        r"\boxed{}",
        r"\boxed{34",
        r"\boxed{\frac{1}{2}",
        r"}{ \boxed{{34}",
        r"\boxed{" + "1" * (MAX_ANSWER_CHARS + 1) + "}",
    ],
)
def test_missing_or_malformed_box_scores_minus_one(completion):
    assert reward(completion, "34") == -1.0


def test_variants_of_the_box_command():
    assert math_reward([r"\boxed {34}", r"\fbox{34}", r"\boxed{\boxed{34}}"], ["34"] * 3) == [1.0, 1.0, 1.0]


def test_the_last_box_counts_both_ways():
    completions = [r"first \boxed{3}, finally \boxed{4}", r"first \boxed{4}, finally \boxed{3}"]
    assert math_reward(completions, ["4", "4"]) == [1.0, -1.0]
    assert math_reward(completions, ["3", "3"]) == [-1.0, 1.0]


def test_conversational_completions_use_the_last_assistant_message():
    completions = [
        [{"role": "assistant", "content": r"\boxed{34}"}],
        [{"role": "assistant", "content": r"\boxed{34}"}, {"role": "user", "content": r"really \boxed{35}?"}],
        [{"role": "assistant", "content": r"\boxed{35}"}, {"role": "assistant", "content": r"no: \boxed{34}"}],
        [{"role": "assistant", "content": [{"type": "text", "text": r"\boxed{34}"}]}],
        [{"role": "assistant", "content": r"\boxed{33}"}],
        [{"role": "assistant", "content": None}],
        [{"role": "user", "content": r"\boxed{34}"}],
    ]
    assert math_reward(completions, ["34"] * len(completions)) == [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0]


def test_trl_calling_convention_and_repeated_groups():
    completions = [r"\boxed{34}", r"\boxed{34}", "no answer", r"\boxed{0.5}", r"\boxed{0.5}", r"\boxed{2}"]
    solutions = ["34", "34", "34", r"\frac{1}{2}", r"\frac{1}{2}", r"\frac{1}{2}"]
    got = math_reward(
        prompts=["p"] * 6,
        completions=completions,
        completion_ids=[[1, 2]] * 6,
        trainer_state=None,
        log_extra=lambda *args, **kwargs: None,
        log_metric=lambda *args, **kwargs: None,
        solution=solutions,
        data_source=["test"] * 6,
    )
    assert got == [1.0, 1.0, -1.0, 1.0, 1.0, -1.0]


def test_unparseable_gold_scores_none_and_warns():
    completions = [r"\boxed{34}", r"\boxed{34}", "no box", r"\boxed{34}"]
    with pytest.warns(UserWarning) as record:
        got = math_reward(completions, [r"\frac{1}{", "34", r"\frac{1}{", ""])
    assert got == [None, 1.0, None, None]
    messages = [str(warning.message) for warning in record]
    assert any("row 0" in message and r"'\\frac{1}{'" in message for message in messages)
    assert any("row 2" in message for message in messages)
    assert any("row 3" in message and "''" in message for message in messages)
    assert not any("row 1" in message for message in messages)


def test_mismatched_lengths_and_bad_timeout_are_caller_errors():
    with pytest.raises(ValueError):
        math_reward([r"\boxed{1}"], ["1", "2"])
    with pytest.raises(ValueError):
        math_reward([r"\boxed{1}"], ["1"], verification_timeout=0)


# --- math_reward: robustness and time bounds --------------------------------------------------------------------


def test_100kb_of_garbage_scores_minus_one_quickly():
    rng = random.Random(0)
    tokens = [r"\boxed{", r"\fbox{", "{", "}", "\\", r"\frac", "^", "_", "(", ")", "1", "x", " ", "$", r"\sqrt"]
    soup = "".join(rng.choice(tokens) for _ in range(40_000))[:100_000]
    printable = "".join(chr(rng.randrange(32, 127)) for _ in range(100_000))
    garbage = [
        soup,
        printable,
        r"\boxed{" * 15_000,
        r"\boxed{" + "1+" * 50_000 + "1}",
        "{" * 100_000,
        "\\" * 100_000,
        "x" * 99_993 + r"\boxed{",
    ]
    started = time.monotonic()
    got = math_reward(garbage + [printable + r" so \boxed{34}"], ["34"] * (len(garbage) + 1))
    assert got == [-1.0] * len(garbage) + [1.0]  # the whole text is searched: a box after 100 kB still counts
    assert time.monotonic() - started < 15.0


@pytest.mark.parametrize("gold, answer", SLOW_TO_VERIFY)
def test_slow_verification_times_out_to_minus_one(gold, answer, caplog):
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="stapo_trl.math.reward"):
        got = math_reward([rf"\boxed{{{answer}}}", r"\boxed{34}"], [gold, "34"], verification_timeout=1)
    assert got == [-1.0, 1.0]  # with gold "34", the second answer waits behind the slow one in the same job
    assert time.monotonic() - started < 10.0
    assert any("took over 1 s" in message for message in caplog.messages)
    # The hung verifier was replaced: the next call is judged normally.
    assert math_reward([rf"\boxed{{{gold}}}"], [gold]) == [1.0]


def test_module_default_timeout_applies(monkeypatch):
    gold, answer = SLOW_TO_VERIFY[0]
    monkeypatch.setattr(rewards, "VERIFICATION_TIMEOUT_SECONDS", 0.5)
    started = time.monotonic()
    assert reward(rf"\boxed{{{answer}}}", gold) == -1.0
    assert time.monotonic() - started < 10.0


def test_timeout_holds_off_the_main_thread():
    gold, answer = SLOW_TO_VERIFY[1]
    results = {}

    def score():
        completions = [r"\boxed{0.5}", rf"\boxed{{{answer}}}"]
        results["rewards"] = math_reward(completions, [r"\frac12", gold], verification_timeout=1)

    started = time.monotonic()
    worker = threading.Thread(target=score)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert results["rewards"] == [1.0, -1.0]
    assert time.monotonic() - started < 10.0


def test_dead_verifiers_are_replaced():
    assert reward(r"\boxed{34}", "34") == 1.0
    for verifier in rewards._verifier_pool().idle:
        verifier.process.kill()
        verifier.process.wait()
    assert math_reward([r"\boxed{34}", r"\boxed{35}"], ["34", "34"]) == [1.0, -1.0]


# --- real benchmark golds ---------------------------------------------------------------------------------------

# Golds math-verify finds no expression in (scored None, with a warning), by file: Python code, a subscripted E
# (math-verify's parser takes E for Euler's number and rejects E_1), and "t(0,4]" for "t in (0,4]".
UNPARSEABLE_GOLDS = {
    "Minerva.parquet": {
        "np.arcsin(10/13)",
        r"\hbar \omega(v+1 / 2)-\frac{E_{0}^{2} e^{2}}{2 m \omega^{2}}",
        "E_{1},E_{2}",
    },
    "Olympiad-Bench.parquet": {"$t(0,4]$"},
}


@pytest.mark.skipif(not MATH_EVAL_DIR.is_dir(), reason=f"{MATH_EVAL_DIR} is absent")
def test_every_benchmark_gold_accepts_itself_and_rejects_a_wrong_number():
    golds_by_file = {}
    for path in sorted(MATH_EVAL_DIR.glob("*.parquet")):
        rows = pq.read_table(path, columns=["reward_model"])["reward_model"].to_pylist()
        golds_by_file[path.name] = [row["ground_truth"] for row in rows]
    completions, solutions = [], []
    for golds in golds_by_file.values():
        for gold in golds:
            wrong = "123456789" if gold != "123456789" else "987654321"
            completions += [rf"... so the answer is \boxed{{{gold}}}", rf"\boxed{{{wrong}}}"]
            solutions += [gold, gold]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unparseable golds warn; checked below through their None
        got = iter(math_reward(completions, solutions))

    failures, unparseable = {}, {}
    for name, golds in golds_by_file.items():
        verdicts = [(gold, next(got), next(got)) for gold in golds]
        agreeing = sum(right == 1.0 and wrong == -1.0 for _, right, wrong in verdicts)
        print(f"{name}: {agreeing}/{len(golds)} golds score +1 on themselves and -1 on a wrong number")
        failures[name] = {gold for gold, right, wrong in verdicts if not (right == 1.0 and wrong == -1.0)}
        unparseable[name] = {gold for gold, right, wrong in verdicts if right is None and wrong is None}
    assert {name: golds for name, golds in failures.items() if golds} == UNPARSEABLE_GOLDS
    assert {name: golds for name, golds in unparseable.items() if golds} == UNPARSEABLE_GOLDS
