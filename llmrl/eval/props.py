"""ProPS results: curves of best return against episodes used, the headline of each task × method, and the check
that every method of one table spent the same episodes.

A run is one search seed of one method: its per-iteration rows (``episodes``, ``best_return`` and, for LLM
methods, ``proposal`` and the cumulative LLM counters) and ``final_eval``, the held-out returns of its final
policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from llmrl.envs.control import ControlTask, as_task, make_control_env
from llmrl.eval.headline import metrics_entry
from llmrl.eval.seeds import aggregate_seeds

__all__ = ["evaluate_ppo", "mean_curve", "headline", "metrics_of", "UnequalBudgetError", "check_equal_budgets", "paired_difference"]


def evaluate_ppo(model, task: str | ControlTask, seeds: Sequence[int]) -> np.ndarray:
    """Returns of a Stable-Baselines3 model's deterministic policy (the PPO baseline's final policy) over the
    episodes seeded by ``seeds``."""
    t = as_task(task)
    env = make_control_env(t)
    out = np.zeros(len(seeds))
    try:
        for k, s in enumerate(seeds):
            obs, _ = env.reset(seed=int(s))
            done = False
            while not done:
                a, _ = model.predict(obs, deterministic=True)
                obs, r, term, trunc, _ = env.step(a.item() if isinstance(env.action_space, gym.spaces.Discrete) else a)
                out[k] += float(r)
                done = term or trunc
    finally:
        env.close()
    return out


def mean_curve(runs_rows: Sequence[Sequence[dict]]) -> list[dict]:
    """Seed-mean best return at each row index (runs of one method share their episode schedule). Rows of LLM
    methods add ``fallbacks``: how many seeds' points at that step were random (a fallback, or in the repeat control
    a point replacing a repeat), not the LLM's."""
    n = min(len(r) for r in runs_rows)
    out = []
    for i in range(n):
        point = {"episodes": int(runs_rows[0][i]["episodes"]),
                 "best_return": round(float(np.mean([r[i]["best_return"] for r in runs_rows])), 4)}
        if "proposal" in runs_rows[0][i]:
            point["fallbacks"] = sum(r[i]["proposal"] != "llm" for r in runs_rows)
        out.append(point)
    return out


class UnequalBudgetError(ValueError):
    """Methods of one table spent different numbers of training/search episodes."""


def check_equal_budgets(table: dict[str, dict], *, name: str) -> int:
    """The one episode budget of a table of headlines (method -> ``headline``); different budgets raise
    ``UnequalBudgetError`` naming each method's."""
    budgets = {m: h["episodes"] for m, h in table.items()}
    if len(set(budgets.values())) > 1:
        raise UnequalBudgetError(f"{name}: methods spent different episode budgets {budgets}; a table compares "
                                 "methods at one budget")
    return next(iter(budgets.values()))


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
        errors: dict[str, int] = {}
        for x in last:
            for kind, count in x.get("parse_errors", {}).items():
                errors[kind] = errors.get(kind, 0) + int(count)
        out["llm"] = {
            # the LLM's own points: neither a fallback nor (the repeat control) a random point in place of a repeat
            "llm_proposed": round(sum(x["llm_proposals"] for x in last) / iters, 4),
            "calls": int(calls),
            "tokens": int(sum(x["tokens"] for x in last)),
            "reasks": int(sum(x["reasks"] for x in last)),
            "parse_failure_rate": round(sum(x["parse_failures"] for x in last) / calls, 4) if calls else None,
            "example_copy_rate": (round(sum(x.get("example_copies", 0) for x in last) / calls, 4) if calls
                                  else None),
            "parse_errors": {k: v for k, v in errors.items() if v},
            "duplicate_rate": round(sum(x["duplicates"] for x in last) / iters, 4),
            "fallback_rate": round(sum(x["fallbacks"] for x in last) / iters, 4),
            "faults": int(sum(x["faults"] for x in last)),
        }
    secs = [row["seconds"] for r in runs[:1] for row in r["rows"]]
    out["seconds_per_iteration"] = round(float(np.mean(secs)), 3)
    return out


def metrics_of(h: dict) -> dict:
    """What a method's ``headline`` puts into ``dvc metrics show``, one file per method and so one row each: the
    held-out greedy return of its final policies in the project's headline vocabulary, its training episodes, and
    for an LLM method the share of proposals the LLM made (the rest were random fallbacks) and its parse-failure
    rate. The rest of the headline (best search return, every LLM counter, per-seed values) is the stage's report."""
    f = h["final"]
    out = {"greedy": {"return": f["value"], "return_lo": f["ci_low"], "return_hi": f["ci_high"],
                      "seeds": f["n_seeds"], "episodes": f["episodes"]},
           "train_episodes": h["episodes"]}
    if "llm" in h:
        out.update(llm_proposed=h["llm"]["llm_proposed"], parse_failure=h["llm"]["parse_failure_rate"])
    return metrics_entry(out)


def paired_difference(runs: Sequence[dict], baseline: Sequence[dict], *, confidence: float = 0.95,
                      reps: int = 2000, seed: int = 0, group_by: str | None = None) -> dict:
    """Seed-paired difference of the final values (mean of ``final_eval``) of ``runs`` minus ``baseline``: the
    mean over seeds with a percentile-bootstrap interval over seeds, the seeds won, and the verdict ("better":
    interval above 0, "worse": below, "no difference" otherwise). The quadratic check's answer: does the LLM
    find more than random search at the same number of evaluations?

    ``group_by`` names a field of ``runs`` whose seeds share a source of variation (the tuned optimizer's
    ``adapter``: search seeds i and i + n run the same adapter). With more than one group the interval resamples
    the groups, then the seeds within each drawn group (a two-level bootstrap), so that it is not narrowed by
    counting two searches of one adapter as independent draws; ``groups`` then says how many there were."""
    mine = {r["seed"]: float(np.mean(r["final_eval"])) for r in runs}
    other = {r["seed"]: float(np.mean(r["final_eval"])) for r in baseline}
    seeds = sorted(mine.keys() & other.keys())
    if len(seeds) < 2:
        raise ValueError(f"paired_difference: needs >= 2 seeds run by both, got {seeds}")
    d = np.array([mine[s] - other[s] for s in seeds])
    rng = np.random.default_rng(seed)
    label = {r["seed"]: str(r[group_by]) for r in runs} if group_by else {}
    groups = [np.array([k for k, s in enumerate(seeds) if label[s] == g])
              for g in dict.fromkeys(label[s] for s in seeds)] if group_by else []
    if len(groups) > 1:
        boot = np.empty(reps)
        for b in range(reps):
            drawn = [groups[j] for j in rng.integers(0, len(groups), size=len(groups))]
            boot[b] = np.concatenate([d[g[rng.integers(0, len(g), size=len(g))]] for g in drawn]).mean()
    else:  # one group (or none): the seeds are the units
        boot = d[rng.integers(0, len(d), size=(reps, len(d)))].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "no difference"
    return {"difference": round(float(d.mean()), 4), "ci_low": round(float(lo), 4), "ci_high": round(float(hi), 4),
            "seeds": len(seeds), "seeds_won": int((d > 0).sum()), "verdict": verdict,
            **({"groups": len(groups)} if len(groups) > 1 else {}),
            "per_seed": [round(float(x), 4) for x in d]}
