"""Seed-level statistics: the interval over seeds includes between-seed variance."""

from __future__ import annotations

import numpy as np
import pytest

from llmrl.eval.seeds import aggregate_seeds
from llmrl.eval.stats import wilson_interval


def test_point_value_is_mean_of_seed_means():
    agg = aggregate_seeds([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    assert agg.value == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert agg.per_seed == (0.5, 1.0, 0.0)
    assert agg.n_seeds == 3 and agg.summary()["episodes"] == 14


def test_interval_wider_than_pooled_when_seeds_disagree():
    rng = np.random.default_rng(0)
    # Three seeds whose true rates differ a lot (0.95, 0.5, 0.05): pooling 300 episodes as independent
    # gives a narrow Wilson interval; the seed-level interval must be much wider.
    seeds = [rng.random(100) < p for p in (0.95, 0.5, 0.05)]
    agg = aggregate_seeds(seeds)
    pooled = np.concatenate(seeds)
    lo, hi = wilson_interval(int(pooled.sum()), pooled.size)
    assert agg.ci_high - agg.ci_low > 3 * (hi - lo)
    assert agg.ci_low <= agg.value <= agg.ci_high


def test_identical_seeds_give_episode_level_width():
    s = [1] * 50 + [0] * 50
    agg = aggregate_seeds([s, s, s, s, s])
    # Only episode noise remains: roughly the width of a 500-episode binomial interval.
    lo, hi = wilson_interval(250, 500)
    assert 0.5 * (hi - lo) < agg.ci_high - agg.ci_low < 2.0 * (hi - lo)


def test_deterministic_and_seed_dependent():
    data = [[0, 1, 1], [1, 0, 0, 1], [1, 1]]
    assert aggregate_seeds(data, rng_seed=3) == aggregate_seeds(data, rng_seed=3)
    assert aggregate_seeds(data, rng_seed=3).value == aggregate_seeds(data, rng_seed=4).value


def test_iqm_ignores_an_outlier_seed():
    data = [[10.0] * 5, [11.0] * 5, [12.0] * 5, [-500.0] * 5]
    assert aggregate_seeds(data, statistic="iqm").value == pytest.approx(10.5)
    assert aggregate_seeds(data, statistic="mean").value < 0


@pytest.mark.parametrize("bad, match", [([], "no seeds"), ([[1.0], []], "seed 1 has no episodes"),
                                        ([[float("nan")]], "non-finite")])
def test_bad_input_named(bad, match):
    with pytest.raises(ValueError, match=match):
        aggregate_seeds(bad)


def test_bad_statistic_named():
    with pytest.raises(ValueError, match="statistic"):
        aggregate_seeds([[1.0]], statistic="median")


def test_rate_interval_never_collapses_at_zero_or_one():
    zero = aggregate_seeds([[0] * 100, [0] * 100, [0] * 100], rate=True)
    assert zero.value == 0 and zero.ci_low == 0 and zero.ci_high == pytest.approx(wilson_interval(0, 300)[1])
    one = aggregate_seeds([[1] * 50], rate=True)
    assert one.ci_high == 1 and one.ci_low == pytest.approx(wilson_interval(50, 50)[0])
    with pytest.raises(ValueError, match="0/1"):
        aggregate_seeds([[0.5, 1.0]], rate=True)


def test_headline_uses_rate_intervals():
    from llmrl.eval.headline import headline

    h = headline([[0.0] * 100], [[0.0] * 100])
    assert h["success"] == 0 and h["success_hi"] > 0.03 and h["seeds"] == 1 and h["episodes"] == 100
