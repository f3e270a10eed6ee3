"""One LLM4Teach training run of each kind, from the typed ``llm4teach`` params: a PPO student on a DoorKey-family
task and MAPPO on MPE simple_spread, each with an optional teacher.

Shared by the training stages and the validation selection (``scripts/llm4teach_select.py``) so both train exactly
the same way. The learning curve is measured through a callback (``measure(agent, frames) -> dict``) the
caller builds from the evaluation layer, so this module stays free of evaluation code; ``on_iteration`` sees
every row the trainer yields (a stage logs them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from llmrl.agents.student import GridStudent
from llmrl.agents.teacher import TeacherPolicy
from llmrl.algos import distilled_ppo, mappo
from llmrl.algos.distilled_ppo import make_vector_env
from llmrl.algos.mappo import make_mappo_agent
from llmrl.config.llm4teach import LLM4TeachMPEParams, LLM4TeachTrainParams
from llmrl.config.ppo import PPOParams
import llmrl.envs.doorkey  # noqa: F401  (registers the DoorKey family the grid students train on)
from llmrl.envs.make import make_env
from llmrl.envs.mpe import SpreadBatch
from llmrl.seeding import seed_everything

__all__ = ["Measure", "TeachRun", "gradient_steps", "train_grid_student", "train_spread_student"]

Measure = Callable[[nn.Module, int], dict]


def gradient_steps(cfg: PPOParams, frames: int, iterations: int) -> int:
    """Optimizer steps of a run of ``iterations`` that collected ``frames`` samples: each iteration, ``cfg.epochs``
    passes of ``cfg.minibatch_size`` minibatches over its samples (both trainers count a sample as a frame; MAPPO's
    frames are joint steps x agents), the last minibatch of a pass possibly short."""
    if iterations < 1 or frames < iterations:
        raise ValueError(f"frames, iterations: need iterations >= 1 and frames >= iterations, got {frames}, "
                         f"{iterations}")
    per_iteration = frames // iterations
    return iterations * cfg.epochs * -(-per_iteration // cfg.minibatch_size)


@dataclass
class TeachRun:
    """A trained student, its per-iteration stats and its learning curve (frames, success, return)."""

    agent: nn.Module
    history: list[dict]
    curve: list[dict] = field(default_factory=list)


def train_grid_student(env_id: str, teacher: TeacherPolicy | None, t: LLM4TeachTrainParams, seed: int, *,
                       measure: Measure | None = None, on_iteration: Callable[[dict], None] | None = None,
                       progress: bool = True) -> TeachRun:
    """PPO (+ the annealed teacher term when ``teacher``) on ``env_id`` for ``t.ppo.total_frames`` frames.

    ``measure(agent, frames)`` is called before training and ``t.curve_points`` times along it (the agent in
    eval mode); its dicts form the curve.
    """
    seed_everything(seed)
    cfg = t.ppo
    envs = make_vector_env(lambda: make_env(env_id), cfg.num_envs)
    width, height, _ = envs.single_observation_space.shape
    agent = GridStudent(width, height, int(envs.single_action_space.n), tuple(t.student.channels),
                        t.student.hidden, t.student.embed_dim)
    every = max(1, cfg.iterations // t.curve_points)
    curve: list[dict] = []

    def point(frames: int) -> None:
        if measure is None:
            return
        agent.eval()
        curve.append({"frames": frames, **measure(agent, frames)})
        agent.train()

    point(0)
    history = []
    for stats in distilled_ppo.train(agent, envs, cfg, seed=seed,
                                     teacher=teacher.distributions if teacher else None, distill=t.distill,
                                     progress=progress):
        history.append(stats)
        if stats["iteration"] % every == 0 or stats["iteration"] == cfg.iterations:
            point(stats["frames"])
        if on_iteration is not None:
            on_iteration(stats)
    envs.close()
    return TeachRun(agent, history, curve)


def train_spread_student(teacher: TeacherPolicy | None, m: LLM4TeachMPEParams, seed: int, *,
                         on_iteration: Callable[[dict], None] | None = None, progress: bool = True) -> TeachRun:
    """MAPPO (+ the per-agent teacher term when ``teacher``) on simple_spread for ``m.ppo.total_frames``."""
    seed_everything(seed)
    cfg = m.ppo
    envs = SpreadBatch(cfg.num_envs, m.n_agents, m.max_cycles, m.local_ratio)
    agent = make_mappo_agent(envs.obs_dim, envs.n_agents, envs.n_actions, tuple(m.hidden))
    history = []
    for stats in mappo.train(agent, envs, cfg, seed=seed, teacher=teacher.distributions if teacher else None,
                             distill=m.distill, progress=progress):
        history.append(stats)
        if on_iteration is not None:
            on_iteration(stats)
    return TeachRun(agent, history)
