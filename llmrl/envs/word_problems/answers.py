"""Final answers of math solutions: extraction and normalisation, shared by data loaders, environment and evaluation.

Handles GSM8K's ``#### 72``, MATH's ``\\boxed{}``, "The answer is: X", thousands commas, units and currency,
trailing periods, fractions (``3/4``, ``\\frac{3}{4}``, mixed ``1 1/2``), negative numbers and light LaTeX.
Numbers compare to a relative 1e-6; anything else compares as whitespace-free lower-case text.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["ANSWER_PHRASE", "ANSWER_RE", "format_number", "last_boxed", "through_first_answer", "extract_answer",
           "normalize_answer", "answers_match", "is_correct"]

ANSWER_PHRASE = "The answer is:"
ANSWER_RE = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?", re.IGNORECASE)


def format_number(value: Fraction | float) -> str:
    """Integers without a decimal point, other values with up to 6 decimals and no trailing zeros."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    f = float(value)
    if math.isfinite(f) and f == int(f):
        return str(int(f))
    return f"{f:.6f}".rstrip("0").rstrip(".")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        rest = text[start:].split(None, 1)  # "\boxed 5"
        return rest[1].split("$")[0].strip() if len(rest) > 1 else None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1: i]
    return None


def through_first_answer(text: str) -> str | None:
    """``text`` through the end of its first line that states an answer ("The answer is ..."), or None if no line
    does. The rule that ends a ``MathEnv`` episode: every variant is trained and evaluated on the answer it
    states first, not on whatever it writes after it."""
    m = ANSWER_RE.search(text)
    if m is None:
        return None
    end = text.find("\n", m.end())
    return text if end < 0 else text[:end + 1]


def extract_answer(text: str) -> str | None:
    """The final answer a solution states, or None if it states none.

    Looked for, in order: the last "The answer is: X" (rest of that line), GSM8K's "#### X", the last
    ``\\boxed{X}``.
    """
    matches = list(ANSWER_RE.finditer(text))
    if matches:
        rest = text[matches[-1].end():].strip().split("\n", 1)[0].strip()
        boxed = last_boxed(rest)
        return boxed if boxed is not None else (rest or None)
    if "####" in text:
        rest = text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
        return rest or None
    return last_boxed(text)


_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_LEADING_NUMBER_RE = re.compile(rf"^(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}|\\[dt]?frac\s*(\d)\s*(\d)")


def _strip_latex(s: str) -> str:
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "").replace("\\ ", "")
    s = s.replace("\\%", "%").replace("\\$", "$").replace("^\\circ", "").replace("^{\\circ}", "")
    s = re.sub(r"\\text\{\s*[a-zA-Z ]*\}", "", s)  # units: \text{ cm}
    s = re.sub(r"\\(?:text|mathrm|mathbf)\{([^{}]*)\}", r"\1", s)
    s = _LATEX_FRAC_RE.sub(lambda m: f"({m.group(1) or m.group(3)})/({m.group(2) or m.group(4)})", s)
    s = s.replace("\\cdot", "*").replace("\\times", "*")
    return s


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer: a plain number where there is one, else compact LaTeX-light text.

    "$1,234.50 dollars." -> "1234.5"; "3/4" and "\\frac{3}{4}" -> "0.75"; "−7" -> "-7"; "x = 5" -> "5";
    "\\boxed{(1, 2)}" -> "(1,2)".
    """
    s = answer.strip().removeprefix("####").strip()
    boxed = last_boxed(s)
    if boxed is not None:
        s = boxed
    s = _strip_latex(s).replace("−", "-").replace("–", "-")
    s = s.strip().strip("$").strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5"
    s = s.rstrip(".").strip()
    num = _as_number(s)
    if num is not None:
        return format_number(num)
    return re.sub(r"\s+", "", s).rstrip(".").lower()


def _as_number(s: str) -> Fraction | None:
    """The number an answer starts with (units and trailing words ignored), or None."""
    t = s.replace("$", "").replace("£", "").replace("€", "").strip()
    t = re.sub(r"(?<=\d),(?=\d{3}(?:\D|$))", "", t)
    t = re.sub(r"^\((.*)\)$", r"\1", t) if re.fullmatch(r"\(\s*-?[\d./ ]+\)", t) else t
    mixed = re.match(r"^(-?\d+)\s+(\d+)\s*/\s*(\d+)\b", t)  # "1 1/2"
    if mixed:
        whole, num, den = (int(g) for g in mixed.groups())
        if den == 0:
            return None
        return Fraction(whole) + (Fraction(num, den) if whole >= 0 else -Fraction(num, den))
    frac = re.match(r"^\((-?[\d.]+)\)\s*/\s*\((-?[\d.]+)\)", t)  # "(3)/(4)" from \frac
    m = frac or _LEADING_NUMBER_RE.match(t)
    if not m:
        return None
    rest = t[m.end():]
    # A unit or word after a space ("3 bolts", "5 %") keeps the number; "2x", "5 + 3", "1, 2" are not numbers.
    if rest.strip() and not (rest.strip()[0] == "%" or (rest[0].isspace() and rest.strip()[0].isalpha())):
        return None
    if frac:
        num, den = Fraction(frac.group(1)), Fraction(frac.group(2))
    else:
        parts = m.group(0).split("/")
        num = Fraction(parts[0].strip())
        den = Fraction(parts[1].strip()) if len(parts) > 1 else Fraction(1)
    if den == 0:
        return None
    return num / den


def answers_match(predicted: str | None, gold: str) -> bool:
    """True if ``predicted`` states the same answer as ``gold`` after normalisation (numbers to 1e-6)."""
    if predicted is None:
        return False
    p, g = normalize_answer(predicted), normalize_answer(gold)
    if p == g:
        return True
    try:
        pf, gf = float(p), float(g)
    except ValueError:
        return False
    return math.isclose(pf, gf, rel_tol=1e-6, abs_tol=1e-9)


def is_correct(solution: str, gold: str) -> bool:
    """Whether a whole solution's final answer equals ``gold``."""
    return answers_match(extract_answer(solution), gold)
