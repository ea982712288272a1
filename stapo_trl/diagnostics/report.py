"""Case reports of the spurious-token trace, in the layout of the paper's Appendix 11.4, and the `stapo-report` command.

    stapo-report RUN_DIR [--format html|md] [--output PATH] [--max_cases N] [--word_clouds] [--plots]
    stapo-report plots RUN [RUN ...] --output DIR      # RUN: a run directory or NAME=RUN_DIR
    stapo-report word_clouds RUN_DIR --output DIR
    stapo-report mechanism RUN [RUN ...] --output PAGE.md|PAGE.html  # Table 1 of runs logged with mechanism metrics

    from stapo_trl.diagnostics.report import render_html, write_report
    from stapo_trl.diagnostics.trace import load_trace
    write_report("outputs/stapo")                     # -> outputs/stapo/spurious_report.html
    html = render_html(load_trace("outputs/stapo"), max_cases=20)

`python -m stapo_trl.diagnostics.report` is the same command as `stapo-report`; `report` is its default subcommand.
A report shows, per case, the context with the token highlighted, its probability P, the advantage Adv. of its
completion, its entropy H against the S2T threshold τ_h, and the policy's top alternatives; before the cases, the
number of traced tokens per step and the most frequent tokens. The page is one jinja2 template, autoescaped (HTML),
and its Markdown twin, where every value is escaped for Markdown unless marked safe. Word clouds and plots need the
optional dependencies: `pip install "stapo-trl[diagnostics]"`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from .trace import STATUSES, iter_trace, load_trace, row_order, run_root, trace_files, visible_token


__all__ = ["load_trace", "main", "render_html", "render_markdown", "summarize", "write_report"]

logger = logging.getLogger(__name__)

SORTS = ("probability", "step")
FORMATS = ("html", "md")
REPORT_NAME = "spurious_report"
LOG_RATIO_KEY = "spurious/silenced_ratio"
COMMANDS = ("report", "plots", "word_clouds", "mechanism")

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

_HTML = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 60rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05rem; margin-bottom: .3rem; } h3 small { color: #666; font-weight: normal; }
table { border-collapse: collapse; margin: .4rem 0; font-size: .92rem; }
th, td { border: 1px solid #ddd; padding: .2rem .5rem; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.context { white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .9rem;
           background: #f7f7f7; border-left: 3px solid #bbb; padding: .5rem .8rem; }
.case.silenced mark { background: #f6b8b8; } .case.kept mark { background: #b8d4f6; }
mark { padding: 0 .1rem; border-radius: 2px; font-weight: bold; }
.alt.self { font-weight: bold; text-decoration: underline; }
.tokens { display: flex; gap: 2rem; flex-wrap: wrap; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.note { color: #555; font-size: .9rem; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p>Traced tokens: <strong>{{ totals.silenced }}</strong> silenced and <strong>{{ totals.kept }}</strong>
kept candidates over <strong>{{ steps|length }}</strong> step(s) and {{ ranks }} rank(s).</p>
<p class="note">{{ explanation }}</p>
<h2>Counts per step</h2>
<details{% if steps|length <= 50 %} open{% endif %}><summary>{{ steps|length }} step(s)</summary>
<table class="counts">
<tr><th>step</th><th>silenced (traced)</th><th>kept (traced)</th>{% if ratios %}<th>silenced ratio (logged)</th>{% endif %}</tr>
{% for step, silenced, kept, ratio in steps %}
<tr><td class="num">{{ step }}</td><td class="num">{{ silenced }}</td><td class="num">{{ kept }}</td>
{%- if ratios %}<td class="num">{{ ratio }}</td>{% endif %}</tr>
{% endfor %}
</table>
</details>
<h2>Most frequent tokens</h2>
<div class="tokens">
{% for name, counts in tokens.items() %}
<table><tr><th>{{ name }} token</th><th>count</th></tr>
{% for token, count in counts %}
<tr><td><code>{{ token }}</code></td><td class="num">{{ count }}</td></tr>
{% else %}
<tr><td colspan="2">none</td></tr>
{% endfor %}
</table>
{% endfor %}
</div>
{% if images %}
<h2>Figures</h2>
{% for caption, url in images.items() %}
<figure><img src="{{ url }}" alt="{{ caption }}"><figcaption>{{ caption }}</figcaption></figure>
{% endfor %}
{% endif %}
<h2>Cases: {{ shown }}, {{ order }} ({{ cases|length }} shown)</h2>
{% for case in cases %}
<section class="case {{ case.status }}" id="case-{{ case.number }}">
<h3>Case {{ case.number }} <small>{{ case.meta }}</small></h3>
{# one line: the page shows the context's own newlines (white-space: pre-wrap) #}
<div class="context">{{ case.before }}<mark title="token id {{ case.token_id }}">{{ case.token }}</mark>{{ case.after }}</div>
<table class="stats">
<tr><th>{{ case.label }}</th><th>P</th><th>Adv.</th><th>H vs τ_h</th><th>‖∇‖</th><th>dH</th><th>Top-5</th></tr>
<tr><td><code>{{ case.token }}</code></td>{% for value in case.stats %}<td class="num">{{ value }}</td>{% endfor %}<td>
{%- for text, is_self in case.alternatives %}{% if not loop.first %} • {% endif %}<span class="alt{% if is_self %} self{% endif %}">{{ text }}</span>{% endfor -%}
</td></tr>
</table>
</section>
{% else %}
<p>{{ no_cases }}{% if kept_hint %} {{ kept_hint }}{% endif %}</p>
{% endfor %}
</body>
</html>
"""

