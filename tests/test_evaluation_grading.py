"""stapo_trl.evaluation.grading: the model verifier behind the rules (evaluation only): only rule negatives are sent,
only "A" counts, verdicts are stored beside the rule verdict, and regrade adds / keeps / drops the verifier."""

import json
from pathlib import Path

import pytest

from stapo_trl.evaluation import (
    KEEP,
    SAMPLES_FILE,
    EvalConfig,
    VerifierConfig,
    evaluate,
    parse_verdict,
    regrade,
    verifier_prompt,
)
from stapo_trl.evaluation import grading as grading_module
from stapo_trl.evaluation.generation import Generation
from stapo_trl.toy import SHIPPED_CHECKPOINT


PROMPT = "Question: {question}\nGold: {gold_answer}\nResponse: {llm_response}\nJudge with A, B or C. \\boxed{}"


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "verifier_prompt.txt"
    path.write_text(PROMPT)
    return str(path)


@pytest.fixture(scope="module")
def rule_run(tmp_path_factory):
    """A small math run on the shipped benchmarks with the toy model, rules only: its directory."""
    output_dir = tmp_path_factory.mktemp("rule-run")
    config = EvalConfig(
        output_dir=str(output_dir),
        benchmarks=["AMC23", "MATH500"],
        num_samples=2,
        max_problems=3,
        max_new_tokens=8,
        presets=["t1.0"],
        backend="transformers",
    )
    evaluate(str(SHIPPED_CHECKPOINT), config)
    return output_dir


def records_of(output_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(output_dir) / SAMPLES_FILE).read_text().splitlines()]


def latest_records(output_dir) -> dict:
    return {(r["benchmark"], r["problem_id"], r["sample_index"]): r for r in records_of(output_dir)}


class ScriptedVerifier:
    """Answers A, B, C or garbage in turn; records every prompt it is sent."""

    name = "scripted-verifier"
    default_batch_size = 3
    answers = ("A", "B", "C", "A lot of text that is no verdict")

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens):
        assert temperature == 0.0 and max_new_tokens == 32  # greedy, bounded
        outputs = []
        for prompt in prompts:
            outputs.append(Generation(self.answers[len(self.prompts) % 4], 1, "stop"))
            self.prompts.append(prompt[0]["content"])
        return outputs


def test_parse_verdict_counts_only_a_clear_letter():
    assert [parse_verdict(text) for text in ("A", " B\n", "(C)", "A.", "Final Judgment: \\boxed{A} - CORRECT")] == [
        "A",
        "B",
        "C",
        "A",
        "A",
    ]
    assert {parse_verdict(text) for text in ("A lot of work", "", "D", "AB", "The answer is A")} == {"unparseable"}


def test_the_prompt_is_filled_literally_and_checked_before_any_work(tmp_path, prompt_file):
    message = verifier_prompt(PROMPT, "Find {x}.", "\\frac{1}{2}", "so \\boxed{0.5}")
    assert message == [
        {
            "role": "user",
            "content": "Question: Find {x}.\nGold: \\frac{1}{2}\nResponse: so \\boxed{0.5}\n"
            "Judge with A, B or C. \\boxed{}",
        }
    ]
    with pytest.raises(ValueError, match=r"--verifier_prompt.*not distributed"):
        VerifierConfig().check()
    incomplete = tmp_path / "incomplete.txt"
    incomplete.write_text("{question} {llm_response}")
    with pytest.raises(ValueError, match=r"lacks \{gold_answer\}"):
        VerifierConfig(prompt_file=str(incomplete)).check()
    with pytest.raises(ValueError, match="math answers only"):
        EvalConfig(output_dir=str(tmp_path), task="code", verifier=VerifierConfig(prompt_file=prompt_file))


