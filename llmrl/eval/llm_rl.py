"""LLM_RL's result logic: a training run's headline, a model's test accuracy over its training seeds, each variant
against the base model on the same problems, and accuracy by whether a problem's arithmetic was seen in training.

Every model answers the same test problems, so problems are shared by every seed and every model: a variant's
accuracy is the mean over its seeds and the problems, with an interval that draws seeds and problems as crossed
factors (``llmrl.eval.paired.mean_bootstrap``; pooling the seeds' answers as independent would narrow it). The base
model is one run: its interval is over problems alone (``seeds: 1``, "one run, interval over problems"). A variant's
reading against the base model is the paired difference on the same problems (``paired_bootstrap``): "higher" or
"lower" only where its interval excludes 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmrl.eval.headline import headline
from llmrl.eval.paired import mean_bootstrap, paired_bootstrap
from llmrl.eval.stats import wilson_interval

__all__ = ["training_summary", "accuracy_entry", "against_base", "accuracy_by_arithmetic", "interval_units"]


def interval_units(seeds: int) -> str:
    """What an accuracy interval is over, as the report states it."""
    return "seeds x problems, crossed bootstrap" if seeds > 1 else "one run, interval over problems"


def training_summary(history: Sequence[dict], samples: Sequence[dict], *, answer_tokens: int, dtype: str,
                     seconds: float) -> dict:
    """A training run's headline from the rows its variant yielded (``llmrl.algos.reinforce_kl.train``,
    ``llmrl.algos.llm_rl_grpo.train``) and every sample it drew: the samples, optimiser steps and tokens per answer
    (its cap ``answer_tokens`` and the mean generated), so a reader can check the variants were compared on equal
    terms; the mean reward of the first and last rows that carry one; the compute dtype and wall time."""
    rewards = [h["average_reward"] for h in history if "average_reward" in h]
    if not rewards:
        raise ValueError("training_summary: no row carries an average_reward")
    tokens = [r["tokens"] for r in samples if r.get("tokens") is not None]
    return {"samples": len(samples), "optimizer_steps": sum(h["optimizer_steps"] for h in history),
            "answer_tokens": answer_tokens, "tokens": round(float(np.mean(tokens)), 1) if tokens else None,
            "reward_first": round(rewards[0], 4), "reward_last": round(rewards[-1], 4), "dtype": dtype,
            "seconds": round(seconds, 1)}


def _correct(per_seed_records: Sequence[Sequence[dict]], who: str) -> np.ndarray:
    """[seeds, problems] 0/1 correctness, every seed on the same problems in the same order."""
    if not per_seed_records:
        raise ValueError(f"{who}: no seeds")
    ids = [tuple(r["id"] for r in records) for records in per_seed_records]
    for i, seed_ids in enumerate(ids):
        if not seed_ids:
            raise ValueError(f"{who}: seed {i} has no records")
        if seed_ids != ids[0]:
            raise ValueError(f"{who}: seed {i} answered other problems than seed 0; every seed must be scored on "
                             "the same problems")
    return np.array([[float(r["correct"]) for r in records] for records in per_seed_records])


def accuracy_entry(per_seed_records: Sequence[Sequence[dict]], *, digits: int = 4, reps: int = 2000) -> dict:
    """One model in one decoding mode, from ``llmrl.agents.math_solver.solve``'s records of each training seed
    (the base model: one list), every seed on the same problems in the same order.

    Returns the headline (``success`` = accuracy, its interval over seeds and problems as crossed factors, widened
    to hold the pooled answers' Wilson interval so that 0 of 100 still allows a rate above 0; ``seeds``,
    ``episodes``), the accuracy of each seed (``per_seed``, in the order given), what the interval is over
    (``interval``), and the parse-failure rate, the share of answers cut by the token cap and the mean tokens per
    answer, pooled over seeds.
    """
    correct = _correct(per_seed_records, "accuracy_entry")
    pooled = [r for records in per_seed_records for r in records]
    n = len(pooled)
    crossed = mean_bootstrap(correct, reps=reps)
    wilson = wilson_interval(int(correct.sum()), n)
    return {**headline(correct.tolist(), digits=digits, reps=reps),
            "success_lo": round(min(crossed["ci_low"], wilson[0]), digits),
            "success_hi": round(max(crossed["ci_high"], wilson[1]), digits),
            "interval": interval_units(correct.shape[0]),
            "per_seed": [round(float(c.mean()), digits) for c in correct],
            "parse_failure": round(sum(r["parsed_answer"] is None for r in pooled) / n, digits),
            "truncated": round(sum(r["finish_reason"] == "length" for r in pooled) / n, digits),
            "tokens": round(sum(r["n_tokens"] for r in pooled) / n, 1)}


def against_base(variant_records: Sequence[Sequence[dict]], base_records: Sequence[Sequence[dict]], *,
                 reps: int = 2000) -> dict:
    """A variant's accuracy minus the base model's on the same problems (``solve``'s records per seed of each), with
    a paired interval drawing problems (shared by both) and each model's seeds as crossed factors; ``verdict``
    "higher" or "lower" only where the interval excludes 0, else "no difference"."""
    a, b = _correct(variant_records, "against_base"), _correct(base_records, "against_base")
    if [r["id"] for r in variant_records[0]] != [r["id"] for r in base_records[0]]:
        raise ValueError("against_base: the variant and the base model answered other problems; a paired "
                         "comparison needs the same problems in the same order")
    return paired_bootstrap(a, b, reps=reps)


def accuracy_by_arithmetic(per_seed_records: Sequence[Sequence[dict]], seen: Sequence[float], *,
                           digits: int = 4) -> dict:
    """Accuracy over seeds on the test problems whose calculations were all unseen in training, partly seen, and
    all seen (``seen``: per problem, in the records' order, the share of its calculations made in training:
    ``llmrl.envs.word_problems.generator.seen_arithmetic``); only the groups that hold a problem."""
    correct = _correct(per_seed_records, "accuracy_by_arithmetic")
    share = np.asarray(seen, dtype=np.float64)
    if share.shape != (correct.shape[1],):
        raise ValueError(f"accuracy_by_arithmetic: {share.size} seen shares for {correct.shape[1]} problems")
    groups = {"unseen": share == 0, "partly_seen": (share > 0) & (share < 1), "seen": share == 1}
    return {name: {"problems": int(mask.sum()), "accuracy": round(float(correct[:, mask].mean()), digits)}
            for name, mask in groups.items() if mask.any()}
