"""KALM evaluation: goal-conditioned policies on a level's goals, many episodes stepped in lockstep.

Protocol: episode j of a level plays goal ``goals[j % len(goals)]`` from ``reset(seed=first_seed + j)``, so every
policy meets the same goals and initial states. Episodes run until the env terminates (its own success checker)
or truncates at the level's step cap. All live episodes are stepped together so a d3rlpy policy predicts one
batch per step (the gymnasium vector envs need one env class per vector, and our episodes mix goals).
Environments are built once per (goal, slot) and reused across policies (Meta-World builds take ~1-2 s each).

Results aggregate over training seeds with ``llmrl.eval.seeds.aggregate_seeds`` (seed = unit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmrl.envs import kalm_levels as kl

__all__ = ["BatchAct", "EpisodeOutcome", "EnvPool", "run_level", "offline_act", "random_act", "grounded_act",
           "evaluate_benchmark"]

# act(obs [n, d], goal indices [n], episode indices [n]) -> actions [n, ...]
BatchAct = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class EpisodeOutcome:
    goal: int
    seed: int
    success: bool
    length: int


class EnvPool:
    """Environments of a level's episodes, built on first use and kept for the next policy."""

    def __init__(self, goals: Sequence[kl.Goal], settings: kl.EnvSettings):
        self.goals = list(goals)
        self.settings = settings
        self._envs: dict[int, object] = {}

    def env(self, episode: int, seed: int):
        if episode not in self._envs:
            self._envs[episode] = kl.make_goal_env(self.goals[episode % len(self.goals)], seed, self.settings)
        return self._envs[episode]

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def run_level(act: BatchAct, pool: EnvPool, episodes: int, first_seed: int) -> list[EpisodeOutcome]:
    """Play ``episodes`` episodes of the pool's level in lockstep; outcomes in episode order."""
    n_goals = len(pool.goals)
    envs = [pool.env(j, first_seed + j) for j in range(episodes)]
    obs = np.stack([env.reset(seed=first_seed + j)[0] for j, env in enumerate(envs)]).astype(np.float32)
    live = np.ones(episodes, bool)
    lengths = np.zeros(episodes, int)
    success = np.zeros(episodes, bool)
    goal_idx = np.arange(episodes) % n_goals
    while live.any():
        idx = np.flatnonzero(live)
        actions = act(obs[idx], goal_idx[idx], idx)
        for k, j in enumerate(idx):
            nxt, _r, terminated, truncated, info = envs[j].step(actions[k])
            obs[j] = nxt
            lengths[j] += 1
            if terminated or truncated:
                live[j] = False
                success[j] = bool(info.get("success", False))
    return [EpisodeOutcome(int(goal_idx[j]), first_seed + j, bool(success[j]), int(lengths[j]))
            for j in range(episodes)]


def offline_act(policy, embeddings: np.ndarray) -> BatchAct:
    """A ``BatchAct`` from an ``OfflinePolicy``; ``embeddings[g]`` is goal g's instruction embedding."""
    def act(obs, goals, _episodes):
        return policy.act_batch(obs, embeddings[goals])
    return act


def random_act(benchmark: str, seed: int) -> BatchAct:
    """Uniform random actions (discrete: all actions; continuous: uniform in [-1, 1]^d), seeded per episode."""
    spec = kl.action_spec(benchmark)
    rngs: dict[int, np.random.Generator] = {}

    def act(obs, _goals, episodes):
        out = []
        for j in episodes:
            rng = rngs.setdefault(int(j), np.random.default_rng([seed, int(j)]))
            out.append(int(rng.integers(spec.n)) if spec.discrete
                       else rng.uniform(spec.low, spec.high, spec.n).astype(np.float32))
        return np.asarray(out)
    return act


