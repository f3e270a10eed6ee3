"""Seeded construction of any registered gymnasium environment."""

from __future__ import annotations

import contextlib
import io
import logging

import gymnasium as gym
import numpy as np

__all__ = ["FAMILIES", "episode_success", "episode_successes", "QuietReset", "make_env"]

log = logging.getLogger(__name__)


def episode_success(info: dict, reward: float, terminated: bool) -> bool:
    """The one definition of an episode's success, for training statistics and evaluation alike: the env's own
    ``info["success"]`` where it reports one (DoorKey family, Meta-World, KALM's levels), else the episode
    terminated on a positive reward (BabyAI, BabyAI-Text)."""
    if "success" in info:
        return bool(info["success"])
    return bool(terminated and reward > 0)


def episode_successes(final_info: dict, rewards: np.ndarray, terminated: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``episode_success`` for every env of a vector step (``final_info`` of gymnasium's same-step autoreset):
    a bool per env, False where no episode ended."""
    if "success" in final_info:
        return np.asarray(final_info["success"], dtype=bool) & done
    return (rewards > 0) & terminated & done


# The project's own environment families, each registered with gymnasium by importing its module: a caller imports
# the family it makes (a stage depends on the environments it uses, and no other: dvc.yaml's deps are its imports).
FAMILIES = {"BabyAI-Text-": "llmrl.envs.babyai_text (GLAM's BabyAI-Text levels)",
            **{f"MiniGrid-{name}": "llmrl.envs.doorkey (LLM4Teach's DoorKey family)"
               for name in ("SimpleDoorKey-", "LavaDoorKey-", "ColoredDoorKey-", "TwoDoor-")}}


class QuietReset(gym.Wrapper):
    """Keep BabyAI's level-generation chatter ("Sampling rejected: ...", printed to stdout) out of logs."""

    def reset(self, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()):
            return self.env.reset(**kwargs)


def make_env(env_id: str, seed: int | None = None, **kwargs) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)``, quiet, with its first reset and action space seeded by ``seed``.

    Later resets continue the environment's own RNG stream, so a fixed seed fixes the whole sequence of
    episodes. MiniGrid's and BabyAI's ids are always known; the project's families once their module is imported
    (``FAMILIES``). Raises ``gymnasium.error.Error`` naming the id if it is not registered.
    """
    import minigrid  # noqa: F401  (importing it registers MiniGrid-* and BabyAI-*)

    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.NameNotFound as err:
        family = next((module for prefix, module in FAMILIES.items() if env_id.startswith(prefix)), None)
        hint = f"; import {family} first, it registers the id" if family else ""
        raise gym.error.NameNotFound(f"make_env: unknown environment id {env_id!r} ({err}){hint}") from err
    env = QuietReset(env)
    if seed is not None:
        env.action_space.seed(seed)
        env.reset(seed=seed)
    return env
