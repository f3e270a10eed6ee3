"""GRPO fine-tuning of the ProPS optimizer LLM: the data set of scored parameter vectors, the prompt, four rewards.

The original (``finetune.py`` of sachingrover211/llm-rl_finetune) sampled 4,000 MountainCarContinuous parameter
vectors, scored each over 20 episodes, and asked the LLM, shown one of them as the only history entry, for a
better point; the completions were rewarded for their format and for the return of the point they proposed.
Here, differently from the original:
- vectors are drawn from the ONE parameter range of ``props.space`` (the original drew from [-10, 10] while its
  prompt allowed [-6, 6]);
- the prompt is the search's own numeric template (``props_prompts.render_search_prompt``) with one history
  entry, and a system message asking for ``<think>…</think>`` followed by the answer line in the search's
  ``params[i]: x`` format, which the search's strict parser (``props_prompts.parse_reply``) reads;
- the assistant turn may be opened with an ``answer_prefix`` (a final assistant message, which
  ``llmrl.algos.grpo`` continues), as the search opens it for a model
  too small to start in the format (SmolLM2-135M: 3 % of its replies parsed without ``params[0]:``, 72 % with it,
  on the CPU default's prompts), so that GRPO trains the turn the search asks for; every reward reads the prefix
  and the completion together (a reply that starts with the answer has no ``<think>`` block: both format rewards
  are then 0 and only the policy and improvement rewards vary);
- each reward is a pure function of its arguments (the completions and the example's own columns); the settings
  they need are bound once by ``make_reward_funcs`` and never change:
  - ``format_soft``: a closed ``<think>…</think>`` block (any number of lines: the original's regex had no
    DOTALL, so any multi-line reasoning scored 0) followed by a non-empty answer;
  - ``format_hard``: soft, and the answer after ``</think>`` is accepted by the search's parser (exactly
    ``n_params`` values in the ``params[i]: x`` format, finite, in range, not the shown point; the original's
    regex never matched the format its prompt asked for);
  - ``policy``: the return R of one rollout of the proposed point, seeded by the example's ``rollout_seed``
    column, mapped to [0, 1] as clip((R - return_floor) / return_span, 0, 1) ((R + 200) / 300 on
    MountainCarContinuous, the original's mapping); 0 for a reply the search would reject;
  - ``improvement``: clip((R_new - R_old) / return_span, 0, 1) with R_old the example's own ``r_old`` column
    (the original read a module-level global set by the policy reward, and multiplied by R_new / R_old, which
    flips sign when R_old < 0 and divides by zero at R_old = 0; dividing by the fixed span keeps the sign of
    the improvement).
  All four completions of a group see the same example, so the same rollout seed: they differ only by the
  point proposed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmrl.agents.linear_policy import ParamEvaluator, policy_for
from llmrl.algos.grpo import RewardFunc, completion_text
from llmrl.algos.props_prompts import PromptSettings, format_example, parse_reply, render_search_prompt
from llmrl.envs.control import ControlTask

__all__ = ["ScoredVectors", "sample_scored_vectors", "split_indices", "build_records", "RewardSettings",
           "reply_texts", "accepted_replies", "format_soft", "format_hard", "policy_reward",
           "improvement_reward", "make_reward_funcs"]

SYSTEM_PROMPT = (
    "You are a numerical optimizer. First reason step by step inside <think> and </think>. "
    "After </think>, write only the new point on one line in this format: {format_example}"
)

_THINK_BLOCK = re.compile(r"<think>(.*?)</think>(.*)", re.DOTALL | re.IGNORECASE)


def answer_after_think(text: str) -> str | None:
    """The text after the first closed ``<think>…</think>`` block (multi-line), or None without one."""
    m = _THINK_BLOCK.search(text)
    return None if m is None else m.group(2)


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class ScoredVectors:
    params: np.ndarray  # (N, n_params), rounded to the prompt's decimals
    returns: np.ndarray  # (N, episodes) per-episode returns
    seeds: np.ndarray  # (N, episodes) reset seeds of those episodes


def sample_scored_vectors(task: ControlTask, n: int, episodes: int, *, low: float, high: float, decimals: int,
                          seed: int, max_episode_steps: int | None = None) -> ScoredVectors:
    """``n`` vectors ~ U(low, high) rounded to ``decimals`` (the precision the prompt asks for), each scored over
    ``episodes`` episodes with distinct reset seeds, all episodes stepped together."""
    policy = policy_for(task)
    rng = np.random.default_rng(seed)
    params = np.round(rng.uniform(low, high, size=(n, policy.n_params)), decimals)
    seeds = seed * 1_000_000 + np.arange(n * episodes, dtype=np.int64).reshape(n, episodes)
    evaluator = ParamEvaluator(task, max_episode_steps=max_episode_steps)
    try:
        returns = evaluator.returns(params, seeds)
    finally:
        evaluator.close()
    return ScoredVectors(params, returns, seeds)


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation of range(n) cut into train and test indices (test at least one when n > 1)."""
    order = np.random.default_rng(seed + 1).permutation(n)
    n_test = min(n - 1, max(1, round(n * test_fraction))) if n > 1 else 0
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def build_messages(task: ControlTask, history_params: Sequence[float], history_value: float,
                   settings: PromptSettings, *, iteration: int, total_iterations: int) -> list[dict]:
    """The chat of one example: the system message and the search's numeric prompt with one history entry."""
    policy = policy_for(task)
    user = render_search_prompt("numeric", task=task, policy=policy, history=[(history_params, history_value)],
                                iteration=iteration, total_iterations=total_iterations, settings=settings)
    return [{"role": "system", "content": SYSTEM_PROMPT.format(format_example=format_example(policy.n_params))},
            {"role": "user", "content": user}]


