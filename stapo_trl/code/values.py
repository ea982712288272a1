"""Return values across the sandbox's wall: JSON that keeps the Python types the harnesses compare by.

Each benchmark's own harness compares a function's return value as a Python object: EvalPlus tells a tuple from a
list and uses ``np.allclose`` on arrays, LiveCodeBench counts ``np.int64(5)`` as ``5``, PRIME fails a value that
``json.dumps`` cannot write. Plain JSON would blur all three, so `encode` (run inside the sandbox, standard library
only: `sandbox_harness.py` imports it) tags what JSON lacks and `decode` (in the trainer) rebuilds it:

- ``{"__tuple__": [...]}``, ``{"__set__": [...]}``, ``{"__frozenset__": [...]}``, ``{"__dict__": [[key, value], ...]}``
  (every dict, so non-string keys survive);
- ``{"__float__": "nan"}`` (or ``"inf"``, ``"-inf"``): strict JSON has no such numbers;
- ``{"__numpy__": [dtype, value]}`` for NumPy scalars, ``{"__ndarray__": [dtype, nested list]}`` for arrays;
- ``{"__repr__": "..."}`` for anything else (a custom object): decoded as an `Opaque` value, equal to nothing, so
  an object whose ``__eq__`` always says yes earns nothing here.
"""

from __future__ import annotations

import math
from typing import Any


_PLAIN = (str, bool, int, type(None))


def encode(value: Any) -> Any:
    """`value` as JSON-ready data (see the module docstring); raises ``RecursionError`` on a cycle or deep nesting."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if kind is list:
        return [encode(item) for item in value]
    if kind is tuple:
        return {"__tuple__": [encode(item) for item in value]}
    if kind in (set, frozenset):
        items = sorted((encode(item) for item in value), key=repr)  # a stable order; sets compare unordered anyway
        return {"__set__" if kind is set else "__frozenset__": items}
    if kind is dict:
        return {"__dict__": [[encode(key), encode(item)] for key, item in value.items()]}
    module = getattr(kind, "__module__", "")
    if module == "numpy" and hasattr(value, "dtype"):
        if hasattr(value, "shape") and value.shape != ():
            return {"__ndarray__": [str(value.dtype), encode(value.tolist())]}
        return {"__numpy__": [str(value.dtype), encode(value.item())]}
    return {"__repr__": repr(value)[:1000]}


def decode(data: Any) -> Any:
    """The Python value `encode` wrote; NumPy types need NumPy here (the trainer has it)."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        return {key: decode(item) for key, item in data.items()}  # plain JSON from an executor that does not tag
    ((tag, content),) = data.items()
    if tag == "__tuple__":
        return tuple(decode(item) for item in content)
    if tag in ("__set__", "__frozenset__"):
        items = [decode(item) for item in content]
        try:
            return set(items) if tag == "__set__" else frozenset(items)
        except TypeError:
            return Opaque(repr(items))
    if tag == "__dict__":
        try:
            return {decode(key): decode(item) for key, item in content}
        except TypeError:
            return Opaque(repr(content))
    if tag == "__float__":
        return float(content)
    if tag in ("__numpy__", "__ndarray__"):
        import numpy as np

        dtype, value = content
        return np.array(decode(value), dtype=dtype) if tag == "__ndarray__" else np.dtype(dtype).type(decode(value))
    if tag == "__repr__":
        return Opaque(content)
    return {tag: decode(content)}


class Opaque:
    """A return value that cannot cross the sandbox's wall (a custom object): known by its ``repr`` only."""

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other):
        return False

    def __hash__(self):
        return hash(self.text)

    def __repr__(self):
        return self.text
