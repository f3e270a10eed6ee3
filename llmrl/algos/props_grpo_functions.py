"""GRPO data and rewards that teach in-context optimisation: episodes on cheap objective functions.

The CPU tiers' recipe for fine-tuning the ProPS optimizer (the paper profile keeps the original's MountainCar
recipe, ``llmrl.algos.props_grpo``). Each example is one step of an optimisation run on a function of
``llmrl.envs.functions``: the prompt is the ProPS search's own chat (``props_prompts.search_messages``, numeric
template, system message, the answer opened with ``answer_prefix`` as the search opens it) holding a history of k
evaluated points, k drawn from [history_min, history_max] (k = 0: the search's first turn, "No point has been
evaluated yet"), produced by

- ``random``: k points uniform in the parameter range (random search's history), or
- ``hill_climb``: a partial hill-climbing run (a uniform first point, then best so far + N(0, sigma^2) with sigma
  log-uniform over ``hill_step``), i.e. the history of a search that has started to converge.

Beside these made-up histories, ``loop_functions`` > 0 adds the search's own prompts (``search_loop_examples``): the
base model runs the ProPS search on train (and validation) functions at the held-out test's settings, and every
exchange it had becomes an example, the chat exactly as the search sent it: its own proposals, repeats and fallback
draws in the history, the oldest entries dropped to the prompt budget, and the re-asks (its rejected reply and the
correction) that a one-step example never shows. Their replies are scored against every point evaluated before the
turn and parsed as the search parses them (a copy of the search's current point is rejected).

Training examples come from the ``train`` split only, validation examples (checkpoint selection) from the
``validation`` split; the ``test`` split is never built here (``function_records`` refuses it).

Rewards (each a pure function of the completions and the example's columns; ``score_reply`` is the one place a
reply is judged, parsed by the search's strict parser, with no "current" point for a made-up history and the
search's current point for its own turns; duplicates judged apart):

- ``improvement``: (f(x) - best) / (optimum - best) clipped to [0, 1], where best is the best value in the
  history: the share of the remaining gap to the optimum the proposal closes (per function, so functions of
  different scales weigh alike); 0 when the point is not better, unparsable or a duplicate,
  and on an empty history;
- ``parse_penalty``: -1 when the strict parser rejects the reply (count, range, malformed line), else 0;
- ``duplicate_penalty``: -1 when the point equals one already in the history, else 0;
- ``format``: 1 when the answer line is made of well-formed ``params[i]: number`` items (``props_grpo``'s
  ``format_soft``: count, range and novelty aside), else 0.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmrl.agents.linear_policy import PlainVector
from llmrl.algos.grpo import RewardFunc
from llmrl.algos.props_grpo import MALFORMED, reply_texts
from llmrl.algos.props_function_search import function_task, search_budget
from llmrl.algos.props_prompts import PromptSettings, parse_reply, search_messages
from llmrl.algos.props_search import OptimizerLLM, SearchState, props_search
from llmrl.config.props import (PropsFunctionDataParams, PropsGRPOParams, PropsHeldoutParams, PropsLLMParams,
                                PropsSearchParams, PropsSpaceParams)
from llmrl.envs.functions import FunctionTask, TestFunction, draw_function

__all__ = ["PRODUCERS", "history_for", "function_records", "ReplyOutcome", "score_reply", "improvement_reward",
           "parse_penalty", "duplicate_penalty", "format_reward", "make_function_rewards", "outcome_rates", "GRPOData",
           "grpo_data", "reply_outcomes", "loop_examples", "search_loop_examples", "mix_examples"]

PRODUCERS = ("random", "hill_climb")


def history_for(fn: TestFunction, k: int, producer: str, rng: np.random.Generator, space: PropsSpaceParams,
                hill_step: tuple[float, float]) -> list[tuple[list[float], float]]:
    """k evaluated points of ``fn`` as ``producer`` makes them (module doc), rounded to the prompt's decimals;
    values exact."""
    if producer not in PRODUCERS:
        raise ValueError(f"producer: must be one of {PRODUCERS}, got {producer!r}")
    points: list[np.ndarray] = []
    values: list[float] = []
    sigma = float(np.exp(rng.uniform(np.log(hill_step[0]), np.log(hill_step[1]))))
    for _ in range(k):
        if producer == "random" or not points:
            x = np.round(rng.uniform(space.low, space.high, size=fn.dim), space.decimals)
        else:
            best = points[int(np.argmax(values))]
            x = np.round(np.clip(best + rng.normal(0.0, sigma, size=fn.dim), space.low, space.high), space.decimals)
        points.append(x)
        values.append(float(fn.values(x)))
    return [([float(v) for v in p], val) for p, val in zip(points, values)]


def function_records(split: str, n: int, p: PropsFunctionDataParams, space: PropsSpaceParams, *,
                     optimum_hint: bool, total_iterations: int, answer_prefix: str) -> list[dict]:
    """``n`` examples on functions of ``split`` (train or validation): one function each (index i of the split,
    dimension drawn from ``p.dims``), a history of k points from a producer drawn by ``p.random_share``, the
    search's chat, and the columns the rewards read (``function``: the function as JSON, ``history``: the points
    and values as JSON, ``answer_prefix``)."""
    if split not in ("train", "validation"):
        raise ValueError(f"split: GRPO examples come from 'train' or 'validation' functions only, got {split!r}")
    rng = np.random.default_rng([p.seed, {"train": 0, "validation": 1}[split], 4_201])
    records = []
    for i in range(n):
        dim = int(rng.choice(p.dims))
        fn = draw_function(split, i, dim, centre_range=p.centre_range, curvature=tuple(p.curvature))
        k = int(rng.integers(p.history_min, p.history_max + 1))
        producer = "random" if rng.random() < p.random_share else "hill_climb"
        history = history_for(fn, k, producer, rng, space, tuple(p.hill_step))
        task = FunctionTask(split, dim, optimum=fn.optimum, step_size=p.step_size)
        settings = PromptSettings(low=space.low, high=space.high, decimals=space.decimals, step_size=p.step_size,
                                  optimum=fn.optimum if optimum_hint else None, episodes=1)
        messages = search_messages("numeric", task=task, policy=PlainVector(dim), history=history,
                                   iteration=k + 1, total_iterations=total_iterations, settings=settings)
        records.append({
            "id": i, "split": split, "dim": dim, "family": fn.family, "producer": producer, "k": k,
            "prompt": messages + ([{"role": "assistant", "content": answer_prefix}] if answer_prefix else []),
            "function": fn.to_json(),
            "history": json.dumps(history),
            "current": "null",
            "attempt": 0,
            "answer_prefix": answer_prefix,
        })
    return records


def loop_examples(states: Sequence[SearchState], task: FunctionTask, answer_prefix: str) -> list[dict]:
    """One example per exchange of the finished searches ``states`` on ``task``'s functions (ids left to the
    caller): the chat the search sent (answer prefix opened), the function, every point evaluated before the turn
    and the search's current point then."""
    out = []
    for st in states:
        fn = task.function(st.seed)
        for rec in st.records:
            before = [([float(x) for x in params], float(value)) for params, value in st.history[:rec["iteration"] - 1]]
            current = before[-1][0] if before else None
            for ex in rec["exchanges"]:
                if "messages" not in ex:  # an LLM fault: nothing was asked of the model
                    continue
                out.append({
                    "id": -1, "split": task.split, "dim": task.n_params, "family": fn.family, "producer": "search",
                    "k": len(before),
                    "prompt": ex["messages"] + ([{"role": "assistant", "content": answer_prefix}] if answer_prefix
                                                else []),
                    "function": fn.to_json(), "history": json.dumps(before), "current": json.dumps(current),
                    "attempt": ex["attempt"], "answer_prefix": answer_prefix,
                })
    return out


