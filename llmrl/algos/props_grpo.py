"""GRPO fine-tuning of the ProPS optimizer LLM: the data set of scored parameter vectors, the prompt, four rewards.

The original (``finetune.py`` of sachingrover211/llm-rl_finetune) sampled 4,000 MountainCarContinuous parameter
vectors, scored each over 20 episodes, and asked the LLM, shown one of them as the only history entry, for a
better point; the completions were rewarded for their format and for the return of the point they proposed.
What carries over, and what is done differently here:
- vectors are drawn from the ONE parameter range of ``props.space`` (the original drew from [-10, 10] while its
  prompt allowed [-6, 6]) and scored at the task's horizon, the one the search runs and the prompt states;
- the chat is the search's own (``props_prompts.search_messages``): the one ProPS system message and the numeric
  template with one history entry, so the tuned model is asked in search exactly as it was trained (the
  original trained with a system prompt asking for ``<think>…</think><policy>…</policy>`` that its search never
  sent);
- the assistant turn may be opened with an ``answer_prefix`` (a final assistant message, which
  ``llmrl.algos.grpo`` continues), as the search opens it for a model too small to start in the format
  (SmolLM2-135M: 3 % of its replies parsed without ``params[0]:``, 72 % with it); every reward reads the prefix
  and the completion together, so each can be earned under the prefix;
- each reward is a pure function of its arguments (the completions and the example's own columns); the settings
  they need are bound once by ``make_reward_funcs``:
  - ``format_soft``: the answer line (the first line naming ``params[``, after an optional closed ``<think>``
    block) is made of well-formed ``params[i]: number`` items, each index once, no placeholder copied, a
    trailing ``f(params)`` echo allowed; the count, range and novelty are not asked (the original: its tags);
  - ``format_hard``: the search's strict parser accepts the reply (exact count, in range, not the shown point;
    the original's regex never matched the format its prompt asked for);
  - ``policy``: the return R of one rollout of the proposed point, seeded by the example's ``rollout_seed``
    column, normalised as norm(R) = clip((R - return_floor) / return_span, 0, 1) ((R + 200) / 300 on
    MountainCarContinuous, the original's mapping); 0 for a reply the search would reject;
  - ``improvement``: the original's formula on normalised returns, with n = norm(R_new), o = norm(R_old):
    clip((n - o) * n / o, 0, 1), and n where o = 0 (the original's guard); R_old is the example's own ``r_old``
    column (the original read a module-level global set by the policy reward); 0 for a rejected reply.
  ``policy`` and ``improvement`` share one rollout per proposal (``RolloutMemo``, bound by ``make_reward_funcs``;
  the original shared it through that global): a proposed point is rolled out once per rollout seed.
  All completions of a group see the same example, so the same rollout seed: they differ only by the point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmrl.agents.linear_policy import ParamEvaluator, policy_for
from llmrl.algos.grpo import RewardFunc, completion_text
from llmrl.algos.props_prompts import PromptSettings, parse_reply, search_messages
from llmrl.config.props import PropsGRPOParams, PropsSpaceParams
from llmrl.envs.control import ControlTask

__all__ = ["ScoredVectors", "sample_scored_vectors", "split_indices", "build_records", "FineTuneData",
           "fine_tune_data", "RewardSettings", "reply_texts", "accepted_replies", "normalised_return", "RolloutMemo",
           "format_soft", "format_hard", "policy_reward", "improvement_reward", "make_reward_funcs",
           "training_summary", "MALFORMED"]

# Parser verdicts that say the answer line itself is malformed; the others (count, range, non-finite, the shown
# point) judge a well-formed line.
MALFORMED = {"no_answer", "example_copy", "junk", "repeated_index"}


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class ScoredVectors:
    params: np.ndarray  # (N, n_params), rounded to the prompt's decimals
    returns: np.ndarray  # (N, episodes) per-episode returns
    seeds: np.ndarray  # (N, episodes) reset seeds of those episodes


def sample_scored_vectors(task: ControlTask, n: int, episodes: int, *, low: float, high: float, decimals: int,
                          seed: int) -> ScoredVectors:
    """``n`` vectors ~ U(low, high) rounded to ``decimals`` (the precision the prompt asks for), each scored over
    ``episodes`` episodes at the task's horizon with distinct reset seeds, all episodes stepped together."""
    policy = policy_for(task)
    rng = np.random.default_rng(seed)
    params = np.round(rng.uniform(low, high, size=(n, policy.n_params)), decimals)
    seeds = seed * 1_000_000 + np.arange(n * episodes, dtype=np.int64).reshape(n, episodes)
    evaluator = ParamEvaluator(task)
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
    """The chat of one example: the search's own (system message, numeric prompt) with one history entry."""
    return search_messages("numeric", task=task, policy=policy_for(task), history=[(history_params, history_value)],
                           iteration=iteration, total_iterations=total_iterations, settings=settings)


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