def grounded_act(model, goals: Sequence[kl.Goal]) -> BatchAct:
    """A ``BatchAct`` of KALM's grounded LLM (``GroundedLM``) acting greedily: the first call starts every episode
    of the level as one batch, later calls append each live episode's (a_t, s_{t+1}) to its row of the KV cache.
    Stepping the episodes together costs a few batched forwards per step instead of one forward per episode."""
    held: dict = {}

    def act(obs, goal_idx, episodes):
        episodes = [int(j) for j in episodes]
        if not held:
            state, h = model.start_episodes([goals[g].instruction for g in goal_idx], obs)
        else:
            state, last = held["state"], held["actions"]
            if episodes != held["episodes"]:  # some episodes ended: drop their rows
                keep = [held["episodes"].index(j) for j in episodes]
                state, last = model.select_rows(state, keep), last[keep]
            state, h = model.feed(state, last, obs)
        actions = model.actions_from_hidden(h, greedy=True)
        held.update(state=state, actions=actions, episodes=episodes)
        return actions
    return act


log = logging.getLogger("llmrl.kalm.eval")


def evaluate_benchmark(benchmark: str, *, offline_runs: Sequence[tuple[str, Path]], table, levels: Sequence[str],
                       settings: kl.EnvSettings, episodes: int, first_seed: int, random_seeds: int,
                       confidence: float = 0.95, grounded=None, grounded_episodes: int = 0,
                       threads: int = 1) -> dict:
    """Every row of one benchmark on every level; returns ``{"rows": [...], "episodes": [...], "headline": {...}}``.

    ``offline_runs``: (row name, model path) per trained seed — runs sharing a row name are its seeds. Rows are
    aggregated with ``aggregate_seeds`` (training seed = unit); the random row has ``random_seeds`` seeds; the
    grounded LLM row (``grounded.models[benchmark]``, a level's episodes in one batch) one. The headline is each
    row's success averaged over levels.
    """
    import torch

    from llmrl.agents.offline_policy import OfflinePolicy
    from llmrl.eval.seeds import aggregate_seeds

    torch.set_num_threads(threads)
    start = time.perf_counter()
    pools = {lv: EnvPool(kl.goals(benchmark, lv), settings) for lv in levels}
    embeds = {lv: table.lookup([g.instruction for g in pools[lv].goals]) for lv in levels}
    scores: dict[str, dict[str, list[list[float]]]] = {}
    episodes_out: list[dict] = []

    def record(row: str, level: str, seed, outcomes) -> None:
        scores.setdefault(row, {}).setdefault(level, []).append([float(o.success) for o in outcomes])
        episodes_out.extend({"benchmark": benchmark, "row": row, "level": level, "train_seed": seed,
                             "goal": pools[level].goals[o.goal].instruction, "episode_seed": o.seed,
                             "success": o.success, "length": o.length} for o in outcomes)

    for row, path in offline_runs:
        policy = OfflinePolicy.load(path, np.zeros(table.dim), name=row)
        for lv in levels:
            record(row, lv, str(path.parent.name), run_level(offline_act(policy, embeds[lv]), pools[lv], episodes,
                                                             first_seed))
        log.info("%s %s (%s) evaluated (%.0fs)", benchmark, row, path.parent.name, time.perf_counter() - start)
    for seed in range(random_seeds):
        for lv in levels:
            record("random", lv, seed, run_level(random_act(benchmark, seed), pools[lv], episodes, first_seed))
    if grounded is not None and grounded_episodes:
        if benchmark not in grounded.models:
            log.warning("no grounded LLM for %s (have %s): row left out", benchmark, sorted(grounded.models))
        else:
            for lv in levels:
                record("grounded-llm", lv, 0, run_level(grounded_act(grounded.models[benchmark], pools[lv].goals),
                                                        pools[lv], min(grounded_episodes, episodes), first_seed))
        log.info("%s grounded-llm evaluated (%.0fs)", benchmark, time.perf_counter() - start)
    for pool in pools.values():
        pool.close()
    rows, headline = [], {}
    for row, by_level in scores.items():
        means = []
        for lv, per_seed in by_level.items():
            agg = aggregate_seeds(per_seed, confidence=confidence, rng_seed=0, rate=True).summary()  # 0/1 successes
            rows.append({"benchmark": benchmark, "row": row, "level": lv, **agg})
            means.append(agg["value"])
            log.info("%s %-22s %-8s success %.3f [%.3f, %.3f] seeds %s", benchmark, row, lv, agg["value"],
                     agg["ci_low"], agg["ci_high"], agg["per_seed"])
        headline[row] = round(float(np.mean(means)), 4)
    return {"rows": rows, "episodes": episodes_out, "headline": headline,
            "seconds": round(time.perf_counter() - start, 1)}
