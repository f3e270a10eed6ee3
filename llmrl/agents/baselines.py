"""Reference policies every method is compared against."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["RandomPolicy", "BabyAIBotPolicy"]


class RandomPolicy:
    """Uniform over the action space (or over ``n_actions`` first actions), seeded per episode."""

    name = "random"

    def __init__(self, n_actions: int | None = None):
        self.n_actions = n_actions
        self.space: gym.Space | None = None
        self.rng = np.random.default_rng(0)

    def reset(self, env: gym.Env, seed: int) -> None:
        self.space = env.action_space
        self.rng = np.random.default_rng(seed)

    def act(self, obs: Any, *, greedy: bool = False) -> Any:
        if self.n_actions is not None:
            return int(self.rng.integers(self.n_actions))
        if isinstance(self.space, gym.spaces.Discrete):
            return int(self.space.start + self.rng.integers(self.space.n))
        assert self.space is not None, "call reset() first"
        self.space.seed(int(self.rng.integers(2**31)))
        return self.space.sample()


class BabyAIBotPolicy:
    """minigrid's BabyAI bot (a planner with privileged access to the level); deterministic."""

    name = "bot"

    def __init__(self) -> None:
        self.bot = None

    def reset(self, env: gym.Env, seed: int) -> None:
        from minigrid.utils.baby_ai_bot import BabyAIBot

        self.bot = BabyAIBot(env.unwrapped)

    def act(self, obs: Any, *, greedy: bool = True) -> int:
        assert self.bot is not None, "call reset() first"
        return int(self.bot.replan())