@dataclass(frozen=True)
class FineTuneData:
    """The fine-tune's data: the scored vectors, their train/test split, and one example per vector of each split
    (``records["train"]``, ``records["test"]``; only the train split is trained on)."""

    vectors: ScoredVectors
    train: np.ndarray  # indices into vectors
    test: np.ndarray
    records: dict[str, list[dict]]

    def vector_rows(self) -> list[dict]:
        """Every scored vector with its split, its per-episode returns and their reset seeds."""
        held_out = set(self.test.tolist())
        v = self.vectors
        return [{"id": i, "split": "test" if i in held_out else "train", "params": v.params[i].tolist(),
                 "returns": v.returns[i].tolist(), "seeds": v.seeds[i].tolist()} for i in range(len(v.params))]


def fine_tune_data(task: ControlTask, p: PropsGRPOParams, space: PropsSpaceParams) -> FineTuneData:
    """``p.vectors`` vectors from the one range of ``space``, scored over ``p.episodes`` episodes at ``task``'s
    horizon, split ``p.test_fraction`` held out, each shown in the search's prompt (its step size and optimum hint
    as ``p`` asks); the reward rollouts' seeds never reuse a scoring episode's."""
    vectors = sample_scored_vectors(task, p.vectors, p.episodes, low=space.low, high=space.high,
                                    decimals=space.decimals, seed=p.seed)
    train, test = split_indices(p.vectors, p.test_fraction, p.seed)
    settings = PromptSettings(low=space.low, high=space.high, decimals=space.decimals,
                              step_size=p.step_size or task.step_size,
                              optimum=task.optimum if p.optimum_hint else None, episodes=p.episodes)
    rollout_seed_base = (p.seed + 1) * 1_000_000_000
    records = {split: build_records(task, vectors, idx, settings, iteration=p.iteration,
                                    total_iterations=p.total_iterations, rollout_seed_base=rollout_seed_base,
                                    answer_prefix=p.answer_prefix)
               for split, idx in (("train", train), ("test", test))}
    return FineTuneData(vectors, train, test, records)


# ------------------------------------------------------------------------------------------------ rewards


@dataclass(frozen=True)
class RewardSettings:
    """What the rewards need besides their inputs; fixed for a run. Rollouts run at ``task``'s horizon."""

    task: ControlTask
    n_params: int
    low: float
    high: float
    return_floor: float  # return normalised to 0
    return_span: float  # returns return_floor + return_span and above normalise to 1


def reply_texts(completions, answer_prefix: Sequence[str] | None) -> list[str]:
    """Each whole reply: the example's ``answer_prefix`` (TRL passes the column, one per completion) and the
    completion the model wrote after it."""
    prefixes = answer_prefix if answer_prefix is not None else [""] * len(completions)
    return [(p or "") + completion_text(c) for p, c in zip(prefixes, completions)]


def normalised_return(r: float, s: RewardSettings) -> float:
    """clip((r - return_floor) / return_span, 0, 1): the original's (R + 200) / 300 on MountainCarContinuous."""
    return float(np.clip((r - s.return_floor) / s.return_span, 0.0, 1.0))


def _parsed(text: str, old_params, s: RewardSettings):
    return parse_reply(text, s.n_params, s.low, s.high, current=old_params)


def format_soft(completions, answer_prefix=None, *, settings: RewardSettings, **_) -> list[float]:
    """1.0 where the answer line is made of well-formed ``params[i]: number`` items (count, range and novelty
    aside; module doc)."""
    return [float(_parsed(t, None, settings).error not in MALFORMED)
            for t in reply_texts(completions, answer_prefix)]


def _accepted(text: str, old_params, s: RewardSettings) -> np.ndarray | None:
    """The point the search would accept from this reply (its parser, the shown point as current), or None."""
    parsed = _parsed(text, old_params, s)
    return parsed.params if parsed.ok else None


def accepted_replies(completions, old_params, answer_prefix=None, *, settings: RewardSettings) -> list[float]:
    """1.0 where the search's parser accepts the whole reply: the replies the search would not re-ask (not a
    reward; ``props_grpo`` records its rate per step)."""
    return [float(_accepted(t, o, settings) is not None)
            for t, o in zip(reply_texts(completions, answer_prefix), old_params)]


def format_hard(completions, old_params, answer_prefix=None, *, settings: RewardSettings, **_) -> list[float]:
    """1.0 where the search's strict parser accepts the reply."""
    return accepted_replies(completions, old_params, answer_prefix, settings=settings)


class RolloutMemo:
    """Returns of rolled-out proposals keyed by (point, rollout seed): the policy and improvement rewards of one
    batch roll each proposal out once. Holds the last ``keep`` entries."""

    def __init__(self, keep: int = 4096):
        self.keep = keep
        self.returns: dict[tuple, float] = {}
        self.rollouts = 0  # episodes actually played

    def get(self, points: Sequence[np.ndarray], seeds: Sequence[int], s: RewardSettings) -> list[float]:
        keys = [(tuple(float(x) for x in p), int(seed)) for p, seed in zip(points, seeds)]
        known = {k: self.returns[k] for k in keys if k in self.returns}
        todo = [k for k in dict.fromkeys(keys) if k not in known]
        if todo:
            evaluator = ParamEvaluator(s.task)
            try:
                got = evaluator.returns(np.asarray([k[0] for k in todo]), np.asarray([[k[1]] for k in todo]))
            finally:
                evaluator.close()
            self.rollouts += len(todo)
            fresh = {k: float(r) for k, r in zip(todo, got[:, 0])}
            known.update(fresh)
            if len(self.returns) + len(fresh) > self.keep:
                self.returns.clear()
            self.returns.update(fresh)
        return [known[k] for k in keys]


