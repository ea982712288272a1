"""stapo_trl.math.verifier, the program of the verifier processes: its rewriting of answers before math-verify parses
them (judging itself is tested through math_reward, in test_math_reward.py)."""

import pytest

from stapo_trl.math.verifier import read_e_notation


@pytest.mark.parametrize(
    "latex, expected",
    [
        ("4.5e33", r"(4.5 \times 10^{33})"),
        ("1e-8", r"(1 \times 10^{-8})"),
        ("6.02E+23", r"(6.02 \times 10^{23})"),
        (r"\frac{2}{1e3}", r"\frac{2}{(1 \times 10^{3})}"),
        ("1e5, 2.5e-3", r"(1 \times 10^{5}), (2.5 \times 10^{-3})"),
        ("2e", "2e"),
        ("x_1e2", "x_1e2"),
        (r"e^{2}", r"e^{2}"),
        ("1.5e", "1.5e"),
    ],
)
def test_read_e_notation(latex, expected):
    assert read_e_notation(latex) == expected
