"""The model card of a STAPO run: TRL's card, plus the method, its S2T settings and the run's evaluation table.

`STAPOTrainer.create_model_card` (called at each checkpoint, by `push_to_hub` and at the end of the training
scripts) writes it to `<output_dir>/README.md`. A base model or dataset is linked to the Hub only when it is a Hub
id; a local or toy checkpoint is named as such, never as a broken link.
"""

import os
import re
from importlib.metadata import version
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .methods import METHODS


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SUMMARY_FILE = "summary.md"  # the Markdown table stapo_trl.evaluation writes into its output directory

TEMPLATE = Path(__file__).parent / "templates" / "model_card.md"  # Jinja, filled by `model_card`


def method_name(args) -> str:
    """The `--method` preset whose values `args` all have (the most specific one), else "custom"."""
    matching = [
        (len(values), name)
        for name, values in METHODS.items()
        if all(getattr(args, key, None) == value for key, value in values.items())
    ]
    return max(matching)[1] if matching else "custom"


def s2t_settings(args) -> list[tuple[str, str]]:
    """(setting, value) rows: the S2T mask's fields, then the loss fields the methods differ in."""
    rows = [
        ("spurious_mask_mode", args.spurious_mask_mode),
        ("τ_p (spurious_prob_threshold)", args.spurious_prob_threshold),
        ("q (spurious_entropy_quantile)", args.spurious_entropy_quantile),
    ]
    if hasattr(args, "spurious_mask_scope"):
        rows.append(("spurious_mask_scope", args.spurious_mask_scope))
    for name in ("loss_type", "epsilon", "epsilon_high", "delta", "beta", "top_entropy_quantile", "num_generations",
                 "temperature", "learning_rate"):  # fmt: skip
        rows.append((name, getattr(args, name)))
    return [(name, f"`{value}`") for name, value in rows]


def evaluation_tables(output_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """(relative path, Markdown) of each evaluation summary in `output_dir` or one folder below it."""
    folder = Path(output_dir)
    found = sorted([folder / SUMMARY_FILE, *folder.glob(f"*/{SUMMARY_FILE}")])
    return [(str(path.relative_to(folder)), path.read_text().strip()) for path in found if path.is_file()]


def local_model_name(path: str | os.PathLike) -> str:
    """A local base model as the card names it: the last two components of its path (`toy/checkpoint`,
    `run/checkpoint-500`), never the machine's absolute path, which would be pushed to the Hub with the card."""
    return "/".join(Path(path).parts[-2:])


def model_card(
    args,
    base_model: str | None,
    model_name: str,
    hub_model_id: str,  # where `pipeline` loads it from: the Hub id, or else the local output directory
    dataset_name: str | None,
    tags: list[str],
    trainer_name: str,
    paper: dict,
) -> ModelCard:
    """The card of a run with `args` (a STAPOConfig) from `base_model` (a Hub id or a local path)."""
    on_hub = bool(base_model) and bool(_HUB_ID.match(base_model)) and not os.path.isdir(base_model)
    card_data = ModelCardData(
        base_model=base_model if on_hub else None,
        datasets=dataset_name if dataset_name and _HUB_ID.match(dataset_name) else None,
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *tags],
    )
    versions = [(name, version(package)) for name, package in (
        ("stapo-trl", "stapo-trl"), ("TRL", "trl"), ("Transformers", "transformers"), ("Pytorch", "torch"),
        ("Datasets", "datasets"), ("Tokenizers", "tokenizers"))]  # fmt: skip
    return ModelCard.from_template(
        card_data,
        template_str=TEMPLATE.read_text(encoding="utf-8"),
        model_name=model_name,
        base_model=base_model if on_hub else None,
        local_base=local_model_name(base_model) if base_model and not on_hub else None,
        dataset_name=dataset_name,
        dataset_link=bool(dataset_name and _HUB_ID.match(dataset_name) and not os.path.exists(dataset_name)),
        hub_model_id=hub_model_id,
        trainer_name=trainer_name,
        paper_title=paper.get("title"),
        trainer_citation=paper.get("citation"),
        method=method_name(args),
        settings=s2t_settings(args),
        evaluation=evaluation_tables(args.output_dir),
        versions=versions,
    )
