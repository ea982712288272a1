"""math_reward (DAPO's +1/-1 rule via math-verify), the boxed-answer and gold readers: correctness, multi-part answers
against math-verify's own verdicts, robustness, time and memory bounds, verifier processes."""

import os


os.environ["HF_HUB_OFFLINE"] = "1"

import decimal  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from conftest import is_gone  # noqa: E402

from stapo_trl.math import reward as rewards  # noqa: E402
from stapo_trl.math.reward import (  # noqa: E402
    MAX_ANSWER_CHARS,
    boxed_answers,
    extract_boxed_answer,
    gold_answer,
    math_reward,
)


REPO_ROOT = Path(__file__).resolve().parents[1]
MATH_EVAL_DIR = REPO_ROOT / "stapo_trl" / "math" / "benchmarks"  # the six shipped benchmark files

# (gold, answer) pairs that keep sympy busy for minutes (measured: over 40 s each without a time limit).
SLOW_TO_VERIFY = [
    (r"\frac{\log 2}{\log 2-\log 3}", "123456789"),
    ("2", "(x+1)^{10000}-(x-1)^{10000}"),
]

# Answers that write integers too large to evaluate; the first also kept sympy busy for minutes.
TOO_LARGE_TO_JUDGE = [
    "9^{9^{9^{9^{9^{9^{9^{9^{9^{9^{9}}}}}}}}}}",
    "9^{9^{9}}",
    "10^{100000}",
    "2^{2^{33}}",
    "3^{10^{5}} + 1",
    "(5000)! - 1",
    r"\frac{1}{10^{10^{10}}}",
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
        (r"first \boxed{1}, then \boxed{2}", "1, 2"),  # boxes close together make one answer, as in math-verify
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


# Boxes that make one answer, and boxes that do not; the expected parts are math-verify's own grouping
# (latex2sympy2_extended's extract_boxed_content, which math-verify's parse uses), checked below.
GROUPED_AS_MATH_VERIFY_DOES = [
    (r"\boxed{2}, \boxed{3}, \boxed{5}", ["2", "3", "5"]),
    (r"\boxed{1} papers and \boxed{2} bins", ["1", "2"]),
    (r"$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$", ["(2, 2)", "(6, 2)"]),
    (r"\boxed{1},\boxed{2},\boxed{3}", ["1", "2", "3"]),
    (r"\boxed{3} \quad \boxed{4}", ["3", "4"]),
    (r"\boxed{5}\text{ cm and }\boxed{7}\text{ cm}", ["5", "7"]),
    (r"\boxed{x = 1} \text{ or } \boxed{x = -1}", ["x = 1", "x = -1"]),
    (r"\boxed{1}, \boxed{1}", ["1"]),  # a repeated answer counts once
    (r"\boxed{3} is the first one; the second one, after the rest of the work on the other case, is \boxed{4}", ["4"]),
    (r"\boxed{3} which we double to get \boxed{4}", ["4"]),  # no separator between them
    (r"\boxed{\boxed{5}}", ["5"]),
]


@pytest.mark.parametrize("text, expected", GROUPED_AS_MATH_VERIFY_DOES)
def test_boxed_answers_group_boxes_as_math_verify_does(text, expected):
    from latex2sympy2_extended.math_normalization import extract_boxed_content

    assert extract_boxed_content(text, mode="last") == ",".join(expected)  # the reference
    assert boxed_answers(text) == expected
    assert extract_boxed_answer(text) == ", ".join(expected)


@pytest.mark.parametrize(
    "text, expected",
    [(r"\boxed{} , \boxed{4}", ["4"]), (r"\boxed{1} and \boxed{2", []), (r"\boxed{1} and \boxed{}", []), ("x", [])],
)
def test_boxed_answers_ignore_empty_and_unclosed_boxes(text, expected):
    assert boxed_answers(text) == expected


def test_boxed_answers_cap_the_total_length():
    part = "1" * (MAX_ANSWER_CHARS // 2)
    assert boxed_answers(rf"\boxed{{{part}}}, \boxed{{{part}2}}") == []
    assert boxed_answers(rf"\boxed{{{part}}}, \boxed{{{part[1:]}2}}") == [part, part[1:] + "2"]


@pytest.mark.parametrize(
    "gold, expected",
    [
        ("34", "34"),
        ("  34 \n", "34"),
        (r"\boxed{204}", "204"),
        (r"The sum is $3 + 4$, so the answer is $\boxed{7}$.", "7"),
        (r"\boxed{1} papers and \boxed{2} bins", "1, 2"),
        ("(2, 2), (6, 2)", "(2, 2), (6, 2)"),
        (r"\boxed{34", r"\boxed{34"),  # no well-formed box: the whole text, which then fails to parse
        (None, ""),
        (7, "7"),
    ],
)
def test_gold_answer(gold, expected):
    assert gold_answer(gold) == expected


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
    # A box well before the final one (over 70 characters apart) is an intermediate result, not part of the answer.
    filler = " so we continue the computation with the other case, which needs a few more lines of work, and"
    completions = [
        rf"first \boxed{{3}},{filler} finally \boxed{{4}}",
        rf"first \boxed{{4}},{filler} finally \boxed{{3}}",
    ]
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
    assert got == [-1.0, 1.0]
    assert time.monotonic() - started < 10.0
    assert any("took over 1 s" in message for message in caplog.messages)
    # The hung verifier was replaced: the next call is judged normally.
    assert math_reward([rf"\boxed{{{gold}}}"], [gold]) == [1.0]


def test_a_timeout_bound_with_partial_applies():
    gold, answer = SLOW_TO_VERIFY[0]
    bound_reward = functools.partial(math_reward, verification_timeout=0.5)
    started = time.monotonic()
    assert bound_reward([rf"\boxed{{{answer}}}"], [gold]) == [-1.0]
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


@pytest.mark.parametrize("answer", TOO_LARGE_TO_JUDGE)
def test_answers_writing_huge_integers_are_refused_before_any_verifier_sees_them(answer, caplog):
    assert rewards._writes_too_large_an_integer(answer)
    with caplog.at_level(logging.WARNING, logger="stapo_trl.math.reward"):
        assert reward(rf"\boxed{{{answer}}}", "34", verification_timeout=600) == -1.0
    assert any("writes an integer of over" in message for message in caplog.messages)


@pytest.mark.parametrize(
    "answer", ["2^{2023}", "2^{10}", "10^{9999}", "100!", "2^{2^{10}}", "x^{10^{6}}", "2^{2^{n}}"]
)
def test_large_but_reasonable_answers_are_not_refused(answer):
    assert not rewards._writes_too_large_an_integer(answer)


def test_no_benchmark_gold_would_be_refused_as_an_answer():
    for path in sorted(MATH_EVAL_DIR.glob("*.parquet")):
        for row in pq.read_table(path, columns=["reward_model"])["reward_model"].to_pylist():
            assert not rewards._writes_too_large_an_integer(gold_answer(row["ground_truth"])), (path.name, row)


@pytest.fixture
def fresh_pool(monkeypatch):
    """A pool of its own for the test (its verifiers start afresh), closed afterwards."""
    monkeypatch.setattr(rewards, "_pool", None)
    yield
    if rewards._pool is not None:
        rewards._pool.close()


def slow_answers(count: int) -> list[str]:
    """Distinct answers to the gold "2" that each keep sympy busy for minutes and pass the cheap refusal."""
    return [rf"\boxed{{(x+1)^{{{9000 + n}}}-(x-1)^{{{9000 + n}}}}}" for n in range(count)]


def test_a_call_with_a_batch_of_slow_answers_ends_within_its_budget(caplog):
    assert reward(r"\boxed{34}", "34") == 1.0  # verifiers started
    completions = slow_answers(12) + [r"\boxed{34}"]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="stapo_trl.math.reward"):
        got = math_reward(completions, ["2"] * 12 + ["34"], verification_timeout=600, time_budget=3)
    elapsed = time.monotonic() - started
    assert got[:12] == [-1.0] * 12
    assert elapsed < 3 + 5  # the budget, and the time to kill what was running
    assert any("time budget ran out" in message for message in caplog.messages)
    assert reward(r"\boxed{34}", "34") == 1.0  # the killed verifiers were replaced


def test_a_budget_bound_with_partial_applies():
    bound_reward = functools.partial(math_reward, time_budget=2.0, verification_timeout=600)
    started = time.monotonic()
    assert bound_reward(slow_answers(4), ["2"] * 4) == [-1.0] * 4
    assert time.monotonic() - started < 2 + 5


def test_a_partial_with_settings_is_a_reward_trl_names_math_reward(tokenizer, prompt_dataset, tmp_path):
    from conftest import cpu_config

    from stapo_trl import STAPOTrainer
    from stapo_trl.toy.model import tiny_qwen3

    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer),
        reward_funcs=functools.partial(math_reward, verification_timeout=2.0, verifier_processes=1),
        args=cpu_config(tmp_path),
        train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )
    assert trainer.reward_func_names == ["math_reward"]  # logged as rewards/math_reward/mean