def test_only_rule_negatives_go_to_the_verifier_and_only_a_counts(rule_run, tmp_path, monkeypatch, prompt_file):
    import shutil

    output_dir = tmp_path / "run"
    shutil.copytree(rule_run, output_dir)
    rules_only = json.loads((output_dir / "summary.json").read_text())
    before = latest_records(output_dir)
    negatives = {key for key, record in before.items() if record["correct"] is False}
    assert negatives  # the toy model gets these wrong in 8 tokens

    verifier = ScriptedVerifier()
    monkeypatch.setattr(grading_module, "make_backend", lambda *args, **kwargs: verifier)
    summary = regrade(output_dir, verifier=VerifierConfig(prompt_file=prompt_file, model="scripted"))

    after = latest_records(output_dir)
    judged = {key for key, record in after.items() if record.get("verifier_verdict") is not None}
    assert judged == negatives and len(verifier.prompts) == len(negatives)  # rule negatives only, each once
    assert all(after[key]["correct"] == before[key]["correct"] for key in before)  # rule verdicts untouched
    assert {after[key]["verifier_verdict"] for key in judged} <= {"A", "B", "C", "unparseable"}
    problem_text = next(iter(verifier.prompts))
    assert problem_text.startswith("Question: ") and "\nGold: " in problem_text

    for name, result in summary["results"]["t1.0"]["benchmarks"].items():
        per_problem = {}
        for (benchmark, problem_id, _), record in after.items():
            if benchmark == name:
                counted = record["correct"] or record.get("verifier_verdict") == "A"
                per_problem.setdefault(problem_id, []).append(counted)
        expected = 100 * sum(sum(v) / len(v) for v in per_problem.values()) / len(per_problem)
        assert result["score_with_verifier"] == pytest.approx(expected)
        assert result["score"] == rules_only["results"]["t1.0"]["benchmarks"][name]["score"]
        assert result["num_verifier_accepted"] == sum(
            after[key].get("verifier_verdict") == "A" for key in judged if key[0] == name
        )
    table = (output_dir / "summary.md").read_text()
    assert "rules only" in table and "rules, then scripted" in table and table.count("| Model |") == 2

    # KEEP: the stored verdicts stay, nothing is asked again.
    asked = len(verifier.prompts)
    assert regrade(output_dir, verifier=KEEP) == summary
    assert len(verifier.prompts) == asked
    # None: the verifier is dropped; the rule numbers are those of the rules-only run.
    dropped = regrade(output_dir, verifier=None)
    assert all("verifier_verdict" not in record for record in latest_records(output_dir).values())
    assert dropped["results"] == rules_only["results"] and "rules only" not in (output_dir / "summary.md").read_text()


def test_a_local_causal_lm_stands_in_for_compassverifier(rule_run, tmp_path, prompt_file):
    """The toy model as the verifier, through the transformers backend: its outputs are no verdicts, so every
    rule negative is judged "unparseable" and nothing is credited."""
    import shutil

    output_dir = tmp_path / "run"
    shutil.copytree(rule_run, output_dir)
    verifier = VerifierConfig(prompt_file=prompt_file, model=str(SHIPPED_CHECKPOINT), backend="transformers")
    summary = regrade(output_dir, verifier=verifier, verification_timeout=None)
    records = latest_records(output_dir).values()
    judged = [record for record in records if record.get("verifier_verdict") is not None]
    assert judged and all(record["correct"] is False for record in judged)
    assert all(record["verifier"] == str(SHIPPED_CHECKPOINT) for record in judged)
    assert all(record["verifier_verdict"] == parse_verdict(record["verifier_output"]) for record in judged)
    for name, result in summary["results"]["t1.0"]["benchmarks"].items():
        negatives = [record for record in records if record["benchmark"] == name and record["correct"] is False]
        assert result["num_verifier_checked"] == len(negatives) and result["num_verifier_pending"] == 0
        accepted = sum(record["verifier_verdict"] == "A" for record in negatives)
        assert result["num_verifier_accepted"] == accepted
        assert (result["score_with_verifier"] == result["score"]) == (accepted == 0)


def test_the_command_refuses_a_verifier_without_its_prompt_before_loading_a_model(tmp_path, monkeypatch):
    from stapo_trl.evaluation import cli
    from stapo_trl.evaluation import run as run_module

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(run_module, "make_backend", no_model)
    with pytest.raises(ValueError, match="--verifier_prompt"):
        cli.main(["--model", "toy", "--output_dir", str(tmp_path), "--verifier"])
    assert not any(tmp_path.iterdir())
