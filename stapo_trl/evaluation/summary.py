"""Summaries of a run directory (avg@N per benchmark and preset) and Markdown tables laid out like the paper's.

avg@N of a benchmark = mean over its problems of the fraction of correct samples, in percent (as the paper). Two
numbers when a model verifier was used: the rules alone (``score``), and the rules then the verifier
(``score_with_verifier``: a sample counts when the rules accept it or the verifier answers "A").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .presets import Preset
from .store import (
    SAMPLES_FILE,
    SUMMARY_JSON,
    SUMMARY_MD,
    is_finished,
    latest,
    read_run,
    read_samples,
)
from .tasks import get_task


def summarize(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Summarise a run directory from its records and its plan (``run.json``); write summary.json / summary.md.

    A sample whose generation failed counts as incorrect (``num_errors`` says how many); missing samples (a run
    still in progress) are left out and the result is marked ``complete: false``. ``avg`` is the mean over the
    task's benchmarks (``avg_over`` names those present when some are missing); ``mean_response_length`` is
    the mean completion length in tokens, per benchmark and averaged over the benchmarks.
    """
    output_dir = Path(output_dir)
    run = read_run(output_dir)
    task = get_task(run.get("task", "math"))
    presets = [Preset(**preset) for preset in run["plan"]["presets"]]
    verifier = run.get("verifier")
    records = latest(read_samples(output_dir / SAMPLES_FILE))
    summary = {
        "model": run["model_name"],
        "model_path": run["settings"]["model"],
        "task": task.name,
        "settings": run["settings"],
        "verifier": verifier,
        "results": {},
    }
    for preset in presets:
        per_benchmark = {
            name: _benchmark_result(
                records,
                name,
                preset,
                spec["problem_ids"],
                spec["num_samples"],
                verifier,
            )
            for name, spec in run["plan"]["benchmarks"].items()
        }
        summary["results"][preset.name] = {
            "temperature": preset.temperature,
            "top_p": preset.top_p,
            "benchmarks": per_benchmark,
            **_averages(per_benchmark, tuple(task.benchmarks)),
        }
    (output_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    (output_dir / SUMMARY_MD).write_text(markdown_table({summary["model"]: summary}))
    return summary


def _benchmark_result(records, name, preset, problem_ids, num_samples, verifier) -> dict[str, Any]:
    rule_scores, verified_scores, lengths = [], [], []
    done = errors = exact_match = truncated = checked = accepted = pending = 0
    for problem_id in problem_ids:
        rule, verified = [], []
        for index in range(num_samples):
            record = records.get((name, preset.name, problem_id, index))
            if record is None or not is_finished(record, preset, retry_errors=False):
                continue
            done += 1
            if record.get("correct") is None:  # failed generation or grading
                errors += 1
                rule.append(False)
                verified.append(False)
                continue
            correct = bool(record["correct"])
            verdict = record.get("verifier_verdict") if verifier else None
            rule.append(correct)
            verified.append(correct or verdict == "A")
            if verifier and not correct:
                checked += verdict is not None
                accepted += verdict == "A"
                pending += verdict is None
            exact_match += record.get("grading") == "exact_match"
            if record.get("num_tokens") is not None:
                lengths.append(record["num_tokens"])
                truncated += record.get("finish_reason") == "length"
        if rule:
            rule_scores.append(sum(rule) / len(rule))
            verified_scores.append(sum(verified) / len(verified))
    expected = len(problem_ids) * num_samples
    result = {
        "metric": f"avg@{num_samples}",
        "score": 100 * sum(rule_scores) / len(rule_scores) if rule_scores else None,
        "num_problems": len(problem_ids),
        "num_samples": num_samples,
        "num_done": done,
        "num_errors": errors,
        "num_exact_match_graded": exact_match,
        "complete": done == expected and errors == 0,
        "mean_response_length": sum(lengths) / len(lengths) if lengths else None,
        "truncated_fraction": truncated / len(lengths) if lengths else None,
    }
    if verifier:
        result.update(
            score_with_verifier=100 * sum(verified_scores) / len(verified_scores) if verified_scores else None,
            num_verifier_checked=checked,
            num_verifier_accepted=accepted,
            num_verifier_pending=pending,
            complete_with_verifier=result["complete"] and pending == 0,
        )
    return result


def _averages(per_benchmark: Mapping[str, Mapping[str, Any]], table_benchmarks: tuple[str, ...]) -> dict[str, Any]:
    present = [name for name in table_benchmarks if per_benchmark.get(name, {}).get("score") is not None]
    lengths = [r["mean_response_length"] for r in per_benchmark.values() if r["mean_response_length"] is not None]
    averages = {
        "avg": sum(per_benchmark[name]["score"] for name in present) / len(present) if present else None,
        "avg_over": present,
        "complete": len(present) == len(table_benchmarks) and all(r["complete"] for r in per_benchmark.values()),
        "mean_response_length": sum(lengths) / len(lengths) if lengths else None,
    }
    if any("score_with_verifier" in result for result in per_benchmark.values()):
        scores = [per_benchmark[name].get("score_with_verifier") for name in present]
        averages["avg_with_verifier"] = sum(scores) / len(scores) if present and None not in scores else None
        averages["complete_with_verifier"] = averages["complete"] and all(
            r.get("complete_with_verifier", False) for r in per_benchmark.values()
        )
    return averages


def markdown_table(summaries: Mapping[str, Mapping[str, Any]], digits: int = 2) -> str:
    """Markdown tables laid out like the paper's (Table 2 for math, Table 3 for code): a block per decoding
    preset, a row per model; when a model verifier was used, a second block per preset with its numbers.

    Columns: the task's benchmarks in the paper's order, Avg (then any other benchmark evaluated, and the mean
    response length in tokens). ``–`` marks a benchmark not evaluated; ``*`` a partial result (samples missing or
    failed, or Avg over fewer than the task's benchmarks).
    """
    task = get_task(next(iter(summaries.values())).get("task", "math")) if summaries else get_task("math")
    table_benchmarks = tuple(task.benchmarks)
    presets: dict[str, Mapping[str, Any]] = {}
    extra: list[str] = []
    verifiers = {summary.get("verifier", {}).get("model") for summary in summaries.values() if summary.get("verifier")}
    for summary in summaries.values():
        if summary.get("task", "math") != task.name:
            raise ValueError("markdown_table: all summaries must be of one task (math and code tables differ)")
        for preset_name, result in summary["results"].items():
            presets.setdefault(preset_name, result)
            extra += [name for name in result["benchmarks"] if name not in table_benchmarks and name not in extra]
    columns = [*table_benchmarks, "Avg", *extra, "Mean length"]
    kinds = ["rules", "verifier"] if verifiers else ["rules"]
    blocks, partial = [], False
    for preset_name, first in presets.items():
        for kind in kinds:
            title = f"**{Preset(preset_name, first['temperature'], first['top_p']).label}** (`{preset_name}`)"
            if verifiers:
                title += " rules only" if kind == "rules" else f" rules, then {', '.join(sorted(verifiers))}"
            lines = [
                title,
                "",
                "| Model | " + " | ".join(columns) + " |",
                "|---|" + "---:|" * len(columns),
            ]
            for model_name, summary in summaries.items():
                result = summary["results"].get(preset_name)
                cells = []
                for column in columns:
                    value, complete = _cell(result, column, kind)
                    cells.append("–" if value is None else f"{value:.{digits if column != 'Mean length' else 0}f}")
                    if value is not None and not complete:
                        cells[-1] += "*"
                        partial = True
                lines.append(f"| {model_name} | " + " | ".join(cells) + " |")
            blocks.append("\n".join(lines))
    metrics = {
        name: result["benchmarks"][name]["metric"]
        for summary in summaries.values()
        for result in summary["results"].values()
        for name in result["benchmarks"]
    }
    notes = [f"Layout of the paper's {task.table}. Scores: "]
    notes[0] += ", ".join(f"{name} {metric}" for name, metric in metrics.items()) + " (%)."
    notes.append("Mean length: mean response length in tokens, averaged over the benchmarks.")
    if verifiers:
        notes.append('With the verifier: a sample counts when the rules accept it or the verifier answers "A".')
    if partial:
        notes.append(
            f"\\* partial: samples missing or failed, or Avg over fewer than the {len(table_benchmarks)} benchmarks."
        )
    return "\n\n".join(blocks) + "\n\n" + " ".join(notes) + "\n"


def _cell(result: Mapping[str, Any] | None, column: str, kind: str) -> tuple[float | None, bool]:
    if result is None:
        return None, True
    suffix = "_with_verifier" if kind == "verifier" else ""
    if column == "Avg":
        return result.get("avg" + suffix), result.get("complete" + suffix, False)
    if column == "Mean length":
        return result["mean_response_length"], True
    benchmark = result["benchmarks"].get(column)
    if benchmark is None:
        return None, True
    return benchmark.get("score" + suffix), benchmark.get("complete" + suffix, False)
