"""examples/study.py end to end at toy size: runs, per-method summary, table and plots."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import png_size


STUDY = Path(__file__).resolve().parents[1] / "examples" / "study.py"


@pytest.mark.slow
def test_study_writes_results_and_plots(tmp_path):
    spec = importlib.util.spec_from_file_location("study", STUDY)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    report_dir = tmp_path / "report"
    study.main([
        "--methods", "stapo", "justrl_fullmask", "--seeds", "0", "--max_steps", "2", "--workers", "2",
        "--runs_dir", str(tmp_path / "runs"), "--report_dir", str(report_dir), "--",
        "--logging_steps", "1", "--heldout_max_problems", "4", "--heldout_num_samples", "1",
        "--per_device_train_batch_size", "16",
    ])  # fmt: skip

    rows = list(csv.DictReader((report_dir / "runs.csv").open()))
    assert sorted(row["method"] for row in rows) == ["justrl_fullmask", "stapo"]
    assert all(row["steps"] == "2" and 0 <= float(row["heldout_accuracy_after"]) <= 1 for row in rows)
    summary = json.loads((report_dir / "summary.json").read_text())
    assert set(summary) == {"stapo", "justrl_fullmask"} and summary["stapo"]["seeds"] == 1
    table = (report_dir / "results.md").read_text()
    assert table.startswith("| method | seeds | held-out acc. before") and "| justrl_fullmask | 1 |" in table
    assert "| stapo | low_prob_low_entropy |" in table and "low_prob_low_entropy/grad_norm_share" in rows[0]
    assert "## stapo" in (report_dir / "table1.md").read_text()  # the paper's Table 1 per method
    pngs = sorted(report_dir.glob("*.png"))
    assert pngs and all(min(png_size(p)) > 100 for p in pngs)
