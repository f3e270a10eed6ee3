import pytest

from llmrl.agents import BabyAIBotPolicy, RandomPolicy
from llmrl.envs import make_env
from llmrl.eval import evaluate, mean_interval, wilson_interval


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-3)
    assert wilson_interval(20, 20)[1] == 1.0
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    assert mean_interval([1.0, 1.0]) == (1.0, 1.0)
    lo, hi = mean_interval([0.0, 1.0, 2.0])
    assert lo < 1.0 < hi


def test_bot_beats_random_with_intervals():
    env = make_env("BabyAI-GoToLocal-v0")
    bot = evaluate(BabyAIBotPolicy(), env, range(1000, 1040), mode="greedy", progress=False).summary()
    rnd = evaluate(RandomPolicy(n_actions=6), env, range(1000, 1040), mode="sampled", progress=False).summary()
    assert bot["episodes"] == 40 and bot["seeds"] == "1000-1039" and bot["mode"] == "greedy"
    assert bot["success_rate"] >= 0.95 and bot["success_ci95"][0] > rnd["success_ci95"][1]
    lo, hi = bot["success_ci95"]
    assert lo <= bot["success_rate"] <= hi


def test_same_seeds_same_result():
    env = make_env("BabyAI-GoToLocal-v0")
    a = evaluate(RandomPolicy(n_actions=6), env, range(10), mode="sampled", progress=False).table()
    b = evaluate(RandomPolicy(n_actions=6), env, range(10), mode="sampled", progress=False).table()
    assert a == b


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        evaluate(RandomPolicy(), make_env("BabyAI-GoToLocal-v0"), [0], mode="argmax")
