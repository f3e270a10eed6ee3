"""Black-box baselines for ProPS at the same episode budget: uniform random search and the cross-entropy method.

Both search the same parameter space (``props.space``) for the same policy family and spend the same number of
episodes per seed as a ProPS search (``iterations × episodes_per_eval``); every episode counts.

- Random search: each iteration draws one uniform point and scores it over ``episodes_per_eval`` episodes on the
  very episode seeds ProPS uses at that iteration (common random numbers); the final policy is the best point.
- Hill climbing ("best so far + Gaussian step"): the first point is uniform, every later one the best point so far
  plus N(0, step^2) per coordinate, clipped to the range and rounded to the prompt's decimals; the final policy
  is the best point. It is what an optimizer that copies its best history line and perturbs it does.
- CEM: a diagonal Gaussian (mean at the range centre, ``init_std``) samples ``population`` candidates per
  generation, each scored over ``episodes_per_candidate`` episodes; the best ``elite_frac`` refit mean and std
  (std floored at ``min_std``, samples clipped to the range). Generations fill the budget exactly (a generation
  size that does not divide it is an error: every method of a table spends the same episodes); the final
  policy is the distribution mean. Its ``best_return`` is the best candidate's mean over its few episodes, an
  optimistic figure: compare methods on the held-out evaluation of their final policies.

``rep`` (0 by default) gives a method a further independent stream per search seed, so that one function or task
can be searched several times (repetitions of a run on the same item).

Several seeds advance in lockstep so their episodes are evaluated in one batch. Both run on control tasks (at the
horizon ``search.max_episode_steps`` gives) and on the environment-free quadratic task. Rows use ProPS's vocabulary
(``step``, ``episodes``, ``return_mean``, ``best_return``, ``seconds``), one per seed per iteration/generation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from llmrl.agents.linear_policy import objective_for
from llmrl.algos.props_search import SEED_STRIDE, episode_seeds, random_point, search_task
from llmrl.config.props import CEMParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import ControlTask, QuadraticTask

__all__ = ["BlackboxState", "random_search", "hill_climb", "cem"]


def _stream(seed: int, salt: int, rep: int) -> list[int]:
    """A method's generator seed for one search seed; repetition 0 keeps the streams of runs made before ``rep``."""
    return [seed, salt] + ([rep] if rep else [])


@dataclass
class BlackboxState:
    method: str
    seed: int
    rng: np.random.Generator
    best_params: np.ndarray | None = None
    best_return: float = -np.inf
    final_params: np.ndarray | None = None
    episodes: int = 0


def random_search(
    task: str | ControlTask | QuadraticTask,
    seeds: Sequence[int],
    search: PropsSearchParams,
    space: PropsSpaceParams,
    *,
    states_out: list[BlackboxState] | None = None,
    rep: int = 0,
) -> Iterator[dict]:
    t = search_task(search, task)
    ev = objective_for(t)
    n = ev.n_params
    states = [BlackboxState("random_search", s, np.random.default_rng(_stream(s, 104729, rep))) for s in seeds]
    if states_out is not None:
        states_out.extend(states)
    try:
        for it in range(1, search.iterations + 1):
            t0 = time.perf_counter()
            points = np.stack([random_point(st.rng, n, space) for st in states])
            seed_mat = np.stack([episode_seeds(st.seed, it, search.episodes_per_eval) for st in states])
            means = ev.returns(points, seed_mat, search_seeds=[st.seed for st in states]).mean(axis=1)
            seconds = time.perf_counter() - t0
            for st, x, m in zip(states, points, means):
                st.episodes += search.episodes_per_eval
                if m > st.best_return:
                    st.best_return, st.best_params = float(m), x
                st.final_params = st.best_params
                yield {"task": t.key, "method": st.method, "seed": st.seed, "step": it, "episodes": st.episodes,
                       "return_mean": float(m), "best_return": st.best_return, "seconds": seconds}
    finally:
        ev.close()


