"""The methods compared in the paper (§5.1, Fig. 8), as STAPOConfig values on top of the JustRL setting.

One `--method` switch of `examples/train_math.py` selects them, so every baseline runs from the same script and
code path. Values given explicitly (recipe or command line) win over these.
"""

METHODS: dict[str, dict] = {
    # STAPO: S2T silences low-probability, low-entropy tokens of positive-advantage completions (Eq. 6).
    "stapo": {"spurious_mask_mode": "low_entropy"},
    # JustRL: the same setting without S2T.
    "justrl": {"spurious_mask_mode": "none"},
    # JustRL-FullMask: every low-probability token of positive-advantage completions masked (Fig. 3).
    "justrl_fullmask": {"spurious_mask_mode": "all"},
    # Fig. 8 ablations: silence the high-entropy candidates instead, or a random fraction q of them.
    "high_entropy_mask": {"spurious_mask_mode": "high_entropy"},
    "random_mask": {"spurious_mask_mode": "random"},
    # 20-Entropy: update only the top 20% highest-entropy tokens (TRL's top_entropy_quantile).
    "20_entropy": {"spurious_mask_mode": "none", "top_entropy_quantile": 0.2},
    # GRPO as in DeepSeekMath: per-sequence mean, symmetric clip ε = 0.2, no dual-clip, KL β = 0.04 to the initial
    # policy.
    "grpo": {"spurious_mask_mode": "none", "loss_type": "grpo", "epsilon_high": 0.2, "delta": None, "beta": 0.04},
}


def method_config(name: str) -> dict:
    """The STAPOConfig values of method `name` (a copy)."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}; choose one of {sorted(METHODS)}.")
    return dict(METHODS[name])
