"""stapo-trl: STAPO (Spurious-Token-Aware Policy Optimization) on top of Hugging Face TRL."""

from .config import STAPOConfig
from .s2t import spurious_token_mask
from .trainer import STAPOTrainer

__version__ = "0.1.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "spurious_token_mask", "math_reward"]


def __getattr__(name):
    # math_reward pulls in math-verify (sympy): loaded on first use only.
    if name == "math_reward":
        from .rewards import math_reward

        return math_reward
    raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