def rollout_returns(completions, old_params, rollout_seed, settings: RewardSettings,
                    answer_prefix: Sequence[str] | None = None,
                    memo: RolloutMemo | None = None) -> list[float | None]:
    """Return of one rollout per accepted proposal (seeded by the example's ``rollout_seed``); None if rejected."""
    points = [_accepted(t, o, settings) for t, o in zip(reply_texts(completions, answer_prefix), old_params)]
    rows = [i for i, p in enumerate(points) if p is not None]
    out: list[float | None] = [None] * len(points)
    if rows:
        got = (memo or RolloutMemo()).get([points[i] for i in rows], [rollout_seed[i] for i in rows], settings)
        for i, r in zip(rows, got):
            out[i] = r
    return out


def policy_reward(completions, old_params, rollout_seed, answer_prefix=None, *, settings: RewardSettings,
                  memo: RolloutMemo | None = None, **_) -> list[float]:
    """norm(R) of one rollout of the proposed point; 0 when rejected."""
    returns = rollout_returns(completions, old_params, rollout_seed, settings, answer_prefix, memo)
    return [0.0 if r is None else normalised_return(r, settings) for r in returns]


def improvement_reward(completions, old_params, rollout_seed, r_old, answer_prefix=None, *,
                       settings: RewardSettings, memo: RolloutMemo | None = None, **_) -> list[float]:
    """The original's clip((n - o) * n / o, 0, 1) on normalised returns n = norm(R_new), o = norm(R_old), and n
    where o = 0; 0 when rejected."""
    returns = rollout_returns(completions, old_params, rollout_seed, settings, answer_prefix, memo)
    out = []
    for r, old in zip(returns, r_old):
        if r is None:
            out.append(0.0)
            continue
        n, o = normalised_return(r, settings), normalised_return(old, settings)
        out.append(n if o == 0 else float(np.clip((n - o) * n / o, 0.0, 1.0)))
    return out


def make_reward_funcs(settings: RewardSettings, memo: RolloutMemo | None = None) -> list[RewardFunc]:
    """The four rewards with their settings and one shared ``RolloutMemo`` bound, named as TRL logs them
    (``rewards/<name>/mean``)."""
    memo = memo if memo is not None else RolloutMemo()

    def bind(fn, name, **bound):
        def reward(*args, **kwargs):
            return fn(*args, settings=settings, **bound, **kwargs)

        reward.__name__ = name
        reward.__doc__ = fn.__doc__
        return reward

    return [bind(format_soft, "format_soft"), bind(format_hard, "format_hard"),
            bind(policy_reward, "policy", memo=memo), bind(improvement_reward, "improvement", memo=memo)]


# ------------------------------------------------------------------------------------------------ the result


def training_summary(rows: Sequence[dict], completions: Sequence[dict], vectors: ScoredVectors,
                     settings: RewardSettings) -> dict:
    """What a fine-tune did, from its training rows (``llmrl.algos.grpo.train``) and every sampled completion (its
    ``step``, ``id`` of the vector shown, ``answer_prefix``, ``completion`` and ``reward_format_hard``): the steps
    and completions; the share of whole replies (prefix + completion) the search's strict parser accepts at the
    first and last step and over all, i.e. one minus its parse failures; the mean reward and the hard-format
    reward's rate at the first and last step that logged them, and the hard-format rate over all completions."""
    def first_last(key: str) -> list[float | None]:
        values = [r[key] for r in rows if key in r]
        return [values[0], values[-1]] if values else [None, None]

    accepted = accepted_replies([c["completion"] for c in completions],
                                [vectors.params[c["id"]].tolist() for c in completions],
                                [c["answer_prefix"] for c in completions], settings=settings)
    steps = sorted({c["step"] for c in completions})

    def accepted_at(step) -> float:
        at = [a for a, c in zip(accepted, completions) if c["step"] == step]
        return round(sum(at) / len(at), 4)

    return {
        "steps": len(rows),
        "completions": len(completions),
        "accepted_rate_first_last": [accepted_at(steps[0]), accepted_at(steps[-1])] if steps else [None, None],
        "accepted_rate_all": round(sum(accepted) / len(accepted), 4) if accepted else None,
        "reward_mean_first_last": first_last("reward_mean"),
        "format_hard_rate_first_last": first_last("reward_format_hard"),
        "format_hard_rate_all": (sum(c["reward_format_hard"] for c in completions) / len(completions)
                                 if completions else None),
    }
