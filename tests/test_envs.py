import gymnasium as gym
import numpy as np
import pytest

from llmrl.envs import make_env

LEVELS = ["BabyAI-GoToLocal-v0", "BabyAI-PickupLoc-v0", "MiniGrid-DoorKey-5x5-v0"]


@pytest.mark.parametrize("env_id", LEVELS)
def test_same_seed_same_episodes(env_id):
    def rollout(seed):
        env = make_env(env_id, seed=seed)
        out = []
        for _ in range(3):
            obs, _ = env.reset()
            out.append((obs["image"].copy(), obs["mission"]))
            for _ in range(5):
                obs, *_ = env.step(env.action_space.sample())
            out.append((obs["image"].copy(), obs["mission"]))
        return out

    a, b, c = rollout(3), rollout(3), rollout(4)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
    assert not all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, c))


def test_babyai_noise_kept_out_of_stdout(capsys):
    env = make_env("BabyAI-PickupLoc-v0", seed=0)
    for s in range(30):
        env.reset(seed=s)
    assert "Sampling rejected" not in capsys.readouterr().out


def test_unknown_env_names_the_id():
    with pytest.raises(gym.error.Error, match="BabyAI-PickupLocal-v0"):
        make_env("BabyAI-PickupLocal-v0")
