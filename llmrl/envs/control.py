"""Control tasks for policy-parameter search (ProPS): a validated registry and a seeded environment builder.

Each task names its gymnasium id, the policy family searched over (a linear policy ``a = sW + b`` or, for
FrozenLake, a Q-table), the original's per-task prompt constants (the hinted optimum and ``step_size`` of
``sachingrover211/llm-rl_finetune``; both are logged params where used), and plain-language facts about the
state and action variables that the semantic (ProPS+) prompt shows. Nothing here knows about LLMs or policies.

**One truth per task.** A task carries its episode horizon (``horizon``; None: the environment's own limit), and
everything a prompt states about it is derived from that one horizon: the description's "after N steps", the
reward sentence's maximum, and the optimum hint (``optimum``). How the stated maximum follows the horizon is
the task's ``optimum_rule``:

- ``per_step``: the maximum is reached by collecting the best step reward at every step (CartPole,
  InvertedPendulum: +1 per step; Swimmer: the original's 250 per 1,000 steps), so it scales with the horizon;
- ``fixed``: the maximum does not depend on the horizon (Pendulum: 0, the best possible step reward);
- ``own_horizon``: the maximum holds at the environment's own limit only (MountainCarContinuous: +100 at the flag,
  which a linear policy reaches within 999 steps but rarely within 200; FrozenLake: the goal within 100 steps).
  A shorter horizon makes no true statement of the maximum possible: ``at_horizon`` refuses it.

``QuadraticTask`` is the one task without an environment: f(params) = optimum - scale * ||params - c||^2 with a
centre c drawn per search seed, the direct check of whether an optimizer improves in context at all (ProPS
against random search, no episodes). It has no horizon and no semantic description.

An unknown task raises ``UnknownTaskError`` naming it and the known ones; ids are checked against gymnasium's
registry at import time (a typo such as ``Cartpole-v1`` cannot pass silently).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np

__all__ = ["UnknownTaskError", "OptimumRule", "ControlTask", "TASKS", "QuadraticTask", "get_task", "as_task",
           "make_control_env"]

OptimumRule = Literal["per_step", "fixed", "own_horizon"]


class UnknownTaskError(KeyError):
    """A task name that is neither a registry key nor a registered gymnasium id of a known task."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


def _figure(x: float) -> str:
    """A stated figure as the prompts write it (no trailing ``.0``)."""
    return f"{x:g}"


@dataclass(frozen=True)
class ControlTask:
    """One search task at one horizon. ``state_names``/``action_names`` give the meaning of each variable, in
    order; ``description_text``/``reward_text`` may name ``{horizon}`` and ``{optimum}``, filled in from the
    task's own horizon (module doc)."""

    key: str
    env_id: str
    policy: Literal["linear", "qtable"]
    own_optimum: float  # the best return at the environment's own limit (the original's hinted ``max_val``)
    optimum_rule: OptimumRule
    step_size: float  # the original's suggested exploration step
    description_text: str
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    reward_text: str
    horizon: int | None = None  # episode cap; None: the environment's own limit

    @property
    def own_horizon(self) -> int:
        """The environment's own episode limit (gymnasium's ``max_episode_steps``)."""
        return int(gym.spec(self.env_id).max_episode_steps)

    @property
    def episode_steps(self) -> int:
        """The horizon episodes run at."""
        return self.horizon if self.horizon is not None else self.own_horizon

    @property
    def optimum(self) -> float:
        """The best return possible at this horizon: the figure the optimum hint and ProPS+ state."""
        if self.optimum_rule == "per_step":
            return self.own_optimum * self.episode_steps / self.own_horizon
        return self.own_optimum

    @property
    def description(self) -> str:
        return self.description_text.format(horizon=self.episode_steps, optimum=_figure(self.optimum))

    @property
    def reward(self) -> str:
        return self.reward_text.format(horizon=self.episode_steps, optimum=_figure(self.optimum))

    def at_horizon(self, horizon: int | None) -> ControlTask:
        """This task with episodes capped at ``horizon`` (None: the environment's own limit), every statement
        rescaled to it; a cap above the own limit, or any cap of an ``own_horizon`` task, is a ``ValueError``."""
        if horizon is None or horizon == self.own_horizon:
            return dataclasses.replace(self, horizon=None)
        if horizon <= 0:
            raise ValueError(f"max_episode_steps.{self.key}: must be > 0, got {horizon}")
        if horizon > self.own_horizon:
            raise ValueError(f"max_episode_steps.{self.key}: {horizon} exceeds {self.env_id}'s own limit "
                             f"{self.own_horizon}")
        if self.optimum_rule == "own_horizon":
            raise ValueError(f"max_episode_steps.{self.key}: {self.env_id} runs at its own {self.own_horizon} steps "
                             f"only; its best return ({_figure(self.own_optimum)}) is not reachable in general "
                             f"within {horizon}, so no stated maximum would be true")
        return dataclasses.replace(self, horizon=int(horizon))


