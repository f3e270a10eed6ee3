"""The calculator never raises anything but CalculatorError, on any text (property-based, hypothesis)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrl.envs.word_problems import CalculatorError, MathEnv, apply_calculator, safe_eval

numbers = st.one_of(st.integers(-10**6, 10**6).map(str),
                    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
                    st.sampled_from(["1e309", "0.0", "1,000", "1e-320", "(1/3)", "(-8)", "0"]))
ops = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", " x ", "×", "÷"])


@st.composite
def expressions(draw, depth=3):
    if depth == 0 or draw(st.booleans()):
        return draw(numbers)
    left, right = draw(expressions(depth=depth - 1)), draw(expressions(depth=depth - 1))
    expr = f"{left}{draw(ops)}{right}"
    return f"({expr})" if draw(st.booleans()) else ("-" + expr if draw(st.booleans()) else expr)


def _check(expr: str) -> None:
    try:
        value = safe_eval(expr)
    except CalculatorError:
        return
    assert isinstance(value, (Fraction, float))
    if isinstance(value, float):
        assert value == value and abs(value) != float("inf")


@settings(max_examples=400, deadline=None)
@given(expressions())
def test_arithmetic_expressions_never_raise_other_errors(expr):
    _check(expr)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/%().,x×÷ e\x00abc", max_size=60))
def test_arbitrary_text_never_raises_other_errors(text):
    _check(text)
    line, calls = apply_calculator(f"so <<{text}={text}>>{text}")
    assert isinstance(line, str) and 0 <= calls <= 1


@pytest.mark.parametrize("expr", ["(-8)**(1/3)+1", "0**-1", "1e309*1", "1e300**2.0", "1.5%0.0", "2**(1/2)**1e5"])
def test_known_crashers_raise_calculator_error(expr):
    with pytest.raises(CalculatorError):
        safe_eval(expr)


def test_env_step_with_calculator_survives_complex_power():
    env = MathEnv([{"problem": "p", "answer": "1"}], calculator=True)
    env.reset(seed=0)
    _, _, _, _, info = env.step("x = <<(-8)**(1/3)+1=1>>1")
    assert "line" in info
