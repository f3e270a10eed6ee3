"""BabyAI goal environments for KALM: one room, a goal given as a structured task, a compact state observation.

A task is a string of one or two steps joined by ``>`` ("then"): ``goto:<colour>:<type>`` or
``pickup:<colour>:<type>``, e.g. ``pickup:red:ball>goto:blue:box`` = "pick up the red ball, then carry it to the
blue box". In a two-step task the go-to step counts only while the agent still holds what the first step picked
up (``GoToCarryingInstr``): BabyAI's own "X then Y" forgets the first step once done (its bot drops the object
before walking on), which no single observation can check. The level is minigrid's ``RoomGridLevel`` (so BabyAI's own verifier decides success and gives the reward
``1 - 0.9 * step / max_steps``, and minigrid's ``BabyAIBot`` can solve it); the goal object(s) are placed at
random with ``num_distractors`` other objects, every object in the room of a distinct (type, colour).
The mission string the agent sees is the goal's instruction text (a paraphrase), not BabyAI's surface form.

Observation (``OBS_DIM`` = 41 float32): the room's compact, exact state, what CLEVR-Robot's object vector is to
KALM (``compact_state``; layout below): the agent's position and direction, the carried object, and one fixed slot
per (type, colour) holding that object's position, each dim one categorical field (``obs_fields``) with minigrid's
codes (``minigrid.core.constants``). As in CLEVR-Robot, where each object has its own slot, "the red ball" names
the same dims in every episode, and the state's layout says nothing about which object the goal is (the generator
adds the goal object first: a state listing objects in placement order would tell a policy where the goal is
without reading its instruction). So every object in a room is of a distinct (type, colour). A step changes a few
fields, where an egocentric view is rewritten on every turn; the success rule reads it exactly
(``compact_success``, BabyAI's verifier's conditions). Positions are absolute grid cells, so rooms up to
``MAX_ROOM_SIZE`` cells a side fit the fields.
Actions: minigrid's 7 discrete actions (left, right, forward, pickup, drop, toggle, done).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from minigrid.core.constants import COLOR_TO_IDX, DIR_TO_VEC, OBJECT_TO_IDX
from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
from minigrid.envs.babyai.core.verifier import BeforeInstr, GoToInstr, ObjDesc, PickupInstr

__all__ = ["OBS_DIM", "N_ACTIONS", "COLOURS", "OBJECT_TYPES", "BadTaskError", "parse_task", "obs_fields",
           "make_babyai_env", "SLOTS", "MAX_OBJECTS", "MAX_ROOM_SIZE", "compact_dim", "compact_fields", "compact_state",
           "read_compact", "compact_success"]

N_ACTIONS = 7
COLOURS = ("red", "green", "blue", "purple", "yellow", "grey")
OBJECT_TYPES = ("ball", "box", "key")
VERBS = ("goto", "pickup")


class BadTaskError(ValueError):
    """A BabyAI task string that does not parse (see the module docstring for the grammar)."""


def parse_task(task: str) -> list[tuple[str, str, str]]:
    """``"pickup:red:ball>goto:blue:box"`` -> ``[("pickup", "red", "ball"), ("goto", "blue", "box")]``."""
    steps = []
    for part in task.split(">"):
        bits = part.split(":")
        if len(bits) != 3 or bits[0] not in VERBS or bits[1] not in COLOURS or bits[2] not in OBJECT_TYPES:
            raise BadTaskError(f"BabyAI task {task!r}: step {part!r} is not <goto|pickup>:<colour>:<type>")
        steps.append((bits[0], bits[1], bits[2]))
    if not 1 <= len(steps) <= 2:
        raise BadTaskError(f"BabyAI task {task!r}: one or two steps expected")
    if len(steps) == 2 and (steps[0][0], steps[1][0]) != ("pickup", "goto"):
        raise BadTaskError(f"BabyAI task {task!r}: a two-step task is pickup>goto")
    return steps


class GoToCarryingInstr(GoToInstr):
    """Go to (face) an object matching ``obj_desc`` while carrying one of colour/type ``carried``."""

    def __init__(self, obj_desc, carried: tuple[str, str]):
        super().__init__(obj_desc)
        self.carried = carried

    def surface(self, env):
        return f"go to {self.desc.surface(env)} carrying the {self.carried[0]} {self.carried[1]}"

    def verify_action(self, action):
        held = self.env.carrying
        if held is None or (held.color, held.type) != self.carried:
            return "continue"
        return super().verify_action(action)


def _instrs(steps: list[tuple[str, str, str]]):
    verb, colour, kind = steps[0]
    first = GoToInstr(ObjDesc(kind, colour)) if verb == "goto" else PickupInstr(ObjDesc(kind, colour))
    if len(steps) == 1:
        return first
    verb2, colour2, kind2 = steps[1]
    if verb != "pickup" or verb2 != "goto":
        raise BadTaskError(f"two-step tasks are pickup>goto, got {verb}>{verb2}")
    return BeforeInstr(first, GoToCarryingInstr(ObjDesc(kind2, colour2), (colour, kind)))


class KalmBabyAILevel(RoomGridLevel):
    """One room with the task's object(s) and distractors; BabyAI's verifier checks the task."""

    def __init__(self, task: str, instruction: str, room_size: int = 7, num_distractors: int = 3,
                 max_steps: int = 64, **kwargs):
        self.task_steps = parse_task(task)
        targets = len({(colour, kind) for _verb, colour, kind in self.task_steps})
        if targets + num_distractors > len(SLOTS):
            raise ValueError(f"num_distractors {num_distractors} (kalm.env.babyai_num_distractors): with {targets} "
                             f"goal object(s) a room holds at most {len(SLOTS)} objects of distinct (type, colour)")
        self.instruction = instruction
        self.num_distractors = num_distractors
        super().__init__(num_rows=1, num_cols=1, room_size=room_size, max_steps=max_steps, **kwargs)

    def gen_mission(self) -> None:
        self.place_agent()
        targets = []
        for _verb, colour, kind in self.task_steps:
            if (kind, colour) not in targets:
                self.add_object(0, 0, kind, colour)
                targets.append((kind, colour))
        present = list(targets)
        while len(present) < len(targets) + self.num_distractors:
            kind = self._rand_elem(OBJECT_TYPES)
            colour = self._rand_elem(COLOURS)
            if (kind, colour) in present:
                # never a goal object's twin (the description stays unambiguous), nor another distractor's: each
                # (type, colour) has one slot of the compact state
                continue
            self.add_object(0, 0, kind, colour)
            present.append((kind, colour))
        self.check_objs_reachable()
        self.instrs = _instrs(self.task_steps)

    def _gen_grid(self, width, height):
        super()._gen_grid(width, height)
        self.mission = self.instruction


class CompactObsWrapper(gym.Wrapper):
    """Observations are the compact state (``compact_state``); ``info["success"]`` = BabyAI's reward on a terminal
    step."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        high = max(len(OBJECT_TO_IDX), len(COLOR_TO_IDX), MAX_ROOM_SIZE) - 1
        self.observation_space = gym.spaces.Box(0.0, float(high), (OBS_DIM,), np.float32)

    def reset(self, **kwargs):
        _obs, info = self.env.reset(**kwargs)
        return compact_state(self.env), {**info, "success": False}

    def step(self, action):
        _obs, reward, terminated, truncated, info = self.env.step(action)
        return compact_state(self.env), reward, terminated, truncated, {**info,
                                                                        "success": bool(terminated and reward > 0)}


