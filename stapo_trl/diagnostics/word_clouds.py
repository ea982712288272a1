"""Word clouds of the silenced vs the kept low-probability tokens of a trace (the paper's Fig. 9).

    from stapo_trl.diagnostics.trace import load_trace
    from stapo_trl.diagnostics.word_clouds import word_clouds
    word_clouds(load_trace("outputs/stapo"), "figures/")  # {"silenced": .../word_cloud_silenced.png, "kept": ...}

Both kinds are low-probability tokens of positive-advantage completions (S2T candidates): "silenced" are the
low-entropy ones S2T removed from the loss (spurious), "kept" the high-entropy ones it left in (exploratory). The font
size of a token is proportional to how often it was traced. A trace samples at most `spurious_trace_max_silenced`
silenced and `spurious_trace_max_kept` kept tokens per micro-batch, so the clouds show frequencies within that sample.
The `wordcloud` package (and matplotlib, for its font) is optional: `pip install "stapo-trl[diagnostics]"`.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from .trace import STATUSES, iter_trace, visible_token


logger = logging.getLogger(__name__)
INSTALL_HINT = 'pip install "stapo-trl[diagnostics]"'

# The paper's clouds filter out common articles and prepositions (Fig. 9's caption); pass stopwords=() to keep all.
DEFAULT_STOPWORDS = frozenset(
    "a an the of in on at to for by with from into onto as about over under between among through and or".split()
)
HUES = {"silenced": 0, "kept": 215}  # red for the spurious tokens, blue for the exploratory ones


def cloud_label(token: str) -> str:
    """A word-cloud label: the token without surrounding whitespace; a pure-whitespace token by its visible name."""
    return visible_token(token.strip() or token)


def _color_func(hue: int):
    def color(word, font_size, position, orientation, random_state=None, **kwargs):
        return f"hsl({hue}, 70%, {random_state.randint(22, 48)}%)"  # dark enough to read on white

    return color


def token_frequencies(
    trace: Iterable[Mapping], status: str, stopwords: Iterable[str] = DEFAULT_STOPWORDS
) -> Counter[str]:
    """How often each token text was traced with this status, keyed by its word-cloud label (see `cloud_label`)."""
    return _frequencies(trace, stopwords)[status]


def _frequencies(trace: Iterable[Mapping], stopwords: Iterable[str]) -> dict[str, Counter[str]]:
    """Label frequencies of every status, in one pass (a trace can be streamed from its files)."""
    stop = {word.lower() for word in stopwords}
    counts: dict[str, Counter[str]] = {status: Counter() for status in STATUSES}
    for row in trace:
        status = row.get("status")
        if status in counts:
            label = cloud_label(row.get("token", ""))
            if label.lower() not in stop:
                counts[status][label] += 1
    return counts


def _default_font() -> str | None:
    """DejaVu Sans from matplotlib: unlike wordcloud's bundled font it has the glyphs of the labels (␣, ∅)."""
    try:
        from matplotlib import font_manager
    except ImportError:  # wordcloud installed without matplotlib: its own font, some labels show as boxes
        return None
    return font_manager.findfont("DejaVu Sans", fallback_to_default=True)


def word_clouds(
    trace: Iterable[Mapping] | str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    stopwords: Iterable[str] = DEFAULT_STOPWORDS,
    width: int = 800,
    height: int = 400,
    max_words: int = 200,
    random_state: int = 0,
    font_path: str | None = None,
) -> dict[str, Path]:
    """Write one word cloud PNG per status ("silenced", "kept") to `output_dir`.

    Args:
        trace: trace rows (`load_trace`), or a run directory / trace file to read them from.
        output_dir: where `word_cloud_silenced.png` and `word_cloud_kept.png` go (created if needed).
        stopwords: token texts left out (case-insensitive); the default drops common articles and prepositions,
            as in the paper.
        width, height, max_words: size of the images and most tokens drawn.
        random_state: seed of the layout, so that the same trace gives the same images.
        font_path: a TrueType font; default DejaVu Sans from matplotlib.

    Returns:
        `{status: path}` for the clouds written. A status with no traced token is skipped with a logged warning.
    """
    try:
        from wordcloud import WordCloud
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(f"Word clouds need the wordcloud package, an optional dependency: {INSTALL_HINT}") from error
    rows = iter_trace(trace) if isinstance(trace, (str, os.PathLike)) else trace
    all_frequencies = _frequencies(rows, stopwords)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    font_path = font_path or _default_font()
    written = {}
    for status in STATUSES:
        frequencies = all_frequencies[status]
        if not frequencies:
            logger.warning("No %s tokens in the trace (after stop words): no word cloud for them.", status)
            continue
        cloud = WordCloud(
            width=width, height=height, max_words=max_words, random_state=random_state, background_color="white",
            color_func=_color_func(HUES[status]), font_path=font_path, prefer_horizontal=0.9, min_font_size=8,
        )  # fmt: skip
        cloud.generate_from_frequencies(frequencies)
        path = output / f"word_cloud_{status}.png"
        cloud.to_file(str(path))
        written[status] = path
    return written
