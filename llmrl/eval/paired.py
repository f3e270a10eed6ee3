"""Intervals for scores of runs (training seeds, repetitions) on shared items (functions, problems, episodes'
starts): a method's mean, and the paired difference of two methods scored on the same items.

Runs and items are crossed factors: every run answers every item, so a run's effect (a better seed) is shared by
all items and an item's difficulty by all runs. The bootstrap draws both at once (Owen's pigeonhole bootstrap,
*The pigeonhole bootstrap*, Ann. Appl. Stat. 2007): one draw of items with replacement and, per method, one draw of
its runs with replacement, every drawn run scored on every drawn item. Drawing runs apart within each item (nested)
would average a seed's effect away over the items and give intervals too narrow for three seeds; pooling every
answer as independent (runs × items) drops both factors. Pigeonhole intervals are slightly conservative.

Why by hand: rliable's stratified bootstrap resamples runs within tasks and treats two methods apart, and scipy's
bootstrap draws one factor; neither keeps the pairing and both factors.
"""

from __future__ import annotations

import numpy as np

__all__ = ["paired_bootstrap", "mean_bootstrap"]


def _check(name: str, *arrays: np.ndarray) -> list[np.ndarray]:
    xs = [np.asarray(a, dtype=np.float64) for a in arrays]
    if any(x.ndim != 2 or x.shape[1] != xs[0].shape[1] or x.shape[0] < 1 for x in xs) or xs[0].shape[1] < 2:
        raise ValueError(f"{name}: expected [runs, items] arrays on the same >= 2 items, got "
                         f"{' and '.join(str(x.shape) for x in xs)}")
    if not all(np.isfinite(x).all() for x in xs):
        raise ValueError(f"{name}: scores must be finite")
    return xs


def _means(x: np.ndarray, items: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per replicate, the mean of ``x`` over one draw of its runs (shared by every item) and the drawn items."""
    reps = items.shape[0]
    runs = rng.integers(0, x.shape[0], size=(reps, x.shape[0]))
    per_run_item = x[runs[:, :, None], items[:, None, :]]  # [reps, runs, items]
    return per_run_item.mean(axis=(1, 2))


def _interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2])
    return round(float(lo), 4), round(float(hi), 4)


def mean_bootstrap(a: np.ndarray, *, confidence: float = 0.95, reps: int = 2000, seed: int = 0) -> dict:
    """The mean of ``a`` [runs, items] with a pigeonhole percentile interval (runs and items drawn as crossed
    factors). One run: the interval is over items alone, and ``runs: 1`` says so."""
    (x,) = _check("mean_bootstrap", a)
    rng = np.random.default_rng(seed)
    items = rng.integers(0, x.shape[1], size=(reps, x.shape[1]))
    lo, hi = _interval(_means(x, items, rng), confidence)
    return {"mean": round(float(x.mean()), 4), "ci_low": lo, "ci_high": hi, "items": int(x.shape[1]),
            "runs": int(x.shape[0]), "reps": int(reps)}


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95, reps: int = 2000,
                     seed: int = 0) -> dict:
    """The mean over items of (``a``'s mean over runs - ``b``'s) for ``a`` [runs_a, items] and ``b`` [runs_b,
    items] scored on the same items, with a pigeonhole percentile interval: each replicate draws the items once for
    both methods (the pairing) and each method's runs once, shared by every item (a method with one run keeps it).

    Returns the difference, its interval, the items and runs, the items where ``a`` is higher and lower (its mean),
    and the verdict ("higher": interval above 0, "lower": below, "no difference" otherwise).
    """
    x, y = _check("paired_bootstrap", a, b)
    rng = np.random.default_rng(seed)
    n = x.shape[1]
    items = rng.integers(0, n, size=(reps, n))
    draws = _means(x, items, rng) - _means(y, items, rng)
    lo, hi = _interval(draws, confidence)
    d = x.mean(0) - y.mean(0)
    return {"difference": round(float(d.mean()), 4), "ci_low": lo, "ci_high": hi, "items": int(n),
            "runs": [int(x.shape[0]), int(y.shape[0])], "items_higher": int((d > 0).sum()),
            "items_lower": int((d < 0).sum()), "reps": int(reps),
            "verdict": "higher" if lo > 0 else "lower" if hi < 0 else "no difference"}