def make_babyai_env(task: str, instruction: str, seed: int | None = None, *, room_size: int = 7,
                    num_distractors: int = 3, max_steps: int = 64) -> gym.Env:
    if room_size > MAX_ROOM_SIZE:
        raise ValueError(f"room_size {room_size} (kalm.env.babyai_room_size): the compact state's position fields "
                         f"hold rooms up to MAX_ROOM_SIZE = {MAX_ROOM_SIZE} cells")
    env = CompactObsWrapper(KalmBabyAILevel(task, instruction, room_size=room_size,
                                            num_distractors=num_distractors, max_steps=max_steps))
    if seed is not None:
        env.reset(seed=seed)
    return env


# ---- the compact state: what CLEVR-Robot's object vector is to KALM -------------------------------------------------
# Layout (every dim one categorical "index" field): agent x, y, direction; carried object's type and colour (type 0:
# nothing); then one slot per (type, colour) of OBJECT_TYPES x COLOURS, in that order, holding the object's x, y
# (x = y = 0: not in the room, or carried: walls fill row and column 0, so no object sits there). Exact and absolute
# where the egocentric view is rewritten on every turn: a step changes a few fields.
SLOTS = tuple((kind, colour) for kind in OBJECT_TYPES for colour in COLOURS)
MAX_OBJECTS = len(SLOTS)
# position classes of every room (kalm.env.babyai_room_size at most this): one model spec for any room size
MAX_ROOM_SIZE = 16
_AGENT, _SLOT = 5, 2


