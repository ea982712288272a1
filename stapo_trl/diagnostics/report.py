"""Case reports of the spurious-token trace, in the layout of the paper's Appendix 11.4, as HTML or Markdown.

    from stapo_trl.diagnostics.report import load_trace, render_html, write_report
    write_report("outputs/stapo")                     # -> outputs/stapo/spurious_report.html
    html = render_html(load_trace("outputs/stapo"), max_cases=20)

A trace (`STAPOConfig(spurious_trace=True)`, see `stapo_trl.diagnostics.trace`) is one JSON object per traced
token in `<output_dir>/spurious_trace/rank-<i>.jsonl`. A report shows, per case, the context with the token
highlighted, its probability P, the advantage Adv. of its completion, its entropy H against the S2T threshold τ_h,
and the policy's top alternatives; before the cases, the number of traced tokens per step and the most frequent
tokens. The command line is `python -m stapo_trl.report` (or `stapo-report`), see `stapo_trl.report`.
"""

from __future__ import annotations

import heapq
import html
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

logger = logging.getLogger(__name__)

STATUSES = ("silenced", "kept")
SORTS = ("probability", "step")
FORMATS = ("html", "md")
REPORT_NAME = "spurious_report"
TRACE_DIRNAME = "spurious_trace"  # as in .trace, not imported from there: reading a trace does not need torch
LOG_RATIO_KEY = "spurious/silenced_ratio"

# How whitespace looks in labels (the paper's notation: ␣ for a space, \n for a newline).
_VISIBLE = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


# ----------------------------------------------------------------------------------------------------- reading


def trace_files(path: str | os.PathLike) -> list[Path]:
    """The trace files of a run: `path` is a run directory, its `spurious_trace/` folder, or one `.jsonl` file."""
    path = Path(path)
    if path.is_file():
        return [path]
    directory = path / TRACE_DIRNAME if (path / TRACE_DIRNAME).is_dir() else path
    files = sorted(directory.glob("rank-*.jsonl"), key=lambda f: (len(f.name), f.name))  # rank-2 before rank-10
    if not files:
        raise FileNotFoundError(
            f"No trace in {path}: expected {path / TRACE_DIRNAME}/rank-<i>.jsonl, written when the run had "
            "STAPOConfig(spurious_trace=True)."
        )
    return files


