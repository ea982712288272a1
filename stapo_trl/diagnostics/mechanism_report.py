"""The paper's Table 1 and a Fig. 2(c)-style picture from the `mechanism/*` metrics of one or several runs.

    stapo-report mechanism RUN [RUN ...] --output table.md     # RUN: a run directory or NAME=RUN_DIR

    from stapo_trl.diagnostics.mechanism_report import write_mechanism_report
    write_mechanism_report({"STAPO": "outputs/stapo", "JustRL": "outputs/justrl"}, "mechanism.md")

The runs must have trained with `STAPOConfig(spurious_mechanism_metrics=True)`. A run's table averages the logged
values over its log entries (each the mean of its logging window's steps; a quadrant's entropy change only over
the steps where the quadrant held tokens). The picture has one panel per run: the four quadrants of probability ×
entropy, coloured by the mean logit-gradient norm of a token of the quadrant relative to that of all
positive-advantage tokens (gradient-norm share / token share). How the training curves evolve: `stapo-report plots`
draws the quadrants' shares and entropy changes over the steps. The page is a jinja2 template shipped with the
package (`templates/mechanism.{md,html}.j2`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from .metrics import COLUMNS, GROUPS, MECHANISM_PREFIX, QUADRANTS
from .plots import _import_matplotlib, load_log_history, metric_series, run_names


GROUP_LABELS = {
    "low_prob_low_entropy": "P < τ_p, H < τ_h",
    "low_prob_high_entropy": "P < τ_p, H ≥ τ_h",
    "high_prob_low_entropy": "P ≥ τ_p, H < τ_h",
    "high_prob_high_entropy": "P ≥ τ_p, H ≥ τ_h",
    "silenced": "silenced by S2T",
}
# What the paper's §3.2 says of each group (Table 1, Lemma 3.2, Theorem 3.3), for the reader's comparison.
PAPER_TABLE_1 = {
    "low_prob_low_entropy": "high spurious risk, large gradient norms, entropy increase",
    "low_prob_high_entropy": "exploration; entropy increase",
    "high_prob_low_entropy": "",
    "high_prob_high_entropy": "",
    "silenced": "S2T's choice: the first group, in mode low_entropy",
}
FIGURE_NAME = "mechanism_quadrants.png"

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("stapo_trl.diagnostics", "templates"),
    autoescape=jinja2.select_autoescape(["html.j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def run_table(log_history: Sequence[Mapping]) -> dict:
    """Table 1 of one run: `{group: {column: mean or None}}`, plus "relative_grad_norm" per group, "entropy_threshold"
    and "entries" (how many log entries held the metrics)."""
    table: dict = {}
    entries = 0
    for group in GROUPS:
        row = {}
        for column in COLUMNS:
            steps, values = metric_series(log_history, f"{MECHANISM_PREFIX}{group}/{column}")
            row[column] = sum(values) / len(values) if values else None
            entries = max(entries, len(steps))
        shares = row["token_share"], row["grad_norm_share"]
        row["relative_grad_norm"] = shares[1] / shares[0] if None not in shares and shares[0] > 0 else None
        table[group] = row
    _, thresholds = metric_series(log_history, f"{MECHANISM_PREFIX}entropy_threshold")
    table["entropy_threshold"] = sum(thresholds) / len(thresholds) if thresholds else None
    table["entries"] = entries
    return table


def _percent(value, digits=3):
    return "–" if value is None else f"{100 * value:.{digits}g}%"


def _number(value, digits=3):
    return "–" if value is None else f"{value:.{digits}g}"


def _rows(table: Mapping) -> list[dict]:
    return [
        {
            "group": GROUP_LABELS[group],
            "token_share": _percent(table[group]["token_share"]),
            "grad_norm_share": _percent(table[group]["grad_norm_share"]),
            "relative_grad_norm": _number(table[group]["relative_grad_norm"]),
            "entropy_change": _number(table[group]["entropy_change"]),
            "paper": PAPER_TABLE_1[group],
        }
        for group in GROUPS
    ]


def render(tables: Mapping[str, Mapping], fmt: str = "md", figure: str | None = None) -> str:
    """The page of `{run name: run_table(...)}` as Markdown ("md") or HTML ("html"); `figure`: the picture's URL."""
    runs = [
        {
            "name": name,
            "rows": _rows(table),
            "entries": table["entries"],
            "threshold": _number(table["entropy_threshold"]),
        }
        for name, table in tables.items()
    ]
    return _ENVIRONMENT.get_template(f"mechanism.{fmt}.j2").render(runs=runs, figure=figure)