def search_loop_examples(optimizer: OptimizerLLM, split: str, functions: Sequence[int], g: PropsGRPOParams,
                         search: PropsSearchParams, h: PropsHeldoutParams, space: PropsSpaceParams,
                         llm_p: PropsLLMParams) -> list[dict]:
    """``optimizer``'s ProPS searches of ``split``'s functions ``functions`` in the held-out test's dimensions and at
    its settings, as examples (``loop_examples``). Train and validation functions only: the test split never reaches
    GRPO."""
    if split not in ("train", "validation"):
        raise ValueError(f"split: the search's examples come from 'train' or 'validation' functions, got {split!r}")
    budget = search_budget(search, h)
    out: list[dict] = []
    for dim in h.dims:
        task = function_task(split, dim, g)
        states: list[SearchState] = []
        for _ in props_search(task, ["props"], list(functions), optimizer, budget, space, llm_p, states_out=states):
            pass
        out += loop_examples(states, task, llm_p.answer_prefix)
    return out


def mix_examples(made: Sequence[dict], searched: Sequence[dict], share: float, n: int,
                 rng: np.random.Generator) -> list[dict]:
    """``n`` examples, ``share`` of them (at most all of ``searched``) drawn without replacement from the search's
    own, the rest the first of ``made``; ids renumbered 0..n-1 in that order."""
    n_searched = min(len(searched), round(share * n))
    picked = [searched[i] for i in sorted(rng.choice(len(searched), n_searched, replace=False))] if n_searched else []
    return [dict(ex, id=i) for i, ex in enumerate([*made[:n - n_searched], *picked])]


