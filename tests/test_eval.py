import pytest
import numpy as np

from llmrl.agents.baselines import BabyAIBotPolicy, RandomPolicy
from llmrl.envs.make import make_env
from llmrl.eval.harness import evaluate
from llmrl.eval.stats import mean_interval, wilson_interval


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


def test_claims_follow_interval_separation():
    from llmrl.eval.stats import compare_intervals

    a, b = {"ci_low": 0.34, "ci_high": 0.57}, {"ci_low": 0.17, "ci_high": 0.38}
    assert compare_intervals(a, b) == "overlapping"  # 0.46 vs 0.27 is not "beats" when the intervals overlap
    assert compare_intervals({"ci_low": 0.4, "ci_high": 0.6}, b) == "higher"
    assert compare_intervals(b, {"ci_low": 0.4, "ci_high": 0.6}) == "lower"


def test_iqm_and_probability_of_improvement_with_stratified_bootstrap():
    from llmrl.eval.rliable_stats import iqm, probability_of_improvement

    scores = np.array([[0.0, 0.2, 0.4, 1.0], [0.1, 0.3, 0.5, 0.9], [0.2, 0.4, 0.6, 0.8]])
    out = iqm(scores, reps=500)
    # the middle 50 % of the 12 scores: 0.2 0.3 0.4 0.4 0.5 0.6 -> 0.4
    assert out["value"] == pytest.approx(0.4) and out["ci_low"] <= out["value"] <= out["ci_high"]
    assert (out["runs"], out["tasks"]) == (3, 4) and iqm(scores, reps=500) == out  # seeded
    better = probability_of_improvement(scores + 1.0, scores, reps=500)
    assert better["value"] == 1.0 and better["ci_low"] == 1.0
    same = probability_of_improvement(scores, scores, reps=500)
    assert same["value"] == pytest.approx(0.5) and same["ci_low"] < 0.5 < same["ci_high"]
    with pytest.raises(ValueError, match="tasks"):
        probability_of_improvement(scores, scores[:, :2])
    with pytest.raises(ValueError, match=r"\[runs, tasks\]"):
        iqm(np.array([1.0, 2.0]))


def test_a_metrics_entry_holds_numbers_only():
    from llmrl.eval.headline import HEADLINE_KEYS, headline_part, metrics_entry

    entry = {"success": 0.5, "success_lo": 0.4, "success_hi": 0.6, "seeds": 3, "episodes": 30, "per_seed": [0.5],
             "vs_base": "higher", "tokens": 12.5}
    assert headline_part(entry) == {k: entry[k] for k in ("success", "success_lo", "success_hi", "seeds", "episodes")}
    assert set(headline_part(entry)) <= set(HEADLINE_KEYS)
    assert metrics_entry({"greedy": headline_part(entry)}, aulc=0.2, beats_random=True)["beats_random"] is True
    for bad in ({"dtype": "float32"}, {"env": "AMD EPYC | AVX2"}, {"per_seed": [0.5]}, {"tokens": None}):
        with pytest.raises(ValueError, match="not a number"):
            metrics_entry({"greedy": headline_part(entry)}, **bad)
    with pytest.raises(ValueError, match="greedy.vs_base='higher'"):
        metrics_entry({"greedy": entry})
