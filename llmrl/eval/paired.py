"""A paired difference of two methods scored on the same items (functions, problems, episodes), with a two-level
bootstrap: the items, then each item's runs.

Why by hand: rliable's intervals resample runs within tasks (its stratified bootstrap) and treat two methods apart;
scipy's bootstrap draws one level. A comparison on shared items needs the pairing kept (an item's two methods drawn
together) and both levels drawn (which items, and which seeds on each).
"""

from __future__ import annotations

import numpy as np

__all__ = ["paired_hierarchical_bootstrap"]


def paired_hierarchical_bootstrap(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95, reps: int = 2000,
                                  seed: int = 0) -> dict:
    """The mean over items of (mean of ``a``'s runs - mean of ``b``'s runs) on each item, for ``a`` [runs_a, items]
    and ``b`` [runs_b, items] scored on the same items (functions, problems, episodes), with a two-level
    percentile bootstrap: items are drawn with replacement (the pairing: an item's two methods stay together),
    then each drawn item's runs of each method are drawn with replacement (seeds; a method with one run keeps it).

    Returns the difference, its interval, the items and runs, the items where ``a`` is higher (its mean), and the
    verdict ("higher": interval above 0, "lower": below, "no difference" otherwise).
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or x.shape[1] < 2 or min(x.shape[0], y.shape[0]) < 1:
        raise ValueError(f"paired_hierarchical_bootstrap: expected [runs, items] arrays on the same >= 2 items, got "
                         f"{x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("paired_hierarchical_bootstrap: scores must be finite")
    rng = np.random.default_rng(seed)
    n = x.shape[1]
    items = rng.integers(0, n, size=(reps, n))
    # per replicate and drawn item, the mean of runs drawn with replacement from that item's runs
    xr = x[rng.integers(0, x.shape[0], size=(reps, n, x.shape[0])), items[..., None]].mean(-1)
    yr = y[rng.integers(0, y.shape[0], size=(reps, n, y.shape[0])), items[..., None]].mean(-1)
    draws = (xr - yr).mean(-1)
    d = x.mean(0) - y.mean(0)
    lo, hi = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"difference": round(float(d.mean()), 4), "ci_low": round(float(lo), 4), "ci_high": round(float(hi), 4),
            "items": int(n), "runs": [int(x.shape[0]), int(y.shape[0])], "items_higher": int((d > 0).sum()),
            "items_lower": int((d < 0).sum()), "reps": int(reps),
            "verdict": "higher" if lo > 0 else "lower" if hi < 0 else "no difference"}
