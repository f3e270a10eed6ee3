"""Math word problems as a language environment (LLM_RL's stepwise GSM8K setting).

State: the problem and the solution lines written so far. Action: one line of text. The episode ends when a
line states the final answer ("The answer is: X"), when the policy ends its turn (an empty line), or after
``max_steps`` lines (truncated). Reward: 1 on the final step if the stated answer equals the gold answer.

Answers are extracted and compared by ``llmrl.data.math_answers``. Also here: the optional calculator that
rewrites ``<<48/2=24>>`` annotations with a whitelisted arithmetic evaluator. Model output is never run as
code: the original used ``eval``.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import gymnasium as gym
import numpy as np

from llmrl.data.math_answers import (  # noqa: F401  (re-exported: the env's answer rules)
    ANSWER_PHRASE,
    ANSWER_RE,
    answers_match,
    extract_answer,
    format_number,
    is_correct,
    last_boxed,
    normalize_answer,
)

# ------------------------------------------------------------------------------------------------ calculator


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


class MathEnv(gym.Env):
    """Stepwise solving of a fixed list of problems (dicts with ``problem`` and ``answer``).

    ``reset(seed=s)`` draws a problem with the seeded RNG; ``reset(options={"index": i})`` picks problem i.
    Observation: ``{"problem": str, "solution": str}`` where ``solution`` is the lines so far, each ending in
    a newline. ``step(line)`` keeps the text before the first newline, applies the calculator if enabled and
    appends it. ``info`` carries the appended line, the parsed answer and ``success``.
    """

    metadata = {"render_modes": []}

    def __init__(self, problems: Sequence[dict[str, Any]], max_steps: int = 10, calculator: bool = False,
                 calculator_calls: int = 4):
        if not problems:
            raise ValueError("MathEnv: problems is empty")
        for i, p in enumerate(problems):
            if "problem" not in p or "answer" not in p:
                raise ValueError(f"MathEnv: problems[{i}] needs 'problem' and 'answer' fields, has {sorted(p)}")
        if max_steps <= 0:
            raise ValueError(f"MathEnv: max_steps must be > 0, got {max_steps}")
        self.problems = list(problems)
        self.max_steps = max_steps
        self.calculator = calculator
        self.calculator_calls = calculator_calls
        self.observation_space = gym.spaces.Dict({"problem": gym.spaces.Text(100_000),
                                                  "solution": gym.spaces.Text(100_000)})
        self.action_space = gym.spaces.Text(10_000)
        self.index = 0
        self.lines: list[str] = []

    @property
    def current(self) -> dict[str, Any]:
        return self.problems[self.index]

    def _obs(self) -> dict[str, str]:
        return {"problem": self.current["problem"], "solution": "".join(line + "\n" for line in self.lines)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "index" in options:
            index = int(options["index"])
            if not 0 <= index < len(self.problems):
                raise IndexError(f"MathEnv.reset: index {index} outside [0, {len(self.problems)})")
            self.index = index
        else:
            self.index = int(self.np_random.integers(len(self.problems)))
        self.lines = []
        return self._obs(), {"id": self.current.get("id", self.index), "answer": self.current["answer"]}

    def step(self, action: str):
        line = action.split("\n", 1)[0].rstrip()
        calls = 0
        if self.calculator and line:
            line, calls = apply_calculator(line, self.calculator_calls)
        info: dict[str, Any] = {"line": line, "calculator_calls": calls, "parsed_answer": None, "success": False}
        if not line.strip():
            # An empty line means the policy ended its turn (end-of-turn token or a blank line).
            return self._obs(), 0.0, True, False, {**info, "end": "end_of_turn"}
        self.lines.append(line)
        if ANSWER_RE.search(line):
            parsed = extract_answer(line)
            success = answers_match(parsed, str(self.current["answer"]))
            info.update(parsed_answer=parsed, success=success, end="answer")
            return self._obs(), float(success), True, False, info
        truncated = len(self.lines) >= self.max_steps
        return self._obs(), 0.0, False, truncated, {**info, "end": "max_steps" if truncated else None}


def discounted_returns(n_steps: int, final_reward: float, gamma: float, clamp: tuple[float, float] = (0.0, 10.0)
                       ) -> np.ndarray:
    """Per-step returns of an episode rewarded only at its end: a line k steps before the end gets γ^k·R.

    Clamped to ``clamp`` as in LLM_RL.
    """
    k = np.arange(n_steps - 1, -1, -1, dtype=np.float64)
    return np.clip(final_reward * gamma ** k, *clamp)
