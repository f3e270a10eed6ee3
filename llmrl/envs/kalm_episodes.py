"""KALM's offline data: expert episodes on the training goals, rewards labelled by the observation rule.

Meta-World: metaworld's scripted expert of each task plus Gaussian action noise (clipped to [-1, 1]); BabyAI:
minigrid's BabyAI bot. Each episode is stored with its instruction as ``mission``, observations ``obs`` (the one
each action was taken in) and ``next_obs`` (the one it led to; KALM's dynamics pattern needs s'), and rewards and
terminals from ``llmrl.envs.kalm_levels.label_rewards`` — the same rule the imagined rollouts are labelled with.
An episode that ends without the rule firing (time limit, or the env's own success that the rule does not see)
is flagged ``truncated`` on its last step so d3rlpy keeps every step. ``info`` keeps the env's own success beside
the rule's, so their agreement is measurable (``rule_agreement``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl

__all__ = ["labelled_episode", "episode_seeds", "expert_episodes", "rule_agreement"]


def goal_episode(goal: kl.Goal, env, act: Callable[[np.ndarray, dict], Any], seed: int, policy: str) -> Episode:
    """Run one episode of ``goal`` from ``env.reset(seed=seed)`` with ``act(obs, info)``; label it."""
    obs, info = env.reset(seed=seed)
    observations, next_observations, actions = [], [], []
    env_success = False
    while True:
        action = act(obs, info)
        nxt, _reward, terminated, truncated, info = env.step(action)
        observations.append(obs)
        actions.append(action)
        next_observations.append(nxt)
        obs = nxt
        if terminated or truncated:
            env_success = bool(info.get("success", False))
            break
    return labelled_episode(goal, np.asarray(observations), np.asarray(actions), np.asarray(next_observations),
                            seed=seed, policy=policy, info={"success": env_success, "imaginary": False})


def labelled_episode(goal: kl.Goal, observations: np.ndarray, actions: np.ndarray, next_observations: np.ndarray,
                     *, seed: int, policy: str, info: dict[str, Any]) -> Episode:
    """An ``Episode`` cut and rewarded by ``label_rewards``; ``truncated`` marks an end without rule success."""
    obs = kl.check_obs(goal.benchmark, observations, "observations")
    nxt = kl.check_obs(goal.benchmark, next_observations, "next_observations")
    rewards, terminated = kl.label_rewards(goal, nxt)
    T = len(rewards)
    truncated = np.zeros(T, bool)
    truncated[-1] = not terminated[-1]
    return Episode(
        observations={"obs": obs[:T], "next_obs": nxt[:T]}, actions=np.asarray(actions)[:T], rewards=rewards,
        terminated=terminated, truncated=truncated, mission=goal.instruction, env_id=f"kalm-{goal.benchmark}",
        seed=seed, policy=policy,
        info={"task": goal.task, "level": goal.level, "split": goal.split, "benchmark": goal.benchmark,
              "rule_success": bool(terminated[-1]), **info},
    )


def episode_seeds(goals: Sequence[kl.Goal], episodes_per_task: int) -> int:
    """How many consecutive seeds ``expert_episodes`` uses for ``goals``: one per episode of every task."""
    return len({g.task for g in goals}) * episodes_per_task


def expert_episodes(benchmark: str, goals: Sequence[kl.Goal], episodes_per_task: int, *, seed: int,
                    settings: kl.EnvSettings, action_noise: float = 0.0) -> Iterator[Episode]:
    """Expert episodes over the tasks of ``goals``: episode i of the t-th task (tasks sorted) uses seed
    ``seed + t * episodes_per_task + i`` and the task's i-th instruction (cycling), so every phrasing of a task
    appears in the data and no two episodes share a start. (With seed + i for every task, BabyAI's episodes i of all
    tasks began from one agent pose: a validation set of 2 episodes per task held 2 starts, whose actions, 1 % right
    turns against the training data's 21 %, were no sample of the training distribution.) ``episode_seeds`` gives
    the count of seeds used."""
    by_task: dict[str, list[kl.Goal]] = {}
    for g in goals:
        by_task.setdefault(g.task, []).append(g)
    for t_index, (task, phrasings) in enumerate(sorted(by_task.items())):
        env = None
        for i in range(episodes_per_task):
            goal = phrasings[i % len(phrasings)]
            ep_seed = seed + t_index * episodes_per_task + i
            if benchmark == "metaworld":
                from llmrl.envs.metaworld_tasks import ScriptedPolicy

                env = env or kl.make_goal_env(goal, ep_seed, settings)
                expert = ScriptedPolicy(task)
                rng = np.random.default_rng([seed, t_index, i])

                def act(obs, info, expert=expert, rng=rng):
                    a = expert.act(obs, info)
                    return np.clip(a + rng.normal(0.0, action_noise, a.shape), -1.0, 1.0).astype(np.float32)

                yield goal_episode(goal, env, act, ep_seed, policy=f"scripted+noise{action_noise:g}")
            else:
                from minigrid.utils.baby_ai_bot import BabyAIBot

                env = kl.make_goal_env(goal, ep_seed, settings)  # the mission text is fixed at construction
                holder: dict[str, Any] = {}

                def act(obs, info, holder=holder, env=env):
                    if "bot" not in holder:
                        holder["bot"] = BabyAIBot(env.unwrapped)
                    return int(holder["bot"].replan())

                yield goal_episode(goal, env, act, ep_seed, policy="bot")
        if env is not None:
            env.close()


def rule_agreement(episodes: Sequence[Episode]) -> dict[str, Any]:
    """How often the observation rule's success equals the env's own success, overall and per task."""
    per_task: dict[str, list[bool]] = {}
    for ep in episodes:
        per_task.setdefault(ep.info["task"], []).append(bool(ep.info["rule_success"]) == bool(ep.info["success"]))
    flat = [x for v in per_task.values() for x in v]
    return {"agreement": round(float(np.mean(flat)), 4) if flat else None, "episodes": len(flat),
            "per_task": {k: round(float(np.mean(v)), 4) for k, v in sorted(per_task.items())}}
