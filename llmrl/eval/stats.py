"""Confidence intervals for rates and means."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = ["wilson_interval", "mean_interval", "compare_intervals"]


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial rate; well-behaved at 0 and 1, unlike the normal approximation."""
    if n <= 0:
        raise ValueError(f"wilson_interval: n must be > 0, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes must be in [0, {n}], got {successes}")
    z = stats.norm.ppf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 or n successes the bound is exactly 0 or 1; floating point leaves ~1e-18 otherwise.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return float(lo), float(hi)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval for a mean; a single value (or no spread) gives a zero-width interval."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_interval: no values")
    m = float(x.mean())
    if x.size == 1 or float(x.std()) == 0.0:
        return m, m
    half = stats.t.ppf(0.5 + confidence / 2, df=x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return m - float(half), m + float(half)


def compare_intervals(a: dict, b: dict) -> str:
    """How result ``a`` stands against ``b``, each a dict with ``ci_low`` and ``ci_high``: "higher" or "lower"
    only when the intervals do not overlap, else "overlapping". A claim that one beats, lowers or helps the
    other is made only where this says so."""
    if a["ci_low"] > b["ci_high"]:
        return "higher"
    if a["ci_high"] < b["ci_low"]:
        return "lower"
    return "overlapping"