def test_bad_settings_are_caller_errors():
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="time_budget"):
            math_reward([r"\boxed{1}"], ["1"], time_budget=bad)
    for name in ("verifier_processes", "verifier_memory_bytes"):
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match=name):
                math_reward([r"\boxed{1}"], ["1"], **{name: bad})


def test_one_prompts_answers_are_spread_over_the_verifiers(fresh_pool, caplog):
    # Two slow answers to one prompt, 2 s each: judged side by side they both time out within a 5 s budget;
    # judged one after the other (4 s, plus starting a replacement verifier) the budget would cut the second.
    math_reward = functools.partial(rewards.math_reward, verifier_processes=2)
    assert math_reward([r"\boxed{1}", r"\boxed{2}"], ["1", "2"]) == [1.0, 1.0]  # two verifiers started
    for verifier in rewards._pool.starting:  # one may have done all the work while the other was starting
        assert verifier.connection.poll(120)
    assert math_reward([r"\boxed{1}", r"\boxed{2}"], ["1", "2"]) == [1.0, 1.0]  # ... and is now ready
    assert len(rewards._pool.idle) == 2
    with caplog.at_level(logging.WARNING, logger="stapo_trl.math.reward"):
        got = math_reward(slow_answers(2), ["2", "2"], verification_timeout=2, time_budget=5)
    assert got == [-1.0, -1.0]
    assert sum("took over 2 s" in message for message in caplog.messages) == 2
    assert not any("time budget ran out" in message for message in caplog.messages)


