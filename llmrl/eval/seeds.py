"""Results aggregated over seeds as the unit, with intervals that include between-seed variance.

A training seed is one draw of the whole experiment: its evaluation episodes are correlated (one policy
plays all of them), so pooling 3 seeds × 100 episodes as 300 independent episodes understates the
uncertainty. ``aggregate_seeds`` takes each seed's per-episode scores and estimates the interval with a
two-level (hierarchical) bootstrap: seeds are resampled with replacement, then episodes within each drawn
seed, and the statistic is taken over the resampled per-seed means. The interval therefore widens with the
spread between seeds and with the episode noise inside each seed.

Statistics: ``mean`` of the per-seed means, or ``iqm`` (interquartile mean, the 25 % trimmed mean of the
per-seed means, as recommended by Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice").

Written here rather than taken from ``rliable``: rliable 1.2.0 needs ``arch<8``, whose 7.x releases fail to
import beside pandas 3, and rliable's stratified bootstrap treats each run's score as fixed (it resamples runs,
not the episodes within a run), which at 3–5 seeds hides most of the evaluation noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

__all__ = ["Statistic", "SeedAggregate", "aggregate_seeds"]

Statistic = Literal["mean", "iqm"]


def _statistic(seed_means: np.ndarray, statistic: Statistic) -> np.ndarray:
    """The statistic over the last axis (seeds)."""
    if statistic == "mean":
        return seed_means.mean(axis=-1)
    return stats.trim_mean(seed_means, 0.25, axis=-1)


@dataclass(frozen=True)
class SeedAggregate:
    """A statistic over seeds with its bootstrap interval; ``summary()`` is the metrics-file entry."""

    value: float
    ci_low: float
    ci_high: float
    per_seed: tuple[float, ...]
    episodes: tuple[int, ...]
    statistic: Statistic
    confidence: float

    @property
    def n_seeds(self) -> int:
        return len(self.per_seed)

    def summary(self, digits: int = 4) -> dict:
        r = lambda x: round(float(x), digits)  # noqa: E731
        return {"value": r(self.value), "ci_low": r(self.ci_low), "ci_high": r(self.ci_high),
                "per_seed": [r(x) for x in self.per_seed], "n_seeds": self.n_seeds,
                "episodes": int(sum(self.episodes))}


def aggregate_seeds(
    per_seed_scores: Sequence[Sequence[float]],
    *,
    statistic: Statistic = "mean",
    confidence: float = 0.95,
    reps: int = 2000,
    rng_seed: int = 0,
    rate: bool = False,
) -> SeedAggregate:
    """Aggregate per-episode scores of several seeds: ``per_seed_scores[i]`` holds seed i's episode scores.

    Returns the statistic over the per-seed means and a percentile interval from ``reps`` hierarchical
    bootstrap resamples (deterministic for a given ``rng_seed``). One seed gives an episode-only interval;
    its ``n_seeds`` of 1 says so.

    ``rate=True`` (scores are 0/1 outcomes): the interval is widened to contain the Wilson interval of the
    pooled episodes. A bootstrap cannot see uncertainty where every episode has the same outcome (0 of 300
    resamples to 0 every time), while 0 of 300 still allows a true rate of about 1 %.
    """
    if statistic not in ("mean", "iqm"):
        raise ValueError(f"aggregate_seeds: statistic must be 'mean' or 'iqm', got {statistic!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"aggregate_seeds: confidence must be in (0, 1), got {confidence}")
    if reps < 1:
        raise ValueError(f"aggregate_seeds: reps must be >= 1, got {reps}")
    seeds = [np.asarray(s, dtype=np.float64).ravel() for s in per_seed_scores]
    if not seeds:
        raise ValueError("aggregate_seeds: no seeds")
    for i, s in enumerate(seeds):
        if s.size == 0:
            raise ValueError(f"aggregate_seeds: seed {i} has no episodes")
        if not np.all(np.isfinite(s)):
            raise ValueError(f"aggregate_seeds: seed {i} has non-finite scores")
    means = np.array([s.mean() for s in seeds])
    value = float(_statistic(means, statistic))

    rng = np.random.default_rng(rng_seed)
    n = len(seeds)
    boot_means = np.empty((reps, n))
    drawn = rng.integers(0, n, size=(reps, n))  # which seed fills each slot of each resample
    for j in range(n):
        # Episodes resampled within seed j once per (resample, slot) that drew it; vectorised per seed.
        slots = np.argwhere(drawn == j)
        if len(slots) == 0:
            continue
        s = seeds[j]
        idx = rng.integers(0, s.size, size=(len(slots), s.size))
        boot_means[slots[:, 0], slots[:, 1]] = s[idx].mean(axis=1)
    boot = _statistic(boot_means, statistic)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    # The percentile interval always contains the point estimate's neighbourhood; guard rounding at the edges.
    lo, hi = min(float(lo), value), max(float(hi), value)
    if rate:
        pooled = np.concatenate(seeds)
        if not np.all((pooled == 0) | (pooled == 1)):
            raise ValueError("aggregate_seeds: rate=True needs 0/1 scores")
        from llmrl.eval.stats import wilson_interval

        wlo, whi = wilson_interval(int(pooled.sum()), pooled.size, confidence)
        lo, hi = min(lo, wlo), max(hi, whi)
    return SeedAggregate(value=value, ci_low=lo, ci_high=hi, per_seed=tuple(float(m) for m in means),
                         episodes=tuple(int(s.size) for s in seeds), statistic=statistic, confidence=confidence)
