"""The tiny offline world: a character tokenizer, a Qwen3-shaped model, synthetic math problems.

Everything here is built locally, so demos and tests run without the Hugging Face Hub.

- `toy_checkpoint()`: path of a tiny Qwen3 already partly taught the synthetic arithmetic (the one shipped in
  `stapo_trl/toy/checkpoint/`, or else one built on first use into a cache directory).
- `toy_dataset_files()`: the synthetic train and held-out problems as parquet files in DAPO-Math-17K's layout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


TOY_VERSION = "1"
"""Bump when the problems, the tokenizer, the model shape or the pretraining recipe change."""

SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"

_CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_cache_dir() -> Path:
    """`$STAPO_TRL_CACHE` if set, else `$XDG_CACHE_HOME/stapo_trl` (default `~/.cache/stapo_trl`)."""
    if os.environ.get("STAPO_TRL_CACHE"):
        return Path(os.environ["STAPO_TRL_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "stapo_trl"


def _is_checkpoint(path: Path) -> bool:
    return all((path / name).is_file() for name in _CHECKPOINT_FILES)


def toy_checkpoint(cache_dir: str | os.PathLike | None = None, rebuild: bool = False) -> str:
    """Return the directory of the toy checkpoint (model and tokenizer, loadable with `from_pretrained`).

    The checkpoint shipped with the package is returned when present. Otherwise (or with `rebuild=True`) it is
    built once with `stapo_trl.toy.pretrain.build_toy_checkpoint` (a minute or a few on a CPU) into
    `<cache_dir>/toy-<TOY_VERSION>` (default cache: `default_cache_dir()`), under a file lock and with an atomic
    rename, so concurrent callers build it once and never see a half-written directory.
    """
    if not rebuild and _is_checkpoint(SHIPPED_CHECKPOINT):
        return str(SHIPPED_CHECKPOINT)
    from filelock import FileLock

    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache_dir / f"toy-{TOY_VERSION}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / f".toy-{TOY_VERSION}.lock")):
        if _is_checkpoint(target) and not rebuild:
            return str(target)
        from .pretrain import build_toy_checkpoint

        staging = Path(tempfile.mkdtemp(prefix=f".toy-{TOY_VERSION}-", dir=cache_dir))
        try:
            build_toy_checkpoint(staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def toy_dataset_files(
    cache_dir: str | os.PathLike | None = None,
    num_train: int = 2000,
    num_heldout: int = 200,
    seed: int = 0,
) -> dict[str, str]:
    """Write (once) the synthetic train and held-out problems as DAPO-Math-17K-layout parquet files.

    Returns `{"train": path, "heldout": path}`; the two sets are disjoint (see `stapo_trl.toy.problems`). Files go
    to `<cache_dir>/toy-data-<TOY_VERSION>/` (default cache: `default_cache_dir()`) and are named after their size,
    seed and `layout_fingerprint()`; existing files are reused, since they are deterministic. Load them with
    `stapo_trl.math.data.load_dapo_math(path)`.
    """
    from .problems import layout_fingerprint, write_dapo_layout

    directory = (Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()) / (
        f"toy-data-{TOY_VERSION}"
    )
    paths = {}
    for split, n in (("train", num_train), ("heldout", num_heldout)):
        path = directory / f"{split}-n{n}-seed{seed}-{layout_fingerprint()}.parquet"
        if not path.is_file():
            write_dapo_layout(path, n, seed=seed, split=split)
        paths[split] = str(path)
    return paths
