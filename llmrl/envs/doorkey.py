"""LLM4Teach's DoorKey family: MiniGrid rooms observed through a full-grid memory of every cell seen so far.

Description
    One room of random size (5–10 cells a side; TwoDoor: 20×20) with a locked door in its wall and the key
    that opens it. The agent sees a 3×3 egocentric view; the observation accumulates everything it has seen.
    Variants: ``SimpleDoorKey`` (one key, one door), ``LavaDoorKey`` (adds a lava cell, which ends the
    episode when entered; never in front of the door), ``ColoredDoorKey`` (a blue door, a blue key and a red
    key; only the matching colour opens), ``TwoDoor`` (two locked doors on opposite walls, key near the centre).
Mission Space
    "open the door" (constant, so it is not part of the observation).
Action Space
    MiniGrid's 7 primitives: left, right, forward, pickup, drop, toggle, done.
Observation Encoding
    ``uint8`` array [W, H, 4] over the whole grid, padded to the largest room so the space is fixed. Channels
    0–2 are MiniGrid's (object, colour, state) for every cell seen at least once this episode (0, 0, 0 where
    never seen); the agent's own cell shows what it carries (empty if nothing). Channel 3 is the agent's
    direction (0–3) at its cell and 4 elsewhere. This is the original's ``HistoricalObsEnv`` memory.
Rewards
    ``1 - 0.9 * t / T_max`` when the door opens, else 0.
Termination
    The door opens (success, ``info["success"] = True``), lava is entered, or ``T_max`` = 150 steps pass
    (truncation).
Registered Configurations
    ``MiniGrid-SimpleDoorKey-Min5-Max10-View3``, ``MiniGrid-LavaDoorKey-Min5-Max10-View3``,
    ``MiniGrid-ColoredDoorKey-Min5-Max10-View3``, ``MiniGrid-TwoDoor-Min20-Max20``.

All randomness goes through the environment's seeded ``np_random``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from minigrid.core.constants import COLOR_NAMES, OBJECT_TO_IDX
from minigrid.core.grid import Grid
from minigrid.core.mission import MissionSpace
from minigrid.core.world_object import Door, Key, Lava
from minigrid.minigrid_env import MiniGridEnv

__all__ = ["ENV_IDS"]

UNSEEN = np.zeros(3, dtype=np.uint8)
EMPTY = np.array([OBJECT_TO_IDX["empty"], 0, 0], dtype=np.uint8)
NO_AGENT = 4  # direction channel value away from the agent's cell


def _encode(obj) -> np.ndarray:
    return EMPTY if obj is None else np.asarray(obj.encode(), dtype=np.uint8)


class MemoryGridEnv(MiniGridEnv):
    """A MiniGrid room whose observation is the memory of all cells seen so far (see module docstring).

    Subclasses draw the room in ``_gen_grid`` and list the doors whose opening counts as success in
    ``self.doors``.
    """

    def __init__(self, min_room_size: int, max_room_size: int, agent_view_size: int = 3,
                 max_steps: int = 150, **kwargs):
        if not 5 <= min_room_size <= max_room_size:
            raise ValueError(f"room sizes must satisfy 5 <= min_room_size <= max_room_size, got "
                             f"{min_room_size}, {max_room_size}")
        self.min_room_size = min_room_size
        self.max_room_size = max_room_size
        self.doors: list[Door] = []
        super().__init__(mission_space=MissionSpace(mission_func=lambda: "open the door"),
                         width=max_room_size, height=max_room_size, agent_view_size=agent_view_size,
                         max_steps=max_steps, **kwargs)
        self.observation_space = spaces.Box(0, 255, (self.width, self.height, 4), dtype=np.uint8)
        self.memory = np.zeros((self.width, self.height, 3), dtype=np.uint8)
        self._view_offsets = self._make_view_offsets()

    def _make_view_offsets(self) -> list[np.ndarray]:
        """Per direction: the absolute (dx, dy) offset of every view cell (vx, vy) from the agent.

        Inverse of ``MiniGridEnv.get_view_coords``: cell = agent + d*(sz-1) - r*hs + vx*r - vy*d.
        """
        sz, hs = self.agent_view_size, self.agent_view_size // 2
        vx, vy = np.meshgrid(np.arange(sz), np.arange(sz), indexing="ij")
        offsets = []
        for d in range(4):
            dvec = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]][d])
            rvec = np.array([-dvec[1], dvec[0]])
            off = dvec * (sz - 1) - rvec * hs + vx[..., None] * rvec - vy[..., None] * dvec
            offsets.append(off)  # [sz, sz, 2]
        return offsets

    def _room_size(self) -> tuple[int, int]:
        lo, hi = self.min_room_size, self.max_room_size + 1
        return self._rand_int(lo, hi), self._rand_int(lo, hi)

    def _walled_room(self, size_x: int, size_y: int) -> None:
        self.grid = Grid(self.width, self.height)
        self.grid.wall_rect(0, 0, size_x, size_y)

    def _wall_door_pos(self, size_x: int, size_y: int, wall: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """A random door cell on ``wall`` (0 east, 1 south, 2 west, 3 north) and the cell inside in front of it."""
        if wall == 0:
            y = self._rand_int(1, size_y - 1)
            return (size_x - 1, y), (size_x - 2, y)
        if wall == 1:
            x = self._rand_int(1, size_x - 1)
            return (x, size_y - 1), (x, size_y - 2)
        if wall == 2:
            y = self._rand_int(1, size_y - 1)
            return (0, y), (1, y)
        x = self._rand_int(1, size_x - 1)
        return (x, 0), (x, 1)

    # ------------------------------------------------------------------ memory observation

    def reset(self, *, seed=None, options=None):
        self.memory[:] = 0
        self._last_agent_pos = None
        return super().reset(seed=seed, options=options)

    def gen_obs(self) -> np.ndarray:
        _, vis_mask = self.gen_obs_grid()
        ax, ay = self.agent_pos
        cells = self._view_offsets[self.agent_dir][vis_mask] + (ax, ay)
        inside = (cells[:, 0] >= 0) & (cells[:, 0] < self.width) & (cells[:, 1] >= 0) & (cells[:, 1] < self.height)
        for x, y in cells[inside]:
            self.memory[x, y] = _encode(self.grid.get(int(x), int(y)))
        # Only cells in view or the one the agent just left can change, so re-encoding those keeps the
        # memory equal to the true grid on every seen cell (what the original re-encodes each step).
        if self._last_agent_pos is not None:
            lx, ly = self._last_agent_pos
            self.memory[lx, ly] = _encode(self.grid.get(lx, ly))
        self._last_agent_pos = (int(ax), int(ay))
        obs = np.empty((self.width, self.height, 4), dtype=np.uint8)
        obs[..., :3] = self.memory
        obs[ax, ay, :3] = _encode(self.carrying)
        obs[..., 3] = NO_AGENT
        obs[ax, ay, 3] = self.agent_dir
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        success = action == self.actions.toggle and any(d.is_open for d in self.doors)
        if success:
            reward, terminated = self._reward(), True
        info["success"] = bool(success)
        return obs, reward, terminated, truncated, info


class SimpleDoorKeyEnv(MemoryGridEnv):
    """One locked door in a random wall, its key anywhere in the room."""

    def _gen_grid(self, width, height):
        sx, sy = self._room = self._room_size()
        self._walled_room(sx, sy)
        door_pos, self._door_front = self._wall_door_pos(sx, sy, self._rand_int(0, 4))
        color = self._rand_elem(sorted(COLOR_NAMES))
        self.doors = [Door(color, is_locked=True)]
        self.grid.set(*door_pos, self.doors[0])
        self.place_agent((0, 0), (sx, sy), rand_dir=True)
        self.place_obj(Key(color), (0, 0), (sx, sy))
        self.mission = "open the door"


class LavaDoorKeyEnv(SimpleDoorKeyEnv):
    """SimpleDoorKey plus one lava cell, never on the cell in front of the door."""

    def _gen_grid(self, width, height):
        super()._gen_grid(width, height)
        self.place_obj(Lava(), (0, 0), self._room, reject_fn=lambda env, pos: tuple(pos) == self._door_front)


class ColoredDoorKeyEnv(MemoryGridEnv):
    """A blue locked door, one blue key and ``num_keys - 1`` red keys; keys never block the door."""

    def __init__(self, min_room_size: int, max_room_size: int, min_num_keys: int = 2, max_num_keys: int = 2,
                 **kwargs):
        if not 1 <= min_num_keys <= max_num_keys:
            raise ValueError(f"key counts must satisfy 1 <= min_num_keys <= max_num_keys, got "
                             f"{min_num_keys}, {max_num_keys}")
        self.min_num_keys, self.max_num_keys = min_num_keys, max_num_keys
        super().__init__(min_room_size, max_room_size, **kwargs)

    def _gen_grid(self, width, height):
        sx, sy = self._room_size()
        self._walled_room(sx, sy)
        door_pos, front = self._wall_door_pos(sx, sy, self._rand_int(0, 4))
        self.doors = [Door("blue", is_locked=True)]
        self.grid.set(*door_pos, self.doors[0])
        self.place_agent((0, 0), (sx, sy), rand_dir=True)
        reject = lambda env, pos: tuple(pos) == front  # noqa: E731
        n_keys = self._rand_int(self.min_num_keys, self.max_num_keys + 1)
        self.place_obj(Key("blue"), (0, 0), (sx, sy), reject_fn=reject)
        for _ in range(n_keys - 1):
            self.place_obj(Key("red"), (0, 0), (sx, sy), reject_fn=reject)
        self.mission = "open the door"


class TwoDoorEnv(MemoryGridEnv):
    """Two locked doors on opposite walls of a large room, the key in the central 2×2 cells; either door wins."""

    def _gen_grid(self, width, height):
        sx, sy = self._room_size()
        self._walled_room(sx, sy)
        walls = (0, 2) if self._rand_int(0, 2) == 0 else (1, 3)
        color = self._rand_elem(sorted(COLOR_NAMES))
        self.doors = [Door(color, is_locked=True) for _ in walls]
        for wall, door in zip(walls, self.doors):
            pos, _ = self._wall_door_pos(sx, sy, wall)
            self.grid.set(*pos, door)
        self.place_obj(Key(color), (sx // 2 - 1, sy // 2 - 1), (2, 2))
        self.place_agent((0, 0), (sx, sy), rand_dir=True)
        self.mission = "open the door"


ENV_IDS = {
    "simpledoorkey": "MiniGrid-SimpleDoorKey-Min5-Max10-View3",
    "lavadoorkey": "MiniGrid-LavaDoorKey-Min5-Max10-View3",
    "coloreddoorkey": "MiniGrid-ColoredDoorKey-Min5-Max10-View3",
    "twodoor": "MiniGrid-TwoDoor-Min20-Max20",
}

_SPECS = {
    ENV_IDS["simpledoorkey"]: ("SimpleDoorKeyEnv", {"min_room_size": 5, "max_room_size": 10}),
    ENV_IDS["lavadoorkey"]: ("LavaDoorKeyEnv", {"min_room_size": 5, "max_room_size": 10}),
    ENV_IDS["coloreddoorkey"]: ("ColoredDoorKeyEnv", {"min_room_size": 5, "max_room_size": 10,
                                                      "min_num_keys": 2, "max_num_keys": 2}),
    ENV_IDS["twodoor"]: ("TwoDoorEnv", {"min_room_size": 20, "max_room_size": 20}),
}

for _env_id, (_cls, _kwargs) in _SPECS.items():
    if _env_id not in gym.registry:
        gym.register(id=_env_id, entry_point=f"llmrl.envs.doorkey:{_cls}",
                     kwargs={**_kwargs, "agent_view_size": 3, "max_steps": 150})
