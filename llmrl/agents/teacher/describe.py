"""Observation → text for LLM4Teach's planners (the original ``Mediator.RL2LLM``): the DoorKey family's grid and
MPE simple_spread's landmarks, the object names the texts use, and every text a task kind can produce."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, OBJECT_TO_IDX

__all__ = ["TaskKind", "ENV_KIND", "OBJECT_NAMES", "Scene", "describe", "describe_spread", "canonical_colors",
           "restore_colors", "observation_texts"]

TaskKind = Literal["doorkey", "coloreddoorkey", "twodoor", "simple_spread"]
KEY, DOOR = OBJECT_TO_IDX["key"], OBJECT_TO_IDX["door"]

# Which text and plan vocabulary each environment uses (LavaDoorKey shares SimpleDoorKey's, as in the original).
ENV_KIND: dict[str, TaskKind] = {
    "MiniGrid-SimpleDoorKey-Min5-Max10-View3": "doorkey",
    "MiniGrid-LavaDoorKey-Min5-Max10-View3": "doorkey",
    "MiniGrid-ColoredDoorKey-Min5-Max10-View3": "coloreddoorkey",
    "MiniGrid-TwoDoor-Min20-Max20": "twodoor",
    "simple_spread_v3": "simple_spread",
}

# The object names each task's text uses (ColoredDoorKey: the canonical color1.. aliases the planner sees, and
# the real colours the skills see after ``restore_colors``).
OBJECT_NAMES: dict[TaskKind, tuple[str, ...]] = {
    "doorkey": ("key", "door"),
    "coloreddoorkey": tuple(f"{c} {o}" for c in IDX_TO_COLOR.values() for o in ("key", "door")),
    "twodoor": ("key", "door1", "door2"),
    "simple_spread": ("landmark 1", "landmark 2", "landmark 3"),
}


@dataclass(frozen=True)
class Scene:
    """An observation as text, and where each object the text names is (grid cell, or relative position)."""

    text: str
    objects: dict[str, tuple] = field(default_factory=dict, compare=False)


def describe(obs: np.ndarray, kind: TaskKind) -> Scene:
    """The original mediator's text for ``obs``: keys (not held) first, then doors, then what is held."""
    if kind == "simple_spread":
        return describe_spread(obs)
    obj = obs[..., 0]
    agent = tuple(int(v) for v in np.argwhere(obs[..., 3] != 4)[0])
    named: list[str] = []
    objects: dict[str, tuple] = {}
    carrying = "nothing"
    for i, j in np.argwhere(obj == KEY):
        name = f"{IDX_TO_COLOR[int(obs[i, j, 1])]} key" if kind == "coloreddoorkey" else "key"
        if (int(i), int(j)) == agent:
            carrying = name
        else:
            named.append(name)
            objects[name] = (int(i), int(j))
    for n, (i, j) in enumerate(np.argwhere(obj == DOOR), start=1):
        name = {"coloreddoorkey": f"{IDX_TO_COLOR[int(obs[i, j, 1])]} door", "twodoor": f"door{n}"}.get(kind, "door")
        named.append(name)
        objects[name] = (int(i), int(j))
    seen = ", ".join(f"<{n}>" for n in named) or "<nothing>"
    return Scene(f"Agent sees {seen}, holds <{carrying}>.", objects)


def describe_spread(obs: np.ndarray) -> Scene:
    """simple_spread (N=3) agent observation → landmarks by distance, each free or taken by a closer agent.

    Observation layout (mpe2): own velocity (2), own position (2), landmarks relative (3×2), other agents
    relative (2×2), communication (2×2).
    """
    landmarks = obs[4:10].reshape(3, 2)
    others = obs[10:14].reshape(2, 2)
    mine = np.linalg.norm(landmarks, axis=1)
    theirs = np.linalg.norm(landmarks[:, None, :] - others[None, :, :], axis=2).min(axis=1)
    order = np.argsort(mine, kind="stable")
    parts, objects = [], {}
    for rank, k in enumerate(order, start=1):
        parts.append(f"<landmark {rank}> {'taken' if theirs[k] < mine[k] else 'free'}")
        objects[f"landmark {rank}"] = tuple(float(v) for v in landmarks[k])
    return Scene("Landmarks from nearest to farthest: " + ", ".join(parts) + ".", objects)


_COLOR_WORDS = re.compile(r"\b(red|green|blue|purple|yellow|grey)\b")


def canonical_colors(text: str) -> tuple[str, dict[str, str]]:
    """Rename colours to color1, color2, ... in order of first appearance; return the text and the way back."""
    colors = list(dict.fromkeys(_COLOR_WORDS.findall(text)))
    back = {f"color{i}": c for i, c in enumerate(colors, start=1)}
    for alias, color in back.items():
        text = re.sub(rf"\b{color}\b", alias, text)
    return text, back


def restore_colors(plan: str, back: dict[str, str]) -> str:
    for alias, color in back.items():
        plan = re.sub(rf"\b{alias}\b", color, plan)
    return plan


def observation_texts(kind: TaskKind) -> list[str]:
    """Every text ``describe`` can produce for a task kind (canonical colours), for pre-filling a reply cache.

    The DoorKey family has a handful (6 for SimpleDoorKey); simple_spread has 8 free/taken patterns.
    """
    if kind == "simple_spread":
        return [
            "Landmarks from nearest to farthest: "
            + ", ".join(f"<landmark {r}> {'taken' if (bits >> (r - 1)) & 1 else 'free'}" for r in (1, 2, 3)) + "."
            for bits in range(8)
        ]
    texts = []

    def add(seen: list[str], held: str) -> None:
        text = f"Agent sees {', '.join(f'<{s}>' for s in seen) or '<nothing>'}, holds <{held}>."
        text = canonical_colors(text)[0] if kind == "coloreddoorkey" else text
        if text not in texts:
            texts.append(text)

    if kind == "doorkey":
        for held in ("nothing", "key"):
            for keys in ([], ["key"]) if held == "nothing" else ([],):
                for doors in ([], ["door"]):
                    add(keys + doors, held)
    elif kind == "twodoor":
        for held in ("nothing", "key"):
            for keys in ([], ["key"]) if held == "nothing" else ([],):
                for doors in ([], ["door1"], ["door1", "door2"]):
                    add(keys + doors, held)
    else:  # coloreddoorkey: a blue door, one blue and one red key; keys listed in grid order
        for held in ("nothing", "blue key", "red key"):
            free = [k for k in ("blue key", "red key") if k != held]
            for n in range(len(free) + 1):
                for keys in itertools.permutations(free, n):
                    for doors in ([], ["blue door"]):
                        add(list(keys) + doors, held)
    return texts