def build_records(task: ControlTask, data: ScoredVectors, indices: Sequence[int], settings: PromptSettings, *,
                  iteration: int, total_iterations: int, rollout_seed_base: int, answer_prefix: str = "") -> list[dict]:
    """One example per vector: its chat prompt and the columns the rewards read (``old_params``, ``r_old`` = the
    mean return shown in the prompt, ``rollout_seed``, ``answer_prefix``: the text the reply starts with, the
    prompt's final assistant message when not empty)."""
    records = []
    for i in indices:
        r_old = float(data.returns[i].mean())
        messages = build_messages(task, data.params[i].tolist(), r_old, settings, iteration=iteration,
                                  total_iterations=total_iterations)
        records.append({
            "id": int(i),
            "prompt": messages + ([{"role": "assistant", "content": answer_prefix}] if answer_prefix else []),
            "old_params": [float(x) for x in data.params[i]],
            "r_old": r_old,
            "rollout_seed": int(rollout_seed_base + i),
            "answer_prefix": answer_prefix,
        })
    return records


# ------------------------------------------------------------------------------------------------ rewards


@dataclass(frozen=True)
class RewardSettings:
    """What the rewards need besides their inputs; fixed for a run."""

    task: ControlTask
    n_params: int
    low: float
    high: float
    return_floor: float  # return mapped to 0 by the policy reward
    return_span: float  # returns return_floor + return_span and above map to 1
    max_episode_steps: int | None = None


def reply_texts(completions, answer_prefix: Sequence[str] | None) -> list[str]:
    """Each whole reply: the example's ``answer_prefix`` (TRL passes the column, one per completion) and the
    completion the model wrote after it."""
    prefixes = answer_prefix if answer_prefix is not None else [""] * len(completions)
    return [(p or "") + completion_text(c) for p, c in zip(prefixes, completions)]


def format_soft(completions, answer_prefix=None, **_) -> list[float]:
    """1.0 where a closed ``<think>…</think>`` block (multi-line allowed) is followed by a non-empty answer."""
    out = []
    for text in reply_texts(completions, answer_prefix):
        answer = answer_after_think(text)
        out.append(float(answer is not None and answer.strip() != ""))
    return out


def _accepted(text: str, old_params, s: RewardSettings, *, need_think: bool) -> np.ndarray | None:
    """The point the search would accept from this reply (its parser, the shown point as current), or None."""
    if need_think:
        text = answer_after_think(text)
        if text is None:
            return None
    parsed = parse_reply(text, s.n_params, s.low, s.high, current=old_params)
    return parsed.params if parsed.ok else None


def accepted_replies(completions, old_params, answer_prefix=None, *, settings: RewardSettings) -> list[float]:
    """1.0 where the search's parser accepts the whole reply, no think block needed: the replies the search would
    not re-ask (not a reward; ``props_grpo`` records its rate per step)."""
    return [float(_accepted(t, o, settings, need_think=False) is not None)
            for t, o in zip(reply_texts(completions, answer_prefix), old_params)]


def format_hard(completions, old_params, answer_prefix=None, *, settings: RewardSettings, **_) -> list[float]:
    """1.0 where the think block is there and the answer after it passes the search's strict parser."""
    return [float(_accepted(t, o, settings, need_think=True) is not None)
            for t, o in zip(reply_texts(completions, answer_prefix), old_params)]


def rollout_returns(completions, old_params, rollout_seed, settings: RewardSettings,
                    answer_prefix: Sequence[str] | None = None) -> list[float | None]:
    """Return of one rollout per accepted proposal (seeded by the example's ``rollout_seed``); None if rejected."""
    points = [_accepted(t, o, settings, need_think=False)
              for t, o in zip(reply_texts(completions, answer_prefix), old_params)]
    rows = [i for i, p in enumerate(points) if p is not None]
    out: list[float | None] = [None] * len(points)
    if rows:
        evaluator = ParamEvaluator(settings.task, max_episode_steps=settings.max_episode_steps)
        try:
            returns = evaluator.returns(np.stack([points[i] for i in rows]),
                                        np.asarray([[rollout_seed[i]] for i in rows], dtype=np.int64))
        finally:
            evaluator.close()
        for i, r in zip(rows, returns[:, 0]):
            out[i] = float(r)
    return out


def policy_reward(completions, old_params, rollout_seed, answer_prefix=None, *, settings: RewardSettings,
                  **_) -> list[float]:
    """clip((R - return_floor) / return_span, 0, 1) of one rollout of the proposed point; 0 when rejected."""
    returns = rollout_returns(completions, old_params, rollout_seed, settings, answer_prefix)
    return [0.0 if r is None else float(np.clip((r - settings.return_floor) / settings.return_span, 0.0, 1.0))
            for r in returns]


def improvement_reward(completions, old_params, rollout_seed, r_old, answer_prefix=None, *,
                       settings: RewardSettings, **_) -> list[float]:
    """clip((R_new - R_old) / return_span, 0, 1), R_old the example's own ``r_old``; 0 when rejected."""
    returns = rollout_returns(completions, old_params, rollout_seed, settings, answer_prefix)
    return [0.0 if r is None else float(np.clip((r - old) / settings.return_span, 0.0, 1.0))
            for r, old in zip(returns, r_old)]


def make_reward_funcs(settings: RewardSettings) -> list[RewardFunc]:
    """The four rewards with their settings bound, named as TRL logs them (``rewards/<name>/mean``)."""

    def bind(fn, name):
        def reward(*args, **kwargs):
            return fn(*args, settings=settings, **kwargs)

        reward.__name__ = name
        reward.__doc__ = fn.__doc__
        return reward

    return [format_soft, bind(format_hard, "format_hard"), bind(policy_reward, "policy"),
            bind(improvement_reward, "improvement")]