_MARKDOWN = """\
# {{ title }}

Traced tokens: **{{ totals.silenced }}** silenced and **{{ totals.kept }}** kept candidates over **{{ steps|length }}** step(s) and {{ ranks }} rank(s).

{{ explanation }}

## Counts per step

| step | silenced (traced) | kept (traced) |{% if ratios %} silenced ratio (logged) |{% endif +%}
|---:|---:|---:|{% if ratios %}---:|{% endif +%}
{% for step, silenced, kept, ratio in steps %}
| {{ step }} | {{ silenced }} | {{ kept }} |{% if ratios %} {{ ratio }} |{% endif +%}
{% endfor %}

## Most frequent tokens

{% for name, counts in tokens.items() %}
| {{ name }} token | count |
|---|---:|
{% for token, count in counts %}
| {{ token }} | {{ count }} |
{% else %}
| none | 0 |
{% endfor %}

{% endfor %}
{% if images %}
## Figures

{% for caption, url in images.items() %}
![{{ caption }}]({{ url|safe }})

{% endfor %}
{% endif %}
## Cases: {{ shown }}, {{ order }} ({{ cases|length }} shown)

{% for case in cases %}
### Case {{ case.number }} · {{ case.meta }}

{{ case|blockquote }}

| {{ case.label }} | P | Adv. | H vs τ_h | ‖∇‖ | dH | Top-5 |
|---|---:|---:|---:|---:|---:|---|
| {{ case.token }} | {% for value in case.stats %}{{ value }} | {% endfor %}{{ case.alternatives|map("first")|map("md")|join(" • ")|safe }} |

{% else %}
{{ no_cases }}{% if kept_hint %} {{ kept_hint }}{% endif +%}
{% endfor %}
"""

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


_HTML_TEMPLATE = jinja2.Environment(
    autoescape=True, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
).from_string(_HTML)
_MARKDOWN_ENVIRONMENT = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, finalize=md_escape)
_MARKDOWN_ENVIRONMENT.filters.update(md=md_escape, blockquote=_md_blockquote)
_MARKDOWN_TEMPLATE = _MARKDOWN_ENVIRONMENT.from_string(_MARKDOWN)


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


# ---------------------------------------------------------------------------------------------- command line


def _add(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """An option spelled with underscores (as in the configs) and with hyphens."""
    flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*flags, dest=name, **kwargs)


