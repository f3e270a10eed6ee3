"""KALM's imaginary rollouts for a level's goals, and their quality measured against the real simulator.

For rollout i of a level: goal = goals[i % len(goals)], real initial state s_0 from ``make_goal_env(goal, seed + i)``;
the grounded model imagines (a_t, s_{t+1}) step by step through its KV cache (``GroundedLM.imagine``) and stops at
the horizon or at the first imagined s_{t+1} that satisfies the level's observation rule (``obs_success``).
Rewards and terminals come from ``label_rewards`` through ``llmrl.envs.kalm_episodes.labelled_episode``: the same rule
as the real data. Episodes carry ``info["imaginary"] = True``.

Rollout quality (not measured in KALM): each imagined action sequence is replayed open-loop in the real env from
the same seed; we report the env's own success of the replay, and the per-step error between imagined and
simulated next states (mean absolute error over dimensions, and L2 norm), up to where the replay ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.config.kalm import KalmImagineParams
from llmrl.envs.kalm_episodes import labelled_episode
from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.llm.grounded import GroundedLM

__all__ = ["horizon", "imagine_level", "rollout_quality", "episode_text"]


@dataclass
class ReplayResult:
    success: bool  # the env's own checker during the open-loop replay
    mae: list[float]  # per step: mean |imagined s_{t+1} - simulated s_{t+1}| over dimensions
    l2: list[float]  # per step: ||imagined - simulated||_2


def horizon(p: KalmImagineParams, benchmark: str) -> int:
    return p.metaworld_horizon if benchmark == "metaworld" else p.babyai_horizon


class GoalEnvs:
    """One real env per goal, reset with each rollout's seed: ``reset(seed=s)`` gives the same initial state as a
    fresh ``make_goal_env(goal, s)`` (Meta-World: task variation s % 50), and building a Meta-World env costs
    ~0.7 s of CPU, so rollouts share it."""

    def __init__(self, settings):
        self.settings = settings
        self._envs: dict[kl.Goal, object] = {}

    def reset(self, goal: kl.Goal, seed: int):
        if goal not in self._envs:
            self._envs[goal] = kl.make_goal_env(goal, seed, self.settings)
        env = self._envs[goal]
        obs, _ = env.reset(seed=seed)
        return env, obs

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def initial_states(goals: Sequence[kl.Goal], n: int, first_seed: int, envs: GoalEnvs) -> list[tuple[kl.Goal, int, np.ndarray]]:
    """(goal, seed, s_0) for rollouts 0..n-1 (goals in turn, seed first_seed + i), from the real envs."""
    out = []
    for i in range(n):
        goal = goals[i % len(goals)]
        _env, obs = envs.reset(goal, first_seed + i)
        out.append((goal, first_seed + i, kl.check_obs(goal.benchmark, obs, "initial observation")))
    return out


def imagine_level(model: GroundedLM, goals: Sequence[kl.Goal], p: KalmImagineParams, settings) -> list[Episode]:
    """``p.rollouts`` imagined episodes over ``goals`` (all of one benchmark), labelled by the real-data rule."""
    if not goals:
        raise kl.UnknownLevelError("imagine_level: no goals")
    benchmark = goals[0].benchmark
    if model.spec.obs_dim != kl.obs_dim(benchmark):
        raise kl.ObservationSizeError(f"grounded model obs_dim {model.spec.obs_dim}, {benchmark} observations "
                                      f"have size {kl.obs_dim(benchmark)}")
    envs = GoalEnvs(settings)
    starts = initial_states(goals, p.rollouts, p.seed, envs)
    envs.close()
    gen = torch.Generator().manual_seed(p.seed)
    T = horizon(p, benchmark)
    episodes = []
    for lo in tqdm(range(0, len(starts), p.batch_size), desc=f"imagine {benchmark}/{goals[0].level}"):
        chunk = starts[lo:lo + p.batch_size]
        chunk_goals = [g for g, _, _ in chunk]

        def stop(_t, nxt, chunk_goals=chunk_goals):
            return [kl.obs_success(g, o) for g, o in zip(chunk_goals, nxt, strict=True)]

        acts, nexts, lengths = model.imagine([g.instruction for g in chunk_goals],
                                             np.stack([s for _, _, s in chunk]), T, greedy=p.greedy,
                                             temperature=p.temperature, generator=gen, stop=stop)
        for j, (goal, seed, s0) in enumerate(chunk):
            n = int(lengths[j])
            nxt = nexts[j, :n].astype(np.float32)
            obs = np.concatenate([s0[None], nxt[:-1]], 0)
            episodes.append(labelled_episode(goal, obs, acts[j, :n], nxt, seed=seed, policy="grounded-llm",
                                             info={"imaginary": True, "greedy": p.greedy}))
    return episodes


def replay(episode: Episode, goal: kl.Goal, envs: GoalEnvs) -> ReplayResult:
    """Replay the imagined actions open-loop in the real env from the episode's seed."""
    env, obs = envs.reset(goal, episode.seed)
    success, mae, l2 = False, [], []
    imagined = episode.observations["next_obs"]
    for t, a in enumerate(episode.actions):
        obs, _r, terminated, truncated, info = env.step(int(a) if np.ndim(a) == 0 else np.asarray(a, np.float32))
        diff = np.asarray(obs, np.float32) - imagined[t]
        mae.append(float(np.abs(diff).mean()))
        l2.append(float(np.linalg.norm(diff)))
        success = success or bool(info.get("success", False))
        if terminated or truncated:
            break
    return ReplayResult(success, mae, l2)


