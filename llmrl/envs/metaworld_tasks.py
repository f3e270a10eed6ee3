"""Meta-World tasks with a fixed task per episode seed, a step cap, and KALM's composed two-stage tasks.

``metaworld.MT1(name, seed)`` holds 50 task variations (object and goal positions) of one environment class;
the gymnasium id ``Meta-World/MT1`` re-samples one at every reset, which makes an episode irreproducible from
its seed alone. ``MetaWorldTaskEnv`` instead picks variation ``variation_of(seed)`` at ``reset(seed=seed)`` with
``set_task`` (``reset()`` before any ``set_task`` raises in metaworld 3.1.1, so the constructor sets one), so
episode ``seed`` always starts from the same object and goal positions. ``variation_of`` defaults to
``seed % 50``; KALM passes its split map (``llmrl.envs.kalm_levels.metaworld_variation``), which keeps the
variations of training data, validation, imagination and evaluation apart.

Observations are metaworld's 39-d vector (goal visible: ``_partially_observable`` is False for MT1 tasks):
``[0:3]`` hand position, ``[3]`` gripper opening, ``[4:7]`` object 1 position, ``[7:11]`` its quaternion,
``[11:14]`` object 2 position, ``[14:18]`` its quaternion, ``[18:36]`` the same 18 values one frame earlier,
``[36:39]`` goal position. Actions are 4-d in [-1, 1] (hand xyz delta, gripper).

KALM's hard tasks *make-coffee* (coffee-push, then coffee-button) and *locked-door-open* (door-unlock, then
door-open) are not shipped by metaworld. ``TwoStageTaskEnv`` composes them as one episode over a shared step
budget: the first stage runs until its own ``info["success"]``, then the second stage's environment starts
from its fixed variation and the episode succeeds when the second stage does. The physical state does not carry
over between stages: each stage is a different MuJoCo model in metaworld (sawyer_door_lock.xml vs
sawyer_door_pull.xml; the coffee tasks place the mug differently), so a state copy is impossible. The
observation is the current stage's 39-d vector; ``info["stage"]`` says which stage is running.

Scripted experts: ``metaworld.policies.Sawyer<Name>V3Policy`` (``scripted_policy(task)``).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["OBS_DIM", "ACTION_DIM", "FRAME", "GOAL", "UnknownTaskError", "make_task_env", "ScriptedPolicy"]

OBS_DIM = 39
ACTION_DIM = 4
FRAME = 18  # hand, gripper and two objects' poses: [0:18] now, [18:36] the frame before
GOAL = (36, 37, 38)
N_VARIATIONS = 50

#: KALM's composed hard tasks: name -> (first stage, second stage), metaworld names without "-v3".
TWO_STAGE_TASKS: dict[str, tuple[str, str]] = {
    "make-coffee": ("coffee-push", "coffee-button"),
    "locked-door-open": ("door-unlock", "door-open"),
}


class UnknownTaskError(KeyError):
    """A Meta-World task name that neither metaworld nor ``TWO_STAGE_TASKS`` provides."""


@functools.lru_cache(maxsize=None)
def _benchmark(task: str):
    import metaworld

    name = f"{task}-v3"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return metaworld.MT1(name, seed=0)
        except (KeyError, AssertionError, ValueError) as err:
            raise UnknownTaskError(f"Meta-World task {task!r}: not in metaworld ({err})") from None


def default_variation(seed: int) -> int:
    return seed % N_VARIATIONS


class MetaWorldTaskEnv(gym.Env):
    """One metaworld task; ``reset(seed=s)`` uses variation ``variation_of(s)``; truncates after ``max_steps``."""

    metadata = {"render_modes": []}

    def __init__(self, task: str, seed: int = 0, max_steps: int = 150,
                 variation_of: Callable[[int], int] = default_variation):
        if max_steps <= 0:
            raise ValueError(f"MetaWorldTaskEnv: max_steps must be > 0, got {max_steps}")
        self.task = task
        self.max_steps = max_steps
        self.variation_of = variation_of
        mt1 = _benchmark(task)
        self._tasks = mt1.train_tasks
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.env = mt1.train_classes[f"{task}-v3"]()
        self.env.set_task(self._tasks[self._variation(seed)])
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.env.set_task(self._tasks[self._variation(seed)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, info = self.env.reset(seed=seed)
        self._t = 0
        return np.asarray(obs, dtype=np.float32), {**info, "success": False}

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, reward, _terminated, _truncated, info = self.env.step(action)
        self._t += 1
        success = bool(info.get("success", 0.0))
        # Meta-World never terminates on success; KALM's episodes end there (the reward label is 1 on that step).
        terminated = success
        truncated = (self._t >= self.max_steps) and not terminated
        return np.asarray(obs, dtype=np.float32), float(reward), terminated, truncated, {**info, "success": success}

    def _variation(self, seed: int) -> int:
        v = int(self.variation_of(seed))
        if not 0 <= v < len(self._tasks):
            raise ValueError(f"{self.task}: variation {v} of seed {seed} is not in 0..{len(self._tasks) - 1}")
        return v

    def close(self) -> None:
        self.env.close()


class TwoStageTaskEnv(gym.Env):
    """Stage one until its success, then stage two; success = stage two's success (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, task: str, seed: int = 0, max_steps: int = 150,
                 variation_of: Callable[[int], int] = default_variation):
        if task not in TWO_STAGE_TASKS:
            raise UnknownTaskError(f"two-stage task {task!r}: known are {sorted(TWO_STAGE_TASKS)}")
        self.task = task
        self.max_steps = max_steps
        first, second = TWO_STAGE_TASKS[task]
        # Each stage gets the whole budget as its own cap; the shared cap is enforced here.
        self.stages = [MetaWorldTaskEnv(first, seed, max_steps, variation_of),
                       MetaWorldTaskEnv(second, seed, max_steps, variation_of)]
        self.observation_space = self.stages[0].observation_space
        self.action_space = self.stages[0].action_space
        self.stage = 0
        self._t = 0
        self._seed = seed

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._seed = self._seed if seed is None else seed
        self.stage, self._t = 0, 0
        obs, info = self.stages[0].reset(seed=self._seed)
        return obs, {**info, "stage": 0}

    def step(self, action):
        obs, reward, terminated, _truncated, info = self.stages[self.stage].step(action)
        self._t += 1
        success = False
        if terminated and self.stage == 0:
            self.stage = 1
            obs, _ = self.stages[1].reset(seed=self._seed)
            terminated = False
        elif terminated:
            success = True
        truncated = self._t >= self.max_steps and not terminated
        return obs, reward, terminated, truncated, {**info, "success": success, "stage": self.stage}

    def close(self) -> None:
        for env in self.stages:
            env.close()