# ------------------------------------------------------------------------------------------------ rewards


@dataclass(frozen=True)
class ReplyOutcome:
    """How one reply fares: parsed or why not, whether it repeats a history point, its value and improvement."""

    parsed: bool
    error: str | None
    well_formed: bool
    duplicate: bool
    value: float | None
    improvement: float  # share of the gap to the optimum closed, in [0, 1]; 0 unless parsed, new and better

    @property
    def improves(self) -> bool:
        return self.improvement > 0


def score_reply(text: str, fn: TestFunction, history: Sequence[tuple[Sequence[float], float]], low: float,
                high: float, current: Sequence[float] | None = None) -> ReplyOutcome:
    """Judge a whole reply (answer prefix included) against its example (module doc); ``current``: the search's
    current point, which the parser rejects a copy of (the search's own examples)."""
    parsed = parse_reply(text, fn.dim, low, high, current=None if current is None else np.asarray(current))
    well_formed = parsed.error not in MALFORMED
    if not parsed.ok:
        return ReplyOutcome(False, parsed.error, well_formed, False, None, 0.0)
    x = parsed.params
    duplicate = any(np.allclose(x, np.asarray(h, dtype=np.float64), rtol=0, atol=1e-9) for h, _ in history)
    value = float(fn.values(x))
    if not history:  # the search's first turn: nothing to improve on, only the format and the range count
        return ReplyOutcome(True, None, True, False, value, 0.0)
    best = max(v for _, v in history)
    gap = fn.optimum - best
    gain = 0.0 if duplicate or gap <= 0 else float(np.clip((value - best) / gap, 0.0, 1.0))
    return ReplyOutcome(True, None, True, duplicate, value, gain)


def _outcomes(completions, function, history, answer_prefix, low: float, high: float,
              current=None) -> list[ReplyOutcome]:
    current = current if current is not None else ["null"] * len(function)
    return [score_reply(t, TestFunction.from_json(f), json.loads(h), low, high, json.loads(c))
            for t, f, h, c in zip(reply_texts(completions, answer_prefix), function, history, current)]


def reply_outcomes(rows: Sequence[dict], records: Sequence[dict], low: float, high: float) -> list[ReplyOutcome]:
    """The outcome of each recorded reply (its ``completion`` and the ``id`` of its example in ``records``, whose
    answer prefix opened it)."""
    by_id = {r["id"]: r for r in records}
    out = []
    for r in rows:
        ex = by_id[r["id"]]
        out.append(score_reply((ex.get("answer_prefix") or "") + r["completion"], TestFunction.from_json(ex["function"]),
                               json.loads(ex["history"]), low, high, json.loads(ex.get("current", "null"))))
    return out


def improvement_reward(completions, function, history, answer_prefix=None, current=None, *, low: float,
                       high: float, **_) -> list[float]:
    """The share of the gap between the history's best and the optimum that the proposal closes (0 if none)."""
    return [o.improvement for o in _outcomes(completions, function, history, answer_prefix, low, high, current)]


def parse_penalty(completions, function, history, answer_prefix=None, current=None, *, low: float,
                  high: float, **_) -> list[float]:
    """-1 for a reply the search's strict parser rejects."""
    return [0.0 if o.parsed else -1.0
            for o in _outcomes(completions, function, history, answer_prefix, low, high, current)]


def duplicate_penalty(completions, function, history, answer_prefix=None, current=None, *, low: float,
                      high: float, **_) -> list[float]:
    """-1 for a point already in the history."""
    return [-1.0 if o.duplicate else 0.0
            for o in _outcomes(completions, function, history, answer_prefix, low, high, current)]


def format_reward(completions, function, history, answer_prefix=None, current=None, *, low: float,
                  high: float, **_) -> list[float]:
    """1 for a well-formed answer line (count, range and novelty aside)."""
    return [float(o.well_formed)
            for o in _outcomes(completions, function, history, answer_prefix, low, high, current)]


def make_function_rewards(space: PropsSpaceParams) -> list[RewardFunc]:
    """The four rewards with the parameter range bound, named as TRL logs them (``rewards/<name>/mean``)."""

    def bind(fn, name):
        def reward(*args, **kwargs):
            return fn(*args, low=space.low, high=space.high, **kwargs)

        reward.__name__ = name
        reward.__doc__ = fn.__doc__
        return reward

    return [bind(improvement_reward, "improvement"), bind(parse_penalty, "parse_penalty"),
            bind(duplicate_penalty, "duplicate_penalty"), bind(format_reward, "format")]


