"""Case reports of the spurious-token trace, in the layout of the paper's Appendix 11.4 (`stapo-report RUN_DIR`).

    from stapo_trl.diagnostics.report import render_html, write_report
    from stapo_trl.diagnostics.trace import load_trace
    write_report("outputs/stapo")                     # -> outputs/stapo/spurious_report.html
    html = render_html(load_trace("outputs/stapo"), max_cases=20)

The command line is `stapo_trl.diagnostics.report_cli`.
A report shows, per case, the context with the token highlighted, its probability P, the advantage Adv. of its
completion, its entropy H against the S2T threshold τ_h, and the policy's top alternatives; before the cases, the
number of traced tokens per step and the most frequent tokens. The page is one jinja2 template shipped with the package
(`templates/report.html.j2`, autoescaped) and its Markdown twin (`templates/report.md.j2`), where every value is
escaped for Markdown unless marked safe. Word clouds and plots need the
optional dependencies: `pip install "stapo-trl[diagnostics]"`.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from .trace import STATUSES, iter_trace, load_trace, row_order, run_root, trace_files, visible_token


__all__ = ["load_trace", "render_html", "render_markdown", "summarize", "write_report"]

logger = logging.getLogger(__name__)

SORTS = ("probability", "step")
FORMATS = ("html", "md")
REPORT_NAME = "spurious_report"
LOG_RATIO_KEY = "spurious/silenced_ratio"

EXPLANATION = (
    "P: the policy's probability of the sampled token (at the sampling temperature). Adv.: the advantage of its "
    "completion. H: the entropy of the next-token distribution at that position; τ_h: the S2T entropy threshold "
    "of its micro-batch. With STAPO's mask (spurious_mask_mode='low_entropy') a candidate (P < τ_p, Adv. > 0) is "
    "silenced when H < τ_h and kept otherwise; the ablation modes silence other candidates. Top-5: the "
    "policy's most likely tokens at that position. ‖∇‖: |Adv.| times the norm of the gradient of log P with respect "
    "to the position's logits; dH: the first-order entropy change of that gradient step at the position, per unit "
    "step (positive: entropy rises; paper §3.2). ␣ is a space, \\n a newline. Counts are of traced tokens: the "
    "trace keeps at most spurious_trace_max_silenced silenced and spurious_trace_max_kept kept tokens per "
    "micro-batch."
)

# The measured advice: docs/diagnostics.md, "When the report says No cases", has the commands and the figures.
NO_CASES = (
    "No cases. S2T silences a candidate (P < τ_p, Adv. > 0) only when its entropy is below τ_h, the q-quantile of "
    "the entropies of its step's candidates, so a lone candidate is never silenced, and at the paper's τ_p = 0.002 "
    "a small model's steps rarely hold two. On the offline toy demo (examples/train_math.py), 30 steps at "
    "τ_p = 0.002 traced 7 kept candidates and silenced none; 30 steps with --spurious_prob_threshold 0.02 silenced "
    "5 tokens, from step 17 on. Raise τ_p or train longer (150 steps at τ_p = 0.002 silenced a few tokens per run)."
)


# ------------------------------------------------------------------------------------------------ formatting


def format_probability(probability: float) -> str:
    """P as in Appendix 11.4, in percent with four decimals ("0.0115%"); tinier values in scientific notation."""
    percent = 100.0 * probability
    return f"{percent:.4f}%" if percent == 0 or percent >= 0.0001 else f"{percent:.2e}%"


def format_number(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_alternative(alternative: Mapping) -> str:
    """One top-k alternative as in Appendix 11.4: "code (51.90%)"."""
    return f"{visible_token(alternative.get('token', ''))} ({100.0 * alternative.get('probability', 0.0):.2f}%)"


def format_entropy_vs_threshold(entropy: float | None, threshold: float | None) -> str:
    """H against τ_h: "0.312 < 0.530"; more digits when three do not tell them apart ("0.018223 = 0.018223")."""
    if entropy is None or threshold is None:
        return f"{format_number(entropy, 3)} vs {format_number(threshold, 3)}"
    digits = 3
    while digits < 6 and f"{entropy:.{digits}f}" == f"{threshold:.{digits}f}" and entropy != threshold:
        digits += 1
    sign = "<" if entropy < threshold else "=" if entropy == threshold else ">"
    return f"{entropy:.{digits}f} {sign} {threshold:.{digits}f}"


# --------------------------------------------------------------------------------------------------- summary


@dataclass
class TraceSummary:
    """What a report shows, gathered in one pass over the trace (the trace itself is not kept)."""

    cases: list[dict] = field(default_factory=list)
    steps: dict[int, Counter] = field(default_factory=dict)  # step -> Counter(status)
    totals: Counter = field(default_factory=Counter)  # status -> rows
    tokens: dict[str, Counter] = field(default_factory=lambda: {status: Counter() for status in STATUSES})
    ranks: set = field(default_factory=set)


def summarize(
    trace: Iterable[Mapping], *, status: str = "silenced", sort: str = "probability", max_cases: int | None = 50
) -> TraceSummary:
    """Count the traced tokens per step and per token text, and pick the cases to show.

    Args:
        trace: trace rows (a list from `load_trace`, or the stream of `iter_trace`).
        status: the cases shown: "silenced", "kept" or "all".
        sort: "probability" (lowest first: the most surprising tokens) or "step" (training order).
        max_cases: at most this many cases; None for all.
    """
    if status not in (*STATUSES, "all"):
        raise ValueError(f"status must be one of {(*STATUSES, 'all')}, got {status!r}.")
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {SORTS}, got {sort!r}.")
    summary = TraceSummary()

    def counted(rows):
        for row in rows:
            row_status = row.get("status")
            summary.totals[row_status] += 1
            summary.steps.setdefault(row.get("step", 0), Counter())[row_status] += 1
            summary.ranks.add(row.get("rank", 0))
            if row_status in summary.tokens:
                summary.tokens[row_status][visible_token(row.get("token", ""))] += 1
            if status == "all" or row_status == status:
                yield row

    if sort == "probability":
        key = lambda row: (row.get("probability", 1.0), *row_order(row))  # noqa: E731
    else:
        key = row_order
    if max_cases is None:
        summary.cases = sorted(counted(trace), key=key)
    elif max_cases > 0:
        summary.cases = heapq.nsmallest(max_cases, counted(trace), key=key)
    else:
        for _ in counted(trace):  # no cases: only the counts
            pass
    summary.steps = dict(sorted(summary.steps.items()))
    return summary


def logged_ratios(log_history: Iterable[Mapping] | None) -> dict[int, float]:
    """step -> logged `spurious/silenced_ratio`, from a run's log history."""
    ratios = {}
    for entry in log_history or ():
        value = entry.get(LOG_RATIO_KEY)
        if "step" in entry and isinstance(value, (int, float)):
            ratios[entry["step"]] = float(value)
    return ratios


