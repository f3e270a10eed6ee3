"""Egocentric per-slot features of BabyAI's compact state: where each object is as seen from the agent.

What: for each of the compact state's object slots (``kalm_babyai.SLOTS``), whether the object is on the grid
(``present``: the slot's (x, y) is not (0, 0)) and its offset from the agent in the agent's own frame: ``forward``
cells along the facing direction (minigrid's ``DIR_TO_VEC[dir]``: 0 east +x, 1 south +y, 2 west, 3 north; y grows
downward) and ``right`` cells along its right (``DIR_TO_VEC[(dir + 1) % 4]``, minigrid's ``right_vec``). The
object in the cell the agent faces has forward 1, right 0. An absent or carried slot has present 0 and offsets 0.

Why: the compact state is absolute, which suits the dynamics the grounded model predicts, but as a policy input it
makes "which way to turn" a nonlinear function of the agent's position and direction and the object's position.
DiscreteBC on the compact state agreed with the expert on held-out starts no better than the majority action (0.54
after 2,000 updates, 0.50 after 10,000, against 0.55); with these offsets beside it, 0.69 and 0.68
(docs/measurements.md). They are inputs only: the stored state and
every predicted state stay the compact one (``kalm.env.babyai_egocentric_input`` switches them on).

Layout, per slot in ``SLOTS`` order:
- numeric (``egocentric_features``, d3rlpy policies): present, forward, right -> ``EGOCENTRIC_DIM`` = 54 dims;
- categorical (``egocentric_classes``, ``egocentric_onehot``, the grounded model's input): present in 2 classes,
  forward and right in ``2 * MAX_ROOM_SIZE - 1`` = 31 classes each (offset + ``OFFSET_SHIFT``), one-hot blocks
  [present 2 | forward 31 | right 31] per slot -> ``EGOCENTRIC_ONEHOT_DIM`` = 1152 dims.

``egocentric_offsets`` and ``egocentric_classes`` use operators and slicing only, so they run on numpy arrays and
torch tensors alike (the grounded model computes them on its device); any leading batch shape.
"""

from __future__ import annotations

import numpy as np
from minigrid.core.constants import DIR_TO_VEC

from llmrl.envs.kalm_babyai import MAX_OBJECTS, MAX_ROOM_SIZE, OBS_DIM

__all__ = ["EGOCENTRIC_DIM", "OFFSET_SHIFT", "EGOCENTRIC_CLASSES", "EGOCENTRIC_ONEHOT_DIM", "egocentric_offsets",
           "egocentric_classes", "egocentric_features", "egocentric_onehot"]

EGOCENTRIC_DIM = 3 * MAX_OBJECTS
OFFSET_SHIFT = MAX_ROOM_SIZE - 1  # offsets lie in [-OFFSET_SHIFT, OFFSET_SHIFT]: class = offset + OFFSET_SHIFT
EGOCENTRIC_CLASSES = (2, 2 * MAX_ROOM_SIZE - 1, 2 * MAX_ROOM_SIZE - 1)  # present, forward, right
EGOCENTRIC_ONEHOT_DIM = MAX_OBJECTS * sum(EGOCENTRIC_CLASSES)
_FIRST_SLOT = OBS_DIM - 2 * MAX_OBJECTS  # the slots' (x, y) pairs end the state, after the agent and carried fields


def _check(state) -> None:
    if state.shape[-1:] != (OBS_DIM,):
        raise ValueError(f"egocentric features: state shape {tuple(state.shape)}, BabyAI's compact state has "
                         f"{OBS_DIM} dims (kalm_babyai.compact_state)")


def _along(direction, turn: int) -> tuple:
    """(x, y) of ``DIR_TO_VEC[(direction + turn) % 4]`` per element of ``direction``, from minigrid's table."""
    vx = sum((direction == d) * int(DIR_TO_VEC[(d + turn) % 4][0]) for d in range(4))
    vy = sum((direction == d) * int(DIR_TO_VEC[(d + turn) % 4][1]) for d in range(4))
    return vx, vy


def egocentric_offsets(state) -> tuple:
    """(present, forward, right) of every slot, each [..., MAX_OBJECTS], for compact states [..., OBS_DIM]: present
    is a bool array, the offsets are numbers (0 where the slot is absent)."""
    _check(state)
    state = state.round()
    ax, ay, direction = state[..., 0:1], state[..., 1:2], state[..., 2:3]
    xs, ys = state[..., _FIRST_SLOT::2], state[..., _FIRST_SLOT + 1::2]
    present = (xs != 0) | (ys != 0)
    dx, dy = (xs - ax) * present, (ys - ay) * present
    fx, fy = _along(direction, 0)
    rx, ry = _along(direction, 1)
    return present, dx * fx + dy * fy, dx * rx + dy * ry


def egocentric_classes(state) -> tuple:
    """(present, forward, right) of every slot as class indices (``EGOCENTRIC_CLASSES``), each [..., MAX_OBJECTS]
    (whole numbers, not yet of an integer dtype)."""
    present, forward, right = egocentric_offsets(state)
    return present * 1.0, forward + OFFSET_SHIFT, right + OFFSET_SHIFT


def egocentric_features(state: np.ndarray) -> np.ndarray:
    """The numeric form, float32 [..., EGOCENTRIC_DIM]: (present, forward, right) per slot."""
    state = np.asarray(state, np.float32)
    present, forward, right = egocentric_offsets(state)
    return np.stack([present, forward, right], -1).astype(np.float32).reshape(*state.shape[:-1], EGOCENTRIC_DIM)


def egocentric_onehot(state: np.ndarray) -> np.ndarray:
    """The categorical form, float32 [..., EGOCENTRIC_ONEHOT_DIM]: per slot the one-hot blocks of present, forward
    and right."""
    state = np.asarray(state, np.float32)
    blocks = [np.eye(n, dtype=np.float32)[c.astype(np.int64)]
              for c, n in zip(egocentric_classes(state), EGOCENTRIC_CLASSES, strict=True)]
    return np.concatenate(blocks, -1).reshape(*state.shape[:-1], EGOCENTRIC_ONEHOT_DIM)
