"""LLM4Teach's result logic: MPE's evaluation episodes (``evaluate_spread``), seed-level headlines, the random-baseline
check, the result check, the claim that the LLM's scores help, and the validation selection rule. Stages call these;
tests pin them down (tests/test_llm4teach.py, tests/test_llm4teach_controls.py).

Seeds are the unit everywhere (``llmrl.eval.seeds.aggregate_seeds``): a policy's figure is the mean over its
training seeds of the per-seed mean over evaluation episodes, with a hierarchical-bootstrap interval. Every agent
plays the same test levels, so two students' difference is paired over those levels (``scores_help``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from llmrl.envs.mpe import SpreadBatch
from llmrl.eval.paired import paired_bootstrap
from llmrl.eval.seeds import SeedAggregate, aggregate_seeds

__all__ = ["evaluate_spread", "return_headline", "beats_random", "result_check", "scores_help", "select_setting"]


def evaluate_spread(act: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int, *, n_agents: int = 3,
                    max_cycles: int = 25, local_ratio: float = 0.5) -> list[float]:
    """Episode returns (sum over steps of the agents' mean reward) of a joint policy ``obs [A, D] -> actions [A]``."""
    envs = SpreadBatch(1, n_agents, max_cycles, local_ratio)
    obs = envs.reset(seed=seed)
    returns: list[float] = []
    while len(returns) < episodes:
        obs, _, _, ended = envs.step(np.asarray(act(obs[0]))[None])
        returns += ended
    return returns


def return_headline(per_seed_returns: Sequence[Sequence[float]], *, digits: int = 4, reps: int = 2000) -> dict:
    """``llmrl.eval.headline.headline``'s return part alone, for tasks without success (MPE)."""
    r = aggregate_seeds(per_seed_returns, reps=reps)
    return {"return": round(r.value, digits), "return_lo": round(r.ci_low, digits),
            "return_hi": round(r.ci_high, digits), "seeds": r.n_seeds, "episodes": int(sum(r.episodes))}


def beats_random(agent: SeedAggregate, random: SeedAggregate, *, higher_is_better: bool = True) -> bool:
    """True when the agent's seed-level interval and random's interval are apart, the agent's on the better side
    (higher: the agent's low end above random's high end). Random's point value alone would call an agent better
    that random's own spread could match.

    The report marks a learned baseline with ``beats_random: false`` as not converged beside its number.
    """
    if higher_is_better:
        return bool(agent.ci_low > random.ci_high)
    return bool(agent.ci_high < random.ci_low)


def result_check(students: dict[str, SeedAggregate], ppo: SeedAggregate | None, *, target: float,
                 ceiling: float) -> dict:
    """LLM4Teach's claim at one frame budget: the student taught by ``teacher`` reaches ``target`` success
    (mean over seeds) where pure PPO stays below ``ceiling``. ``met_<teacher>`` per student."""
    out: dict = {}
    for teacher, agg in sorted(students.items()):
        out[f"met_{teacher}"] = bool(ppo is not None and agg.value >= target and ppo.value < ceiling)
    return out


def scores_help(scoring: np.ndarray, controls: Mapping[str, np.ndarray], *, higher_is_better: bool = True,
                confidence: float = 0.95, reps: int = 2000, seed: int = 0) -> dict:
    """Whether the LLM's scores help: the student taught by the scoring teacher against the students taught by its
    controls (the same candidate plans with equal or random scores), each ``[training seeds, test episodes]``
    on the same test episodes.

    Each control's paired difference (``llmrl.eval.paired.paired_bootstrap``: seeds and episodes drawn as crossed
    factors, the episodes shared) must lie wholly on the better side of 0; one control within reach of the scoring
    student, or better than it, and the claim is not made. Returns ``claim``, the rule and ``vs`` (per control,
    the paired difference with its interval).
    """
    if not controls:
        raise ValueError("controls: need at least one control student to compare the scoring student with")
    better = "higher" if higher_is_better else "lower"
    vs = {name: paired_bootstrap(scoring, c, confidence=confidence, reps=reps, seed=seed)
          for name, c in sorted(controls.items())}
    return {"claim": all(v["verdict"] == better for v in vs.values()), "vs": vs,
            "rule": f"every control's paired difference interval ({confidence:.0%}, seeds x episodes) {better} "
                    "than 0"}


def select_setting(rows: Sequence[dict], *, higher_is_better: bool = True, target: float | None = None,
                   keep: str | None = None) -> dict:
    """The validation pick among candidate rows ``{"name", "cost", "per_seed": [...], ...}``.

    With ``target``: the cheapest candidate whose every tuning seed reaches it (ties: better mean); when none
    does, the best mean. Without: the best mean (ties: the better mean of ``tiebreak_per_seed`` where rows carry
    it, a second score for when the first cannot rank them, then cheaper, then ``keep``, the setting in use: a
    tie is no evidence for a change). Returns the pick's name, score and rule.
    """
    if keep is not None and keep not in {r["name"] for r in rows}:
        raise ValueError(f"keep: {keep!r} is not a candidate's name")
    if not rows:
        raise ValueError("select_setting: no candidates")
    sign = 1.0 if higher_is_better else -1.0

    def mean(r: dict) -> float:
        return float(np.mean(r["per_seed"]))

    def tiebreak(r: dict) -> float:
        return float(np.mean(r["tiebreak_per_seed"])) if r.get("tiebreak_per_seed") else 0.0

    if target is not None:
        ok = [r for r in rows if all((s - target) * sign >= 0 for s in r["per_seed"])]
        if ok:
            best = min(ok, key=lambda r: (r["cost"], -sign * mean(r)))
            return {"name": best["name"], "mean": mean(best), "rule": f"cheapest with every tuning seed at "
                    f"{'>=' if higher_is_better else '<='} {target}"}
    best = min(rows, key=lambda r: (-sign * mean(r), -sign * tiebreak(r), r["cost"], r["name"] != keep))
    rule = "best mean" + (f" (no candidate had every tuning seed at target {target})" if target is not None else "")
    tied = [r for r in rows if r is not best and mean(r) == mean(best)]
    if tied:
        second = [r for r in tied if tiebreak(r) == tiebreak(best)]
        by = (["the second score"] if len(second) < len(tied) else []) + (["cost and the setting in use"] if second else [])
        rule += f"; tied with {len(tied)} other(s), broken by {', then '.join(by)}"
    return {"name": best["name"], "mean": mean(best), "rule": rule}
