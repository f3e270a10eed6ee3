"""The calculator of LLM_RL's math setting: ``<<48/2=24>>`` annotations are re-computed by a whitelisted
arithmetic evaluator. Model output is never run as code (the original used ``eval``), and no expression makes it
raise anything but ``CalculatorError`` (property-tested in tests/test_calculator_properties.py).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from fractions import Fraction

from llmrl.envs.word_problems.answers import format_number

__all__ = ["CalculatorError", "safe_eval", "apply_calculator"]

class CalculatorError(ValueError):
    """An expression the calculator refuses: anything but numbers, + - * / // % ** and parentheses."""


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64
_MAX_LENGTH = 200
_MAX_BITS = 1024  # values beyond 2**1024 are refused, so nested powers cannot exhaust memory or time


def _finite(value: float) -> float:
    if isinstance(value, complex) or not math.isfinite(value):
        raise CalculatorError(f"result out of range: {value!r}")
    return value


def _bits(value: Fraction | float) -> int:
    if isinstance(value, Fraction):
        return max(abs(value.numerator).bit_length(), value.denominator.bit_length())
    return 0 if not math.isfinite(value) or value == 0 else max(int(math.log2(abs(value))) + 1, 0)


def safe_eval(expression: str) -> Fraction | float:
    """Value of an arithmetic expression, computed exactly with fractions where possible.

    Only number literals, the operators + - * / // % ** (exponent at most 64 in magnitude), unary +/- and
    parentheses are accepted; names, calls, attributes, strings, comparisons, anything else raise
    ``CalculatorError``, and so do complex, infinite and oversized results: no other exception escapes
    (property-tested with hypothesis). ``x`` and ``×`` count as multiplication, ``÷`` as division, ``1,000`` as 1000.
    """
    if len(expression) > _MAX_LENGTH:
        raise CalculatorError(f"expression longer than {_MAX_LENGTH} characters")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-").replace("$", "")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"(?<=[\d)\s])x(?=[\d(\s])", "*", text)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as err:  # ValueError: a NUL byte in the text
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from err

    def ev(node: ast.AST) -> Fraction | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise CalculatorError(f"number out of range in {expression!r}")
            value = Fraction(node.value) if isinstance(node.value, int) else Fraction(str(node.value))
            if _bits(value) > _MAX_BITS:
                raise CalculatorError(f"number out of range in {expression!r}")
            return value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                size = abs(right) * max(_bits(left), 1)
                if abs(right) > _MAX_EXPONENT or size > _MAX_BITS:
                    raise CalculatorError(f"power too large in {expression!r}")
                if isinstance(right, Fraction) and right.denominator != 1:
                    # A fractional power of a negative number is complex ((-8)**(1/3)): not arithmetic here.
                    if left < 0:
                        raise CalculatorError(f"fractional power of a negative number in {expression!r}")
                    if left == 0 and right < 0:
                        raise CalculatorError(f"division by zero in {expression!r}")
                    return _finite(float(left) ** float(right))
                if left == 0 and right < 0:
                    raise CalculatorError(f"division by zero in {expression!r}")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise CalculatorError(f"division by zero in {expression!r}")
            try:
                value = _BINOPS[type(node.op)](left, right)
            except (OverflowError, ZeroDivisionError) as err:  # float operands: 1e300 ** 2.0, 1.5 % 0.0
                raise CalculatorError(f"{err} in {expression!r}") from None
            if isinstance(value, int):  # Fraction // Fraction gives an int
                value = Fraction(value)
            elif isinstance(value, float):
                value = _finite(value)
            if _bits(value) > _MAX_BITS:
                raise CalculatorError(f"intermediate value too large in {expression!r}")
            return value
        raise CalculatorError(f"{type(node).__name__} not allowed in {expression!r}")

    value = ev(tree)
    if isinstance(value, complex):
        raise CalculatorError(f"complex result in {expression!r}")
    return value


_ANNOTATION_RE = re.compile(r"<<([^<>=]+)(?:=([^<>]*))?>>(\s*)(-?\$?[\d,]*\.?\d+)?")


def apply_calculator(line: str, max_calls: int = 4) -> tuple[str, int]:
    """Recompute up to ``max_calls`` ``<<expr=result>>`` annotations in ``line``.

    Each annotation's result, and the number written right after it (GSM8K writes ``<<48/2=24>>24``), are
    replaced by the calculator's value. Expressions the calculator refuses are left as written. Returns the
    new line and the number of annotations recomputed.
    """
    calls = 0

    def fix(m: re.Match) -> str:
        nonlocal calls
        if calls >= max_calls:
            return m.group(0)
        try:
            value = format_number(safe_eval(m.group(1)))
        except CalculatorError:
            return m.group(0)
        calls += 1
        after = f"{m.group(3)}{value}" if m.group(4) is not None else m.group(3)
        return f"<<{m.group(1)}={value}>>{after}"

    return _ANNOTATION_RE.sub(fix, line), calls


# ----------------------------------------------------------------------------------------------- environment


