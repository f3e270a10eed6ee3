"""BabyAI goal environments for KALM: one room, a goal given as a structured task, a flat vector observation.

A task is a string of one or two steps joined by ``>`` ("then"): ``goto:<colour>:<type>`` or
``pickup:<colour>:<type>``, e.g. ``pickup:red:ball>goto:blue:box`` = "pick up the red ball, then carry it to the
blue box". In a two-step task the go-to step counts only while the agent still holds what the first step picked
up (``GoToCarryingInstr``): BabyAI's own "X then Y" forgets the first step once done (its bot drops the object
before walking on), which no single observation can check. The level is minigrid's ``RoomGridLevel`` (so BabyAI's own verifier decides success and gives the reward
``1 - 0.9 * step / max_steps``, and minigrid's ``BabyAIBot`` can solve it); the goal object(s) are placed at
random with ``num_distractors`` other objects, none of which matches a goal object's colour and type.
The mission string the agent sees is the goal's instruction text (a paraphrase), not BabyAI's surface form.

Observation (``OBS_DIM`` = 151 float32): the 7×7×3 egocentric view (object type, colour, state indices from
``minigrid.core.constants``), row-major over (x, y, channel) as ``obs["image"]`` is laid out, then the agent's
direction one-hot (4). The agent sits at view cell (3, 6) facing cell (3, 5); minigrid draws the carried object
into the agent's own cell (3, 6), so what is in front and what is carried are both read from the observation.
Actions: minigrid's 7 discrete actions (left, right, forward, pickup, drop, toggle, done).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from minigrid.core.constants import COLOR_TO_IDX, DIR_TO_VEC, OBJECT_TO_IDX, STATE_TO_IDX
from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
from minigrid.envs.babyai.core.verifier import BeforeInstr, GoToInstr, ObjDesc, PickupInstr

__all__ = ["OBS_DIM", "N_ACTIONS", "COLOURS", "OBJECT_TYPES", "FRONT_CELL", "AGENT_CELL", "BadTaskError",
           "parse_task", "cell_holds", "obs_fields", "make_babyai_env", "MAX_OBJECTS", "compact_dim",
           "compact_fields", "compact_state", "read_compact", "compact_success"]

VIEW = 7
OBS_DIM = VIEW * VIEW * 3 + 4
N_ACTIONS = 7
COLOURS = ("red", "green", "blue", "purple", "yellow", "grey")
OBJECT_TYPES = ("ball", "box", "key")
VERBS = ("goto", "pickup")
FRONT_CELL = (3, 5)
AGENT_CELL = (3, 6)


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
        placed = 0
        while placed < self.num_distractors:
            kind = self._rand_elem(OBJECT_TYPES)
            colour = self._rand_elem(COLOURS)
            if (kind, colour) in targets:
                continue  # a distractor never matches a goal object, so the description is unambiguous
            self.add_object(0, 0, kind, colour)
            placed += 1
        self.check_objs_reachable()
        self.instrs = _instrs(self.task_steps)

    def _gen_grid(self, width, height):
        super()._gen_grid(width, height)
        self.mission = self.instruction


def obs_fields() -> list[tuple[int, int, str]]:
    """The observation as categorical fields (first dim, classes, kind): each view cell's type, colour and state
    code ("index": one dim holding the class id) and the direction ("onehot": 4 dims). Every dim is covered, so a
    model that predicts a class per field writes an observation with exact codes."""
    fields = []
    for cell in range(VIEW * VIEW):
        for channel, classes in enumerate((len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX))):
            fields.append((3 * cell + channel, classes, "index"))
    fields.append((VIEW * VIEW * 3, 4, "onehot"))
    return fields


def flatten_obs(obs: dict) -> np.ndarray:
    """minigrid's dict observation -> the 151-d vector described in the module docstring."""
    direction = np.zeros(4, dtype=np.float32)
    direction[int(obs["direction"])] = 1.0
    return np.concatenate([np.asarray(obs["image"], dtype=np.float32).reshape(-1), direction])


def view_cell(obs_vec: np.ndarray, x: int, y: int) -> np.ndarray:
    """(type, colour, state) of view cell (x, y) from a flat observation."""
    image = np.asarray(obs_vec[: VIEW * VIEW * 3]).reshape(VIEW, VIEW, 3)
    return image[x, y]


def cell_holds(obs_vec: np.ndarray, cell: tuple[int, int], colour: str, kind: str) -> bool:
    t, c, _s = view_cell(obs_vec, *cell)
    return int(round(float(t))) == OBJECT_TO_IDX[kind] and int(round(float(c))) == COLOR_TO_IDX[colour]