def _named_run(text: str) -> tuple[str | None, str]:
    """`NAME=RUN_DIR` -> (NAME, RUN_DIR); an existing path (even with "=" in it) or a plain path -> (None, path)."""
    if "=" in text and not os.path.exists(text):
        name, path = text.split("=", 1)
        if name and path:
            return name, path
    return None, text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stapo-report",
        description="See the spurious tokens of STAPO runs: trace reports, word clouds and training curves.",
        epilog="Without a subcommand, the arguments are those of `report`.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{report,plots,word_clouds,mechanism}")

    report = commands.add_parser(
        "report", help="render a run's spurious-token trace as an HTML or Markdown page (the default command)",
        description="Render <RUN_DIR>/spurious_trace/rank-*.jsonl (written with STAPOConfig(spurious_trace=True)) "
        "as an HTML or Markdown page in the layout of the paper's Appendix 11.4.",
    )  # fmt: skip
    report.add_argument("run_dir", help="the run's output directory (or its spurious_trace/ folder, or a trace file)")
    _add(report, "format", choices=FORMATS, default=None, help="default: from --output's suffix, else html")
    _add(report, "output", default=None, help="report file (default: <RUN_DIR>/spurious_report.html or .md)")
    _add(report, "max_cases", type=int, default=50, help="cases shown (default: 50; -1 for all)")
    _add(report, "status", choices=(*STATUSES, "all"), default="silenced", help="cases (default: silenced)")
    _add(report, "sort", choices=SORTS, default="probability",
         help="case order: lowest probability first (default) or by step")  # fmt: skip
    _add(report, "top_tokens", type=int, default=20, help="rows of the most-frequent-token tables (default: 20)")
    _add(report, "title", default=None, help="page title (default: 'Spurious tokens: <run name>')")
    _add(report, "word_clouds", action="store_true", help="also draw the word clouds and show them in the report")
    _add(report, "plots", action="store_true", help="also plot the run's training curves and show them in the report")

    plots = commands.add_parser(
        "plots", help="plot the training curves of one or several runs, overlaid (one PNG per quantity)",
        description="Plot reward, entropy, silenced and candidate ratios, entropy quantiles, completion length and "
        "eval/... metrics from each run's trainer_state.json, the runs overlaid.",
    )  # fmt: skip
    plots.add_argument("runs", nargs="+", metavar="RUN", help="a run directory, or NAME=RUN_DIR to name it in legends")
    _add(plots, "output", required=True, help="folder for the PNG files")
    _add(plots, "metric", action="append", default=[], help="another log key to plot (repeatable), e.g. kl")
    _add(plots, "smoothing", type=float, default=0.0, help="exponential moving average in [0, 1) (default: 0)")

    clouds = commands.add_parser(
        "word_clouds", help="word clouds of the silenced vs kept low-probability tokens of a trace (Fig. 9)"
    )
    clouds.add_argument("run_dir", help="the run's output directory (or its spurious_trace/ folder, or a trace file)")
    _add(clouds, "output", default=None, help="folder for the PNG files (default: <RUN_DIR>/word_clouds)")
    _add(clouds, "random_state", type=int, default=0, help="layout seed (default: 0)")

    mechanism = commands.add_parser(
        "mechanism", help="the paper's Table 1 and a Fig. 2(c)-style picture of one or several runs, side by side",
        description="Tabulate the mechanism/* metrics (logged with spurious_mechanism_metrics=True): the "
        "positive-advantage tokens in four probability x entropy quadrants and the silenced ones, with their token "
        "share, gradient-norm share and mean first-order entropy change; and draw the quadrants as a picture.",
    )  # fmt: skip
    mechanism.add_argument("runs", nargs="+", metavar="RUN", help="a run directory, or NAME=RUN_DIR")
    _add(mechanism, "output", required=True, help="the page: a .md or .html file (the picture goes beside it)")
    _add(mechanism, "format", choices=("md", "html"), default=None, help="default: from --output's suffix, else md")
    _add(mechanism, "no_figure", action="store_true", help="the table only, without the picture (no matplotlib)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "report")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        for path in _run(args):
            print(path)
    except (FileNotFoundError, ImportError, ValueError, json.JSONDecodeError) as error:
        parser.exit(1, f"stapo-report: error: {error}\n")
    return 0


def _run(args) -> list:
    # Imported here: the plots and word clouds (and matplotlib / wordcloud inside them) load only when used.
    if args.command == "report":
        max_cases = None if args.max_cases < 0 else args.max_cases
        return [
            write_report(
                args.run_dir, args.output, fmt=args.format, status=args.status, sort=args.sort, max_cases=max_cases,
                top_tokens=args.top_tokens, word_clouds=args.word_clouds, plots=args.plots, title=args.title,
            )
        ]  # fmt: skip
    if args.command in ("plots", "mechanism"):
        from .plots import plot_runs, run_names

        named = [_named_run(run) for run in args.runs]
        unnamed = run_names([path for name, path in named if name is None])
        runs, unnamed_names = {}, iter(unnamed)
        for name, path in named:  # keep the command line's order in the legends
            runs[name if name is not None else next(unnamed_names)] = path
        if args.command == "mechanism":
            from .mechanism_report import write_mechanism_report

            return [write_mechanism_report(runs, args.output, fmt=args.format, figure=not args.no_figure)]
        written = plot_runs(runs, args.output, extra_metrics=args.metric, smoothing=args.smoothing)
        if not written:
            raise ValueError("none of the runs logged any of the plotted quantities.")
        return written
    from .word_clouds import word_clouds

    output = args.output or os.path.join(run_root(args.run_dir), "word_clouds")
    written = word_clouds(args.run_dir, output, random_state=args.random_state)
    if not written:
        raise ValueError(f"the trace of {args.run_dir} has no tokens to draw.")
    return list(written.values())


if __name__ == "__main__":
    sys.exit(main())
