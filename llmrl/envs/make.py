"""Seeded construction of any registered gymnasium environment."""

from __future__ import annotations

import contextlib
import io
import logging

import gymnasium as gym
import numpy as np

__all__ = ["episode_success", "episode_successes", "QuietReset", "make_env"]

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


def _register_all() -> None:
    """Import the packages (and our modules) that register environment ids with gymnasium."""
    import importlib

    import minigrid  # noqa: F401  (importing it registers MiniGrid-* and BabyAI-*)

    for module in ("llmrl.envs.babyai_text", "llmrl.envs.doorkey"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise


class QuietReset(gym.Wrapper):
    """Keep BabyAI's level-generation chatter ("Sampling rejected: ...", printed to stdout) out of logs."""

    def reset(self, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()):
            return self.env.reset(**kwargs)


def make_env(env_id: str, seed: int | None = None, **kwargs) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)``, quiet, with its first reset and action space seeded by ``seed``.

    Later resets continue the environment's own RNG stream, so a fixed seed fixes the whole sequence of
    episodes. Raises ``gymnasium.error.Error`` naming the id if it is not registered.
    """
    _register_all()
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.NameNotFound as err:
        raise gym.error.NameNotFound(f"make_env: unknown environment id {env_id!r} ({err})") from err
    env = QuietReset(env)
    if seed is not None:
        env.action_space.seed(seed)
        env.reset(seed=seed)
    return env
