"""STAPOTrainer._compute_loss copies TRL's GRPOTrainer._compute_loss with the S2T mask inserted: notice when TRL's changes."""

import ast
import hashlib
import inspect
import textwrap

import trl
from trl import GRPOTrainer


# The fingerprint (below) of GRPOTrainer._compute_loss in trl 1.16.0, the method stapo_trl/trainer.py's override copies.
EXPECTED_COMPUTE_LOSS_FINGERPRINT = "a0773aa2fda0f039bb971e47960d38b0f17ff46801f71043e1a7f8c000e7205f"


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


def test_fingerprint_ignores_formatting_but_not_code():
    original = 'def f(x):\n    """Add one."""\n    return x + 1  # a comment\n'
    reformatted = "def f(x):\n    return (\n        x\n        + 1\n    )\n"
    changed = "def f(x):\n    return x + 2\n"
    assert source_fingerprint(original) == source_fingerprint(reformatted) != source_fingerprint(changed)


def test_grpo_compute_loss_is_the_one_the_override_copies():
    fingerprint = source_fingerprint(inspect.getsource(GRPOTrainer._compute_loss))
    assert fingerprint == EXPECTED_COMPUTE_LOSS_FINGERPRINT, (
        f"GRPOTrainer._compute_loss in the installed trl {trl.__version__} is not the trl 1.16.0 method that "
        "STAPOTrainer._compute_loss (stapo_trl/trainer.py) copies with the S2T mask inserted. Compare the two line by "
        "line and port every change of the parent into the override (loss types, masks, keys of `inputs`, "
        "normalizers, metrics), keeping the lines marked '--- S2T'; check what the override calls on the parent "
        "(_get_per_token_logps_and_entropies, get_high_entropy_mask, get_off_policy_mask) still has the same "
        "signature; run tests/test_trainer.py (parity with GRPOTrainer when nothing is silenced, and Eq. 6); then "
        f"widen the trl pin in pyproject.toml and set EXPECTED_COMPUTE_LOSS_FINGERPRINT here to {fingerprint}."
    )