def test_a_verifier_runs_under_its_memory_limit(monkeypatch, fresh_pool, caplog):
    # 2^(2^33) needs a 1 GiB integer: the verifier fails to allocate it, which scores -1 (no timeout involved).
    monkeypatch.setattr(rewards, "_writes_too_large_an_integer", lambda answer: False)  # let the verifier try
    settings = {"verifier_memory_bytes": 128 << 20, "verifier_processes": 1}
    with caplog.at_level(logging.WARNING, logger="stapo_trl.math.reward"):
        assert reward(r"\boxed{2^{2^{33}}}", "1", verification_timeout=600, time_budget=600, **settings) == -1.0
    assert not any("took over" in message for message in caplog.messages)
    (verifier,) = rewards._pool.idle
    assert verifier_memory_kib(verifier.process.pid)["VmPeak"] <= 128 << 10
    assert reward(r"\boxed{34}", "34", **settings) == 1.0


def test_a_memory_limit_changed_after_the_first_call_applies(fresh_pool):
    assert reward(r"\boxed{34}", "34", verifier_processes=1) == 1.0
    assert [address_space_limit(verifier.process.pid) for verifier in rewards._pool.idle] == [2 << 30]
    assert reward(r"\boxed{34}", "34", verifier_processes=1, verifier_memory_bytes=256 << 20) == 1.0
    assert [address_space_limit(verifier.process.pid) for verifier in rewards._pool.idle] == [256 << 20]


def address_space_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as limits:
        (line,) = [line for line in limits if line.startswith("Max address space")]
    return int(line.split()[3])


def test_verifiers_get_a_scrubbed_environment(monkeypatch, fresh_pool):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    assert reward(r"\boxed{34}", "34", verifier_processes=1) == 1.0
    (verifier,) = rewards._pool.idle
    with open(f"/proc/{verifier.process.pid}/environ", "rb") as environ:
        variables = dict(entry.split(b"=", 1) for entry in environ.read().split(b"\0") if entry)
    assert set(variables) == {b"PATH", b"LC_ALL"}  # processes.scrubbed_env: nothing of the trainer's


def verifier_memory_kib(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status.read().splitlines())
    return {name: int(fields[name].split()[0]) for name in ("VmPeak", "VmRSS") if name in fields}


