"""BabyAI's egocentric per-slot features: offsets in the agent's frame for every direction, absent slots zero, any
batch shape, numpy and torch alike, invariant under rotating the world, and right on real environment states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from minigrid.core.constants import COLOR_TO_IDX, DIR_TO_VEC, OBJECT_TO_IDX

from llmrl.envs import kalm_babyai as bab
from llmrl.envs import kalm_egocentric as ke

SLOT = {key: k for k, key in enumerate(bab.SLOTS)}
FIRST = bab.OBS_DIM - 2 * bab.MAX_OBJECTS


def _state(agent, objects=(), carrying=None) -> np.ndarray:
    """A compact state: agent (x, y, dir), objects {(type, colour): (x, y)}, carried (type, colour) or None."""
    s = np.zeros(bab.OBS_DIM, np.float32)
    s[:3] = agent
    if carrying is not None:
        kind, colour = carrying  # its codes; a carried object's slot stays (0, 0)
        s[3:5] = OBJECT_TO_IDX[kind], COLOR_TO_IDX[colour]
    for key, pos in dict(objects).items():
        s[FIRST + 2 * SLOT[key]:FIRST + 2 * SLOT[key] + 2] = pos
    return s


def _slot(features: np.ndarray, key) -> tuple:
    """(present, forward, right) of one slot in the numeric form."""
    return tuple(features[3 * SLOT[key]:3 * SLOT[key] + 3].tolist())


@pytest.mark.parametrize("direction", range(4))
def test_the_object_in_front_is_one_forward_and_the_one_at_the_right_is_one_right(direction):
    front = tuple(np.array([5, 5]) + DIR_TO_VEC[direction])
    right = tuple(np.array([5, 5]) + DIR_TO_VEC[(direction + 1) % 4])
    behind_left = tuple(np.array([5, 5]) - 2 * DIR_TO_VEC[direction] - 3 * DIR_TO_VEC[(direction + 1) % 4])
    f = ke.egocentric_features(_state((5, 5, direction), {("ball", "red"): front, ("key", "blue"): right,
                                                         ("box", "grey"): behind_left}))
    assert _slot(f, ("ball", "red")) == (1, 1, 0)
    assert _slot(f, ("key", "blue")) == (1, 0, 1)
    assert _slot(f, ("box", "grey")) == (1, -2, -3)


def test_hand_worked_offsets_with_y_growing_downward():
    # facing east at (3, 3): (3, 4) is south, on the agent's right; facing north: (4, 3) (east) is on its right
    assert _slot(ke.egocentric_features(_state((3, 3, 0), {("ball", "red"): (3, 4)})), ("ball", "red")) == (1, 0, 1)
    assert _slot(ke.egocentric_features(_state((3, 3, 3), {("ball", "red"): (4, 3)})), ("ball", "red")) == (1, 0, 1)
    # facing west at (6, 2): (2, 2) is four cells ahead
    assert _slot(ke.egocentric_features(_state((6, 2, 2), {("ball", "red"): (2, 2)})), ("ball", "red")) == (1, 4, 0)


def test_absent_and_carried_slots_are_zero():
    f = ke.egocentric_features(_state((7, 9, 1), {("ball", "red"): (2, 2)}, carrying=("key", "green")))
    assert _slot(f, ("key", "green")) == (0, 0, 0)  # carried: its slot is (0, 0)
    absent = [k for k in bab.SLOTS if k != ("ball", "red")]
    assert all(_slot(f, k) == (0, 0, 0) for k in absent)
    onehot = ke.egocentric_onehot(_state((7, 9, 1)))
    per_slot = onehot.reshape(bab.MAX_OBJECTS, sum(ke.EGOCENTRIC_CLASSES))
    # absent: class 0 of present, the zero offset's class of forward and right
    assert (per_slot.argmax(1) == 0).all() and (per_slot.sum(1) == 3).all()
    assert (per_slot[:, 2 + ke.OFFSET_SHIFT] == 1).all() and (per_slot[:, 2 + 31 + ke.OFFSET_SHIFT] == 1).all()


def test_batch_shapes_and_torch_give_the_numpy_values():
    rng = np.random.default_rng(0)
    states = np.zeros((2, 3, bab.OBS_DIM), np.float32)
    states[..., :2] = rng.integers(1, 15, (2, 3, 2))
    states[..., 2] = rng.integers(0, 4, (2, 3))
    states[..., FIRST:] = rng.integers(0, 16, (2, 3, 2 * bab.MAX_OBJECTS))
    f = ke.egocentric_features(states)
    assert f.shape == (2, 3, ke.EGOCENTRIC_DIM) == (2, 3, 54) and f.dtype == np.float32
    assert ke.egocentric_onehot(states).shape == (2, 3, ke.EGOCENTRIC_ONEHOT_DIM) == (2, 3, 18 * 64)
    np.testing.assert_array_equal(f[1, 2], ke.egocentric_features(states[1, 2]))
    present, forward, right = ke.egocentric_offsets(torch.from_numpy(states))
    np.testing.assert_array_equal(torch.stack([present.float(), forward, right], -1).reshape(2, 3, -1).numpy(), f)
    with pytest.raises(ValueError, match="41 dims"):
        ke.egocentric_features(np.zeros((2, 39), np.float32))


_cell = st.integers(1, bab.MAX_ROOM_SIZE - 2)  # inside the walls: row and column 0 are walls


@st.composite
def _states(draw):
    agent = (draw(_cell), draw(_cell), draw(st.integers(0, 3)))
    keys = draw(st.lists(st.sampled_from(bab.SLOTS), unique=True, max_size=6))
    return _state(agent, {k: (draw(_cell), draw(_cell)) for k in keys})


@settings(max_examples=60, deadline=None)
@given(_states())
def test_offsets_map_back_to_the_absolute_positions(state):
    x, y, d = state[:3].astype(int)
    f = ke.egocentric_features(state).reshape(bab.MAX_OBJECTS, 3)
    for k in range(bab.MAX_OBJECTS):
        pos = state[FIRST + 2 * k:FIRST + 2 * k + 2]
        present, forward, right = f[k]
        assert present == float(pos.any())
        if present:
            back = np.array([x, y]) + forward * DIR_TO_VEC[d] + right * DIR_TO_VEC[(d + 1) % 4]
            np.testing.assert_array_equal(back, pos)
        assert abs(forward) <= ke.OFFSET_SHIFT and abs(right) <= ke.OFFSET_SHIFT


@settings(max_examples=60, deadline=None)
@given(_states())
def test_rotating_the_world_a_quarter_turn_keeps_the_features(state):
    # a quarter turn clockwise on screen (y down): east -> south, (x, y) -> (c - y, x), keeping cells inside the walls
    c = bab.MAX_ROOM_SIZE - 1
    turned = state.copy()
    turned[:3] = c - state[1], state[0], (state[2] + 1) % 4
    for k in range(bab.MAX_OBJECTS):
        x, y = state[FIRST + 2 * k:FIRST + 2 * k + 2]
        if x or y:
            turned[FIRST + 2 * k:FIRST + 2 * k + 2] = c - y, x
    np.testing.assert_array_equal(ke.egocentric_features(turned), ke.egocentric_features(state))


def test_in_a_real_room_the_object_the_agent_faces_is_one_forward():
    rng = np.random.default_rng(0)
    found = 0
    for seed in range(40):
        env = bab.make_babyai_env("goto:red:ball", "go to the red ball", seed=seed, num_distractors=6)
        env.reset(seed=seed)
        level = env.unwrapped
        for _ in range(30):
            state = bab.compact_state(env)
            f = ke.egocentric_features(state).reshape(bab.MAX_OBJECTS, 3)
            for obj in level.room_grid[0][0].objs:  # every object where the offsets put it
                k = SLOT[(obj.type, obj.color)]
                back = np.array(level.agent_pos) + f[k, 1] * level.dir_vec + f[k, 2] * level.right_vec
                np.testing.assert_array_equal(back, obj.cur_pos)
            ahead = level.grid.get(*level.front_pos)
            if ahead is not None and (ahead.type, ahead.color) in SLOT:
                assert tuple(f[SLOT[(ahead.type, ahead.color)]]) == (1, 1, 0)
                found += 1
                break
            env.step(int(rng.choice([0, 1, 2])))  # left, right, forward
    assert found >= 5