def compact_dim() -> int:
    return _AGENT + _SLOT * MAX_OBJECTS


OBS_DIM = compact_dim()


def compact_fields(room_size: int = MAX_ROOM_SIZE) -> list[tuple[int, int, str]]:
    """The compact state's categorical fields (first dim, classes, "index") for rooms of up to ``room_size`` cells
    a side."""
    n_types, n_colours = len(OBJECT_TO_IDX), len(COLOR_TO_IDX)
    fields = [(0, room_size, "index"), (1, room_size, "index"), (2, 4, "index"), (3, n_types, "index"),
              (4, n_colours, "index")]
    for k in range(MAX_OBJECTS):
        base = _AGENT + _SLOT * k
        fields += [(base, room_size, "index"), (base + 1, room_size, "index")]
    return fields


def obs_fields() -> list[tuple[int, int, str]]:
    """The observation's categorical fields: every dim of the compact state, one class per code, so a model that
    predicts a class per field writes an exact state."""
    return compact_fields(MAX_ROOM_SIZE)


def compact_state(env) -> np.ndarray:
    """The compact state of a ``KalmBabyAILevel`` (or a wrapper of one) now: float32 [compact_dim()]."""
    level = env.unwrapped
    room = level.room_grid[0][0]
    if any(d is not None for d in room.doors):
        raise ValueError("compact_state: the room has doors, which the compact state has no slots for")
    out = np.zeros(compact_dim(), np.float32)
    out[:3] = (*level.agent_pos, level.agent_dir)
    if level.carrying is not None:
        out[3:5] = OBJECT_TO_IDX[level.carrying.type], COLOR_TO_IDX[level.carrying.color]
    seen = set()
    for obj in room.objs:
        key = (obj.type, obj.color)
        if key not in _SLOT_OF:
            raise ValueError(f"compact_state: a {obj.color} {obj.type} has no slot (types {OBJECT_TYPES}, colours "
                             f"{COLOURS})")
        if key in seen:
            raise ValueError(f"compact_state: two {obj.color} {obj.type}s in the room share one slot")
        seen.add(key)
        if obj is not level.carrying and obj.cur_pos is not None:
            base = _AGENT + _SLOT * _SLOT_OF[key]
            out[base:base + _SLOT] = obj.cur_pos
    return out


_SLOT_OF = {key: k for k, key in enumerate(SLOTS)}
_IDX_TO_OBJECT = {v: k for k, v in OBJECT_TO_IDX.items()}
_IDX_TO_COLOUR = {v: k for k, v in COLOR_TO_IDX.items()}


def read_compact(state: np.ndarray) -> dict:
    """The compact state's fields by name: agent (x, y, direction), carrying (type, colour) or None, and the
    objects on the grid [(type, colour, (x, y))] in slot order."""
    v = np.asarray(state).round().astype(int)
    if v.shape != (compact_dim(),):
        raise ValueError(f"read_compact: shape {v.shape}, the compact state has {compact_dim()} dims")
    objects = []
    for k, (kind, colour) in enumerate(SLOTS):
        x, y = v[_AGENT + _SLOT * k:_AGENT + _SLOT * (k + 1)]
        if (x, y) != (0, 0):
            objects.append((kind, colour, (int(x), int(y))))
    carrying = (_IDX_TO_OBJECT[v[3]], _IDX_TO_COLOUR[v[4]]) if v[3] else None
    return {"agent": (int(v[0]), int(v[1]), int(v[2])), "carrying": carrying, "objects": objects}


def compact_success(task: str, state: np.ndarray) -> bool:
    """The task's success rule on a compact state: go-to, a matching object in the cell the agent faces;
    pick-up, carrying a matching object; pick-up then go-to, both (BabyAI's verifier's conditions)."""
    fields = read_compact(state)
    x, y, d = fields["agent"]
    front = (x + int(DIR_TO_VEC[d][0]), y + int(DIR_TO_VEC[d][1]))
    ok = True
    for verb, colour, kind in parse_task(task):
        if verb == "pickup":
            ok = ok and fields["carrying"] == (kind, colour)
        else:
            ok = ok and any(o[:2] == (kind, colour) and o[2] == front for o in fields["objects"])
    return bool(ok)
