"""LLM_RL's result logic: a training run's headline, a model's test accuracy over its training seeds, and each variant
against the base model.

A training seed is the unit (``llmrl.eval.seeds.aggregate_seeds`` through ``llmrl.eval.headline.headline``): a
variant's accuracy is the mean over its seeds of each seed's accuracy on the same test problems, with a
hierarchical-bootstrap interval that widens with the spread between seeds. The base model has no training seed:
its interval is over the problems alone (``seeds: 1``). A variant beats (or falls below) the base model in a
decoding mode only where the two intervals do not overlap (``llmrl.eval.stats.compare_intervals``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmrl.eval.headline import headline
from llmrl.eval.stats import compare_intervals

__all__ = ["training_summary", "accuracy_entry", "against_base"]


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


def accuracy_entry(per_seed_records: Sequence[Sequence[dict]], *, digits: int = 4, reps: int = 2000) -> dict:
    """One model in one decoding mode, from ``llmrl.agents.math_solver.solve``'s records of each training seed
    (the base model: one list), every seed on the same problems in the same order.

    Returns the headline (``success`` = accuracy, its seed-level interval, ``seeds``, ``episodes``), the accuracy
    of each seed (``per_seed``, in the order given), and the parse-failure rate, the share of answers cut by the
    token cap and the mean tokens per answer, pooled over seeds.
    """
    if not per_seed_records:
        raise ValueError("accuracy_entry: no seeds")
    ids = [tuple(r["id"] for r in records) for records in per_seed_records]
    for i, seed_ids in enumerate(ids):
        if not seed_ids:
            raise ValueError(f"accuracy_entry: seed {i} has no records")
        if seed_ids != ids[0]:
            raise ValueError(f"accuracy_entry: seed {i} answered other problems than seed 0; every seed must be "
                             "scored on the same problems")
    correct = [[float(r["correct"]) for r in records] for records in per_seed_records]
    pooled = [r for records in per_seed_records for r in records]
    n = len(pooled)
    return {**headline(correct, digits=digits, reps=reps),
            "per_seed": [round(float(np.mean(c)), digits) for c in correct],
            "parse_failure": round(sum(r["parsed_answer"] is None for r in pooled) / n, digits),
            "truncated": round(sum(r["finish_reason"] == "length" for r in pooled) / n, digits),
            "tokens": round(sum(r["n_tokens"] for r in pooled) / n, 1)}


def against_base(variant: dict, base: dict) -> str:
    """How a variant's accuracy stands against the base model's in one mode (two ``accuracy_entry`` results):
    "higher" or "lower" only where their intervals do not overlap, else "overlapping"."""
    return compare_intervals({"ci_low": variant["success_lo"], "ci_high": variant["success_hi"]},
                             {"ci_low": base["success_lo"], "ci_high": base["success_hi"]})
