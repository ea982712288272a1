"""Loading a DAPO-Math-17K-shaped parquet file: `load_dapo_math` now against earlier versions of it, side by side.

    python benchmarks/data_loading.py                                         # 1,790 problems x 100 = 179,000 rows
    python benchmarks/data_loading.py --problems 17900 --rounds 1             # the Hub copy's size: 1.79M rows

The file is generated in DAPO's veRL layout: ``prompt`` (one user message, the problem inside DAPO's answer-format
wrapper), ``reward_model`` (``ground_truth``, ``style``), ``data_source``, ``ability`` and ``extra_info.index`` (unique
per row), each of `--problems` distinct problems (about 300 characters of text) repeated `--repeats` times, the whole
list over again as in the Hub copy (1.79M rows for ~17.9k problems).

The earlier versions are read from this repository's history (``git show REV:stapo_trl/math/data.py``, its relative
imports made absolute) into temporary modules; before timing, each must return the same problems, solutions and ids
as the working tree's. Every round calls each version, in a random order, twice: first with an empty `datasets`
cache (what a first run pays: `datasets.load_dataset` converts the file to Arrow), then again with that cache. The
table gives the median seconds of each over the rounds.
"""

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from _common import markdown_table


REPOSITORY = Path(__file__).resolve().parent.parent
MODULE = "stapo_trl/math/data.py"
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
WORDS = ["Let", "$x$", "be", "the", "sum", "of", "all", "integers", "$n$", "such", "that", "$\\frac{n}{2}$", "find"]


def write_dapo_parquet(path: Path, problems: int, repeats: int) -> None:
    """A parquet file in DAPO-Math-17K's layout: `problems` distinct problems, the list repeated `repeats` times."""
    generator = random.Random(0)
    texts = [f"Problem {i}. " + " ".join(generator.choices(WORDS, k=60)) for i in range(problems)]
    rows = problems * repeats
    problem = [row % problems for row in range(rows)]
    table = pa.table(
        {
            "data_source": ["math_dapo"] * rows,
            "prompt": [[{"content": DAPO_PREFIX + texts[i] + DAPO_SUFFIX, "role": "user"}] for i in problem],
            "ability": ["MATH"] * rows,
            "reward_model": [{"ground_truth": str(i * 7 % 1000), "style": "rule-lighteval/MATH_v2"} for i in problem],
            "extra_info": [{"index": f"dapo-{row:08d}"} for row in range(rows)],
        }
    )
    pq.write_table(table, path)


def module_at(revision: str, directory: Path):
    """`stapo_trl/math/data.py` as it was at `revision`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{MODULE}"], cwd=REPOSITORY, capture_output=True, text=True, check=True
    ).stdout
    path = directory / f"data_{revision}.py"
    path.write_text(source.replace("from .", "from stapo_trl.math."), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def timed_load(load, path: Path, cache: Path) -> float:
    datasets.config.HF_DATASETS_CACHE = cache  # read by datasets.load_dataset at every call
    start = time.perf_counter()
    load(path)
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=1790, help="distinct problems")
    parser.add_argument("--repeats", type=int, default=100, help="rows per problem (the Hub copy: about 100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--revisions", nargs="*", default=["42860a9", "c428344"], help="earlier versions to compare")
    parser.add_argument("--quick", action="store_true", help="a tiny file and one round (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.problems, args.repeats, args.rounds = 20, 5, 1
    datasets.disable_progress_bars()
    sys.path.insert(0, str(REPOSITORY))
    from stapo_trl.math.data import load_dapo_math

    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        path = directory / "dapo.parquet"
        start = time.perf_counter()
        write_dapo_parquet(path, args.problems, args.repeats)
        rows = args.problems * args.repeats
        print(f"{path.name}: {rows:,} rows ({path.stat().st_size / 2**20:.1f} MiB), written in "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
        loaders = {"working tree": load_dapo_math}
        loaders.update({revision: module_at(revision, directory).load_dapo_math for revision in args.revisions})

        datasets.config.HF_DATASETS_CACHE = directory / "cache-check"
        expected = load_dapo_math(path).select_columns(["problem", "solution", "id"]).to_dict()
        assert len(expected["problem"]) == args.problems, len(expected["problem"])
        for name, load in loaders.items():
            got = load(path).select_columns(["problem", "solution", "id"]).to_dict()
            assert got == expected, f"{name} returns other rows than the working tree"

        times: dict[str, dict[str, list[float]]] = {name: {"cold": [], "warm": []} for name in loaders}
        order = list(loaders)
        for round_ in range(args.rounds):
            random.Random(round_).shuffle(order)
            for name in order:
                cache = directory / f"cache-{round_}-{name}"
                times[name]["cold"].append(timed_load(loaders[name], path, cache))
                times[name]["warm"].append(timed_load(loaders[name], path, cache))

    baseline = {kind: statistics.median(times["working tree"][kind]) for kind in ("cold", "warm")}
    table = []
    for name, kinds in times.items():
        cold, warm = statistics.median(kinds["cold"]), statistics.median(kinds["warm"])
        table.append([name, cold, warm, cold / baseline["cold"], warm / baseline["warm"]])
    load = "load average {:.2f}/{:.2f}/{:.2f} (1/5/15 min)".format(*os.getloadavg())
    print(
        f"{os.cpu_count()} logical CPUs; {load}; {args.rounds} round(s); {args.problems:,} problems x {args.repeats}"
    )
    print(markdown_table(["version", "first load s", "cached load s", "first / now", "cached / now"], table))


if __name__ == "__main__":
    main()
