"""The DoorKey family environments: registration, gymnasium conformance, determinism, memory observation,
success reward, and the oracle teacher solving them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from llmrl.agents.teacher import ENV_KIND, OraclePlanner, TeacherPolicy, observation_texts
from llmrl.envs.make import make_env
from llmrl.envs.doorkey import ENV_IDS
from llmrl.eval.harness import evaluate

ALL = list(ENV_IDS.values())


@pytest.mark.parametrize("env_id", ALL)
def test_registered_and_check_env(env_id):
    env = make_env(env_id, seed=0)  # registered by importing llmrl.envs.doorkey (ENV_IDS above)
    assert env_id in gym.registry
    check_env(env.unwrapped, skip_render_check=True)
    side = 20 if "TwoDoor" in env_id else 10
    assert env.observation_space.shape == (side, side, 4)
    assert env.unwrapped.max_steps == 150 and env.unwrapped.agent_view_size == 3


@pytest.mark.parametrize("env_id", ALL)
def test_same_seed_same_episode(env_id):
    def rollout(seed):
        env = make_env(env_id)
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(0)
        out = [obs]
        for _ in range(60):
            obs, r, term, trunc, _ = env.step(int(rng.integers(7)))
            out += [obs, np.array([r, term, trunc])]
            if term or trunc:
                obs, _ = env.reset()
                out.append(obs)
        return out

    a, b, c = rollout(3), rollout(3), rollout(4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_memory_keeps_seen_cells_and_marks_agent():
    env = make_env(ENV_IDS["simpledoorkey"])
    obs, _ = env.reset(seed=1)
    u = env.unwrapped
    seen_before = obs[..., 0] != 0
    assert 0 < seen_before.sum() <= 9  # a 3x3 view at most
    for _ in range(4):  # turn on the spot: the memory only grows
        obs, *_ = env.step(0)
        assert np.all(obs[..., 0][seen_before] != 0)
    assert (obs[..., 0] != 0).sum() > seen_before.sum()
    ax, ay = u.agent_pos
    assert obs[ax, ay, 3] == u.agent_dir and (obs[..., 3] == 4).sum() == obs[..., 3].size - 1
    # every remembered cell agrees with the true grid (agent's cell shows what it carries: nothing)
    for x, y in zip(*np.nonzero(obs[..., 0])):
        if (x, y) == (ax, ay):
            continue
        cell = u.grid.get(int(x), int(y))
        expect = (1, 0, 0) if cell is None else cell.encode()
        assert tuple(obs[x, y, :3]) == tuple(expect)


def test_success_ends_episode_with_time_discounted_reward():
    env = make_env(ENV_IDS["simpledoorkey"])
    teacher = TeacherPolicy("doorkey", OraclePlanner("doorkey"), 7)
    obs, _ = env.reset(seed=5)
    for t in range(1, 151):
        obs, reward, term, trunc, info = env.step(teacher.act(obs, greedy=True))
        if term:
            break
    assert info["success"] and term and not trunc
    assert reward == pytest.approx(1 - 0.9 * t / 150)


def test_oracle_teacher_solves_simpledoorkey():
    env = make_env(ENV_IDS["simpledoorkey"])
    teacher = TeacherPolicy("doorkey", OraclePlanner("doorkey"), 7)
    s = evaluate(teacher, env, range(1000, 1100), mode="greedy", progress=False).summary()
    assert s["success_rate"] >= 0.95
    assert set(teacher.text_counts) <= set(observation_texts("doorkey"))


@pytest.mark.parametrize("key", ["lavadoorkey", "coloreddoorkey", "twodoor"])
def test_oracle_texts_are_enumerated(key):
    env_id = ENV_IDS[key]
    kind = ENV_KIND[env_id]
    teacher = TeacherPolicy(kind, OraclePlanner(kind), 7)
    s = evaluate(teacher, make_env(env_id), range(20), mode="greedy", progress=False).summary()
    assert set(teacher.text_counts) <= set(observation_texts(kind))
    assert s["success_rate"] >= (0.4 if key == "twodoor" else 0.9)
