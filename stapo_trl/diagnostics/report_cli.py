"""The `stapo-report` command: trace reports, word clouds, training curves and the paper's Table 1 of STAPO runs.

    stapo-report RUN_DIR [--format html|md] [--output PATH] [--max_cases N] [--word_clouds] [--plots]
    stapo-report plots RUN [RUN ...] --output DIR      # RUN: a run directory or NAME=RUN_DIR
    stapo-report word_clouds RUN_DIR --output DIR
    stapo-report mechanism RUN [RUN ...] --output PAGE.md|PAGE.html  # Table 1 of runs logged with mechanism metrics

`python -m stapo_trl.diagnostics.report_cli` is the same command; `report` is its default subcommand. The work is
done by `report` (the trace page), `plots`, `word_clouds` and `mechanism_report`, each imported when its
subcommand runs, so that matplotlib and wordcloud load only when used.
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .report import FORMATS, SORTS, write_report
from .trace import STATUSES, run_root


COMMANDS = ("report", "plots", "word_clouds", "mechanism")


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
