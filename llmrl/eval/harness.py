"""Run any policy for N episodes over fixed seeds; report success and return with 95% confidence intervals.

Protocol: episode i is ``env.reset(seed=seeds[i])``, so every policy meets the same levels. ``greedy`` and
``sampled`` are separate modes, reported apart; a policy that has no randomness reports whichever mode it
was run in. Success is ``info["success"]`` where the environment gives it, else a positive reward on a
terminal step (MiniGrid / BabyAI convention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from llmrl.data.trajectories import Episode
from llmrl.envs.make import episode_success
from llmrl.eval.stats import mean_interval, wilson_interval

__all__ = ["Mode", "Policy", "EpisodeRecord", "EvalResult", "run_episode", "evaluate"]

Mode = Literal["greedy", "sampled"]


class Policy(Protocol):
    name: str

    def reset(self, env: gym.Env, seed: int) -> None:
        """Start an episode; ``seed`` seeds any sampling the policy does in it."""

    def act(self, obs: Any, *, greedy: bool) -> Any:
        """The action for ``obs``."""


@dataclass
class EpisodeRecord:
    seed: int
    episode_return: float
    length: int
    success: bool


@dataclass
class EvalResult:
    policy: str
    env_id: str
    mode: str
    episodes: list[EpisodeRecord] = field(default_factory=list)
    confidence: float = 0.95

    @property
    def n(self) -> int:
        return len(self.episodes)

    def summary(self) -> dict:
        """Rates with their intervals, episode count and seed range: the metrics file entry."""
        succ = [e.success for e in self.episodes]
        rets = [e.episode_return for e in self.episodes]
        lo, hi = wilson_interval(int(sum(succ)), self.n, self.confidence)
        rlo, rhi = mean_interval(rets, self.confidence)
        seeds = [e.seed for e in self.episodes]
        return {
            "policy": self.policy,
            "env_id": self.env_id,
            "mode": self.mode,
            "episodes": self.n,
            "seeds": f"{min(seeds)}-{max(seeds)}" if seeds == list(range(min(seeds), max(seeds) + 1)) else seeds,
            "success_rate": float(np.mean(succ)),
            "success_ci95": [lo, hi],
            "mean_return": float(np.mean(rets)),
            "return_ci95": [rlo, rhi],
            "mean_length": float(np.mean([e.length for e in self.episodes])),
        }

    def table(self) -> list[dict]:
        return [asdict(e) for e in self.episodes]


def _split_obs(obs: Any) -> tuple[dict[str, Any], str]:
    """Numeric and text parts of an observation, and the mission if it carries one."""
    if isinstance(obs, dict):
        mission = obs.get("mission", "")
        return {k: v for k, v in obs.items() if k != "mission"}, mission if isinstance(mission, str) else ""
    return {"obs": obs}, ""


def run_episode(
    env: gym.Env,
    policy: Policy,
    seed: int,
    *,
    greedy: bool,
    max_steps: int | None = None,
    record: bool = False,
    action_text: Callable[[Any], str] | None = None,
) -> tuple[EpisodeRecord, Episode | None]:
    """One episode from ``env.reset(seed=seed)``; optionally the full trajectory."""
    obs, info = env.reset(seed=seed)
    policy.reset(env, seed)
    ret, t = 0.0, 0
    steps: dict[str, list] = {"obs": [], "actions": [], "rewards": [], "terminated": [], "truncated": []}
    mission = ""
    terminated = truncated = False
    reward = 0.0
    while True:
        action = policy.act(obs, greedy=greedy)
        if record:
            parts, mission = _split_obs(obs)
            steps["obs"].append(parts)
            steps["actions"].append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        t += 1
        ret += float(reward)
        if max_steps is not None and t >= max_steps and not terminated:
            truncated = True
        if record:
            steps["rewards"].append(reward)
            steps["terminated"].append(terminated)
            steps["truncated"].append(truncated and not terminated)
        if terminated or truncated:
            break
    success = episode_success(info, float(reward), terminated)
    rec = EpisodeRecord(seed=seed, episode_return=ret, length=t, success=success)
    episode = None
    if record:
        keys = steps["obs"][0].keys()
        episode = Episode(
            observations={k: np.stack([np.asarray(o[k]) for o in steps["obs"]]) for k in keys},
            actions=np.asarray(steps["actions"]),
            action_text=[action_text(a) for a in steps["actions"]] if action_text else None,
            rewards=np.asarray(steps["rewards"]),
            terminated=np.asarray(steps["terminated"]),
            truncated=np.asarray(steps["truncated"]),
            mission=mission,
            env_id=env.spec.id if env.spec else "",
            seed=seed,
            policy=policy.name,
            info={"success": success, "greedy": greedy},
        )
    return rec, episode


def evaluate(
    policy: Policy,
    env: gym.Env,
    seeds: Sequence[int],
    *,
    mode: Mode = "greedy",
    max_steps: int | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    action_text: Callable[[Any], str] | None = None,
    progress: bool = True,
) -> EvalResult:
    """Evaluate ``policy`` on ``env`` for one episode per seed in ``seeds``.

    ``on_episode`` receives each full trajectory (e.g. a ``TrajectoryWriter.append``) — the demos stage
    records bot demonstrations this way.
    """
    if mode not in ("greedy", "sampled"):
        raise ValueError(f"evaluate: mode must be 'greedy' or 'sampled', got {mode!r}")
    if len(seeds) == 0:
        raise ValueError("evaluate: seeds is empty")
    result = EvalResult(policy=policy.name, env_id=env.spec.id if env.spec else str(env), mode=mode)
    for seed in tqdm(seeds, desc=f"eval {policy.name} {mode}", disable=not progress, leave=False):
        rec, ep = run_episode(env, policy, int(seed), greedy=mode == "greedy", max_steps=max_steps,
                              record=on_episode is not None, action_text=action_text)
        result.episodes.append(rec)
        if on_episode is not None and ep is not None:
            on_episode(ep)
    return result
