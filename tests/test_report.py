"""Spurious-token reports (HTML, Markdown), word clouds and the command line, on the trace of a tiny training run."""

import json
import logging
import sys
from html.parser import HTMLParser

import pytest
from conftest import png_size, train_tiny_run
from test_trace import FIELDS

from stapo_trl.diagnostics.report import (
    format_entropy_vs_threshold,
    format_number,
    format_probability,
    render_html,
    render_markdown,
    summarize,
    write_report,
)
from stapo_trl.diagnostics.report_cli import main
from stapo_trl.diagnostics.trace import iter_trace, load_trace, visible_token


STEP_TABLE_HEADER = "| step | silenced (traced) | kept (traced) |"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer, prompt_dataset):
    """A 2-step STAPO run with a trace and a trainer_state.json (made once for the module)."""
    output_dir = tmp_path_factory.mktemp("tiny_run")
    return train_tiny_run(output_dir, tokenizer, prompt_dataset, spurious_trace=True, spurious_trace_context_tokens=6)


class Page(HTMLParser):
    """Collects the start tags, the text of every <mark>, and all text, of an HTML page."""

    def __init__(self):
        super().__init__()
        self.tags, self.marks, self.text, self._in_mark = [], [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "mark":
            self._in_mark = True
            self.marks.append("")

    def handle_endtag(self, tag):
        if tag == "mark":
            self._in_mark = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_mark:
            self.marks[-1] += data


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    parser.close()
    return parser


NASTY = [
    {
        "step": 3, "rank": 1, "status": "silenced", "sample": 0, "position": 7, "token_id": 11, "token": "<script>",
        "probability": 0.000115, "entropy": 0.25, "advantage": 1.62, "entropy_threshold": 0.5,
        "context_before": "a & b <b>bold</b>\n    indented\n- item ",
        "context_after": "</mark><script>alert(1)</script>",
        "top_alternatives": [
            {"token": "&amp;", "token_id": 1, "probability": 0.519},
            {"token": "\n", "token_id": 2, "probability": 0.3148},
            {"token": " |x|", "token_id": 3, "probability": 0.1},
        ],
    },
    {
        "step": 1, "rank": 0, "status": "kept", "sample": 2, "position": 0, "token_id": 12, "token": "\n",
        "probability": 0.0015, "entropy": 2.5, "advantage": 0.35, "entropy_threshold": None,
        "context_before": "", "context_after": '"quoted" *stars* _under_',
        "top_alternatives": [{"token": "x", "token_id": 4, "probability": 0.9}],
    },
]  # fmt: skip


@pytest.fixture
def nasty_run(tmp_path):
    trace_dir = tmp_path / "spurious_trace"
    trace_dir.mkdir()
    for rank in (0, 1):
        rows = [row for row in NASTY if row["rank"] == rank]
        (trace_dir / f"rank-{rank}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


def test_load_trace_reads_every_rank_sorted_by_step(nasty_run, run_dir):
    rows = load_trace(nasty_run)
    assert [row["step"] for row in rows] == [1, 3] and {row["rank"] for row in rows} == {0, 1}
    tiny = load_trace(run_dir)
    assert tiny and all(set(row) == FIELDS for row in tiny)
    assert [row["step"] for row in tiny] == sorted(row["step"] for row in tiny)
    assert load_trace(run_dir / "spurious_trace") == tiny == load_trace(run_dir / "spurious_trace" / "rank-0.jsonl")


def test_html_report_of_a_training_run(run_dir):
    path = write_report(run_dir)
    assert path == run_dir / "spurious_report.html" and path.stat().st_size > 0
    page = parse(path.read_text(encoding="utf-8"))
    assert page.tags[0] == "html" and "mark" in page.tags and "table" in page.tags
    text = "".join(page.text)
    lowest = min((row for row in load_trace(run_dir) if row["status"] == "silenced"), key=lambda r: r["probability"])
    assert page.marks[0] == visible_token(lowest["token"])  # default: silenced cases, lowest probability first
    for value in (format_probability(lowest["probability"]), format_number(lowest["advantage"], 2)):
        assert value in text
    logged = {e["step"]: e for e in json.loads((run_dir / "trainer_state.json").read_text())["log_history"]}
    step = lowest["step"]
    assert format_probability(logged[step]["spurious/silenced_ratio"]) in text  # the logged ratio, per step


def test_markdown_report_via_command_line(run_dir, tmp_path, capsys):
    output = tmp_path / "report.md"
    assert main([str(run_dir), "--format", "md", "--output", str(output), "--max-cases", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(output)
    text = output.read_text(encoding="utf-8")
    assert STEP_TABLE_HEADER in text and "| Masked token | P | Adv. | H vs τ_h | ‖∇‖ | dH | Top-5 |" in text
    assert text.count("### Case ") == 3 and text.count("\\[**") == 3
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert rendered.count("<strong>") >= 3 and "<table>" in rendered


def test_html_escaping(nasty_run):
    page_text = render_html(load_trace(nasty_run), status="all", title="<t> & co")
    page = parse(page_text)
    assert "script" not in page.tags and "b" not in page.tags and page.tags.count("mark") == 2
    text = "".join(page.text)
    assert "<script>alert(1)</script>" in text and "a & b <b>bold</b>" in text and "<t> & co" in text
    assert page.marks == ["<script>", "\\n"]  # sorted by probability; whitespace made visible
    assert "&amp; (51.90%)" in text and "\\n (31.48%)" in text and "0.0115%" in text and "1.62" in text
    assert "0.250 < 0.500" in text and "2.500 vs n/a" in text  # H vs τ_h; a missing threshold


def test_no_cases_says_what_shows_silenced_tokens(nasty_run):
    kept_only = [row for row in load_trace(nasty_run) if row["status"] == "kept"]
    for render in (render_html, render_markdown):
        text = render(kept_only)
        assert "No cases." in text
        assert "--spurious_prob_threshold" in text.replace("\\_", "_")  # the measured advice (Markdown escapes _)
        assert "1 kept candidate(s)" in text  # the trace has kept candidates: say how to show them
        assert "kept candidate(s)" not in render(kept_only, status="all")  # shown as cases: no empty state


def test_entropy_against_threshold():
    assert format_entropy_vs_threshold(0.3124, 0.53) == "0.312 < 0.530"
    assert format_entropy_vs_threshold(0.0182231, 0.0182228) == "0.018223 > 0.018223"  # digits until they differ
    assert format_entropy_vs_threshold(0.0182, 0.0182) == "0.018 = 0.018"  # kept: H >= τ_h


def test_markdown_escaping(nasty_run):
    text = render_markdown(load_trace(nasty_run), status="all", sort="step")
    assert "<script>" not in text and "<b>" not in text
    assert "\\[**\\\\n**\\]" in text and "\\[**&lt;script&gt;**\\]" in text
    assert " \\|x\\| (10.00%)" not in text and "␣\\|x\\| (10.00%)" in text
    assert "> &nbsp;&nbsp;&nbsp;&nbsp;indented" in text  # leading spaces kept, not an indented code block
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert "<script>" not in rendered and "<b>" not in rendered and "<pre>" not in rendered and "<ul>" not in rendered
    assert "<strong>&lt;script&gt;</strong>" in rendered and "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered


def test_summary_options(nasty_run):
    rows = load_trace(nasty_run)
    summary = summarize(rows, status="kept")
    assert [row["status"] for row in summary.cases] == ["kept"] and summary.totals == {"silenced": 1, "kept": 1}
    assert [row["step"] for row in summarize(rows, status="all", sort="step").cases] == [1, 3]
    assert [row["step"] for row in summarize(rows, status="all", sort="probability").cases] == [3, 1]
    assert summarize(rows, status="all", max_cases=1).cases == [rows[1]]
    none = summarize(iter_trace(nasty_run), max_cases=0)
    assert none.cases == [] and sorted(none.steps) == [1, 3] and none.tokens["silenced"] == {"<script>": 1}
    with pytest.raises(ValueError, match="status"):
        summarize(rows, status="masked")


def test_unreadable_last_line_is_skipped(nasty_run, caplog):
    with open(nasty_run / "spurious_trace" / "rank-0.jsonl", "a") as trace_file:
        trace_file.write('{"step": 4, "rank": 0, "status": "sil')  # a run killed while writing
    with caplog.at_level(logging.WARNING):
        assert len(load_trace(nasty_run)) == 2
    assert "unreadable" in caplog.text


def test_missing_trace(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="spurious_trace=True"):
        write_report(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path)])
    assert exit_info.value.code == 1 and "spurious_trace=True" in capsys.readouterr().err


def test_word_clouds(run_dir, tmp_path):
    pytest.importorskip("wordcloud")
    from stapo_trl.diagnostics.word_clouds import word_clouds

    paths = word_clouds(load_trace(run_dir), tmp_path / "a")
    assert set(paths) == {"silenced", "kept"}
    for path in paths.values():
        width, height = png_size(path)
        assert width > 100 and height > 100
    again = word_clouds(run_dir, tmp_path / "b")  # from the run directory, same layout seed
    assert all(again[status].read_bytes() == paths[status].read_bytes() for status in paths)


def test_word_clouds_skip_a_status_without_tokens(nasty_run, tmp_path, caplog):
    pytest.importorskip("wordcloud")
    from stapo_trl.diagnostics.word_clouds import token_frequencies, word_clouds

    rows = [row for row in load_trace(nasty_run) if row["status"] == "silenced"]
    with caplog.at_level(logging.WARNING):
        paths = word_clouds(rows, tmp_path)
    assert list(paths) == ["silenced"] and "No kept tokens" in caplog.text
    assert token_frequencies(load_trace(nasty_run), "kept") == {"\\n": 1}  # pure whitespace: a visible name
    rows = [{"status": "kept", "token": token} for token in (" Let ", "Let", " The", " ")]
    assert token_frequencies(rows, "kept") == {"Let": 2, "␣": 1}  # stripped; "the" is a stop word (any case)
    assert token_frequencies(rows, "kept", stopwords=()) == {"Let": 2, "The": 1, "␣": 1}


def test_report_with_word_clouds_and_plots(run_dir, tmp_path, capsys):
    pytest.importorskip("wordcloud")
    pytest.importorskip("matplotlib")
    output = tmp_path / "out" / "page.html"
    assert main(["report", str(run_dir), "--output", str(output), "--word_clouds", "--plots"]) == 0
    images = sorted((tmp_path / "out" / "page_files").rglob("*.png"))
    assert {path.name for path in images} >= {"word_cloud_silenced.png", "reward.png", "silenced_ratio.png"}
    page = parse(output.read_text(encoding="utf-8"))
    assert page.tags.count("img") == len(images)
    assert "page_files/word_clouds/word_cloud_silenced.png" in output.read_text(encoding="utf-8")


def test_clear_error_without_wordcloud(nasty_run, tmp_path, monkeypatch, capsys):
    from stapo_trl.diagnostics.word_clouds import word_clouds

    monkeypatch.setitem(sys.modules, "wordcloud", None)
    with pytest.raises(ImportError, match=r'pip install "stapo-trl\[diagnostics\]"'):
        word_clouds(load_trace(nasty_run), tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["word_clouds", str(nasty_run)])
    assert exit_info.value.code == 1 and "stapo-trl[diagnostics]" in capsys.readouterr().err
