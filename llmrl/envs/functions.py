"""Families of cheap objective functions for training and testing an in-context optimizer (ProPS's GRPO).

Every function is a concave quadratic bowl f(x) = optimum - (x - c)^T A (x - c) with its maximum ``optimum`` at a
centre c inside the parameter range; the families differ in A:

- ``sphere``: A = s I, one curvature s drawn log-uniformly from ``curvature`` (the quadratic check's shape with
  a random scale);
- ``rotated_ellipsoid``: A = R diag(s) R^T, each axis' curvature drawn log-uniformly from ``curvature`` and R a
  random rotation (the bowl is tilted: no coordinate can be optimised alone).

Splits are disjoint by construction: function ``i`` of split ``k`` is drawn from the seed sequence
(``SPLIT_IDS[k]``, ``i``, a family salt), so no two splits share a generator, and ``draw_function`` refuses an
unknown split. A function's family alternates with its index (balanced), and its dimension is given by the caller
(the search runs one dimension per task) or drawn from ``dims`` (training episodes).

``reference_value`` is the exact mean of f over points drawn uniformly from the parameter range (closed form for a
quadratic): ``normalised_score`` maps it to 0 and the optimum to 1. A search's score is ``gap_closed``: the orders
of magnitude by which its best value closed that gap, -log10(1 - normalised score), floored at ``GAP_FLOOR``
(a score of 6). The linear score crowds every decent search near 1 (30 random points already reach about 0.98 on a
2-d bowl), the log spreads them as BBOB's precision targets do; either is comparable across functions of different
scales and dimensions, so scores can be averaged, bootstrapped and compared (rliable's IQM and probability of
improvement).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["FAMILIES", "SPLITS", "SPLIT_IDS", "Family", "Split", "TestFunction", "draw_function", "FunctionTask",
           "normalised_score", "gap_closed", "GAP_FLOOR"]

Family = Literal["sphere", "rotated_ellipsoid"]
Split = Literal["train", "validation", "test"]
FAMILIES: tuple[str, ...] = Family.__args__
SPLITS: tuple[str, ...] = Split.__args__
SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}
_SALT = 60_221


@dataclass(frozen=True)
class TestFunction:
    """One objective: f(x) = optimum - (x - centre)^T matrix (x - centre); ``split`` and ``index`` name its draw."""

    __test__ = False  # not a pytest class

    family: str
    split: str
    index: int
    centre: tuple[float, ...]
    matrix: tuple[tuple[float, ...], ...]
    optimum: float = 100.0

    @property
    def dim(self) -> int:
        return len(self.centre)

    def values(self, params: np.ndarray) -> np.ndarray:
        """f of each row of ``params`` (..., dim)."""
        x = np.asarray(params, dtype=np.float64)
        if x.shape[-1] != self.dim:
            raise ValueError(f"params: expected {self.dim} values, got {x.shape[-1]}")
        d = x - np.asarray(self.centre)
        return self.optimum - np.einsum("...i,ij,...j->...", d, np.asarray(self.matrix), d)

    def reference_value(self, low: float, high: float) -> float:
        """E[f(x)] for x uniform on [low, high]^dim: optimum - tr(A) (high - low)^2 / 12 - (m - c)^T A (m - c)."""
        a = np.asarray(self.matrix)
        m = np.full(self.dim, (low + high) / 2) - np.asarray(self.centre)
        return float(self.optimum - np.trace(a) * (high - low) ** 2 / 12 - m @ a @ m)

    def to_json(self) -> str:
        return json.dumps({"family": self.family, "split": self.split, "index": self.index,
                           "centre": list(self.centre), "matrix": [list(r) for r in self.matrix],
                           "optimum": self.optimum}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TestFunction:
        d = json.loads(text)
        return cls(d["family"], d["split"], int(d["index"]), tuple(d["centre"]),
                   tuple(tuple(r) for r in d["matrix"]), float(d["optimum"]))


def draw_function(split: str, index: int, dim: int, *, centre_range: float = 4.5,
                  curvature: tuple[float, float] = (0.5, 10.0), optimum: float = 100.0) -> TestFunction:
    """Function ``index`` of ``split`` in ``dim`` dimensions (module doc): the centre uniform in
    [-centre_range, centre_range]^dim at one decimal, the family ``FAMILIES[index % 2]``."""
    if split not in SPLIT_IDS:
        raise ValueError(f"split: must be one of {SPLITS}, got {split!r}")
    if dim < 1 or index < 0:
        raise ValueError(f"dim must be >= 1 and index >= 0, got dim={dim}, index={index}")
    lo, hi = curvature
    if not 0 < lo <= hi:
        raise ValueError(f"curvature: expected 0 < low <= high, got {curvature}")
    family = FAMILIES[index % len(FAMILIES)]
    rng = np.random.default_rng([SPLIT_IDS[split], index, dim, _SALT])
    centre = np.round(rng.uniform(-centre_range, centre_range, size=dim), 1)
    if family == "sphere":
        a = np.eye(dim) * np.exp(rng.uniform(np.log(lo), np.log(hi)))
    else:
        s = np.exp(rng.uniform(np.log(lo), np.log(hi), size=dim))
        q, r = np.linalg.qr(rng.normal(size=(dim, dim)))
        q = q * np.sign(np.diag(r))  # a uniformly random orthogonal matrix (Haar)
        a = q @ np.diag(s) @ q.T
        a = (a + a.T) / 2
    return TestFunction(family, split, int(index), tuple(float(v) for v in centre),
                        tuple(tuple(float(v) for v in row) for row in a), optimum)


def normalised_score(value: float, fn: TestFunction, low: float, high: float) -> float:
    """(value - E_uniform[f]) / (optimum - E_uniform[f]): 1 at the optimum, 0 for an average random point."""
    ref = fn.reference_value(low, high)
    return float((value - ref) / (fn.optimum - ref))


GAP_FLOOR = 1e-6


def gap_closed(value: float, fn: TestFunction, low: float, high: float) -> float:
    """-log10 of the share of the gap (optimum - E_uniform[f]) left at ``value``, at most -log10(GAP_FLOOR): 0 for an
    average random point, 1 for a tenth of the gap left, 6 at the optimum."""
    left = max(1.0 - normalised_score(value, fn, low, high), GAP_FLOOR)
    return float(-np.log10(left))


@dataclass(frozen=True)
class FunctionTask:
    """The search's view of one split's functions of one dimension: search seed ``i`` optimises function
    ``first + i`` of the split (``QuadraticTask``'s interface: ``n_params``, ``optimum``, ``step_size``, ``key``,
    ``values(params, search_seed)``)."""

    split: str
    n_params: int
    first: int = 0
    optimum: float = 100.0
    step_size: float = 1.0
    centre_range: float = 4.5
    curvature: tuple[float, float] = (0.5, 10.0)
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if self.split not in SPLIT_IDS:
            raise ValueError(f"split: must be one of {SPLITS}, got {self.split!r}")

    @property
    def key(self) -> str:
        return f"functions-{self.split}-{self.n_params}d"

    def function(self, search_seed: int) -> TestFunction:
        i = self.first + int(search_seed)
        if i not in self._cache:
            self._cache[i] = draw_function(self.split, i, self.n_params, centre_range=self.centre_range,
                                           curvature=self.curvature, optimum=self.optimum)
        return self._cache[i]

    def values(self, params: np.ndarray, search_seed: int) -> np.ndarray:
        return self.function(search_seed).values(params)

    def functions(self, seeds: Sequence[int]) -> list[TestFunction]:
        return [self.function(s) for s in seeds]
