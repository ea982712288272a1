"""`stapo-report mechanism`: Table 1 from hand-written logs, and from a tiny training run that logged it."""

import json

import pytest
from conftest import png_size, train_tiny_run

from stapo_trl.diagnostics.mechanism_report import render, run_table
from stapo_trl.diagnostics.metrics import GROUPS, QUADRANTS
from stapo_trl.diagnostics.plots import plot_runs
from stapo_trl.diagnostics.report_cli import main


def entry(step, values, **extra):
    """A log entry with `mechanism/<group>/<column>` values: `values[group] = (token, grad-norm share, dH)`."""
    logged = {"step": step, **extra}
    for group, (tokens, norm, change) in values.items():
        logged.update(
            {
                f"mechanism/{group}/token_share": tokens,
                f"mechanism/{group}/grad_norm_share": norm,
                f"mechanism/{group}/entropy_change": change,
            }
        )
    return logged


LOGS = [
    {"step": 5, "loss": 0.1},  # an entry without the metrics
    entry(
        10,
        {
            "low_prob_low_entropy": (0.001, 0.03, None),  # no such token in this window: dH is null
            "low_prob_high_entropy": (0.003, 0.05, 0.02),
            "high_prob_low_entropy": (0.5, 0.02, -0.001),
            "high_prob_high_entropy": (0.496, 0.9, -0.03),
            "silenced": (0.0, 0.0, None),
        },
        **{"mechanism/entropy_threshold": 0.2},
    ),
    entry(
        20,
        {
            "low_prob_low_entropy": (0.003, 0.07, 0.01),
            "low_prob_high_entropy": (0.001, 0.01, 0.04),
            "high_prob_low_entropy": (0.6, 0.02, -0.003),
            "high_prob_high_entropy": (0.396, 0.9, -0.01),
            "silenced": (0.002, 0.05, 0.012),
        },
        **{"mechanism/entropy_threshold": 0.4},
    ),
]


def write_run(path, log_history):
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": log_history}))
    return path


def test_run_table_averages_the_log_entries():
    table = run_table(LOGS)
    assert table["entries"] == 2
    assert table["entropy_threshold"] == pytest.approx(0.3)
    low = table["low_prob_low_entropy"]
    assert low["token_share"] == pytest.approx(0.002) and low["grad_norm_share"] == pytest.approx(0.05)
    assert low["entropy_change"] == pytest.approx(0.01)  # only the entry where the group held tokens
    assert low["relative_grad_norm"] == pytest.approx(25.0)
    assert table["high_prob_high_entropy"]["relative_grad_norm"] == pytest.approx(0.9 / 0.446)
    assert table["silenced"]["entropy_change"] == pytest.approx(0.012)


def test_page_formats_and_escaping():
    tables = {"<b>run</b>": run_table(LOGS)}
    html = render(tables, "html")
    assert "&lt;b&gt;run&lt;/b&gt;" in html and "<b>run</b>" not in html
    markdown = render(tables, "md")
    rows = [line for line in markdown.splitlines() if line.startswith("| P")] + [
        line for line in markdown.splitlines() if line.startswith("| silenced")
    ]
    assert len(rows) == len(GROUPS)
    assert "| P < τ_p, H < τ_h | 0.2% | 5% | 25 | 0.01 |" in markdown


def test_command_line_several_runs(tmp_path, capsys):
    stapo, justrl = write_run(tmp_path / "stapo", LOGS), write_run(tmp_path / "justrl", LOGS[:2])
    page = tmp_path / "out" / "table1.md"
    assert main(["mechanism", f"STAPO={stapo}", str(justrl), "--output", str(page)]) == 0
    assert capsys.readouterr().out.strip() == str(page)
    text = page.read_text()
    assert "## STAPO" in text and "## justrl" in text and "(table1_mechanism_quadrants.png)" in text
    width, height = png_size(page.parent / "table1_mechanism_quadrants.png")
    assert width > 300 and height > 200


def test_command_line_names_the_option_when_nothing_was_logged(tmp_path, capsys):
    run = write_run(tmp_path / "plain", [{"step": 1, "loss": 0.2}])
    with pytest.raises(SystemExit) as exit_info:
        main(["mechanism", str(run), "--output", str(tmp_path / "t.md"), "--no_figure"])
    assert exit_info.value.code == 1
    assert "spurious_mechanism_metrics" in capsys.readouterr().err
    assert not (tmp_path / "t.md").exists()


def test_training_run_logs_table_1_and_its_curves(tokenizer, prompt_dataset, tmp_path):
    run = train_tiny_run(tmp_path / "run", tokenizer, prompt_dataset, spurious_mechanism_metrics=True)
    table = run_table(json.loads((run / "trainer_state.json").read_text())["log_history"])
    assert table["entries"] >= 1  # a step whose completions all got the same reward has no positive advantage
    shares = [table[q]["token_share"] for q in QUADRANTS if table[q]["token_share"] is not None]
    assert shares and sum(shares) == pytest.approx(1.0, rel=1e-6)  # the quadrants split the tokens
    page = tmp_path / "page.html"
    assert main(["mechanism", str(run), "--output", str(page)]) == 0
    assert "<table>" in page.read_text()
    stems = {path.stem for path in plot_runs([run], tmp_path / "plots")}
    assert {"mechanism_token_share", "mechanism_grad_norm_share", "mechanism_entropy_change"} <= stems
