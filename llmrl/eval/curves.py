"""Learning curves of the LLM4Teach students: a greedy-success probe on fixed levels and the curve's area.

Apart from ``llmrl.eval.llm4teach`` so the training stages import only what a curve needs (their DVC
deps stay small: a change to the report logic does not retrain anything).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from torch import nn

from llmrl.agents.student import StudentPolicy
import llmrl.envs.doorkey  # noqa: F401  (registers the DoorKey family the curves are measured on)
from llmrl.envs.make import make_env
from llmrl.eval.batched import evaluate_batched

__all__ = ["grid_curve_measure", "aulc"]


def grid_curve_measure(env_id: str, seeds: Sequence[int]) -> Callable[[nn.Module, int], dict]:
    """A learning-curve probe: greedy success and mean return of a grid student on fixed ``seeds`` levels."""
    seeds = list(seeds)

    def measure(agent: nn.Module, frames: int) -> dict:
        s = evaluate_batched(StudentPolicy(agent), lambda: make_env(env_id), seeds, mode="greedy",
                             n_envs=len(seeds), progress=False).summary()
        return {"success_rate": s["success_rate"], "mean_return": s["mean_return"]}

    return measure


def aulc(curve: Sequence[dict], total_frames: int, key: str = "success_rate") -> float:
    """Area under the ``key``-vs-frames curve (trapezoids) divided by the frame budget: the mean of ``key``
    over training. The curve must start at 0 frames and be sorted by frames."""
    if total_frames <= 0:
        raise ValueError(f"aulc: total_frames must be > 0, got {total_frames}")
    if not curve:
        raise ValueError("aulc: empty curve")
    x = np.array([c["frames"] for c in curve], dtype=float)
    y = np.array([c[key] for c in curve], dtype=float)
    if np.any(np.diff(x) < 0):
        raise ValueError("aulc: curve frames must be non-decreasing")
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / total_frames)
