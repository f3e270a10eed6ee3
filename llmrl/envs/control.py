"""Control tasks for policy-parameter search (ProPS): a validated registry and a seeded environment builder.

Each task names its gymnasium id, the policy family searched over (a linear policy ``a = sW + b`` or, for
FrozenLake, a Q-table), the original's per-task prompt constants (the hinted ``optimum`` and ``step_size`` of
``sachingrover211/llm-rl_finetune``; both are logged params where used), and plain-language facts about the
state and action variables that the semantic (ProPS+) prompt shows. Nothing here knows about LLMs or policies.

An unknown task raises ``UnknownTaskError`` naming it and the known ones; ids are checked against gymnasium's
registry at import time of the registry entry (a typo such as ``Cartpole-v1`` cannot pass silently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import gymnasium as gym

__all__ = ["UnknownTaskError", "ControlTask", "TASKS", "get_task", "make_control_env"]


class UnknownTaskError(KeyError):
    """A task name that is neither a registry key nor a registered gymnasium id of a known task."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


@dataclass(frozen=True)
class ControlTask:
    """One search task. ``state_names``/``action_names`` give the meaning of each variable, in order."""

    key: str
    env_id: str
    policy: Literal["linear", "qtable"]
    optimum: float  # the original's hinted best return (its hard-coded ``max_val``)
    step_size: float  # the original's suggested exploration step
    description: str
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    reward: str


TASKS: dict[str, ControlTask] = {
    t.key: t
    for t in [
        ControlTask(
            key="cartpole", env_id="CartPole-v1", policy="linear", optimum=500.0, step_size=1.0,
            description="A pole is hinged on a cart that moves along a frictionless track. The agent pushes "
                        "the cart left or right to keep the pole upright. The episode ends when the pole "
                        "leans more than 12 degrees, the cart leaves the track (|position| > 2.4), or after "
                        "500 steps.",
            state_names=("cart position", "cart velocity", "pole angle (radians)", "pole angular velocity"),
            action_names=("push cart left", "push cart right"),
            reward="+1 for every step the pole stays up; the maximum return is 500.",
        ),
        ControlTask(
            key="mountaincar_continuous", env_id="MountainCarContinuous-v0", policy="linear", optimum=100.0,
            step_size=0.5,
            description="A car sits in a valley between two hills and must reach the flag on top of the right "
                        "hill (position >= 0.45). Its engine is too weak to drive straight up, so it has to "
                        "swing back and forth to build momentum. The action is the engine force in [-1, 1].",
            state_names=("car position (-1.2 to 0.6)", "car velocity (-0.07 to 0.07)"),
            action_names=("engine force (clipped to [-1, 1])",),
            reward="+100 on reaching the flag, minus 0.1 times the squared force at every step.",
        ),
        ControlTask(
            key="pendulum", env_id="Pendulum-v1", policy="linear", optimum=0.0, step_size=0.5,
            description="A pendulum hangs from a fixed pivot and starts at a random angle. The agent applies "
                        "a torque in [-2, 2] to swing it up and hold it upright. Episodes last 200 steps.",
            state_names=("cos(angle)", "sin(angle)", "angular velocity"),
            action_names=("torque (clipped to [-2, 2])",),
            reward="minus (angle^2 + 0.1 velocity^2 + 0.001 torque^2) per step; 0 is the best possible step.",
        ),
        ControlTask(
            key="inverted_pendulum", env_id="InvertedPendulum-v5", policy="linear", optimum=1000.0,
            step_size=0.5,
            description="A pole stands on a cart that slides along a rail (MuJoCo). The agent applies a force "
                        "to the cart to keep the pole upright. The episode ends when the pole tilts more than "
                        "0.2 radians or after 1000 steps.",
            state_names=("cart position", "pole angle (radians)", "cart velocity", "pole angular velocity"),
            action_names=("force on the cart (clipped to [-3, 3])",),
            reward="+1 for every step the pole stays up; the maximum return is 1000.",
        ),
        ControlTask(
            key="swimmer", env_id="Swimmer-v5", policy="linear", optimum=250.0, step_size=0.1,
            description="A three-segment swimmer moves in a viscous fluid (MuJoCo) by applying torques at its "
                        "two joints. The goal is to swim forward (to the right) as fast as possible. Episodes "
                        "last 1000 steps.",
            state_names=("tip angle", "first joint angle", "second joint angle", "tip x-velocity",
                         "tip y-velocity", "tip angular velocity", "first joint angular velocity",
                         "second joint angular velocity"),
            action_names=("torque at the first joint (clipped to [-1, 1])",
                          "torque at the second joint (clipped to [-1, 1])"),
            reward="forward velocity minus 0.0001 times the squared torques, per step.",
        ),
        ControlTask(
            key="frozenlake", env_id="FrozenLake-v1", policy="qtable", optimum=1.0, step_size=0.5,
            description="The agent walks on a 4x4 frozen lake from the top-left cell to the goal in the "
                        "bottom-right cell without falling into holes. The ice is slippery: a move goes in the "
                        "intended direction only a third of the time. Episodes end at the goal, in a hole, or "
                        "after 100 steps.",
            state_names=("cell index (row * 4 + column, 0 to 15)",),
            action_names=("move left", "move down", "move right", "move up"),
            reward="1 on reaching the goal, 0 otherwise.",
        ),
    ]
}


def _check_registry() -> None:
    for task in TASKS.values():
        if task.env_id not in gym.registry:
            raise UnknownTaskError(f"task {task.key!r}: gymnasium has no environment id {task.env_id!r}")


_check_registry()


def get_task(name: str) -> ControlTask:
    """The task by registry key (``cartpole``) or gymnasium id (``CartPole-v1``)."""
    if name in TASKS:
        return TASKS[name]
    for task in TASKS.values():
        if task.env_id == name:
            return task
    raise UnknownTaskError(
        f"unknown control task {name!r}; known: {sorted(TASKS)} or their ids {[t.env_id for t in TASKS.values()]}"
    )


def make_control_env(
    task: str | ControlTask,
    seed: int | None = None,
    *,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """``gymnasium.make`` of the task, optionally with a shorter episode cap, first reset seeded by ``seed``.

    ``max_episode_steps`` (None: the task's own limit) may only shorten the task's limit: a cap above it
    would silently change the task's definition of success.
    """
    t = task if isinstance(task, ControlTask) else get_task(task)
    limit = gym.spec(t.env_id).max_episode_steps
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
