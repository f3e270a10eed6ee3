"""What RL researchers read first: the interquartile mean (IQM) of run x task scores with stratified-bootstrap
intervals, and the probability of improvement of one method over another (Agarwal et al., NeurIPS 2021).

The statistics are ``rliable.metrics``'s own. The bootstrap is written here: ``rliable.library`` resamples through
the ``arch`` package, whose releases either fail to import beside pandas 3 (arch < 8) or reject the ``random_state``
keyword rliable passes (arch 8), so rliable is installed without its dependencies and only its metrics are used.
The resampling is rliable's: runs are drawn with replacement within each task (stratified), independently for the
two methods of a probability of improvement; the interval is the percentile interval. With ``over_tasks`` the tasks
are drawn with replacement first (the same draw for both methods of a comparison: the pairing stays), then the runs
within each: the interval then also covers which tasks were drawn, and stays honest where a method has one run per
task (rliable's stratified draw alone would give it a zero-width interval).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rliable import metrics

__all__ = ["ScoreInterval", "iqm", "probability_of_improvement"]


class ScoreInterval(dict):
    """``{"value", "ci_low", "ci_high", "runs", "tasks", "reps"}`` of one statistic."""


def _check(scores: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1 or not np.isfinite(arr).all():
        raise ValueError(f"{what}: expected a finite [runs, tasks] array, got shape {arr.shape}")
    return arr


def _resample(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    runs, tasks = scores.shape
    idx = rng.integers(0, runs, size=(runs, tasks))  # per task its own draw of runs: stratified by task
    return np.take_along_axis(scores, idx, axis=0)


def _interval(point: float, draws: np.ndarray, confidence: float, shape, reps: int) -> ScoreInterval:
    alpha = (1 - confidence) / 2
    low, high = np.quantile(draws, [alpha, 1 - alpha])
    return ScoreInterval(value=round(float(point), 4), ci_low=round(float(low), 4), ci_high=round(float(high), 4),
                         runs=int(shape[0]), tasks=int(shape[1]), reps=reps)


def _bootstrap(stat: Callable[..., float], arrays: list[np.ndarray], reps: int, confidence: float,
               seed: int, over_tasks: bool = False) -> ScoreInterval:
    rng = np.random.default_rng(seed)
    tasks = arrays[0].shape[1]

    draws = []
    for _ in range(reps):
        cols = rng.integers(0, tasks, size=tasks) if over_tasks else None
        draws.append(stat(*(_resample(a if cols is None else a[:, cols], rng) for a in arrays)))
    return _interval(stat(*arrays), np.array(draws), confidence, arrays[0].shape, reps)


def iqm(scores: np.ndarray, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0,
        over_tasks: bool = False) -> ScoreInterval:
    """IQM of ``scores`` [runs, tasks] (the mean of the middle 50 % of all run x task scores) with its
    stratified-bootstrap interval (``over_tasks``: tasks drawn too; module doc)."""
    arr = _check(scores, "iqm scores")
    return _bootstrap(metrics.aggregate_iqm, [arr], reps, confidence, seed, over_tasks)


def probability_of_improvement(x: np.ndarray, y: np.ndarray, *, reps: int = 2000, confidence: float = 0.95,
                               seed: int = 0, over_tasks: bool = False) -> ScoreInterval:
    """P(X > Y): the chance that a run of X scores above a run of Y on a task drawn at random (ties count a half),
    for ``x`` [runs_x, tasks] and ``y`` [runs_y, tasks] on the same tasks, with its stratified-bootstrap interval."""
    a, b = _check(x, "probability_of_improvement x"), _check(y, "probability_of_improvement y")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"probability_of_improvement: x has {a.shape[1]} tasks, y {b.shape[1]}")
    return _bootstrap(metrics.probability_of_improvement, [a, b], reps, confidence, seed, over_tasks)
