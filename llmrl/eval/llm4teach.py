"""LLM4Teach's result logic: seed-level headlines, the random-baseline check, the result
check and the validation selection rule. Stages call these; tests pin them down (tests/test_llm4teach.py).

Seeds are the unit everywhere (``llmrl.eval.seeds.aggregate_seeds``): a policy's figure is the mean over its
training seeds of the per-seed mean over evaluation episodes, with a hierarchical-bootstrap interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmrl.eval.seeds import SeedAggregate, aggregate_seeds

__all__ = ["return_headline", "beats_random", "result_check", "select_setting"]


def return_headline(per_seed_returns: Sequence[Sequence[float]], *, digits: int = 4, reps: int = 2000) -> dict:
    """``llmrl.eval.headline.headline``'s return part alone, for tasks without success (MPE)."""
    r = aggregate_seeds(per_seed_returns, reps=reps)
    return {"return": round(r.value, digits), "return_lo": round(r.ci_low, digits),
            "return_hi": round(r.ci_high, digits), "seeds": r.n_seeds, "episodes": int(sum(r.episodes))}


def beats_random(agent: SeedAggregate, random_value: float, *, higher_is_better: bool = True) -> bool:
    """True when the agent's whole seed-level interval lies on the better side of random's figure.

    The report marks a learned baseline with ``beats_random: false`` as not converged beside its number.
    """
    if higher_is_better:
        return bool(agent.ci_low > random_value)
    return bool(agent.ci_high < random_value)


def result_check(students: dict[str, SeedAggregate], ppo: SeedAggregate | None, *, target: float,
                 ceiling: float) -> dict:
    """LLM4Teach's claim at one frame budget: the student taught by ``teacher`` reaches ``target`` success
    (mean over seeds) where pure PPO stays below ``ceiling``. ``met_<teacher>`` per student."""
    out: dict = {}
    for teacher, agg in sorted(students.items()):
        out[f"met_{teacher}"] = bool(ppo is not None and agg.value >= target and ppo.value < ceiling)
    return out


def select_setting(rows: Sequence[dict], *, higher_is_better: bool = True, target: float | None = None) -> dict:
    """The validation pick among candidate rows ``{"name", "cost", "per_seed": [...], ...}``.

    With ``target``: the cheapest candidate whose every tuning seed reaches it (ties: better mean); when none
    does, the best mean. Without: the best mean (ties: cheaper). Returns the pick's name, score and rule.
    """
    if not rows:
        raise ValueError("select_setting: no candidates")
    sign = 1.0 if higher_is_better else -1.0

    def mean(r: dict) -> float:
        return float(np.mean(r["per_seed"]))

    if target is not None:
        ok = [r for r in rows if all((s - target) * sign >= 0 for s in r["per_seed"])]
        if ok:
            best = min(ok, key=lambda r: (r["cost"], -sign * mean(r)))
            return {"name": best["name"], "mean": mean(best), "rule": f"cheapest with every tuning seed at "
                    f"{'>=' if higher_is_better else '<='} {target}"}
    best = min(rows, key=lambda r: (-sign * mean(r), r["cost"]))
    rule = "best mean" + (f" (no candidate had every tuning seed at target {target})" if target is not None else "")
    return {"name": best["name"], "mean": mean(best), "rule": rule}
