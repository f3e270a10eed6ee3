"""Scripted skills that turn one step of a teacher's plan into a primitive action.

DoorKey family (observation = the [W, H, 4] memory grid of ``llmrl.envs.doorkey``): explore, go to an
object, pick up, drop, open (toggle), and wait (the original's "do nothing" = primitive 6). Each skill is a
pure function of the observation returning ``(actions or None, finished)`` — all primitives that
start an equally short path, so the teacher spreads its probability over them; ``plan_actions`` runs a plan's
steps in order the way the original ``TeacherPolicy.get_action`` does: a finished skill hands over to the
next step, a skill that cannot act ends the plan with ``wait``; a step with no skill raises.

MPE (``simple_spread``): ``goto_point_action`` steers towards a relative position with the 5 discrete
moves.

Differences from the original skills, on purpose: "explore" walks a breadth-first path to the nearest pose
that faces an unseen cell (the original's turn-and-walk heuristic can circle forever), path finding treats
lava as blocked (the original let "go to" walk through lava, which ends LavaDoorKey episodes), and "drop"
first turns towards a free cell (dropping on an occupied cell is a silent no-op that stalls a stateless
teacher).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from minigrid.core.constants import OBJECT_TO_IDX

__all__ = ["LEFT", "RIGHT", "FORWARD", "VERBS", "Step", "parse_step", "GridView", "SkillOut", "go_to", "plan_actions", "goto_point_action"]

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, WAIT = range(7)
DIR_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
EMPTY, DOOR, GOAL, UNSEEN = OBJECT_TO_IDX["empty"], OBJECT_TO_IDX["door"], OBJECT_TO_IDX["goal"], OBJECT_TO_IDX["unseen"]
VERBS = ("explore", "go to", "pick up", "drop", "open")


@dataclass(frozen=True)
class Step:
    """One plan step: a verb from ``VERBS`` (or "unknown") and the object name it refers to ("" if none)."""

    verb: str
    obj: str = ""


def parse_step(text: str, object_names: tuple[str, ...]) -> Step:
    """A plan step from its text, matched by keyword like the original mediator (first verb, longest object).

    ``object_names`` are the names the environment's text uses ("key", "door", "red key", "door1", ...).
    """
    text = text.strip().lower()
    verb = next((v for v in VERBS if v in text), "unknown")
    obj = max((n for n in object_names if f"<{n}>" in text or n in text), key=len, default="")
    return Step(verb, obj)


class GridView:
    """The parts of a memory observation the skills need, extracted once per step."""

    def __init__(self, obs: np.ndarray):
        self.obj = obs[..., 0]
        self.width, self.height = self.obj.shape
        ax, ay = np.argwhere(obs[..., 3] != 4)[0]
        self.pos = (int(ax), int(ay))
        self.dir = int(obs[ax, ay, 3])
        self.carrying = int(obs[ax, ay, 0])  # empty (1) when nothing is carried
        walk = (self.obj == EMPTY) | (self.obj == GOAL) | ((self.obj == DOOR) & (obs[..., 2] == 0))
        self.walkable = walk.tolist()
        self.unseen = (self.obj == UNSEEN).tolist()
        self.objects = self.obj.tolist()

    def front(self, pos=None, d=None) -> tuple[int, int]:
        (x, y), d = pos or self.pos, self.dir if d is None else d
        return x + DIR_VEC[d][0], y + DIR_VEC[d][1]

    def inside(self, x: int, y: int) -> bool:
        return 0 <= x < self.width and 0 <= y < self.height


def bfs_first_actions(view: GridView, is_goal) -> tuple[int, ...]:
    """Every primitive (left/right/forward) that starts a shortest path to a pose (x, y, d) with ``is_goal``.

    Breadth-first over poses through walkable cells (the agent's own cell always counts as walkable); each
    pose carries the set of first actions that reach it at its shortest depth, so equally short paths keep
    all their first moves. Returns () when no goal pose other than the current one is reachable.
    """
    start = (*view.pos, view.dir)
    depth = {start: 0}
    first = {start: 0}  # bit mask over LEFT, RIGHT, FORWARD
    frontier = [start]
    while frontier:
        goals = [s for s in frontier if s != start and is_goal(*s)]
        if goals:
            mask = 0
            for g in goals:
                mask |= first[g]
            return tuple(a for a in (LEFT, RIGHT, FORWARD) if mask >> a & 1)
        nxt_frontier = []
        for x, y, d in frontier:
            fx, fy = x + DIR_VEC[d][0], y + DIR_VEC[d][1]
            moves = [((x, y, (d - 1) % 4), LEFT), ((x, y, (d + 1) % 4), RIGHT)]
            if view.inside(fx, fy) and view.walkable[fx][fy]:
                moves.append(((fx, fy, d), FORWARD))
            here = depth[(x, y, d)]
            for nxt, act in moves:
                bits = 1 << act if (x, y, d) == start else first[(x, y, d)]
                if nxt not in depth:
                    depth[nxt], first[nxt] = here + 1, bits
                    nxt_frontier.append(nxt)
                elif depth[nxt] == here + 1:
                    first[nxt] |= bits
        frontier = nxt_frontier
    return ()


# A skill's answer: the primitives it would take now (equally good, or None if it cannot act), and whether it
# has finished (then the plan's next step takes over).
SkillOut = tuple[tuple[int, ...] | None, bool]


def explore(view: GridView, _: tuple[int, int] | None) -> SkillOut:
    """Walk to the nearest pose facing an unseen cell; finished when none is left."""

    def faces_unseen(x, y, d):
        fx, fy = x + DIR_VEC[d][0], y + DIR_VEC[d][1]
        return view.inside(fx, fy) and view.unseen[fx][fy]

    actions = bfs_first_actions(view, faces_unseen)
    return (actions, False) if actions else (None, True)


def go_to(view: GridView, target: tuple[int, int] | None) -> SkillOut:
    """Reach a cell next to ``target`` facing it; finished when there. Cannot act without a target or path."""
    if target is None:
        return None, False
    if view.front() == tuple(target):
        return None, True
    actions = bfs_first_actions(view, lambda x, y, d: (x + DIR_VEC[d][0], y + DIR_VEC[d][1]) == tuple(target))
    return actions or None, False


def pick_up(view: GridView, _: tuple[int, int] | None) -> SkillOut:
    return (PICKUP,), True


def drop(view: GridView, _: tuple[int, int] | None) -> SkillOut:
    """Drop onto the free cell in front, turning left until one is in front."""
    fx, fy = view.front()
    if view.inside(fx, fy) and view.objects[fx][fy] == EMPTY:
        return (DROP,), True
    return (LEFT,), False


def toggle(view: GridView, _: tuple[int, int] | None) -> SkillOut:
    return (TOGGLE,), True


SKILLS = {"explore": explore, "go to": go_to, "pick up": pick_up, "drop": drop, "open": toggle}


def plan_actions(steps: list[Step], view: GridView, objects: dict[str, tuple[int, int]]) -> tuple[int, ...]:
    """The primitives a plan takes now (equally good), running steps in order while they finish without acting.

    A "go to" whose object is not in sight is the original's "do nothing" (wait). An unknown verb is an
    error here: the planner marks such replies invalid (``llmrl.agents.teacher.validate_plan``), so one
    reaching the skills is a bug, not a plan (the original silently waited).
    """
    for step in steps:
        if step.verb not in SKILLS:
            raise ValueError(f"plan step {step}: verb {step.verb!r} has no skill (valid: {', '.join(SKILLS)})")
        if step.verb == "go to" and step.obj not in objects:
            return (WAIT,)
        actions, finished = SKILLS[step.verb](view, objects.get(step.obj))
        if actions:
            return actions
        if not finished:
            return (WAIT,)
    return (WAIT,)


# --------------------------------------------------------------------------------------------- MPE

MPE_NOOP, MPE_LEFT, MPE_RIGHT, MPE_DOWN, MPE_UP = range(5)


def goto_point_action(rel_pos: np.ndarray, vel: np.ndarray, *, damping: float = 0.5, tol: float = 0.05) -> int:
    """Discrete MPE move towards ``rel_pos`` (target minus own position), braking against the velocity.

    Moves along the axis with the larger remaining error; no-op inside ``tol``.
    """
    err = np.asarray(rel_pos, dtype=np.float64) - damping * np.asarray(vel, dtype=np.float64)
    if np.abs(err).max() < tol:
        return MPE_NOOP
    if abs(err[0]) >= abs(err[1]):
        return MPE_RIGHT if err[0] > 0 else MPE_LEFT
    return MPE_UP if err[1] > 0 else MPE_DOWN