def make_task_env(task: str, seed: int = 0, max_steps: int = 150,
                  variation_of: Callable[[int], int] = default_variation) -> gym.Env:
    """A single or two-stage task (``TWO_STAGE_TASKS``) as a gymnasium env."""
    if task in TWO_STAGE_TASKS:
        return TwoStageTaskEnv(task, seed, max_steps, variation_of)
    return MetaWorldTaskEnv(task, seed, max_steps, variation_of)


def _policy_class_name(task: str) -> str:
    return "Sawyer" + "".join(part.capitalize() for part in task.split("-")) + "V3Policy"


class ScriptedPolicy:
    """metaworld's scripted expert for ``task`` (composed tasks switch expert with the stage)."""

    def __init__(self, task: str):
        policies = importlib.import_module("metaworld.policies")
        names = TWO_STAGE_TASKS.get(task, (task,))
        try:
            self.experts = [getattr(policies, _policy_class_name(n))() for n in names]
        except AttributeError as err:
            raise UnknownTaskError(f"no scripted metaworld policy for task {task!r} ({err})") from None

    def act(self, obs: np.ndarray, info: dict[str, Any] | None = None) -> np.ndarray:
        stage = int((info or {}).get("stage", 0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Constant(s) may be too high": the env clips actions anyway
            return np.asarray(self.experts[stage].get_action(np.asarray(obs, dtype=np.float64)), dtype=np.float32)
