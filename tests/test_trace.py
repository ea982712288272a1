"""Token traces written during a tiny training run agree with the logged S2T metrics."""

import json

import pytest
from conftest import cpu_config, length_reward

from stapo_trl import STAPOTrainer
from stapo_trl.toy.model import tiny_qwen3


FIELDS = {
    "step", "micro_batch", "rank", "status", "sample", "position", "token_id", "token", "probability", "entropy", "advantage",
    "entropy_threshold", "context_before", "context_after", "top_alternatives", "gradient_norm", "entropy_change",
}  # fmt: skip


@pytest.mark.slow
def test_trace_matches_logged_silenced_counts(tokenizer, prompt_dataset, tmp_path):
    args = cpu_config(
        tmp_path,
        spurious_prob_threshold=0.02,
        max_steps=2,
        spurious_trace=True,
        spurious_trace_max_silenced=10_000,  # everything silenced, to compare with the logged counts
        spurious_trace_max_kept=3,
        spurious_trace_context_tokens=4,
    )
    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer), reward_funcs=length_reward, args=args, train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "spurious_trace" / "rank-0.jsonl").read_text().splitlines()]
    assert rows and all(set(row) == FIELDS for row in rows)

    logged = {e["step"]: e for e in trainer.state.log_history if "spurious/silenced_count" in e}
    for step, entry in logged.items():
        silenced = [r for r in rows if r["status"] == "silenced" and r["step"] == step]
        kept = [r for r in rows if r["status"] == "kept" and r["step"] == step]
        assert len(silenced) == entry["spurious/silenced_count"]
        assert len(kept) <= 3
    assert {r["step"] for r in rows} <= set(logged) and any(r["status"] == "silenced" for r in rows)

    for row in rows:
        assert row["probability"] < 0.02 and row["advantage"] > 0
        if row["status"] == "silenced":
            assert row["entropy"] < row["entropy_threshold"]
        else:
            assert row["entropy"] >= row["entropy_threshold"]
        alternatives = row["top_alternatives"]
        assert len(alternatives) == 5
        probabilities = [a["probability"] for a in alternatives]
        assert probabilities == sorted(probabilities, reverse=True) and probabilities[0] >= row["probability"]
        # |Â| sqrt(1 - 2P + Σ π²), with Σ π² between the top-5's share of it and the largest probability.
        norm = row["gradient_norm"] / row["advantage"]
        low = 1 - 2 * row["probability"] + sum(p * p for p in probabilities)
        assert low**0.5 * (1 - 1e-5) <= norm <= (1 - 2 * row["probability"] + probabilities[0]) ** 0.5
        assert row["token"] == tokenizer.decode([row["token_id"]])
        assert len(tokenizer(row["context_before"], add_special_tokens=False)["input_ids"]) <= 4


def test_no_trace_directory_when_off(tokenizer, prompt_dataset, tmp_path):
    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer), reward_funcs=length_reward, args=cpu_config(tmp_path),
        train_dataset=prompt_dataset, processing_class=tokenizer,
    )  # fmt: skip
    assert trainer._tracer is None
    assert not (tmp_path / "spurious_trace").exists()


def test_a_traced_run_that_traced_nothing_has_an_empty_trace(tmp_path, tokenizer):
    """The report then says there are no cases, instead of "No trace" for a run that had the trace on."""
    from stapo_trl.diagnostics.report_cli import main
    from stapo_trl.diagnostics.trace import SpuriousTokenTracer, load_trace

    SpuriousTokenTracer(str(tmp_path), 0, tokenizer)
    assert load_trace(tmp_path) == []
    assert main([str(tmp_path), "--format", "md"]) == 0
    assert "Traced tokens: **0** silenced" in (tmp_path / "spurious_report.md").read_text()