def hill_climb(
    task: str | ControlTask | QuadraticTask,
    seeds: Sequence[int],
    search: PropsSearchParams,
    space: PropsSpaceParams,
    step: float,
    *,
    states_out: list[BlackboxState] | None = None,
    rep: int = 0,
) -> Iterator[dict]:
    """Best so far + N(0, step^2) per coordinate (module doc), one point per iteration, on random search's episode
    seeds."""
    if not step > 0:
        raise ValueError(f"hill_climb step: must be > 0, got {step}")
    t = search_task(search, task)
    ev = objective_for(t)
    n = ev.n_params
    states = [BlackboxState("hill_climb", s, np.random.default_rng(_stream(s, 3_571, rep))) for s in seeds]
    if states_out is not None:
        states_out.extend(states)
    try:
        for it in range(1, search.iterations + 1):
            t0 = time.perf_counter()
            points = np.stack([
                random_point(st.rng, n, space) if st.best_params is None else
                np.round(np.clip(st.best_params + st.rng.normal(0.0, step, size=n), space.low, space.high),
                         space.decimals)
                for st in states])
            seed_mat = np.stack([episode_seeds(st.seed, it, search.episodes_per_eval) for st in states])
            means = ev.returns(points, seed_mat, search_seeds=[st.seed for st in states]).mean(axis=1)
            seconds = time.perf_counter() - t0
            for st, x, m in zip(states, points, means):
                st.episodes += search.episodes_per_eval
                if m > st.best_return:
                    st.best_return, st.best_params = float(m), x
                st.final_params = st.best_params
                yield {"task": t.key, "method": st.method, "seed": st.seed, "step": it, "episodes": st.episodes,
                       "return_mean": float(m), "best_return": st.best_return, "seconds": seconds}
    finally:
        ev.close()


def cem(
    task: str | ControlTask | QuadraticTask,
    seeds: Sequence[int],
    search: PropsSearchParams,
    space: PropsSpaceParams,
    p: CEMParams,
    *,
    states_out: list[BlackboxState] | None = None,
    rep: int = 0,
) -> Iterator[dict]:
    t = search_task(search, task)
    budget = search.iterations * search.episodes_per_eval
    per_gen = p.population * p.episodes_per_candidate
    if per_gen > budget or budget % per_gen:
        raise ValueError(f"props.baselines.cem: a generation needs {per_gen} episodes, which must divide the budget "
                         f"{budget} (every method spends the same episodes)")
    ev = objective_for(t)
    n = ev.n_params
    n_elite = max(1, int(round(p.elite_frac * p.population)))
    states = [BlackboxState("cem", s, np.random.default_rng(_stream(s, 15485863, rep))) for s in seeds]
    if states_out is not None:
        states_out.extend(states)
    centre = (space.low + space.high) / 2
    mean = np.full((len(states), n), centre)
    std = np.full((len(states), n), p.init_std)
    try:
        gen = 0
        while states[0].episodes + per_gen <= budget:
            gen += 1
            t0 = time.perf_counter()
            cands = np.stack([np.clip(st.rng.normal(mean[k], std[k], size=(p.population, n)), space.low, space.high)
                              for k, st in enumerate(states)])  # (S, pop, n)
            seed_mat = np.stack([
                (st.seed * SEED_STRIDE + st.episodes + np.arange(per_gen)).reshape(p.population, -1)
                for st in states])  # (S, pop, epc): consecutive fresh episode seeds of each search seed
            owners = np.repeat([st.seed for st in states], p.population)
            scores = ev.returns(cands.reshape(-1, n), seed_mat.reshape(-1, p.episodes_per_candidate),
                                search_seeds=owners).mean(axis=1)
            scores = scores.reshape(len(states), p.population)
            seconds = time.perf_counter() - t0
            for k, st in enumerate(states):
                elite = cands[k][np.argsort(-scores[k], kind="stable")[:n_elite]]
                mean[k] = elite.mean(axis=0)
                std[k] = np.maximum(elite.std(axis=0), p.min_std)
                st.episodes += per_gen
                top = int(np.argmax(scores[k]))
                if scores[k][top] > st.best_return:
                    st.best_return, st.best_params = float(scores[k][top]), cands[k][top]
                st.final_params = mean[k].copy()
                yield {"task": t.key, "method": st.method, "seed": st.seed, "step": gen, "episodes": st.episodes,
                       "return_mean": float(scores[k].mean()), "best_return": st.best_return, "seconds": seconds}
    finally:
        ev.close()
