"""The tuned ProPS optimizer on functions it never saw: scores, aggregates, paired comparisons and reply shares; and
the summary of a GRPO run.

A run is one search of one method on one test function (``llmrl.envs.functions``): its rows (one per evaluation)
and its ``best_return``, the best f found within the budget. Its score is ``gap_closed`` of that value: the orders
of magnitude by which it closed the gap between an average random point and the optimum (0 for an average random
point, 6 at the optimum), so functions of different scales and dimensions weigh alike. An item is a function; a method's runs on an item are its repetitions (the tuned
optimizer: one per training seed; the base model and the baselines: sampling or random streams).

Per method: rliable's IQM over all run x item scores. Per comparison (A over B): rliable's probability of
improvement, and the mean paired difference of scores with a bootstrap that draws functions and runs as crossed
factors (``llmrl.eval.paired.paired_bootstrap``: a training seed's adapter is one draw for every function). rliable's
statistics draw functions, then runs within each (``over_tasks``): the base model runs once per function, and
rliable's runs-only draw would give it no interval at all. Per LLM run, the shares of its proposals that improve on
the best value so far, repeat a point already evaluated, and of its replies that fail to parse.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmrl.eval.rliable_stats import iqm, probability_of_improvement
from llmrl.eval.paired import paired_bootstrap

__all__ = ["reply_shares", "score_matrix", "heldout_table", "grpo_summary", "validation_items", "tuning_gate"]


OPENING_TURNS = 2  # the turns asked with at most one evaluated point: the prompts least like a search's middle


def reply_shares(rows: Sequence[dict]) -> dict:
    """Shares of an LLM search's proposals (``proposal == "llm"``) that improve on the best value before them and
    that repeat an evaluated point, of its replies that failed to parse (re-asks included), from its rows
    (cumulative counters in the last), and of its evaluations that fell back to a uniform draw, over the whole search
    and over its first ``OPENING_TURNS`` turns apart."""
    best = -np.inf
    improved = proposed = 0
    for r in rows:
        if r["proposal"] == "llm":
            proposed += 1
            improved += r["return_mean"] > best
        best = max(best, r["return_mean"])
    last = rows[-1]
    return {"proposals": proposed, "improve_share": round(improved / proposed, 4) if proposed else None,
            "repeat_share": round(last["duplicates"] / proposed, 4) if proposed else None,
            "parse_failure_share": round(last["parse_failures"] / last["llm_calls"], 4) if last["llm_calls"] else None,
            "fallback_share": round(last["fallbacks"] / len(rows), 4),
            "opening_fallback_share": round(sum(r["proposal"] == "fallback" for r in rows[:OPENING_TURNS])
                                            / len(rows[:OPENING_TURNS]), 4)}


def score_matrix(runs: Sequence[dict], method: str, items: Sequence[tuple]) -> np.ndarray:
    """[runs, items] scores of ``method``: row r holds its repetition r on every item (each item needs the same
    repetitions)."""
    mine = [r for r in runs if r["method"] == method]
    reps = sorted({r["rep"] for r in mine})
    cell = {(r["rep"], (r["dim"], r["function"])): r["score"] for r in mine}
    missing = [(rep, it) for rep in reps for it in items if (rep, it) not in cell]
    if not mine or missing:
        raise ValueError(f"score_matrix: method {method!r} lacks runs {missing[:3]}{' ...' if len(missing) > 3 else ''}"
                         if mine else f"score_matrix: no runs of {method!r}")
    return np.array([[cell[(rep, it)] for it in items] for rep in reps])


def heldout_table(runs: Sequence[dict], comparisons: Sequence[tuple[str, str]], *, confidence: float = 0.95,
                  reps: int = 2000) -> dict:
    """Per method its IQM (and mean) with intervals, its runs, items and budget, and for LLM methods the reply
    shares; per comparison (a, b) the probability of improvement and the paired difference."""
    items = sorted({(r["dim"], r["function"]) for r in runs})
    methods = list(dict.fromkeys(r["method"] for r in runs))
    budgets = {m: {r["rows"][-1]["episodes"] for r in runs if r["method"] == m} for m in methods}
    if len(set().union(*budgets.values())) != 1:
        raise ValueError(f"heldout_table: methods spent different evaluations: {budgets}")
    scores = {m: score_matrix(runs, m, items) for m in methods}
    table: dict = {"items": len(items), "evaluations": next(iter(budgets[methods[0]])), "methods": {}}
    for m in methods:
        s = scores[m]
        entry = {"iqm": iqm(s, reps=reps, confidence=confidence, over_tasks=True), "mean": round(float(s.mean()), 4),
                 "runs": int(s.shape[0]), "items": int(s.shape[1])}
        mine = [r for r in runs if r["method"] == m]
        if "llm_calls" in mine[0]["rows"][-1]:
            shares = [reply_shares(r["rows"]) for r in mine]
            entry["replies"] = {k: round(float(np.mean([x[k] for x in shares if x[k] is not None])), 4)
                                for k in ("improve_share", "repeat_share", "parse_failure_share", "fallback_share",
                                          "opening_fallback_share")
                                if any(x[k] is not None for x in shares)}
        table["methods"][m] = entry
    table["comparisons"] = {
        f"{a}_over_{b}": {"probability_of_improvement": probability_of_improvement(scores[a], scores[b], reps=reps,
                                                                                   confidence=confidence,
                                                                                   over_tasks=True),
                          "paired_difference": paired_bootstrap(scores[a], scores[b], reps=reps, confidence=confidence)}
        for a, b in comparisons if a in scores and b in scores}
    return table


def _rates(rows: Sequence[dict]) -> dict:
    n = len(rows)
    return {"improve_rate": round(sum(r["reward_improvement"] > 0 for r in rows) / n, 4),
            "duplicate_rate": round(sum(r["reward_duplicate_penalty"] < 0 for r in rows) / n, 4),
            "parse_failure_rate": round(sum(r["reward_parse_penalty"] < 0 for r in rows) / n, 4)}


def grpo_summary(rows: Sequence[dict], completions: Sequence[dict], validations: Sequence[dict], *,
                 functions: bool, replies: Sequence[dict] = ()) -> dict:
    """What a GRPO run did, from TRL's rows, every recorded completion and every validation (step, score, rates):
    steps, completions, the mean reward at the first and last step, the validation score at step 0 (the base
    model), at the selected step and at the last; for function data the shares of training replies that improve,
    repeat or fail to parse over the first and the last tenth of the steps, and, from the validation ``replies``
    (``id``, ``step``, ``reward_improvement``), the last step's gain over the base weights paired by validation
    episode (``validation_gain_last``, an interval over the episodes) and both steps' per-episode scores
    (``validation_items``: what ``tuning_gate`` pools over the training seeds)."""
    if not validations:
        raise ValueError("grpo_summary: no validation was recorded")
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    best = max(validations, key=lambda v: (v["score"], -v["step"]))
    base = next((v for v in validations if v["step"] == 0), None)
    out = {"steps": len(rows), "completions": len(completions),
           "reward_mean_first_last": [rewards[0], rewards[-1]] if rewards else [None, None],
           "validations": len(validations), "selected_step": best["step"],
           "validation_score_base": None if base is None else round(base["score"], 4),
           "validation_score_selected": round(best["score"], 4),
           "validation_score_last": round(validations[-1]["score"], 4)}
    if functions:
        keys = ("improve_rate", "duplicate_rate", "parse_failure_rate")
        out["validation_base"] = {k: base[k] for k in keys} if base else None
        out["validation_selected"] = {k: best[k] for k in keys}
        steps = sorted({c["step"] for c in completions})
        if steps:
            tenth = max(1, len(steps) // 10)
            first, last = set(steps[:tenth]), set(steps[-tenth:])
            out["train_replies_first"] = _rates([c for c in completions if c["step"] in first])
            out["train_replies_last"] = _rates([c for c in completions if c["step"] in last])
        if replies and base is not None:
            items = validation_items(replies, 0, validations[-1]["step"])
            out["validation_items"] = items
            out["validation_gain_last"] = paired_bootstrap(np.array([items["last"]]), np.array([items["base"]]))
    return out


def validation_items(replies: Sequence[dict], base_step: int, last_step: int) -> dict:
    """Per validation episode (``id``, sorted), the mean improvement of its replies at ``base_step`` and at
    ``last_step``: the same episodes at both steps, or a ``ValueError`` naming the difference."""
    def scores(step: int) -> dict:
        per: dict = {}
        for r in replies:
            if r["step"] == step:
                per.setdefault(r["id"], []).append(float(r["reward_improvement"]))
        return {k: float(np.mean(v)) for k, v in per.items()}

    base, last = scores(base_step), scores(last_step)
    if not base or set(base) != set(last):
        raise ValueError(f"validation_items: steps {base_step} and {last_step} replied to different episodes "
                         f"({len(base)} and {len(last)}; {len(set(base) ^ set(last))} not in both)")
    ids = sorted(base)
    return {"ids": ids, "base_step": base_step, "last_step": last_step,
            "base": [round(base[i], 4) for i in ids], "last": [round(last[i], 4) for i in ids]}


def tuning_gate(summaries: Sequence[dict]) -> dict:
    """Did the fine-tune change the optimizer the way its rewards push, before any held-out claim is read? From
    each training seed's ``grpo_summary``: the validation score (on validation functions, never the test's) at the
    base weights (step 0), at the last step and at the selected step, and the training replies' rates over the
    first and last tenth of the steps.

    ``passed``: in every seed the last step's validation score is above the base's and the selection kept a step
    after 0, and, where the summaries hold their per-episode scores (``validation_items``, the same validation
    episodes in every seed), the last step's gain over the base paired by episode, seeds and episodes drawn as
    crossed factors (``validation_gain_last``), has its interval above 0: a gain of one or two replies in 32 per
    seed is within what resampling the replies gives. The last step is one comparison with no selection behind it; the selected step's score is the best of
    several noisy validations, biased upward, so it is reported but never decides the gate alone. The held-out test
    is the unbiased reading; a null there with a failed gate means the fine-tune did not change the optimizer, with
    a passed gate that what it learned on training functions does not carry to new ones.
    """
    if not summaries:
        raise ValueError("tuning_gate: no training seeds")
    digests = {s.get("seed"): s["validation_digest"] for s in summaries if "validation_digest" in s}
    if len(set(digests.values())) > 1:
        raise ValueError(f"tuning_gate: the training seeds validated on different examples (digests {digests}); "
                         "their gains cannot be paired by episode")
    per_seed = []
    for s in summaries:
        if s.get("validation_score_base") is None:
            raise ValueError(f"tuning_gate: seed {s.get('seed')} has no validation at step 0 (the base weights)")
        per_seed.append({"seed": s.get("seed"), "selected_step": s["selected_step"],
                         "validation_base": s["validation_score_base"], "validation_last": s["validation_score_last"],
                         "validation_selected": s["validation_score_selected"],
                         "last_above_base": s["validation_score_last"] > s["validation_score_base"],
                         **{f"train_{k}_first_last": [s["train_replies_first"][k], s["train_replies_last"][k]]
                            for k in ("improve_rate", "duplicate_rate", "parse_failure_rate")
                            if "train_replies_first" in s}})
    gains = [x["validation_last"] - x["validation_base"] for x in per_seed]
    out = {"seeds": len(per_seed), "last_above_base": sum(x["last_above_base"] for x in per_seed),
           "selected_after_step_0": sum(x["selected_step"] > 0 for x in per_seed),
           "validation_gain_last_mean": round(float(np.mean(gains)), 4),
           "passed": all(x["last_above_base"] and x["selected_step"] > 0 for x in per_seed), "per_seed": per_seed}
    items = [s.get("validation_items") for s in summaries]
    if all(items):
        if any(i["ids"] != items[0]["ids"] for i in items):
            raise ValueError("tuning_gate: the seeds' validation episodes differ; their gains cannot be paired")
        paired = paired_bootstrap(np.array([i["last"] for i in items]), np.array([i["base"] for i in items]))
        out["validation_gain_last"] = paired
        out["passed"] = out["passed"] and paired["verdict"] == "higher"
    return out