def _page(summary: TraceSummary, *, title, status, sort, top_tokens, log_history, images) -> dict:
    """The values the templates lay out: plain text, escaped by the template."""
    ratios = logged_ratios(log_history)
    cases = [
        {
            "number": number,
            "status": row.get("status", ""),
            "label": "Masked token" if row.get("status") == "silenced" else "Kept token",
            "meta": f"step {row.get('step')} · rank {row.get('rank')} · sample {row.get('sample')} · "
            f"position {row.get('position')} · {row.get('status')}",
            "token": visible_token(row.get("token", "")),
            "token_id": row.get("token_id"),
            "before": row.get("context_before", ""),
            "after": row.get("context_after", ""),
            "stats": [
                format_probability(row.get("probability", float("nan"))),
                format_number(row.get("advantage"), 2),
                format_entropy_vs_threshold(row.get("entropy"), row.get("entropy_threshold")),
                format_number(row.get("gradient_norm"), 3),
                format_number(row.get("entropy_change"), 4),
            ],
            "alternatives": [
                (format_alternative(alt), alt.get("token_id") == row.get("token_id"))
                for alt in row.get("top_alternatives", [])
            ],
        }
        for number, row in enumerate(summary.cases, start=1)
    ]
    return {
        "title": title,
        "totals": summary.totals,
        "ranks": len(summary.ranks),
        "explanation": EXPLANATION,
        "steps": [
            (step, counts["silenced"], counts["kept"], format_probability(ratios[step]) if step in ratios else "")
            for step, counts in summary.steps.items()
        ],
        "ratios": bool(ratios),
        "tokens": {name: summary.tokens[name].most_common(top_tokens) for name in STATUSES},
        "images": dict(images or {}),
        "cases": cases,
        "shown": "all statuses" if status == "all" else f"{status} tokens",
        "order": "lowest probability first" if sort == "probability" else "by step",
        "no_cases": NO_CASES,
        "kept_hint": (
            f"The trace holds {summary.totals['kept']} kept candidate(s): --status kept (or all) shows them."
            if status == "silenced" and summary.totals["kept"]
            else ""
        ),
    }