def plot_quadrants(tables: Mapping[str, Mapping]):
    """A Fig. 2(c)-style matplotlib Figure: per run, probability × entropy quadrants coloured by the relative
    gradient norm per token, annotated with the token share, gradient-norm share and mean entropy change."""
    Figure, _ = _import_matplotlib()
    from matplotlib.colors import LogNorm

    figure = Figure(figsize=(3.6 * len(tables) + 1.0, 3.8), dpi=120, layout="constrained")
    axes_list = figure.subplots(1, len(tables), squeeze=False)[0]
    relative = [
        table[group]["relative_grad_norm"] for table in tables.values() for group in QUADRANTS
    ]  # fmt: skip
    positive = [value for value in relative if value is not None and value > 0]
    norm = LogNorm(min(positive), max(positive)) if positive and min(positive) < max(positive) else None
    image = None
    for axes, (name, table) in zip(axes_list, tables.items(), strict=True):
        grid = [[math.nan, math.nan], [math.nan, math.nan]]  # [entropy low/high][probability low/high]
        for group in QUADRANTS:
            row = 0 if "low_entropy" in group else 1
            column = 0 if group.startswith("low_prob") else 1
            value = table[group]["relative_grad_norm"]
            grid[row][column] = value if value is not None and value > 0 else math.nan
            text = (
                f"tokens {_percent(table[group]['token_share'], 2)}\n"
                f"grad {_percent(table[group]['grad_norm_share'], 2)}\n"
                f"dH {_number(table[group]['entropy_change'], 2)}"
            )
            box = dict(facecolor="white", alpha=0.75, edgecolor="none")
            axes.text(column, row, text, ha="center", va="center", fontsize=8, bbox=box)
        image = axes.imshow(grid, cmap="Reds", norm=norm, origin="lower")
        axes.set_xticks([0, 1], ["P < τ_p", "P ≥ τ_p"])
        axes.set_yticks([0, 1], ["H < τ_h", "H ≥ τ_h"])
        axes.set_title(name, fontsize=10)
    if image is not None and norm is not None:
        figure.colorbar(image, ax=list(axes_list), label="gradient norm per token / mean (log scale)")
    figure.suptitle("Positive-advantage tokens by probability and entropy", fontsize=10)
    return figure


def write_mechanism_report(
    run_dirs: Mapping[str, str | os.PathLike] | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    fmt: str | None = None,
    figure: bool = True,
) -> Path:
    """Write Table 1 of each run (and, with `figure`, the quadrant picture beside the page) and return the page's path.

    `fmt`: "md" or "html", default from `output`'s suffix. Raises ValueError when no run logged `mechanism/*`.
    """
    output = Path(output)
    fmt = fmt or ("html" if output.suffix.lower() in (".html", ".htm") else "md")
    if fmt not in ("md", "html"):
        raise ValueError(f"format must be 'md' or 'html', got {fmt!r}.")
    tables = {name: run_table(load_log_history(path)) for name, path in run_names(run_dirs).items()}
    missing = [name for name, table in tables.items() if not table["entries"]]
    if missing:
        raise ValueError(
            f"no mechanism/* metrics in the logs of {', '.join(missing)}: train with "
            "spurious_mechanism_metrics=True (--spurious_mechanism_metrics true) to log them."
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    figure_url = None
    if figure:
        path = output.parent / f"{output.stem}_{FIGURE_NAME}"
        plot_quadrants(tables).savefig(path)
        figure_url = path.name
    output.write_text(render(tables, fmt, figure_url), encoding="utf-8")
    return output
