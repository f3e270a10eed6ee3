"""The teacher as a policy: plans mapped through the scripted skills to π_T(a|s) (see the package docstring)."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from llmrl.agents.skills import GridView, Step, goto_point_action, parse_step, plan_actions
from llmrl.agents.teacher.describe import OBJECT_NAMES, Scene, TaskKind, canonical_colors, describe, restore_colors
from llmrl.agents.teacher.planners import Planner
from llmrl.agents.teacher.prompts import PlanDistribution

__all__ = ["spread_plan_action", "TeacherPolicy"]

@functools.lru_cache(maxsize=4096)
def _plan_steps(plan: str, object_names: tuple[str, ...]) -> tuple[Step, ...]:
    return tuple(parse_step(s, object_names) for s in plan.split(","))


def spread_plan_action(steps: Sequence[Step], obs: np.ndarray, objects: dict[str, tuple]) -> int:
    """simple_spread: the first "go to <landmark k>" step steers there; anything else is a no-op."""
    for step in steps:
        if step.verb == "go to" and step.obj in objects:
            return goto_point_action(np.asarray(objects[step.obj]), obs[0:2])
    return 0


class TeacherPolicy:
    """π_T(a|s) from a planner and the scripted skills; also a harness ``Policy`` (the teacher alone)."""

    def __init__(self, kind: TaskKind, planner: Planner, n_actions: int):
        self.kind = kind
        self.planner = planner
        self.n_actions = n_actions
        self.name = f"teacher-{planner.name}"
        self.text_counts: Counter[str] = Counter()
        self.rng = np.random.default_rng(0)

    def plan_for(self, obs: np.ndarray) -> tuple[Scene, str, PlanDistribution, dict[str, str]]:
        scene = describe(obs, self.kind)
        text, back = canonical_colors(scene.text) if self.kind == "coloreddoorkey" else (scene.text, {})
        return scene, text, self.planner.plan(text), back

    def distribution(self, obs: np.ndarray) -> np.ndarray:
        scene, text, dist, back = self.plan_for(obs)
        self.text_counts[text] += 1
        probs = np.zeros(self.n_actions, dtype=np.float32)
        names = OBJECT_NAMES[self.kind]
        view = None if self.kind == "simple_spread" else GridView(obs)
        for plan, p in zip(dist.plans, dist.probs):
            steps = _plan_steps(restore_colors(plan, back), names)
            if view is None:
                probs[spread_plan_action(steps, obs, scene.objects)] += p
            else:
                actions = plan_actions(list(steps), view, scene.objects)
                probs[list(actions)] += p / len(actions)
        return probs

    def distributions(self, obs_batch: np.ndarray) -> np.ndarray:
        return np.stack([self.distribution(o) for o in obs_batch])

    # harness Policy protocol
    def reset(self, env: gym.Env, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, *, greedy: bool) -> int:
        probs = self.distribution(obs)
        if greedy:
            return int(np.argmax(probs))
        return int(self.rng.choice(self.n_actions, p=probs / probs.sum()))