# ------------------------------------------------------------------------------------------------- templates
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#$~!])")


def md_escape(text) -> Markup:
    """Text that Markdown (CommonMark/GFM) shows as is: HTML and Markdown syntax characters escaped."""
    if isinstance(text, Markup):
        return text
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return Markup(_MD_SPECIAL.sub(r"\\\1", text))


def _md_blockquote(case: Mapping) -> Markup:
    """The context as a blockquote, the token in bold between brackets: ...\\[**token**\\]...

    The brackets sit outside the bold: CommonMark does not open or close `**` between a letter and punctuation, so
    `**[b]**` inside a word would not be bold, while `[**b**]` always is. What would start a block at the beginning
    of a line (indentation: code; list markers; headings) is neutralized, and the context's newlines kept.
    """
    before, token, after = (str(md_escape(case[key])) for key in ("before", "token", "after"))
    text = f"{before}\\[**{token}**\\]{after}"
    lines = []
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" \t"))
        line = "&nbsp;" * indent + line[indent:]
        line = re.sub(r"^((?:&nbsp;)*)([-+=])", r"\1\\\2", line)
        lines.append(re.sub(r"^((?:&nbsp;)*\d+)([.)])", r"\1\\\2", line))
    quoted = []
    for index, line in enumerate(lines):
        hard_break = line and index + 1 < len(lines) and lines[index + 1]  # keep the newline inside a paragraph
        quoted.append(f"> {line}  " if hard_break else f"> {line}".rstrip())
    return Markup("\n".join(quoted))


_TEMPLATES = jinja2.PackageLoader("stapo_trl.diagnostics", "templates")
_HTML_TEMPLATE = jinja2.Environment(
    loader=_TEMPLATES, autoescape=True, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
).get_template("report.html.j2")
_MARKDOWN_ENVIRONMENT = jinja2.Environment(loader=_TEMPLATES, trim_blocks=True, lstrip_blocks=True, finalize=md_escape)
_MARKDOWN_ENVIRONMENT.filters.update(md=md_escape, blockquote=_md_blockquote)
_MARKDOWN_TEMPLATE = _MARKDOWN_ENVIRONMENT.get_template("report.md.j2")


def _render(template, trace, *, title, status, sort, max_cases, top_tokens, log_history, images) -> str:
    summary = (
        trace if isinstance(trace, TraceSummary) else summarize(trace, status=status, sort=sort, max_cases=max_cases)
    )
    page = _page(
        summary, title=title, status=status, sort=sort, top_tokens=top_tokens, log_history=log_history, images=images
    )
    return template.render(page)


