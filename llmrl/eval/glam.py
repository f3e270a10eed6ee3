"""GLAM's comparisons: a trained variant against each reference agent on the same evaluation starts, paired by start
(episode seed) with runs and starts as crossed factors (``llmrl.eval.paired``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from llmrl.eval.harness import EvalResult
from llmrl.eval.paired import paired_bootstrap

__all__ = ["paired_against", "require_same_starts", "success_matrix"]


def success_matrix(results: Sequence[EvalResult]) -> np.ndarray:
    """[runs, episodes] successes (1.0 / 0.0) of one agent's runs (training seeds or sampling streams), which must
    share their episode seeds in the same order."""
    seeds = [[e.seed for e in r.episodes] for r in results]
    if not results or any(s != seeds[0] for s in seeds):
        raise ValueError("success_matrix: every run must play the same episode seeds in the same order")
    return np.array([[float(e.success) for e in r.episodes] for r in results])


def require_same_starts(starts: Mapping[str, Sequence[int]]) -> None:
    """Raise ``ValueError`` naming the agents whose episode seeds differ from the first agent's: a paired difference
    needs every agent to have played the same starts in the same order."""
    names = list(starts)
    other = [n for n in names[1:] if list(starts[n]) != list(starts[names[0]])]
    if other:
        raise ValueError(f"paired comparison: {other} played other episode seeds than {names[0]!r}")


def paired_against(method: Mapping[str, np.ndarray], references: Mapping[str, Mapping[str, np.ndarray]], *,
                   reps: int = 2000) -> dict:
    """``{reference: {mode: {difference, ci_low, ci_high, items, runs, reference_runs}}}``: the method's success
    minus each reference's in every mode both were evaluated in (``method`` and each reference map a mode to a
    ``success_matrix``); numbers only, so it sits in a metrics file."""
    out: dict = {}
    for ref, modes in references.items():
        for mode in [m for m in method if m in modes]:
            d = paired_bootstrap(method[mode], modes[mode], reps=reps)
            out.setdefault(ref, {})[mode] = {"difference": d["difference"], "ci_low": d["ci_low"],
                                             "ci_high": d["ci_high"], "items": d["items"], "runs": d["runs"][0],
                                             "reference_runs": d["runs"][1]}
    return out