def outcome_rates(outcomes: Sequence[ReplyOutcome], weights: Sequence[float] | None = None) -> dict:
    """Shares of replies that improve on their history's best, repeat a history point or fail to parse, the mean
    improvement, and the mean total reward (the four rewards summed with ``weights``, TRL's sum)."""
    n = len(outcomes)
    if not n:
        raise ValueError("outcome_rates: no replies")
    w = list(weights) if weights is not None else [1.0, 1.0, 1.0, 1.0]
    total = [w[0] * o.improvement + w[1] * (0.0 if o.parsed else -1.0) + w[2] * (-1.0 if o.duplicate else 0.0)
             + w[3] * float(o.well_formed) for o in outcomes]
    return {"replies": n, "reward_mean": round(float(np.mean(total)), 4),
            "improvement_mean": round(float(np.mean([o.improvement for o in outcomes])), 4),
            "improve_rate": round(sum(o.improves for o in outcomes) / n, 4),
            "duplicate_rate": round(sum(o.duplicate for o in outcomes) / n, 4),
            "parse_failure_rate": round(sum(not o.parsed for o in outcomes) / n, 4)}


# ------------------------------------------------------------------------------------------------ the run's data


@dataclass
class GRPOData:
    """What a ProPS GRPO run trains and validates on: the training and validation examples, the reward functions,
    the example columns each recorded completion keeps, and a description for the metrics."""

    train: list[dict]
    validation: list[dict]
    reward_funcs: list[RewardFunc]
    keys: tuple[str, ...]
    describe: dict


def grpo_data(p, space: PropsSpaceParams, horizon: int | None, searched: dict[str, list[dict]] | None = None
              ) -> GRPOData:
    """The examples and rewards ``p`` (``PropsGRPOParams``) asks for: function episodes (``data: functions``,
    validation on the validation split's functions), with ``searched`` (the search's own examples by split,
    ``search_loop_examples``) mixed in at ``p.functions.loop_share``, or the original's scored control vectors
    (``data: control``, validation on the held-out vectors), at the search's ``horizon`` for a control task."""
    if p.data == "functions":
        f = p.functions
        kw = dict(optimum_hint=p.optimum_hint, total_iterations=p.total_iterations, answer_prefix=p.answer_prefix)
        train = function_records("train", f.train_examples, f, space, **kw)
        validation = function_records("validation", f.validation_examples, f, space, **kw)
        describe = {"data": "functions", "train_examples": len(train), "validation_examples": len(validation),
                    "dims": list(f.dims), "history": [f.history_min, f.history_max]}
        if searched:
            # a generator per split: the validation draw must not depend on how many train exchanges a seed's
            # searches produced, so every training seed validates on the same examples
            train = mix_examples(train, searched["train"], f.loop_share, f.train_examples,
                                 np.random.default_rng([f.seed, 7_331, 0]))
            validation = mix_examples(validation, searched["validation"], f.loop_share, f.validation_examples,
                                      np.random.default_rng([f.seed, 7_331, 1]))
            describe["search_examples"] = {
                split: {"available": len(searched[split]), "used": sum(ex["producer"] == "search" for ex in exs),
                        "reasks_used": sum(ex["producer"] == "search" and ex["attempt"] > 0 for ex in exs)}
                for split, exs in (("train", train), ("validation", validation))}
        describe["validation_digest"] = hashlib.sha256(json.dumps(validation, sort_keys=True).encode()).hexdigest()[:16]
        return GRPOData(train, validation, make_function_rewards(space),
                        ("id", "answer_prefix", "dim", "producer", "k", "attempt"), describe)
    from llmrl.algos.props_grpo import RewardSettings, fine_tune_data, make_reward_funcs
    from llmrl.envs.control import get_task

    task = get_task(p.task, horizon)
    data = fine_tune_data(task, p, space)
    n_params = len(data.records["train"][0]["old_params"])
    settings = RewardSettings(task=task, n_params=n_params, low=space.low, high=space.high,
                              return_floor=p.return_floor, return_span=p.return_span)
    return GRPOData(data.records["train"], data.records["test"], make_reward_funcs(settings), ("id", "answer_prefix"),
                    {"data": "control", "task": task.key, "vectors": p.vectors, "train_examples": len(data.train),
                     "validation_examples": len(data.test)})