class FlatObsWrapper(gym.ObservationWrapper):
    """Dict observation -> flat float32 vector; ``info["success"]`` = BabyAI's reward on a terminal step."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0.0, 10.0, (OBS_DIM,), np.float32)

    def observation(self, observation):
        return flatten_obs(observation)

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        return obs, {**info, "success": False}

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "success": bool(terminated and reward > 0)}


def make_babyai_env(task: str, instruction: str, seed: int | None = None, *, room_size: int = 7,
                    num_distractors: int = 3, max_steps: int = 64) -> gym.Env:
    env = FlatObsWrapper(KalmBabyAILevel(task, instruction, room_size=room_size,
                                         num_distractors=num_distractors, max_steps=max_steps))
    if seed is not None:
        env.reset(seed=seed)
    return env


# ---- the compact state: what CLEVR-Robot's object vector is to KALM -------------------------------------------------
# Layout (every dim one categorical "index" field): agent x, y, direction; carried object's type and colour (type 0:
# nothing); then MAX_OBJECTS slots of (type, colour, state, x, y), the room's objects in placement order, then its
# doors (type 0: empty slot; x = y = 0: off the grid, i.e. carried: walls fill row and column 0, so no object sits
# there). Exact and absolute where the egocentric view is rewritten on every turn: a step changes a few fields.
MAX_OBJECTS = 8
_AGENT, _SLOT = 5, 5


def compact_dim() -> int:
    return _AGENT + _SLOT * MAX_OBJECTS


def compact_fields(room_size: int) -> list[tuple[int, int, str]]:
    """The compact state's categorical fields (first dim, classes, "index") for a room of ``room_size`` cells."""
    n_types, n_colours, n_states = len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX)
    fields = [(0, room_size, "index"), (1, room_size, "index"), (2, 4, "index"), (3, n_types, "index"),
              (4, n_colours, "index")]
    for k in range(MAX_OBJECTS):
        base = _AGENT + _SLOT * k
        fields += [(base, n_types, "index"), (base + 1, n_colours, "index"), (base + 2, n_states, "index"),
                   (base + 3, room_size, "index"), (base + 4, room_size, "index")]
    return fields


def _door_state(obj) -> int:
    if obj.type != "door":
        return 0
    return STATE_TO_IDX["locked" if obj.is_locked else "open" if obj.is_open else "closed"]


def compact_state(env) -> np.ndarray:
    """The compact state of a ``KalmBabyAILevel`` (or a wrapper of one) now: float32 [compact_dim()]."""
    level = env.unwrapped
    room = level.room_grid[0][0]
    objects = list(room.objs) + [d for d in room.doors if d is not None]
    if len(objects) > MAX_OBJECTS:
        raise ValueError(f"compact_state: {len(objects)} objects, at most MAX_OBJECTS = {MAX_OBJECTS} fit "
                         "(lower kalm.env.babyai_num_distractors)")
    out = np.zeros(compact_dim(), np.float32)
    out[:3] = (*level.agent_pos, level.agent_dir)
    if level.carrying is not None:
        out[3:5] = OBJECT_TO_IDX[level.carrying.type], COLOR_TO_IDX[level.carrying.color]
    for k, obj in enumerate(objects):
        base = _AGENT + _SLOT * k
        pos = obj.cur_pos if obj.cur_pos is not None and obj is not level.carrying else (0, 0)
        out[base:base + _SLOT] = (OBJECT_TO_IDX[obj.type], COLOR_TO_IDX[obj.color], _door_state(obj), *pos)
    return out


_IDX_TO_OBJECT = {v: k for k, v in OBJECT_TO_IDX.items()}
_IDX_TO_COLOUR = {v: k for k, v in COLOR_TO_IDX.items()}
_IDX_TO_STATE = {v: k for k, v in STATE_TO_IDX.items()}


def read_compact(state: np.ndarray) -> dict:
    """The compact state's fields by name: agent (x, y, direction), carrying (type, colour) or None, and objects
    [(type, colour, door state or None, (x, y) or None when carried)]."""
    v = np.asarray(state).round().astype(int)
    if v.shape != (compact_dim(),):
        raise ValueError(f"read_compact: shape {v.shape}, the compact state has {compact_dim()} dims")
    objects = []
    for k in range(MAX_OBJECTS):
        t, c, st, x, y = v[_AGENT + _SLOT * k:_AGENT + _SLOT * (k + 1)]
        if t == 0:
            continue
        kind = _IDX_TO_OBJECT[t]
        objects.append((kind, _IDX_TO_COLOUR[c], _IDX_TO_STATE[st] if kind == "door" else None,
                        None if (x, y) == (0, 0) else (int(x), int(y))))
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
            ok = ok and any(o[:2] == (kind, colour) and o[3] == front for o in fields["objects"])
    return bool(ok)
