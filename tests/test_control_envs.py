"""Every ProPS control task: gymnasium's env checker, seeded determinism, batched = looped evaluation."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from llmrl.agents.linear_policy import evaluate_params, evaluate_params_loop, policy_for
from llmrl.envs.control import TASKS, UnknownTaskError, get_task, make_control_env


@pytest.mark.parametrize("key", sorted(TASKS))
def test_check_env_and_determinism(key):
    env = make_control_env(key)
    check_env(env.unwrapped, skip_render_check=True)

    def trajectory(seed):
        e = make_control_env(key)
        e.action_space.seed(seed)
        obs, _ = e.reset(seed=seed)
        out = [np.asarray(obs, dtype=np.float64).ravel()]
        for _ in range(30):
            obs, r, term, trunc, _ = e.step(e.action_space.sample())
            out.append(np.append(np.asarray(obs, dtype=np.float64).ravel(), r))
            if term or trunc:
                break
        e.close()
        return out

    a, b = trajectory(3), trajectory(3)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    c = trajectory(4)
    assert len(a) != len(c) or any(not np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("key", sorted(TASKS))
def test_batched_evaluation_equals_loop(key):
    policy = policy_for(key)
    params = np.random.default_rng(0).uniform(-6, 6, size=(3, policy.n_params))
    cap = 50
    batched = evaluate_params(key, params, [5, 6, 7], max_episode_steps=cap)
    looped = evaluate_params_loop(key, params, [5, 6, 7], max_episode_steps=cap)
    np.testing.assert_allclose(batched, looped, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(batched, evaluate_params(key, params, [5, 6, 7], max_episode_steps=cap))


def test_unknown_task_and_bad_cap_are_named():
    with pytest.raises(UnknownTaskError, match="Cartpole-v1"):
        get_task("Cartpole-v1")
    assert get_task("CartPole-v1").key == "cartpole"
    with pytest.raises(ValueError, match="max_episode_steps: 600 exceeds CartPole-v1's own limit 500"):
        make_control_env("cartpole", max_episode_steps=600)
    for task in TASKS.values():
        assert task.env_id in gym.registry
        env = make_control_env(task)
        policy = policy_for(task)
        names = task.state_names if task.policy == "linear" else ()
        assert len(task.action_names) == (env.action_space.n if hasattr(env.action_space, "n")
                                          else env.action_space.shape[0])
        if names:
            assert len(names) == env.observation_space.shape[0] == policy.obs_dim
        env.close()