def iter_trace(path: str | os.PathLike) -> Iterator[dict]:
    """Stream the rows of every rank file of a trace (file order, not sorted). Unreadable lines are skipped with a
    warning (the last line of a file is cut short when a run is killed while writing it)."""
    for trace_file in trace_files(path):
        bad = 0
        with open(trace_file, encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(row, dict):
                    yield row
                else:
                    bad += 1
        if bad:
            logger.warning("Skipped %d unreadable line(s) of %s.", bad, trace_file)


def _row_order(row: Mapping) -> tuple:
    return (row.get("step", 0), row.get("rank", 0), row.get("sample", 0), row.get("position", 0))


def load_trace(run_dir: str | os.PathLike) -> list[dict]:
    """All rows of a run's trace, every rank file, sorted by step (then rank, sample, position)."""
    return sorted(iter_trace(run_dir), key=_row_order)


# ------------------------------------------------------------------------------------------------ formatting


def visible_token(token: str) -> str:
    """The token with its whitespace made visible: " the" -> "␣the", "\\n\\n" -> "\\\\n\\\\n", "" -> "∅"."""
    if token == "":
        return "∅"
    return "".join(
        _VISIBLE.get(char, f"\\u{ord(char):04x}" if char.isspace() or not char.isprintable() else char)
        for char in token
    )


def cloud_label(token: str) -> str:
    """A word-cloud label: the token without surrounding whitespace; a pure-whitespace token by its visible name."""
    return visible_token(token.strip() or token)


def format_probability(probability: float) -> str:
    """P as in Appendix 11.4, in percent with four decimals ("0.0115%"); tinier values in scientific notation."""
    percent = 100.0 * probability
    return f"{percent:.4f}%" if percent == 0 or percent >= 0.0001 else f"{percent:.2e}%"


def format_number(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_alternative(alternative: Mapping) -> str:
    """One top-k alternative as in Appendix 11.4: "code (51.90%)"."""
    return f"{visible_token(alternative.get('token', ''))} ({100.0 * alternative.get('probability', 0.0):.2f}%)"


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
        key = lambda row: (row.get("probability", 1.0), *_row_order(row))  # noqa: E731
    else:
        key = _row_order
    if max_cases is None:
        summary.cases = sorted(counted(trace), key=key)
    elif max_cases > 0:
        summary.cases = heapq.nsmallest(max_cases, counted(trace), key=key)
    else:
        for _ in counted(trace):  # no cases: only the counts
            pass
    summary.steps = dict(sorted(summary.steps.items()))
    return summary


def _summary(trace, status, sort, max_cases) -> TraceSummary:
    if isinstance(trace, TraceSummary):
        return trace
    return summarize(trace, status=status, sort=sort, max_cases=max_cases)


def logged_ratios(log_history: Iterable[Mapping] | None) -> dict[int, float]:
    """step -> logged `spurious/silenced_ratio`, from a run's log history."""
    ratios = {}
    for entry in log_history or ():
        value = entry.get(LOG_RATIO_KEY)
        if "step" in entry and isinstance(value, (int, float)):
            ratios[entry["step"]] = float(value)
    return ratios


def _explanation() -> str:
    return (
        "P: the policy's probability of the sampled token (at the sampling temperature). Adv.: the advantage of its "
        "completion. H: the entropy of the next-token distribution at that position; τ_h: the S2T entropy threshold "
        "of its micro-batch. With STAPO's mask (spurious_mask_mode='low_entropy') a candidate (P < τ_p, Adv. > 0) is "
        "silenced when H < τ_h and kept otherwise; the ablation modes silence other candidates. Top-5: the "
        "policy's most likely tokens at that position. ␣ is a space, \\n a newline. Counts are of traced tokens: the "
        "trace keeps at most spurious_trace_max_silenced silenced and spurious_trace_max_kept kept tokens per "
        "micro-batch."
    )


def _label(row: Mapping) -> str:
    return "Masked token" if row.get("status") == "silenced" else "Kept token"


def _meta(row: Mapping) -> str:
    return " · ".join(
        [f"step {row.get('step')}", f"rank {row.get('rank')}", f"sample {row.get('sample')}",
         f"position {row.get('position')}", str(row.get("status"))]
    )  # fmt: skip


def format_entropy_vs_threshold(entropy: float | None, threshold: float | None) -> str:
    """H against τ_h: "0.312 < 0.530"; more digits when three do not tell them apart ("0.018223 = 0.018223")."""
    if entropy is None or threshold is None:
        return f"{format_number(entropy, 3)} vs {format_number(threshold, 3)}"
    digits = 3
    while digits < 6 and f"{entropy:.{digits}f}" == f"{threshold:.{digits}f}" and entropy != threshold:
        digits += 1
    sign = "<" if entropy < threshold else "=" if entropy == threshold else ">"
    return f"{entropy:.{digits}f} {sign} {threshold:.{digits}f}"


def _stats(row: Mapping) -> list[str]:
    """P, Adv. and H vs τ_h of a case, formatted."""
    return [
        format_probability(row.get("probability", float("nan"))),
        format_number(row.get("advantage"), 2),
        format_entropy_vs_threshold(row.get("entropy"), row.get("entropy_threshold")),
    ]


# ------------------------------------------------------------------------------------------------------ HTML

_CSS = """
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
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _html_case(number: int, row: Mapping) -> str:
    status = row.get("status", "")
    token = row.get("token", "")
    alternatives = " • ".join(
        f'<span class="alt{" self" if alt.get("token_id") == row.get("token_id") else ""}">'
        f"{_e(format_alternative(alt))}</span>"
        for alt in row.get("top_alternatives", [])
    )
    token = _e(visible_token(token))
    context = (  # one line: the page shows the context's own newlines (white-space: pre-wrap)
        f'{_e(row.get("context_before", ""))}<mark title="token id {_e(row.get("token_id"))}">{token}</mark>'
        f"{_e(row.get('context_after', ''))}"
    )
    cells = "".join(f'<td class="num">{_e(value)}</td>' for value in _stats(row))
    return f"""<section class="case {_e(status)}" id="case-{number}">
<h3>Case {number} <small>{_e(_meta(row))}</small></h3>
<div class="context">{context}</div>
<table class="stats">
<tr><th>{_label(row)}</th><th>P</th><th>Adv.</th><th>H vs τ_h</th><th>Top-5</th></tr>
<tr><td><code>{token}</code></td>{cells}<td>{alternatives}</td></tr>
</table>
</section>"""


def _html_token_table(status: str, counts: Counter, top: int) -> str:
    rows = "".join(
        f'<tr><td><code>{_e(token)}</code></td><td class="num">{count}</td></tr>'
        for token, count in counts.most_common(top)
    )
    rows = rows or '<tr><td colspan="2">none</td></tr>'
    return f"<table><tr><th>{_e(status)} token</th><th>count</th></tr>{rows}</table>"


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
    summary = _summary(trace, status, sort, max_cases)
    ratios = logged_ratios(log_history)
    ratio_header = "<th>silenced ratio (logged)</th>" if ratios else ""
    step_rows = "".join(
        f'<tr><td class="num">{_e(step)}</td><td class="num">{counts["silenced"]}</td>'
        f'<td class="num">{counts["kept"]}</td>'
        + (f'<td class="num">{_e(format_probability(ratios[step]) if step in ratios else "")}</td>' if ratios else "")
        + "</tr>"
        for step, counts in summary.steps.items()
    )
    open_attribute = " open" if len(summary.steps) <= 50 else ""
    token_tables = "".join(_html_token_table(name, summary.tokens[name], top_tokens) for name in STATUSES)
    figures = "".join(
        f'<figure><img src="{_e(url)}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption></figure>'
        for caption, url in (images or {}).items()
    )
    cases = "\n".join(_html_case(number, row) for number, row in enumerate(summary.cases, start=1))
    shown = "all statuses" if status == "all" else f"{status} tokens"
    order = "lowest probability first" if sort == "probability" else "by step"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{_e(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(title)}</h1>
<p>Traced tokens: <strong>{summary.totals["silenced"]}</strong> silenced and <strong>{summary.totals["kept"]}</strong>
kept candidates over <strong>{len(summary.steps)}</strong> step(s) and {len(summary.ranks)} rank(s).</p>
<p class="note">{_e(_explanation())}</p>
<h2>Counts per step</h2>
<details{open_attribute}><summary>{len(summary.steps)} step(s)</summary>
<table class="counts">
<tr><th>step</th><th>silenced (traced)</th><th>kept (traced)</th>{ratio_header}</tr>{step_rows}
</table>
</details>
<h2>Most frequent tokens</h2>
<div class="tokens">{token_tables}</div>
{"<h2>Figures</h2>" + figures if figures else ""}
<h2>Cases: {_e(shown)}, {_e(order)} ({len(summary.cases)} shown)</h2>
{cases or "<p>No cases.</p>"}
</body>
</html>
"""  # noqa: E501


# -------------------------------------------------------------------------------------------------- Markdown

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#$~!])")


def md_escape(text: str) -> str:
    """Text that Markdown (CommonMark/GFM) shows as is: HTML and Markdown syntax characters escaped."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _md_line(line: str) -> str:
    """Neutralize what starts a block at the beginning of a line: indentation (code), list markers, headings."""
    indent = len(line) - len(line.lstrip(" \t"))
    line = "&nbsp;" * indent + line[indent:]
    line = re.sub(r"^((?:&nbsp;)*)([-+=])", r"\1\\\2", line)
    return re.sub(r"^((?:&nbsp;)*\d+)([.)])", r"\1\\\2", line)


def _md_context(row: Mapping) -> str:
    """The context as a blockquote, the token in bold between brackets: ...\\[**token**\\]...

    The brackets sit outside the bold: CommonMark does not open or close `**` between a letter and punctuation, so
    `**[b]**` inside a word would not be bold, while `[**b**]` always is.
    """
    text = (
        md_escape(row.get("context_before", ""))
        + "\\[**" + md_escape(visible_token(row.get("token", ""))) + "**\\]"
        + md_escape(row.get("context_after", ""))
    )  # fmt: skip
    lines = [_md_line(line) for line in text.split("\n")]
    quoted = []
    for index, line in enumerate(lines):
        hard_break = line and index + 1 < len(lines) and lines[index + 1]  # keep the newline inside a paragraph
        quoted.append(f"> {line}  " if hard_break else f"> {line}".rstrip())
    return "\n".join(quoted)


def _md_case(number: int, row: Mapping) -> str:
    token = md_escape(visible_token(row.get("token", "")))
    alternatives = " • ".join(md_escape(format_alternative(alt)) for alt in row.get("top_alternatives", []))
    probability, advantage, entropy = _stats(row)
    return "\n".join(
        [
            f"### Case {number} · {_meta(row)}",
            "",
            _md_context(row),
            "",
            f"| {_label(row)} | P | Adv. | H vs τ_h | Top-5 |",
            "|---|---:|---:|---:|---|",
            f"| {token} | {probability} | {advantage} | {md_escape(entropy)} | {alternatives} |",
            "",
        ]
    )


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
    summary = _summary(trace, status, sort, max_cases)
    ratios = logged_ratios(log_history)
    lines = [
        f"# {md_escape(title)}",
        "",
        f"Traced tokens: **{summary.totals['silenced']}** silenced and **{summary.totals['kept']}** kept candidates "
        f"over **{len(summary.steps)}** step(s) and {len(summary.ranks)} rank(s).",
        "",
        md_escape(_explanation()),
        "",
        "## Counts per step",
        "",
        "| step | silenced (traced) | kept (traced) |" + (" silenced ratio (logged) |" if ratios else ""),
        "|---:|---:|---:|" + ("---:|" if ratios else ""),
    ]
    for step, counts in summary.steps.items():
        line = f"| {step} | {counts['silenced']} | {counts['kept']} |"
        if ratios:
            line += f" {format_probability(ratios[step]) if step in ratios else ''} |"
        lines.append(line)
    lines += ["", "## Most frequent tokens", ""]
    for token_status in STATUSES:
        lines += [f"| {token_status} token | count |", "|---|---:|"]
        most_common = summary.tokens[token_status].most_common(top_tokens)
        lines += [f"| {md_escape(token)} | {count} |" for token, count in most_common] or ["| none | 0 |"]
        lines.append("")
    if images:
        lines += ["## Figures", ""]
        lines += [f"![{md_escape(caption)}]({url})\n" for caption, url in images.items()]
    shown = "all statuses" if status == "all" else f"{status} tokens"
    order = "lowest probability first" if sort == "probability" else "by step"
    lines += [f"## Cases: {shown}, {order} ({len(summary.cases)} shown)", ""]
    lines += [_md_case(number, row) for number, row in enumerate(summary.cases, start=1)] or ["No cases.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------------- files


def run_root(path: str | os.PathLike) -> Path:
    """The run directory of a path given to the report: a run directory, its trace folder or a trace file."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    return path.parent if path.name == TRACE_DIRNAME else path


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