def render_html(
    trace: Iterable[Mapping] | TraceSummary,
    *,
    title: str = "Spurious tokens",
    status: str = "silenced",
    sort: str = "probability",
    max_cases: int | None = 50,
    top_tokens: int = 20,
    log_history: Sequence[Mapping] | None = None,
    images: Mapping[str, str] | None = None,
) -> str:
    """A self-contained HTML page of the trace: counts per step, most frequent tokens, figures and the cases.

    Args:
        trace: trace rows (`load_trace` / `iter_trace`), or a `TraceSummary`.
        title: the page title (e.g. the run's name).
        status, sort, max_cases: which cases, in which order, how many (see `summarize`).
        top_tokens: rows of the most-frequent-token tables.
        log_history: the run's log history; adds the logged silenced ratio to the per-step counts.
        images: `{caption: URL}` of figures to show (word clouds, plots), URLs relative to the page.
    """
    return _render(
        _HTML_TEMPLATE, trace, title=title, status=status, sort=sort, max_cases=max_cases, top_tokens=top_tokens,
        log_history=log_history, images=images,
    )  # fmt: skip


def render_markdown(
    trace: Iterable[Mapping] | TraceSummary,
    *,
    title: str = "Spurious tokens",
    status: str = "silenced",
    sort: str = "probability",
    max_cases: int | None = 50,
    top_tokens: int = 20,
    log_history: Sequence[Mapping] | None = None,
    images: Mapping[str, str] | None = None,
) -> str:
    """The report of `render_html` as Markdown (GitHub-flavoured: tables; the token as \\[**token**\\])."""
    text = _render(
        _MARKDOWN_TEMPLATE, trace, title=title, status=status, sort=sort, max_cases=max_cases, top_tokens=top_tokens,
        log_history=log_history, images=images,
    )  # fmt: skip
    return text.rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------------- files


def _relative_url(target: Path, start: Path) -> str:
    return quote(Path(os.path.relpath(target, start)).as_posix())


def write_report(
    run_dir: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    fmt: str | None = None,
    status: str = "silenced",
    sort: str = "probability",
    max_cases: int | None = 50,
    top_tokens: int = 20,
    word_clouds: bool = False,
    plots: bool = False,
    title: str | None = None,
) -> Path:
    """Write the report of a run's trace and return its path.

    Args:
        run_dir: the run's output directory (or its `spurious_trace/` folder, or one trace file).
        output: the report file; default `<run_dir>/spurious_report.html` (`.md` with `fmt="md"`).
        fmt: "html" or "md"; default from the suffix of `output`, else "html".
        word_clouds, plots: also draw the word clouds of the trace and the run's training curves (needs
            `pip install "stapo-trl[diagnostics]"`), into `<report name>_files/` next to the report, and show them.
        status, sort, max_cases, top_tokens, title: see `render_html`.
    """
    root = run_root(run_dir)
    if fmt is None:
        fmt = "md" if output is not None and Path(output).suffix.lower() in (".md", ".markdown") else "html"
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}.")
    output = Path(output) if output is not None else root / f"{REPORT_NAME}.{fmt}"
    trace_files(run_dir)  # fail early with a clear message when there is no trace
    assets = output.parent / f"{output.stem}_files"
    images: dict[str, str] = {}
    if word_clouds:
        from .word_clouds import word_clouds as draw_word_clouds

        for cloud_status, path in draw_word_clouds(iter_trace(run_dir), assets / "word_clouds").items():
            kind = "spurious (low entropy)" if cloud_status == "silenced" else "exploratory (high entropy)"
            images[f"Word cloud: {cloud_status} low-probability tokens, {kind}"] = _relative_url(path, output.parent)
    from .plots import load_log_history, plot_runs

    try:
        log_history = load_log_history(root)
    except (FileNotFoundError, json.JSONDecodeError) as error:
        log_history = None
        if plots:
            logger.warning("No training curves: %s", error)
    if plots and log_history is not None:
        for path in plot_runs({root.resolve().name: root}, assets / "plots"):
            images[f"Training curve: {path.stem}"] = _relative_url(path, output.parent)
    render = render_html if fmt == "html" else render_markdown
    text = render(
        iter_trace(run_dir), title=title or f"Spurious tokens: {root.resolve().name}", status=status, sort=sort,
        max_cases=max_cases, top_tokens=top_tokens, log_history=log_history, images=images,
    )  # fmt: skip
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    return output
