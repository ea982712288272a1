"""Training curves from one or several runs' logs (`trainer_state.json`), overlaid, one PNG per quantity.

    from stapo_trl.diagnostics.plots import plot_runs
    plot_runs({"STAPO": "outputs/stapo", "JustRL": "outputs/justrl"}, "figures/")

The curves of the paper's Figs. 5 and 6: reward, policy entropy, the silenced ratio (Fig. 6, log scale) and the
candidate ratio of S2T, the token-entropy quantiles (Fig. 5(d)), the mean completion length, the quadrants of the
paper's Table 1 over training (when logged: `spurious_mechanism_metrics=True`), and every `eval/...` metric that a
run logged. matplotlib is an optional dependency (`pip install "stapo-trl[diagnostics]"`), imported
only when a plot is drawn; the figures are drawn without pyplot, so the caller's matplotlib backend is left alone.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .metrics import MECHANISM_PREFIX, QUADRANTS


TRAINER_STATE = "trainer_state.json"
INSTALL_HINT = 'pip install "stapo-trl[diagnostics]"'


@dataclass(frozen=True)
class Quantity:
    """One PNG: the log keys drawn on it (several for the entropy quantiles), its labels and its y scale."""

    filename: str
    title: str
    keys: tuple[str, ...]
    ylabel: str
    scale: float = 1.0  # values are multiplied by this (1e2: shown in percent)
    log_y: bool = False  # log scale when some value is positive; non-positive values are then not drawn
    key_labels: tuple[str, ...] = field(default=())  # legend suffix per key when there are several keys


QUANTITIES = (
    Quantity("reward.png", "Training reward", ("reward",), "mean reward"),
    Quantity("entropy.png", "Policy entropy", ("entropy",), "mean token entropy (nats)"),
    Quantity(
        "silenced_ratio.png",
        "Silenced (spurious) tokens",
        ("spurious/silenced_ratio",),
        "silenced tokens (% of loss tokens)",
        scale=100.0,
        log_y=True,
    ),
    Quantity(
        "candidate_ratio.png",
        "S2T candidates (low-probability tokens of positive-advantage completions)",
        ("spurious/candidate_ratio",),
        "candidates (% of loss tokens)",
        scale=100.0,
    ),
    Quantity(
        "entropy_quantiles.png",
        "Token-entropy quantiles",
        ("entropy/p50", "entropy/p80", "entropy/p95"),
        "token entropy (nats)",
        key_labels=("p50", "p80", "p95"),
    ),
    Quantity("completion_length.png", "Mean completion length", ("completions/mean_length",), "tokens"),
    # The paper's Table 1 over training (spurious_mechanism_metrics=True): the positive-advantage tokens' quadrants.
    *(
        Quantity(
            f"mechanism_{column}.png",
            f"Table 1 quadrants: {title}",
            tuple(f"{MECHANISM_PREFIX}{quadrant}/{column}" for quadrant in QUADRANTS),
            ylabel,
            scale=scale,
            log_y=log_y,
            key_labels=("P<τp H<τh", "P<τp H≥τh", "P≥τp H<τh", "P≥τp H≥τh"),
        )
        for column, title, ylabel, scale, log_y in (
            ("token_share", "share of tokens", "tokens (%)", 100.0, True),
            ("grad_norm_share", "share of the gradient norm", "gradient norm (%)", 100.0, True),
            ("entropy_change", "entropy change", "mean first-order dH per token (per unit step)", 1.0, False),
        )
    ),
)
EVAL_PREFIX = "eval/"
LINE_STYLES = ("-", "--", ":", "-.")


def _import_matplotlib():
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(f"Plotting needs matplotlib, an optional dependency: {INSTALL_HINT}") from error
    return Figure, MaxNLocator


def find_trainer_state(run_dir: str | os.PathLike) -> Path:
    """The run's `trainer_state.json`: the run directory's own if present, else the latest checkpoint's.

    `run_dir` may also be the path of a `trainer_state.json` file.
    """
    path = Path(run_dir)
    if path.is_file():
        return path
    if (path / TRAINER_STATE).is_file():
        return path / TRAINER_STATE
    checkpoints = []
    for candidate in path.glob(f"checkpoint-*/{TRAINER_STATE}"):
        match = re.fullmatch(r"checkpoint-(\d+)", candidate.parent.name)
        if match:
            checkpoints.append((int(match.group(1)), candidate))
    if not checkpoints:
        raise FileNotFoundError(
            f"No {TRAINER_STATE} in {path} or its checkpoint-*/ folders: the trainer writes it when it saves "
            "(save_strategy) or with trainer.save_state()."
        )
    return max(checkpoints)[1]


def load_log_history(run_dir: str | os.PathLike) -> list[dict]:
    """The `log_history` of a run's `trainer_state.json` (see `find_trainer_state`)."""
    with open(find_trainer_state(run_dir)) as state_file:
        return json.load(state_file).get("log_history", [])