TASKS: dict[str, ControlTask] = {
    t.key: t
    for t in [
        ControlTask(
            key="cartpole", env_id="CartPole-v1", policy="linear", own_optimum=500.0, optimum_rule="per_step",
            step_size=1.0,
            description_text="A pole is hinged on a cart that moves along a frictionless track. The agent pushes "
                             "the cart left or right to keep the pole upright. The episode ends when the pole "
                             "leans more than 12 degrees, the cart leaves the track (|position| > 2.4), or after "
                             "{horizon} steps.",
            state_names=("cart position", "cart velocity", "pole angle (radians)", "pole angular velocity"),
            action_names=("push cart left", "push cart right"),
            reward_text="+1 for every step the pole stays up; the maximum return is {optimum}.",
        ),
        ControlTask(
            key="mountaincar_continuous", env_id="MountainCarContinuous-v0", policy="linear", own_optimum=100.0,
            optimum_rule="own_horizon", step_size=0.5,
            description_text="A car sits in a valley between two hills and must reach the flag on top of the right "
                             "hill (position >= 0.45). Its engine is too weak to drive straight up, so it has to "
                             "swing back and forth to build momentum. The action is the engine force in [-1, 1]. "
                             "The episode ends at the flag or after {horizon} steps.",
            state_names=("car position (-1.2 to 0.6)", "car velocity (-0.07 to 0.07)"),
            action_names=("engine force (clipped to [-1, 1])",),
            reward_text="+100 on reaching the flag, minus 0.1 times the squared force at every step; the maximum "
                        "return is a little below {optimum}.",
        ),
        ControlTask(
            key="pendulum", env_id="Pendulum-v1", policy="linear", own_optimum=0.0, optimum_rule="fixed",
            step_size=0.5,
            description_text="A pendulum hangs from a fixed pivot and starts at a random angle. The agent applies "
                             "a torque in [-2, 2] to swing it up and hold it upright. Episodes last {horizon} "
                             "steps.",
            state_names=("cos(angle)", "sin(angle)", "angular velocity"),
            action_names=("torque (clipped to [-2, 2])",),
            reward_text="minus (angle^2 + 0.1 velocity^2 + 0.001 torque^2) per step; {optimum} is the best "
                        "possible step and return.",
        ),
        ControlTask(
            key="inverted_pendulum", env_id="InvertedPendulum-v5", policy="linear", own_optimum=1000.0,
            optimum_rule="per_step", step_size=0.5,
            description_text="A pole stands on a cart that slides along a rail (MuJoCo). The agent applies a force "
                             "to the cart to keep the pole upright. The episode ends when the pole tilts more "
                             "than 0.2 radians or after {horizon} steps.",
            state_names=("cart position", "pole angle (radians)", "cart velocity", "pole angular velocity"),
            action_names=("force on the cart (clipped to [-3, 3])",),
            reward_text="+1 for every step the pole stays up; the maximum return is {optimum}.",
        ),
        ControlTask(
            key="swimmer", env_id="Swimmer-v5", policy="linear", own_optimum=250.0, optimum_rule="per_step",
            step_size=0.1,
            description_text="A three-segment swimmer moves in a viscous fluid (MuJoCo) by applying torques at its "
                             "two joints. The goal is to swim forward (to the right) as fast as possible. "
                             "Episodes last {horizon} steps.",
            state_names=("tip angle", "first joint angle", "second joint angle", "tip x-velocity",
                         "tip y-velocity", "tip angular velocity", "first joint angular velocity",
                         "second joint angular velocity"),
            action_names=("torque at the first joint (clipped to [-1, 1])",
                          "torque at the second joint (clipped to [-1, 1])"),
            reward_text="forward velocity minus 0.0001 times the squared torques, per step; a good swimmer "
                        "scores about {optimum}.",
        ),
        ControlTask(
            key="frozenlake", env_id="FrozenLake-v1", policy="qtable", own_optimum=1.0, optimum_rule="own_horizon",
            step_size=0.5,
            description_text="The agent walks on a 4x4 frozen lake from the top-left cell to the goal in the "
                             "bottom-right cell without falling into holes. The ice is slippery: a move goes in "
                             "the intended direction only a third of the time. Episodes end at the goal, in a "
                             "hole, or after {horizon} steps.",
            state_names=("cell index (row * 4 + column, 0 to 15)",),
            action_names=("move left", "move down", "move right", "move up"),
            reward_text="{optimum} on reaching the goal, 0 otherwise.",
        ),
    ]
}