def rollout_quality(episodes: Sequence[Episode], goals_by_task: dict[str, kl.Goal] | None, settings,
                    goals: Sequence[kl.Goal] | None = None) -> tuple[dict, list[dict]]:
    """Headline quality figures of a level's imagined episodes and a per-episode table.

    ``goals`` (same order as episodes) or ``goals_by_task`` ((task, instruction) lookup) names each episode's goal.
    """
    rows, succ, rule, maes, l2s, first_mae = [], [], [], [], [], []
    envs = GoalEnvs(settings)
    for i, ep in enumerate(episodes):
        goal = goals[i] if goals is not None else goals_by_task[(ep.info["task"], ep.mission)]
        r = replay(ep, goal, envs)
        succ.append(r.success)
        rule.append(bool(ep.terminated[-1]))
        maes.extend(r.mae)
        l2s.extend(r.l2)
        if r.mae:
            first_mae.append(r.mae[0])
        rows.append({"task": goal.task, "instruction": ep.mission, "seed": ep.seed, "length": len(ep),
                     "imagined_success": bool(ep.terminated[-1]), "replay_success": r.success,
                     "mae_mean": round(float(np.mean(r.mae)), 5) if r.mae else None,
                     "mae_first": round(r.mae[0], 5) if r.mae else None,
                     "mae_last": round(r.mae[-1], 5) if r.mae else None})
    envs.close()
    n = len(episodes)
    summary = {
        "rollouts": n,
        "imagined_success": round(float(np.mean(rule)), 4) if n else None,
        "true_success": round(float(np.mean(succ)), 4) if n else None,
        "true_success_given_imagined": (round(float(np.mean([s for s, r in zip(succ, rule) if r])), 4)
                                        if any(rule) else None),
        "step_mae": round(float(np.mean(maes)), 5) if maes else None,
        "step_l2": round(float(np.mean(l2s)), 5) if l2s else None,
        "first_step_mae": round(float(np.mean(first_mae)), 5) if first_mae else None,
        "mean_length": round(float(np.mean([len(e) for e in episodes])), 2) if n else None,
    }
    return summary, rows


def episode_text(ep: Episode, limit: int = 6) -> dict:
    """A readable dump of one imagined episode (first ``limit`` steps)."""
    return {"instruction": ep.mission, "seed": ep.seed, "length": len(ep),
            "imagined_success": bool(ep.terminated[-1]),
            "actions": np.asarray(ep.actions[:limit]).round(3).tolist(),
            "next_obs": np.asarray(ep.observations["next_obs"][:limit]).round(3).tolist()}