# A training process (as far as verifiers are concerned): its verifiers run under a memory limit, and one works on
# an answer that needs ever more memory (after failing to allocate, it is sent the answer again).
TRAINER_LIKE_PARENT = r"""
import sys
import functools
from stapo_trl.math import reward
math_reward = functools.partial(reward.math_reward, verifier_memory_bytes=int(sys.argv[1]), verifier_processes=1)
reward._writes_too_large_an_integer = lambda answer: False
math_reward([r"\boxed{1}"], ["1"])
print(reward._verifier_pool().idle[0].process.pid, flush=True)
while True:
    math_reward([r"\boxed{2^{2^{33}}}"], ["1"], verification_timeout=600, time_budget=600)
"""


def test_verifiers_die_with_a_sigkilled_trainer_and_stay_under_their_memory_limit():
    limit = 128 << 20
    parent = subprocess.Popen(
        [sys.executable, "-c", TRAINER_LIKE_PARENT, str(limit)], stdout=subprocess.PIPE, start_new_session=True
    )
    verifier = None
    try:
        assert select.select([parent.stdout], [], [], 120)[0], "the parent did not report its verifier"
        verifier = int(parent.stdout.readline())
        peak_kib = 0
        deadline = time.monotonic() + 120
        while peak_kib < (limit >> 10) * 3 // 4 and time.monotonic() < deadline:  # until it presses on the limit
            peak_kib = max(peak_kib, verifier_memory_kib(verifier).get("VmPeak", 0))
            time.sleep(0.1)
        assert peak_kib >= (limit >> 10) * 3 // 4, "the verifier never worked on the answer"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=60)
        gone_by = time.monotonic() + 30
        while not is_gone(verifier) and time.monotonic() < gone_by:
            peak_kib = max(peak_kib, verifier_memory_kib(verifier).get("VmPeak", 0))
            time.sleep(0.05)
        assert is_gone(verifier)
        assert peak_kib <= limit >> 10
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
        if verifier is not None and not is_gone(verifier):
            os.kill(verifier, signal.SIGKILL)


