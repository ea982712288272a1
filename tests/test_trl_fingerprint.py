"""The private TRL surface STAPOTrainer relies on, in one place: notice when a TRL release changes any of it.

STAPOTrainer copies `GRPOTrainer._compute_loss` with the S2T mask inserted, wraps three more private methods and
reads private attributes of the parent. Each is listed in `SURFACE` with what depends on it; TRL's methods are
fingerprinted (their syntax tree, blind to comments and formatting), transformers' (a version range) are checked by
signature, attributes by presence. The list itself is checked against what stapo_trl/trainer.py uses, so that a new
dependency cannot be added without entering it here.
"""

import ast
import hashlib
import inspect
import textwrap
from pathlib import Path

import trl
from transformers import Trainer
from trl import GRPOTrainer


TRAINER_SOURCE = Path(__file__).resolve().parents[1] / "stapo_trl" / "trainer.py"

# The syntax-tree fingerprints (`source_fingerprint`) of the GRPOTrainer methods in trl 1.16.0.
FINGERPRINTS = {
    "_compute_loss": "a0773aa2fda0f039bb971e47960d38b0f17ff46801f71043e1a7f8c000e7205f",
    "_prepare_inputs": "5af3fd0e05863c70e82ae4748a17f6668e98488a58612af3cc4ae227e7683752",
    "_generate_and_score_completions": "eb8ae2f174e2d6912de6bc431da6c3330ea7074bd5bdae9a0cf24d9e4c93a75a",
    "_get_per_token_logps_and_entropies": "2e6159c321ddcea5dd5b250f6dc982e29ea3b96ac175ae749547cf48e5f891ea",
    "get_high_entropy_mask": "b25108dca83f1f0aaafb3ef06167772b7c5a09bd70c90e82f8d065ab3dac21e0",
    "get_off_policy_mask": "021bd342723817ba6cd040e488df20cdeb3780fc31c0f760fd0a7ca37141d6c0",
}
# transformers.Trainer methods (transformers is a version range, so their signatures, not their code).
SIGNATURES = {
    "_save_checkpoint": ["self", "model", "trial"],
    "_get_output_dir": ["self", "trial"],
}
# What STAPOTrainer does with each name: what to re-check when it changes.
SURFACE = {
    "_compute_loss": "copied into STAPOTrainer._compute_loss with the lines marked '--- S2T' inserted: port every "
    "change of the parent (loss types, masks, keys of `inputs`, normalizers, metrics) into the copy",
    "_prepare_inputs": "wrapped: returns one micro-batch of the buffered generation per call, indexed by _step modulo "
    "gradient_accumulation_steps; STAPO decides the whole optimizer step at its first micro-batch",
    "_generate_and_score_completions": "wrapped: the old-log-prob forward it runs is captured (with entropies) and "
    "matched by identity with output['old_per_token_logps']",
    "_get_per_token_logps_and_entropies": "wrapped and called: (model, input_ids, attention_mask, logits_to_keep, "
    "batch_size, compute_entropy, **model inputs) -> (logps, entropies, aux_loss)",
    "get_high_entropy_mask": "called by the _compute_loss copy with the parent's arguments",
    "get_off_policy_mask": "called by the _compute_loss copy with the parent's arguments",
    "_save_checkpoint": "wrapped (transformers.Trainer): a failed save removes its partial checkpoint-N folder",
    "_get_output_dir": "called (transformers.Trainer) for the folder of checkpoint-N",
    "_metrics": "the S2T metrics are appended to self._metrics[mode][key], which TRL averages and logs",
    "_step": "TRL's micro-batch counter: _step % gradient_accumulation_steps == 0 starts an optimizer step",
    "_buffered_inputs": "TRL's buffer of a generation batch's micro-batches, read ahead to decide a step",
    "_tag_names": "class attribute overridden: the model card's and Hub tags",
    "_name": "class attribute overridden: the trainer's name in the model card",
    "_paper": "class attribute overridden: the paper title and citation in the model card",
}


def source_fingerprint(source: str) -> str:
    """sha256 of the syntax tree of `source`: blind to comments, docstrings and formatting, not to code."""
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()


def private_names_used_by_the_trainer() -> set[str]:
    """`_name`s that stapo_trl/trainer.py reads on `self` or `super()` or defines in a class body, which the parent
    classes also have: the private surface of GRPOTrainer and Trainer it depends on."""
    tree = ast.parse(TRAINER_SOURCE.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id == "self")
            or (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super")
        ):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.FunctionDef):
                    names.add(statement.name)
                elif isinstance(statement, ast.Assign):
                    names.update(target.id for target in statement.targets if isinstance(target, ast.Name))
    parent_source = inspect.getsource(GRPOTrainer) + inspect.getsource(Trainer)
    return {
        name
        for name in names
        if name.startswith("_")
        and not name.startswith("__")
        and (hasattr(GRPOTrainer, name) or f"self.{name} =" in parent_source)
    }


def test_fingerprint_ignores_formatting_but_not_code():
    original = 'def f(x):\n    """Add one."""\n    return x + 1  # a comment\n'
    reformatted = "def f(x):\n    return (\n        x\n        + 1\n    )\n"
    changed = "def f(x):\n    return x + 2\n"
    assert source_fingerprint(original) == source_fingerprint(reformatted) != source_fingerprint(changed)


def test_every_private_name_the_trainer_uses_is_listed():
    used = private_names_used_by_the_trainer()
    listed = {name for name in SURFACE if name.startswith("_")}
    assert used == listed, (
        f"stapo_trl/trainer.py relies on private names of GRPOTrainer/Trainer not listed in SURFACE here: "
        f"{sorted(used - listed)}; listed but no longer used: {sorted(listed - used)}. Add (or remove) each with what "
        "depends on it, and its fingerprint or signature."
    )


def test_the_private_trl_surface_is_the_one_stapo_was_written_against():
    changed = {}
    for name, expected in FINGERPRINTS.items():
        method = getattr(GRPOTrainer, name, None)
        found = source_fingerprint(inspect.getsource(method)) if method is not None else "missing"
        if found != expected:
            changed[name] = found
    for name, parameters in SIGNATURES.items():
        method = getattr(Trainer, name, None)
        found = list(inspect.signature(method).parameters) if method is not None else "missing"
        if found != parameters:
            changed[name] = found
    source = inspect.getsource(GRPOTrainer)
    for name in ("_metrics", "_step", "_buffered_inputs"):
        if f"self.{name}" not in source:
            changed[name] = "no longer in GRPOTrainer"
    for name in ("_tag_names", "_name", "_paper"):
        if not hasattr(GRPOTrainer, name):
            changed[name] = "no longer a GRPOTrainer class attribute"
    assert not changed, (
        f"trl {trl.__version__} changed the private surface STAPOTrainer (stapo_trl/trainer.py) was written against "
        "(trl 1.16.0). Re-check each of these:\n"
        + "\n".join(f"- {name}: {SURFACE[name]} (now: {found})" for name, found in changed.items())
        + "\nThen run tests/test_trainer.py (parity with GRPOTrainer when nothing is silenced, and Eq. 6) and the "
        "distributed tests, widen the trl pin in pyproject.toml, and update FINGERPRINTS / SIGNATURES here."
    )
