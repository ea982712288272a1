"""Decoding presets: the paper's two decodings and ``T:top_p`` specs. Plain Python, importable without torch."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A decoding setting: sampling temperature (0 = greedy) and nucleus top-p."""

    name: str
    temperature: float
    top_p: float

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"preset {self.name}: need temperature >= 0 and 0 < top_p <= 1, got {self}")

    @property
    def label(self) -> str:
        return f"T = {_decimal(self.temperature)}, top-p = {_decimal(self.top_p)}"


def _decimal(value: float) -> str:
    """1 -> "1.0", 0.95 -> "0.95": how the paper writes decoding settings."""
    return f"{value:.1f}" if float(value).is_integer() else f"{value:g}"


#: The paper's two decodings: training-aligned T=1.0 / top-p 1.0, and JustRL's default T=0.7 / top-p 0.9.
PRESETS: dict[str, Preset] = {
    "t1.0": Preset("t1.0", 1.0, 1.0),
    "t0.7": Preset("t0.7", 0.7, 0.9),
}

_PRESET_SPEC = re.compile(r"^t?(?P<t>\d+(?:\.\d*)?)(?:[:,/]p?(?P<p>\d*\.?\d+))?$")


def parse_preset(spec: str | Preset) -> Preset:
    """A `Preset`, a `PRESETS` name (``"t1.0"``), or ``"T:top_p"`` / ``"tT"`` (``"0.6:0.95"``, ``"t0.6"``)."""
    if isinstance(spec, Preset):
        return spec
    if spec in PRESETS:
        return PRESETS[spec]
    match = _PRESET_SPEC.match(spec.strip())
    if match is None:
        raise ValueError(
            f"unknown decoding preset {spec!r}: use one of {sorted(PRESETS)} or 'T:top_p' (e.g. 0.6:0.95)"
        )
    temperature = float(match["t"])
    top_p = float(match["p"]) if match["p"] else 1.0
    return Preset(
        f"t{temperature:g}" + ("" if top_p == 1.0 else f"-p{top_p:g}"),
        temperature,
        top_p,
    )
