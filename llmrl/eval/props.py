"""ProPS results: curves of best return against episodes used, and the headline of each task × method.

A run is one search seed of one method: its per-iteration rows (``episodes``, ``best_return`` and, for LLM
methods, the cumulative LLM counters) and ``final_eval``, the held-out returns of its final policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmrl.eval.seeds import aggregate_seeds

__all__ = ["mean_curve", "headline"]


def mean_curve(runs_rows: Sequence[Sequence[dict]]) -> list[dict]:
    """Seed-mean best return at each row index (runs of one method share their episode schedule)."""
    n = min(len(r) for r in runs_rows)
    return [{"episodes": int(runs_rows[0][i]["episodes"]),
             "best_return": round(float(np.mean([r[i]["best_return"] for r in runs_rows])), 4)} for i in range(n)]


def headline(runs: Sequence[dict], *, statistic: str = "mean", confidence: float = 0.95, reps: int = 2000) -> dict:
    """Concise figures of one task × method over its seeds (each run one seed).

    ``final``: held-out return of the final policies, with a hierarchical-bootstrap interval over seeds and
    episodes; ``best_search_return``: the best f(params) seen during the search, per seed and its mean (an
    in-sample, optimistic figure); ``episodes``: search episodes used per seed. LLM methods add rates per call
    (parse failures, re-asks), per iteration (fallbacks, duplicates) and seconds per iteration.
    """
    if not runs:
        raise ValueError("headline: no runs")
    final = aggregate_seeds([r["final_eval"] for r in runs], statistic=statistic, confidence=confidence,
                            reps=reps).summary()
    best = [float(r["best_return"]) for r in runs]
    out = {"final": final, "best_search_return": round(float(np.mean(best)), 4),
           "episodes": int(max(r["rows"][-1]["episodes"] for r in runs))}
    last = [r["rows"][-1] for r in runs]
    if "llm_calls" in last[0]:
        iters = sum(len(r["rows"]) for r in runs)
        calls = sum(x["llm_calls"] for x in last)
        out["llm"] = {
            "calls": int(calls),
            "tokens": int(sum(x["tokens"] for x in last)),
            "reasks": int(sum(x["reasks"] for x in last)),
            "parse_failure_rate": round(sum(x["parse_failures"] for x in last) / calls, 4) if calls else None,
            "duplicate_rate": round(sum(x["duplicates"] for x in last) / iters, 4),
            "fallback_rate": round(sum(x["fallbacks"] for x in last) / iters, 4),
            "faults": int(sum(x["faults"] for x in last)),
        }
    secs = [row["seconds"] for r in runs[:1] for row in r["rows"]]
    out["seconds_per_iteration"] = round(float(np.mean(secs)), 3)
    return out
