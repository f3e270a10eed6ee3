"""What the agent sees: the encoded 7x7 egocentric view as a list of facts, in a language-free form.

The wrapper reads only the agent's encoded 7x7 egocentric view (plus the mission), as GLAM's original does, so
it describes any BabyAI level, multi-room ones included: what is hidden behind walls or closed doors is unseen in
the view and is not described, doors are described with their state wherever they are, and the wall rays stop
at the first thing seen.

Sentence order: by default GLAM's (``order="glam"``): the carried object first, then the walls (forward, left,
right), then the objects in the view's column scan (left to right, far to near), so published prompts are
reproduced. ``order="nearest"`` lists objects nearest first and the carried object last.

Facts carry no words of their own: the languages (``languages.py``) turn each into a sentence.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

__all__ = ["VIEW", "AGENT", "DOOR_STATES", "Fact", "ORDERS", "describe_image"]

VIEW = 7
AGENT = (VIEW // 2, VIEW - 1)  # the agent's cell in the egocentric view: bottom row, middle column
DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}


class Fact(NamedTuple):
    """One thing seen: a wall on a ray, an object at (right, forward) from the agent, or the carried object."""

    kind: str  # "wall" | "object" | "carry"
    noun: str = ""
    color: str = ""
    state: str = ""  # doors only: open | closed | locked
    right: int = 0  # negative = left
    forward: int = 0


ORDERS = ("glam", "nearest")


def describe_image(image: np.ndarray, order: str = "glam") -> list[Fact]:
    """Facts seen in an encoded egocentric view (``image[x, y] = (object, colour, state)``, agent at (3, 6)).

    Walls are reported along the three rays (forward, left, right) up to the first thing seen; every visible
    object or door anywhere in the view is reported with its offsets. ``order="glam"``: the carried object
    first, objects in column-scan order (x outer, y inner) as GLAM's description code does; ``"nearest"``:
    objects nearest first, the carried object last.
    """
    if order not in ORDERS:
        raise ValueError(f"describe_image: order must be one of {ORDERS}, got {order!r}")
    image = np.asarray(image)
    if image.shape != (VIEW, VIEW, 3):
        raise ValueError(f"describe_image: expected a {VIEW}x{VIEW}x3 view, got shape {image.shape}")
    ax, ay = AGENT
    facts: list[Fact] = []
    carried = IDX_TO_OBJECT[int(image[ax, ay, 0])]
    carry = ([Fact("carry", carried, IDX_TO_COLOR[int(image[ax, ay, 1])])]
             if carried not in ("unseen", "empty", "agent") else [])
    if order == "glam":
        facts.extend(carry)
    rays = [("forward", [(ax, y) for y in range(ay - 1, -1, -1)]),
            ("left", [(x, ay) for x in range(ax - 1, -1, -1)]),
            ("right", [(x, ay) for x in range(ax + 1, VIEW)])]
    for direction, cells in rays:
        for dist, (x, y) in enumerate(cells, start=1):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if kind in ("empty", "floor"):
                continue
            if kind == "wall":
                facts.append(Fact("wall", "wall", right=(-dist if direction == "left" else dist
                                                           if direction == "right" else 0),
                                  forward=dist if direction == "forward" else 0))
            break  # anything else (object, door, unseen) ends the ray
    objects = []
    for x in range(VIEW):
        for y in range(VIEW):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if (x, y) == AGENT or kind in ("unseen", "empty", "floor", "wall", "agent"):
                continue
            state = DOOR_STATES[int(image[x, y, 2])] if kind == "door" else ""
            objects.append(Fact("object", kind, IDX_TO_COLOR[int(image[x, y, 1])], state, x - ax, ay - y))
    if order == "nearest":
        objects.sort(key=lambda f: (abs(f.right) + f.forward, f.forward, f.right))
    facts.extend(objects)
    if order == "nearest":
        facts.extend(carry)
    return facts
