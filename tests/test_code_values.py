"""stapo_trl.code.values: return values keep their Python types through encode, JSON text and decode."""

import json
import math

import numpy as np
import pytest

from stapo_trl.code.values import Opaque, decode, encode


def round_trip(value):
    return decode(json.loads(json.dumps(encode(value), allow_nan=False)))


@pytest.mark.parametrize(
    "value",
    [
        (1, "a", None, True),
        [(1, 2), [3, (4,)]],
        {1: "x", "1": "y", (2, 3): [4.5]},
        {frozenset({1, 2}), (3, 4)},
        frozenset(),
        float("inf"),
        [float("-inf"), 0.1 + 0.2],
    ],
)
def test_python_values_come_back_equal_and_of_the_same_type(value):
    result = round_trip(value)
    assert result == value and type(result) is type(value)


def test_nan_numpy_and_custom_objects():
    assert math.isnan(round_trip(float("nan")))
    scalar, array = round_trip(np.int64(5)), round_trip(np.array([[1.5, 2.0]], dtype=np.float32))
    assert type(scalar) is np.int64 and scalar == 5
    assert array.dtype == np.float32 and array.tolist() == [[1.5, 2.0]]

    class Anything:
        def __eq__(self, other):
            return True

    opaque = round_trip(Anything())
    assert isinstance(opaque, Opaque) and opaque != opaque and opaque != 3 and "Anything" in repr(opaque)


def test_plain_json_from_another_executor_stays_as_it_is():
    assert decode({"a": [1, {"b": 2}], "c": None}) == {"a": [1, {"b": 2}], "c": None}
    assert decode({"a": 1}) == {"a": 1}
