"""stapo-trl: STAPO (Spurious-Token-Aware Policy Optimization) on top of Hugging Face TRL."""

__version__ = "0.1.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "spurious_token_mask", "math_reward", "code_reward"]

# Loaded on first use, so that light tools (the report command, the data loaders) do not import torch and TRL.
_EXPORTS = {
    "STAPOConfig": ".config",
    "STAPOTrainer": ".trainer",
    "spurious_token_mask": ".s2t",
    "math_reward": ".math.reward",
    "code_reward": ".code.reward",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
