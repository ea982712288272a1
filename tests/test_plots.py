"""Training-curve plots from runs' trainer_state.json: a tiny training run, and hand-written logs."""

import json

import pytest
from conftest import png_size, train_tiny_run

from stapo_trl.diagnostics.plots import (
    QUANTITIES,
    find_trainer_state,
    load_log_history,
    metric_series,
    plot_quantity,
    plot_runs,
    run_names,
)
from stapo_trl.diagnostics.report_cli import main


pytest.importorskip("matplotlib")

BASE = {"reward", "entropy", "silenced_ratio", "candidate_ratio", "entropy_quantiles", "completion_length"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer, prompt_dataset):
    """A 2-step STAPO run that saves a checkpoint (made once for the module)."""
    output_dir = tmp_path_factory.mktemp("tiny_run")
    return train_tiny_run(output_dir, tokenizer, prompt_dataset, save_strategy="steps", save_steps=2)


def write_state(path, log_history):
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": log_history}))


@pytest.fixture
def baseline(tmp_path):
    """A run with checkpoints only (no top-level trainer_state.json), eval metrics, and no S2T metrics."""
    run = tmp_path / "justrl"
    early = [{"step": 1, "reward": 0.0}]
    late = [
        {"step": 1, "reward": 0.1, "entropy": 4.5, "spurious/silenced_ratio": 0.0},
        {"step": 2, "reward": 0.3, "entropy": 4.6, "spurious/silenced_ratio": None},
        {"step": 2, "eval/aime24/avg@32": 0.1, "eval/math500/avg@4": 0.4},
        {"step": 10, "reward": float("nan"), "eval/aime24/avg@32": 0.2},
    ]
    write_state(run / "checkpoint-2", early)
    write_state(run / "checkpoint-10", late)  # the latest by number, not by name
    return run


def test_two_runs_overlaid_with_names(run_dir, tmp_path):
    paths = plot_runs({"STAPO": run_dir, "JustRL": run_dir}, tmp_path)
    assert {path.stem for path in paths} == BASE
    for path in paths:
        width, height = png_size(path)
        assert width > 100 and height > 100
    histories = {"STAPO": load_log_history(run_dir), "JustRL": load_log_history(run_dir)}
    figure = plot_quantity(histories, QUANTITIES[0])
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == ["STAPO", "JustRL"]
    quantiles = plot_quantity(histories, next(q for q in QUANTITIES if q.filename == "entropy_quantiles.png"))
    assert len(quantiles.axes[0].get_legend().get_texts()) == 6  # 2 runs x p50/p80/p95
    silenced = plot_quantity(histories, next(q for q in QUANTITIES if q.filename == "silenced_ratio.png"))
    assert silenced.axes[0].get_yscale() == "log"  # the tiny run silences tokens: a positive ratio


def test_latest_checkpoint_eval_metrics_and_skipped_quantities(baseline, tmp_path):
    assert find_trainer_state(baseline) == baseline / "checkpoint-10" / "trainer_state.json"
    history = load_log_history(baseline)
    assert metric_series(history, "reward") == ([1, 2], [0.1, 0.3])  # NaN dropped
    assert metric_series(history, "spurious/silenced_ratio") == ([1], [0.0])  # null dropped
    paths = plot_runs([baseline], tmp_path)
    assert {path.name for path in paths} == {
        "reward.png", "entropy.png", "silenced_ratio.png", "eval_aime24_avg@32.png", "eval_math500_avg@4.png",
    }  # fmt: skip
    figure = plot_quantity({"justrl": history}, next(q for q in QUANTITIES if q.filename == "silenced_ratio.png"))
    assert figure.axes[0].get_yscale() == "linear"  # only zeros: no log scale
    for path in paths:
        assert min(png_size(path)) > 100


@pytest.mark.parametrize("smoothing", [0.0, 0.9])
def test_silenced_ratio_marks_every_nonzero_point_between_zeros(smoothing):
    """A 200-step run logging every 5 steps (40 points) where S2T silenced tokens in 7 isolated windows."""
    nonzero = {15: 2e-5, 40: 1e-5, 45: 3e-5, 90: 1e-5, 130: 4e-5, 170: 1e-5, 195: 2e-5}
    history = [{"step": step, "spurious/silenced_ratio": nonzero.get(step, 0.0)} for step in range(5, 201, 5)]
    quantity = next(q for q in QUANTITIES if q.filename == "silenced_ratio.png")
    axes = plot_quantity({"stapo": history}, quantity, smoothing=smoothing).axes[0]
    assert axes.get_yscale() == "log"
    raw = axes.get_lines()[0]  # the raw values (faint under a smoothed line)
    assert raw.get_marker() == "o"  # an isolated point has no line segment: only its marker shows it
    drawn = {int(x): y for x, y in zip(raw.get_xdata(), raw.get_ydata()) if y > 0}
    assert drawn == pytest.approx({step: 100 * value for step, value in nonzero.items()})


def test_mixed_runs_extra_metrics_and_names(run_dir, baseline, tmp_path):
    paths = plot_runs([run_dir, baseline], tmp_path, extra_metrics=["spurious/mask_time_ms", "reward"], smoothing=0.5)
    names = {path.name for path in paths}
    assert {f"{stem}.png" for stem in BASE} | {"eval_aime24_avg@32.png", "spurious_mask_time_ms.png"} <= names
    assert len(paths) == len(names)  # "reward" is not drawn twice
    assert list(run_names([baseline, baseline])) == ["justrl", "justrl (2)"]


def test_missing_trainer_state(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_state"):
        plot_runs([tmp_path], tmp_path / "plots")


def test_plots_command_line(run_dir, baseline, tmp_path, capsys):
    output = tmp_path / "plots"
    assert main(["plots", f"STAPO={run_dir}", str(baseline), "--output", str(output), "--metric", "kl"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed and all(png_size(output / name.rsplit("/", 1)[-1]) for name in printed)
    assert (output / "eval_aime24_avg@32.png").exists() and (output / "reward.png").exists()


def test_clear_error_without_matplotlib(run_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "stapo-trl\[diagnostics\]"'):
        plot_runs([run_dir], tmp_path)