def test_fork_while_another_thread_is_inside_math_reward():
    gold, answer = SLOW_TO_VERIFY[0]
    worker = threading.Thread(
        target=math_reward, args=([rf"\boxed{{{answer}}}"], [gold]), kwargs={"verification_timeout": 3}
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not rewards._POOL_LOCK.locked() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert rewards._POOL_LOCK.locked()
        child = os.fork()
        if child == 0:  # the child judges an answer of its own, then leaves without running the parent's cleanup
            try:
                os._exit(0 if math_reward([r"\boxed{34}"], ["34"]) == [1.0] else 1)
            finally:
                os._exit(2)
        deadline = time.monotonic() + 60
        while (status := os.waitpid(child, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        if status == (0, 0):
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        assert status != (0, 0), "the forked child hung"
        assert os.waitstatus_to_exitcode(status[1]) == 0
    finally:
        worker.join()


def test_verifiers_never_import_modules_of_the_working_directory(monkeypatch, fresh_pool, tmp_path):
    marker = tmp_path / "stray code ran"
    (tmp_path / "sympy.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('stray sympy')\n")
    monkeypatch.chdir(tmp_path)
    assert math_reward([r"\boxed{0.5}", r"\boxed{3}"], [r"\frac{1}{2}", "4"]) == [1.0, -1.0]
    assert not marker.exists()


# --- math_reward: multi-part answers, against math-verify's own verdicts -------------------------------------

FAR_APART = " and now that case is settled, we go back to the other case with the same method, which gives"

# (gold, completion): ordered tuples, unordered sets, "and"/"or", \quad, \text{} between boxes, intervals,
# subsets, and earlier boxes that are not part of the final answer.
MULTI_PART_CASES = [
    (r"\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}", r"... \boxed{13}"),
    (r"\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}", r"\boxed{2, 3, 5, 7, 13}"),
    (
        r"\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}",
        r"\boxed{13}, \boxed{7}, \boxed{5}, \boxed{3}, \boxed{2}",
    ),
    (r"\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}", r"\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}"),
    (r"\boxed{1} papers and \boxed{2} bins", r"... \boxed{2}"),
    (r"\boxed{1} papers and \boxed{2} bins", r"\boxed{1} and \boxed{2}"),
    (r"\boxed{1} papers and \boxed{2} bins", r"\boxed{1} or \boxed{2}"),
    ("(2, 2), (6, 2)", r"$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$"),
    ("(2, 2), (6, 2)", r"\boxed{(6, 2)}, \boxed{(2, 2)}"),
    ("(2, 2), (6, 2)", r"\boxed{(2, 2), (6, 2)}"),
    ("(2, 2), (6, 2)", r"\boxed{(2, 2)}"),
    ("(2, 2), (6, 2)", r"\boxed{(2, 6)}, \boxed{(2, 2)}"),
    ("{1,2,3}", r"\boxed{1},\boxed{2},\boxed{3}"),
    ("{1,2,3}", r"\boxed{3},\boxed{1},\boxed{2}"),
    ("{1,2,3}", r"\boxed{\{1, 2, 3\}}"),
    ("{1,2,3}", r"\boxed{1},\boxed{2}"),
    ("(3, 4, 5)", r"\boxed{(3, 4, 5)}"),
    ("(3, 4, 5)", r"\boxed{(5, 4, 3)}"),
    ("(3, 4, 5)", r"\boxed{3}, \boxed{4}, \boxed{5}"),
    ("3, 4", r"\boxed{3} \quad \boxed{4}"),
    ("5, 7", r"\boxed{5}\text{ cm and }\boxed{7}\text{ cm}"),
    ("5, 7", r"\boxed{5}\text{ cm and }\boxed{8}\text{ cm}"),
    ("1, -1", r"\boxed{x = 1} \text{ or } \boxed{x = -1}"),
    ("[1, 2)", r"\boxed{[1, 2)}"),
    ("[1, 2)", r"\boxed{(1, 2]}"),
    (r"(-\infty, 0] \cup [1, \infty)", r"\boxed{(-\infty, 0] \cup [1, \infty)}"),
    (r"(-\infty, 0] \cup [1, \infty)", r"\boxed{(-\infty, 0]} \text{ and } \boxed{[1, \infty)}"),
    (r"(-\infty, 0] \cup [1, \infty)", r"\boxed{[1, \infty)}"),
    ("4", rf"first \boxed{{3}},{FAR_APART} \boxed{{4}}"),
    ("3, 4", rf"first \boxed{{3}},{FAR_APART} \boxed{{4}}"),
]


def math_verify_verdict(gold: str, completion: str) -> bool:
    """math-verify's own parse + verify, the gold read as math (in $...$) unless it has its own boxes."""
    from math_verify import parse, verify

    return verify(parse(gold if r"\boxed" in gold else f"${gold}$"), parse(completion))


def test_multi_part_answers_agree_with_math_verify():
    golds, completions = zip(*MULTI_PART_CASES)
    expected = [1.0 if math_verify_verdict(gold, completion) else -1.0 for gold, completion in MULTI_PART_CASES]
    assert expected.count(1.0) >= 10 and expected.count(-1.0) >= 10  # the cases test both verdicts
    got = math_reward(list(completions), list(golds))
    disagreements = [case for case, mine, theirs in zip(MULTI_PART_CASES, got, expected) if mine != theirs]
    assert disagreements == []


def test_a_subset_of_a_multi_part_answer_is_not_credited_and_a_complete_one_is():
    # Hand-checked: the gold has several parts, the first two completions give one of them; the last two give all.
    cases = [
        (r"\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}", r"... \boxed{13}", -1.0),
        (r"\boxed{1} papers and \boxed{2} bins", r"... \boxed{2}", -1.0),
        ("(2, 2), (6, 2)", r"$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$", 1.0),
        ("{1,2,3}", r"\boxed{1},\boxed{2},\boxed{3}", 1.0),
    ]
    golds, completions, expected = zip(*cases)
    assert math_reward(list(completions), list(golds)) == list(expected)


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
        got = iter(math_reward(completions, solutions, time_budget=math.inf))  # a whole benchmark: no call budget

    failures, unparseable = {}, {}
    for name, golds in golds_by_file.items():
        verdicts = [(gold, next(got), next(got)) for gold in golds]
        agreeing = sum(right == 1.0 and wrong == -1.0 for _, right, wrong in verdicts)
        print(f"{name}: {agreeing}/{len(golds)} golds score +1 on themselves and -1 on a wrong number")
        failures[name] = {gold for gold, right, wrong in verdicts if not (right == 1.0 and wrong == -1.0)}
        unparseable[name] = {gold for gold, right, wrong in verdicts if right is None and wrong is None}
    assert {name: golds for name, golds in failures.items() if golds} == UNPARSEABLE_GOLDS
    assert {name: golds for name, golds in unparseable.items() if golds} == UNPARSEABLE_GOLDS


# --- e-notation: numbers such as 4.5e33 are powers of ten, not Euler's number -----------------------------------

SHIPPED_BENCHMARKS_DIR = REPO_ROOT / "stapo_trl" / "math" / "benchmarks"
# A number in e-notation, as Python's float() reads it; the whole gold is one (as each of Minerva's are).
E_NOTATION_GOLD = r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+"


def shipped_e_notation_golds() -> dict[str, list[str]]:
    golds = {}
    for path in sorted(SHIPPED_BENCHMARKS_DIR.glob("*.parquet")):
        rows = pq.read_table(path, columns=["reward_model"])["reward_model"].to_pylist()
        found = [row["ground_truth"].strip() for row in rows if re.fullmatch(E_NOTATION_GOLD, row["ground_truth"])]
        if found:
            golds[path.name] = found
    return golds


def in_latex(gold: str, exponent_shift: int = 0) -> str:
    """An e-notation gold as LaTeX: "4.5e33" -> "4.5 \\times 10^{33}"; `exponent_shift` adds to the exponent."""
    mantissa, _, exponent = gold.lower().partition("e")
    return f"{mantissa} \\times 10^{{{int(exponent) + exponent_shift}}}"


def euler_reading(gold: str) -> str:
    """What the gold's notation means to math-verify alone: "4.5e33" -> 4.5·e·33, "1e-8" -> e − 8."""
    mantissa, _, exponent = gold.lower().partition("e")
    return f"{mantissa} \\cdot e \\cdot {int(exponent)}" if int(exponent) > 0 else f"{mantissa} e - {-int(exponent)}"


def test_every_shipped_e_notation_gold_is_read_as_a_power_of_ten():
    golds_by_file = shipped_e_notation_golds()
    assert {name: len(golds) for name, golds in golds_by_file.items()} == {"Minerva.parquet": 58}
    cases = []  # (completion, gold, expected)
    for gold in golds_by_file["Minerva.parquet"]:
        cases += [
            (rf"\boxed{{{in_latex(gold)}}}", gold, 1.0),
            (rf"\boxed{{{gold}}}", in_latex(gold), 1.0),  # an answer in e-notation, too
            (rf"\boxed{{{euler_reading(gold)}}}", gold, -1.0),
        ]
    completions, solutions, expected = zip(*cases)
    got = math_reward(list(completions), list(solutions), time_budget=math.inf)
    wrong = [(completion, gold, want, have) for (completion, gold, want), have in zip(cases, got) if want != have]
    assert wrong == []


def test_an_e_notation_gold_judges_every_answer_as_the_same_gold_in_latex():
    golds = shipped_e_notation_golds()["Minerva.parquet"]
    answers = {
        "written out in full": [format(decimal.Decimal(gold), "f") for gold in golds],
        "ten times too large": [in_latex(gold, exponent_shift=1) for gold in golds],
        "ten times too small": [in_latex(gold, exponent_shift=-1) for gold in golds],
    }
    for form, written in answers.items():
        completions = [rf"\boxed{{{answer}}}" for answer in written]
        got = math_reward(completions, golds, time_budget=math.inf)
        assert got == math_reward(completions, [in_latex(gold) for gold in golds], time_budget=math.inf), form
        print(f"{form}: {got.count(1.0)}/{len(golds)} score +1, as against the golds in LaTeX")


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        (r"\frac{2}{1e3}", "0.002", 1.0),  # the power of ten stays one factor
        ("-1e-8", r"-1 \times 10^{-8}", 1.0),
        ("6.02E+23", r"6.02 \times 10^{23}", 1.0),
        ("2e", r"2 e", 1.0),  # no exponent: Euler's number, as written
        ("x_1e2", r"x_1e2", 1.0),  # part of a name, left alone
        ("3e8", r"3 \cdot e \cdot 8", -1.0),
    ],
)
def test_e_notation_in_answers(answer, gold, expected):
    assert reward(rf"\boxed{{{answer}}}", gold) == expected