@dataclass(frozen=True)
class QuadraticTask:
    """f(params) = optimum - scale * ||params - c||^2, c uniform in [-centre_range, centre_range]^n_params at one
    decimal, drawn from the search seed: every search meets another unknown maximum, exactly ``optimum``."""

    n_params: int = 2
    optimum: float = 100.0
    scale: float = 10.0
    centre_range: float = 4.5
    step_size: float = 1.0
    key: str = "quadratic"

    def __post_init__(self) -> None:
        if self.n_params < 1:
            raise ValueError(f"quadratic n_params: must be >= 1, got {self.n_params}")
        if self.scale <= 0 or self.centre_range < 0:
            raise ValueError(f"quadratic: scale must be > 0 and centre_range >= 0, got {self.scale}, "
                             f"{self.centre_range}")

    def centre(self, search_seed: int) -> np.ndarray:
        rng = np.random.default_rng([int(search_seed), 2_718_281])
        return np.round(rng.uniform(-self.centre_range, self.centre_range, size=self.n_params), 1)

    def values(self, params: np.ndarray, search_seed: int) -> np.ndarray:
        """f of each row of ``params`` (..., n_params) for the search seeded ``search_seed``."""
        params = np.asarray(params, dtype=np.float64)
        if params.shape[-1] != self.n_params:
            raise ValueError(f"params: expected {self.n_params} values, got {params.shape[-1]}")
        return self.optimum - self.scale * ((params - self.centre(search_seed)) ** 2).sum(axis=-1)


def _check_registry() -> None:
    for task in TASKS.values():
        if task.env_id not in gym.registry:
            raise UnknownTaskError(f"task {task.key!r}: gymnasium has no environment id {task.env_id!r}")


_check_registry()


def get_task(name: str, horizon: int | None = None) -> ControlTask:
    """The task by registry key (``cartpole``) or gymnasium id (``CartPole-v1``), at ``horizon`` steps per episode
    (None: the environment's own limit; ``ControlTask.at_horizon``)."""
    if name in TASKS:
        return TASKS[name].at_horizon(horizon)
    for task in TASKS.values():
        if task.env_id == name:
            return task.at_horizon(horizon)
    raise UnknownTaskError(
        f"unknown control task {name!r}; known: {sorted(TASKS)} or their ids {[t.env_id for t in TASKS.values()]}"
    )


def as_task(task: str | ControlTask) -> ControlTask:
    """``task`` itself, or the task its name gives (``get_task``, at the environment's own limit)."""
    return task if isinstance(task, ControlTask) else get_task(task)


def make_control_env(
    task: str | ControlTask,
    seed: int | None = None,
    *,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """``gymnasium.make`` of the task at its horizon (``task.horizon``), first reset seeded by ``seed``.

    ``max_episode_steps`` (None: the task's horizon) caps the episodes of this one environment below it (a
    plain environment for tests and tools; searches cap through the task, whose statements then agree); it may
    only shorten the environment's limit: a cap above it would silently change the task's definition of success.
    """
    t = as_task(task)
    limit = gym.spec(t.env_id).max_episode_steps
    if max_episode_steps is None:
        max_episode_steps = t.horizon
    if max_episode_steps is not None:
        if max_episode_steps <= 0:
            raise ValueError(f"max_episode_steps: must be > 0, got {max_episode_steps}")
        if limit is not None and max_episode_steps > limit:
            raise ValueError(f"max_episode_steps: {max_episode_steps} exceeds {t.env_id}'s own limit {limit}")
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = gym.make(t.env_id, render_mode=render_mode, **kwargs)
    if seed is not None:
        env.action_space.seed(seed)
        env.reset(seed=seed)
    return env