def metric_series(log_history: Iterable[Mapping], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric: the log entries that have it, without null or non-finite values."""
    steps, values = [], []
    for entry in log_history:
        value = entry.get(key)
        if "step" not in entry or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            steps.append(entry["step"])
            values.append(float(value))
    return steps, values


def _ema(values: Sequence[float], smoothing: float) -> list[float]:
    smoothed, last = [], None
    for value in values:
        last = value if last is None else smoothing * last + (1.0 - smoothing) * value
        smoothed.append(last)
    return smoothed


def eval_quantities(histories: Mapping[str, Sequence[Mapping]]) -> list[Quantity]:
    """One quantity per `eval/...` metric any run logged (`eval/<benchmark>/avg@<k>` and the others that
    `stapo_trl.evaluation.BenchmarkEvalCallback` logs), in name order."""
    keys = {key for history in histories.values() for entry in history for key in entry}
    keys = sorted(key for key in keys if key.startswith(EVAL_PREFIX))
    return [_single(key, ylabel=_eval_label(key)) for key in keys]


def _eval_label(key: str) -> str:
    """The y label of an eval metric, from `stapo_trl.evaluation`'s names (avg@k is logged in percent)."""
    last = key.rsplit("/", 1)[-1]
    if last.startswith("avg@"):
        return f"{last} (% correct)"
    return {"mean_response_length": "tokens", "seconds": "seconds"}.get(last, last)


def _single(key: str, ylabel: str) -> Quantity:
    """A quantity of one log key, in a file named after the key ("eval/aime24/avg@32" -> "eval_aime24_avg@32.png")."""
    return Quantity(f"{re.sub(r'[^A-Za-z0-9@.-]+', '_', key).strip('_')}.png", key, (key,), ylabel)


def plot_quantity(histories: Mapping[str, Sequence[Mapping]], quantity: Quantity, smoothing: float = 0.0):
    """A matplotlib Figure of one quantity, one line per run (and per key), or None when no run logged it."""
    Figure, MaxNLocator = _import_matplotlib()
    figure = Figure(figsize=(7.0, 4.2), dpi=120, layout="constrained")
    axes = figure.add_subplot()
    series = []  # (label, style, steps, values) of every line
    for run_index, (name, history) in enumerate(histories.items()):
        for index, key in enumerate(quantity.keys):
            steps, values = metric_series(history, key)
            if steps:
                label = name if len(quantity.keys) == 1 else f"{name} · {quantity.key_labels[index]}"
                style = dict(color=f"C{run_index % 10}", linestyle=LINE_STYLES[index % len(LINE_STYLES)])
                series.append((label, style, steps, [value * quantity.scale for value in values]))
    if not series:
        return None
    values = [value for *_, line_values in series for value in line_values]
    log_y = quantity.log_y and any(value > 0 for value in values)
    title = quantity.title
    if log_y:
        axes.set_yscale("log", nonpositive="mask")
        if any(value <= 0 for value in values):
            title += " (zero values not shown on the log scale)"
    for label, style, steps, line_values in series:
        # On the log scale zeros are masked, which leaves isolated non-zero points without a line: mark every point.
        marker = "o" if log_y or len(steps) <= 30 else None
        if smoothing > 0 and len(steps) > 1:
            raw_marker = "o" if log_y else None
            axes.plot(steps, line_values, alpha=0.25, linewidth=0.8, marker=raw_marker, markersize=2, **style)
            axes.plot(steps, _ema(line_values, smoothing), label=label, marker=marker, markersize=3, **style)
        else:
            axes.plot(steps, line_values, label=label, marker=marker, markersize=3, **style)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("optimizer step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(quantity.ylabel)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return figure


def run_names(run_dirs: Mapping[str, str | os.PathLike] | Sequence[str | os.PathLike]) -> dict[str, Path]:
    """Name each run: the given names, else the run directories' names (made unique)."""
    if isinstance(run_dirs, Mapping):
        return {str(name): Path(path) for name, path in run_dirs.items()}
    named: dict[str, Path] = {}
    for path in map(Path, run_dirs):
        name = path.resolve().name if path.is_dir() else path.resolve().parent.name
        unique, counter = name, 2
        while unique in named:
            unique, counter = f"{name} ({counter})", counter + 1
        named[unique] = path
    return named


def plot_runs(
    run_dirs: Mapping[str, str | os.PathLike] | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    extra_metrics: Sequence[str] = (),
    smoothing: float = 0.0,
) -> list[Path]:
    """Draw the training curves of one or several runs, overlaid, one PNG per quantity in `output_dir`.

    Args:
        run_dirs: `{name: run directory}` (the names go in the legends: "STAPO", "JustRL", ...) or a list of run
            directories (named after the directories). A run directory's `trainer_state.json` is used if present,
            else its latest checkpoint's; the path of a `trainer_state.json` works too.
        output_dir: where the PNG files go (created if needed).
        extra_metrics: more log keys to draw, one PNG each (e.g. `"spurious/mask_time_ms"`, `"kl"`).
        smoothing: exponential moving average factor in [0, 1) (TensorBoard-style); 0 draws the raw values.

    Returns:
        The paths of the PNG files written. A quantity no run logged is skipped.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}.")
    _import_matplotlib()  # fail early, before reading anything, when matplotlib is missing
    histories = {name: load_log_history(path) for name, path in run_names(run_dirs).items()}
    if not histories:
        raise ValueError("plot_runs needs at least one run directory.")
    quantities = [*QUANTITIES, *eval_quantities(histories)]
    drawn_keys = {key for quantity in quantities for key in quantity.keys}
    quantities += [_single(key, ylabel=key) for key in dict.fromkeys(extra_metrics) if key not in drawn_keys]
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for quantity in quantities:
        figure = plot_quantity(histories, quantity, smoothing=smoothing)
        if figure is None:
            continue
        path = output / quantity.filename
        figure.savefig(path)
        written.append(path)
    return written
