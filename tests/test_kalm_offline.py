"""KALM offline RL: dataset building, the mix ratio, d3rlpy training, the policy wrapper, params."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from llmrl.algos.kalm_offline import build_dataset, fit_projection, make_learnable, mix_episodes, train_offline
from llmrl.agents.offline_policy import PROJECTION_FILE, OfflinePolicy, save_learnable
from llmrl.config import ParamsError, load_section
from llmrl.config.kalm import KalmOfflineParams, OfflineAlgo
from llmrl.data.embeddings import EmbeddingTable, InstructionProjection, MissingEmbeddingError
from llmrl.envs.kalm_episodes import expert_episodes
from llmrl.files import DamagedFileError
from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.eval.kalm import offline_act, random_act, run_level


def _episode(length: int, mission: str, d: int | None = None, imaginary: bool = False) -> Episode:
    d = kl.obs_dim("babyai") if d is None else d
    rng = np.random.default_rng(length)
    obs = rng.integers(0, 6, (length, d)).astype(np.float32)
    term = np.zeros(length, bool)
    term[-1] = True
    return Episode(observations={"obs": obs, "next_obs": obs}, actions=rng.integers(0, 7, length),
                   rewards=term.astype(np.float32), terminated=term, truncated=np.zeros(length, bool),
                   mission=mission, info={"imaginary": imaginary})


@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.8])
def test_mix_ratio_is_honoured(ratio):
    real = [_episode(n, "go to the red box") for n in (5, 9, 7, 12, 6, 10)]
    imagined = [_episode(n, "go to the red ball", imaginary=True) for n in (3, 4, 6, 2, 5, 3, 4, 6, 2, 5) * 6]
    mixed, stats = mix_episodes(real, imagined, ratio, seed=0)
    assert mixed[:len(real)] == real
    n_imag = sum(len(e) for e in mixed[len(real):])
    assert n_imag == stats.imagined_steps and stats.real_steps == sum(len(e) for e in real)
    assert stats.imagined_available == len(imagined) and stats.imagined_episodes == len(mixed) - len(real)
    assert all(e.info["imaginary"] for e in mixed[len(real):])
    # within half of the longest imagined episode of the target share
    assert abs(n_imag - ratio / (1 - ratio) * stats.real_steps) <= 3
    assert abs(stats.imagined_share - ratio) < 0.06
    again, _ = mix_episodes(real, imagined, ratio, seed=0)
    assert [len(e) for e in again] == [len(e) for e in mixed]
    with pytest.raises(ValueError, match="mix_ratio"):
        mix_episodes(real, imagined, 1.0, seed=0)


def test_no_imagined_transition_is_used_more_often_than_it_was_generated():
    """Too few rollouts for the share: each is used once and the share falls short (recorded), never padded by
    repeating the same rollouts."""
    real = [_episode(n, "go to the red box") for n in (5, 9, 7, 12, 6, 10)]
    imagined = [_episode(n, "go to the red ball", imaginary=True) for n in (3, 4, 6)]
    mixed, stats = mix_episodes(real, imagined, 0.5, seed=0)
    used = mixed[len(real):]
    assert sorted(id(e) for e in used) == sorted(id(e) for e in imagined)  # each generated rollout once
    assert stats.imagined_steps == 13 and stats.imagined_episodes == 3 == stats.imagined_available
    assert stats.imagined_share == pytest.approx(13 / (13 + 49)) and stats.imagined_share < 0.5
    # transitions: no (episode, step) pair occurs more often in the mix than in what was generated
    generated = collections.Counter((id(e), t) for e in imagined for t in range(len(e)))
    in_mix = collections.Counter((id(e), t) for e in used for t in range(len(e)))
    assert all(in_mix[k] <= generated[k] for k in in_mix)
    alone, none = mix_episodes(real, [], 0.5, seed=0)
    assert alone == real and none.imagined_steps == 0 and none.imagined_available == 0


def test_dataset_flags_every_episode_end_and_appends_the_embedding():
    table = EmbeddingTable(["go to the red box", "go to the red ball"], np.eye(2, 3, dtype=np.float32))
    eps = [_episode(5, "go to the red box"), _episode(7, "go to the red ball"), _episode(4, "go to the red box")]
    eps[1].terminated[-1] = False
    eps[1].truncated[-1] = True
    ds = build_dataset(eps, table, "babyai", egocentric=False)
    assert len(ds.episodes) == 3  # no step dropped after a missing end flag
    assert [len(e.observations) for e in ds.episodes] == [5, 7, 4]
    assert ds.transition_count == 5 + 6 + 4  # a timeout episode has no transition out of its last step
    d = kl.obs_dim("babyai")
    assert ds.episodes[1].observations.shape == (7, d + 3)
    np.testing.assert_array_equal(ds.episodes[1].observations[:, d:], np.tile([0, 1, 0], (7, 1)))
    with pytest.raises(MissingEmbeddingError, match="pick up"):
        build_dataset([_episode(3, "pick up the key")], table, "babyai", egocentric=False)


def _smollm_like(n: int, dim: int = 576, seed: int = 0) -> np.ndarray:
    """Embeddings shaped like SmolLM2's mean-pooled ones: one dimension with a mean of about 20, the rest small."""
    x = np.random.default_rng(seed).normal(0.4, 1.0, (n, dim)).astype(np.float32)
    x[:, 7] += 20.0
    return x


def test_instruction_projection_centres_keeps_k_columns_and_round_trips(tmp_path):
    x = _smollm_like(12)
    proj = InstructionProjection.fit(x, 4)
    y = proj.apply(x)
    assert y.shape == (12, 4) and y.dtype == np.float32 and proj.input_dim == 576 and proj.dim == 4
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-4)  # centred: the dominant constant dimension is gone
    variances = y.var(0)
    assert np.all(np.diff(variances) <= 1e-6)  # principal components, largest first
    # the columns are the best rank-4 summary: the residual equals the variance left in the other components
    residual = ((x - proj.mean) - y @ proj.components.T)
    assert np.square(residual).sum() < np.square(x - x.mean(0)).sum() * 0.85
    # signs fixed: the largest entry of each component is positive, so a refit gives the same columns
    w = proj.components
    assert np.all(w[np.abs(w).argmax(0), np.arange(4)] > 0)
    np.testing.assert_array_equal(InstructionProjection.fit(x, 4).apply(x), y)
    proj.save(tmp_path / "p.npz")
    np.testing.assert_array_equal(InstructionProjection.load(tmp_path / "p.npz").apply(x), y)
    # fewer distinct instructions than k: the trailing columns are zero, the input size stays k
    few = InstructionProjection.fit(x[:3], 8)
    assert few.apply(x).shape == (12, 8) and np.all(few.apply(x)[:, 2:] == 0)
    with pytest.raises(ValueError, match="fitted on size 576"):
        proj.apply(x[:, :100])
    with pytest.raises(ValueError, match="k must be at least 1"):
        InstructionProjection.fit(x, 0)


def test_dataset_with_projection_holds_the_projected_instruction():
    texts = ["go to the red box", "go to the red ball", "pick up the blue key"]
    table = EmbeddingTable(texts, _smollm_like(3))
    eps = [_episode(5, texts[0]), _episode(6, texts[1]), _episode(4, texts[0])]
    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteBC", steps=10, instruction_components=2)
    proj = fit_projection(eps, table, algo)
    # fitted on the instructions of the data (two here), not on the whole table
    np.testing.assert_allclose(proj.mean, table.embeddings[:2].mean(0), rtol=1e-5)
    ds = build_dataset(eps, table, "babyai", proj, egocentric=False)
    d = kl.obs_dim("babyai")
    assert ds.episodes[0].observations.shape == (5, d + 2)
    np.testing.assert_allclose(ds.episodes[1].observations[0, d:], proj.apply(table.get(texts[1])), rtol=1e-6)
    assert fit_projection(eps, table, algo.model_copy(update={"instruction_components": 0})) is None


def test_wrong_observation_size_raises_before_training():
    table = EmbeddingTable(["go to the red box"], np.ones((1, 4), np.float32))
    with pytest.raises(kl.ObservationSizeError, match="observations/obs"):
        build_dataset([_episode(5, "go to the red box", d=39)], table, "babyai", egocentric=False)


def test_params_validate_d3rlpy_config_and_levels():
    ok = {"algos": {"b": {"benchmark": "babyai", "algo": "DiscreteBC", "steps": 10, "config": {"batch_size": 8}}}}
    p = load_section({"kalm": {"offline": ok}}, "kalm.offline", KalmOfflineParams)
    assert p.algos["b"].d3rlpy_config().batch_size == 8
    bad_kw = {"algos": {"b": {"benchmark": "babyai", "algo": "DiscreteBC", "steps": 10, "config": {"bogus": 1}}}}
    with pytest.raises(ParamsError, match="kalm.offline.algos.b"):
        load_section({"kalm": {"offline": bad_kw}}, "kalm.offline", KalmOfflineParams)
    with pytest.raises(ParamsError, match="does not fit"):
        load_section({"kalm": {"offline": {"algos": {"b": {"benchmark": "babyai", "algo": "TD3PlusBC",
                                                             "steps": 10}}}}}, "kalm.offline", KalmOfflineParams)
    with pytest.raises(ParamsError, match="observation_scaler is set by standardise"):
        load_section({"kalm": {"offline": {"algos": {"b": {"benchmark": "babyai", "algo": "DiscreteBC", "steps": 10,
                                                             "config": {"observation_scaler": None}}}}}},
                     "kalm.offline", KalmOfflineParams)
    with pytest.raises(ParamsError, match="imagined_levels"):
        load_section({"kalm": {"offline": {**ok, "imagined_levels": ["medium"]}}}, "kalm.offline",
                     KalmOfflineParams)


@pytest.fixture(scope="module")
def tiny_goto():
    """Bot episodes on four go-to goals in a small room, embedded with the tiny LLM."""
    from llmrl.llm.load import load_model
    from llmrl.llm.embed import build_table

    goals = [g for g in kl.goals("babyai", "train") if g.task.startswith("goto:")
             and g.instruction.startswith("go to the")][:4]
    settings = kl.EnvSettings(max_steps=30, room_size=6, num_distractors=2)
    # 300 a goal (~4,600 steps): with 60 (~900 steps) BC fits them (loss 0.15) and still acts no better than random
    # (0.175 against 0.15): it must learn which slot the instruction names, as well as how to walk to it
    episodes = list(expert_episodes("babyai", goals, 300, seed=0, settings=settings))
    table = build_table(load_model("tiny"), [g.instruction for g in goals])
    return goals, settings, episodes, table


def test_discrete_bc_on_tiny_real_data_beats_random(tiny_goto, tmp_path):
    import d3rlpy

    goals, settings, episodes, table = tiny_goto
    # beta=0: no logit regularisation, so the loss is the imitation loss alone (d3rlpy's default 0.5 adds ~1.2)
    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteBC", steps=3000,
                       config={"batch_size": 64, "learning_rate": 1e-3, "beta": 0.0})
    projection = fit_projection(episodes, table, algo)
    learnable = make_learnable(algo, seed=0)
    rows = list(train_offline(learnable, build_dataset(episodes, table, "babyai", projection, egocentric=False),
                              algo.steps, log_every=600))
    assert [r["step"] for r in rows] == [600, 1200, 1800, 2400, 3000]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    pool = kl.GoalEnvPool(settings)
    embeds = table.lookup([g.instruction for g in goals])
    policy = OfflinePolicy(learnable, embeds[0], projection=projection)
    trained = np.mean([o.success for o in run_level(offline_act(policy, embeds), goals, pool, 10, 20_000)])
    rand = np.mean([o.success for o in run_level(random_act("babyai", 0), goals, pool, 10, 20_000)])
    assert trained >= rand + 0.15, (trained, rand)  # measured: 0.625 at 3000 updates, random 0.15
    # save -> d3rlpy.load_learnable round trip gives the same actions
    save_learnable(learnable, tmp_path / "model.d3", projection, egocentric=False)
    assert PROJECTION_FILE in (tmp_path / "SHA256SUMS").read_text()
    kept = (tmp_path / PROJECTION_FILE).read_bytes()
    (tmp_path / PROJECTION_FILE).unlink()  # listed in the manifest: its loss is named, not a size mismatch later
    with pytest.raises(DamagedFileError, match=PROJECTION_FILE):
        OfflinePolicy.load(tmp_path / "model.d3", embeds[0])
    (tmp_path / PROJECTION_FILE).write_bytes(kept)
    loaded = OfflinePolicy.load(tmp_path / "model.d3", embeds[0])
    assert loaded.projection is not None  # the raw table embedding goes in; the model reads its projection
    x = np.stack([e.observations["obs"][0] for e in episodes[:8]])
    np.testing.assert_array_equal(loaded.act_batch(x, embeds[[0] * 8]), policy.act_batch(x, embeds[[0] * 8]))
    assert isinstance(d3rlpy.load_learnable(str(tmp_path / "model.d3")), type(learnable))
    # the action distribution a sampled evaluation draws from: its arg-max is d3rlpy's greedy action
    probs = loaded.action_probs(x, embeds[[0] * 8])
    np.testing.assert_allclose(probs.sum(1), 1, rtol=1e-5)
    np.testing.assert_array_equal(probs.argmax(1), policy.act_batch(x, embeds[[0] * 8]))
    sampled = np.mean([o.success for o in run_level(offline_act(policy, embeds, sample_seed=0), goals, pool, 10,
                                                    20_000)])
    assert sampled >= rand + 0.15, (sampled, rand)
    again = run_level(offline_act(policy, embeds, sample_seed=0), goals, pool, 10, 20_000)
    other = run_level(offline_act(policy, embeds, sample_seed=1), goals, pool, 10, 20_000)
    assert [o.length for o in again] == [o.length for o in run_level(offline_act(policy, embeds, sample_seed=0),
                                                                     goals, pool, 10, 20_000)]
    assert [o.length for o in again] != [o.length for o in other]
    with pytest.raises(ValueError, match="input size"):
        policy.act_batch(x[:, :39], embeds[[0] * 8])


def test_egocentric_policy_input_is_the_datasets_row_and_is_recorded_with_the_model(tmp_path):
    """With egocentric features, BC trains on obs ⊕ features ⊕ instruction and ``OfflinePolicy`` builds the same
    row from an environment observation; the saved model records the flag, and a policy told otherwise fails
    naming it."""
    from llmrl.agents.offline_policy import INPUT_FILE, policy_observation
    from llmrl.envs.kalm_egocentric import EGOCENTRIC_DIM, egocentric_features

    goals = kl.goals("babyai", "train")[:2]
    settings = kl.EnvSettings(max_steps=16, room_size=6, num_distractors=2)
    episodes = list(expert_episodes("babyai", goals, 3, seed=0, settings=settings))
    table = EmbeddingTable([g.instruction for g in goals], np.random.default_rng(0).normal(size=(2, 5)).astype(
        np.float32))
    ds = build_dataset(episodes, table, "babyai", egocentric=True)
    d = kl.obs_dim("babyai")
    first = ds.episodes[0].observations
    assert first.shape[1] == d + EGOCENTRIC_DIM + table.dim
    obs0 = episodes[0].observations["obs"]
    np.testing.assert_array_equal(first[:, d:d + EGOCENTRIC_DIM], egocentric_features(obs0))
    with pytest.raises(ValueError, match="babyai_egocentric_input"):
        build_dataset(episodes, table, "metaworld", egocentric=True)
    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteBC", steps=5, config={"batch_size": 8})
    learnable = make_learnable(algo, seed=0)
    list(train_offline(learnable, ds, algo.steps, 5))
    policy = OfflinePolicy(learnable, table.embeddings[0], egocentric=True)
    env = kl.make_goal_env(goals[0], 10_000, settings)
    obs, _ = env.reset(seed=10_000)
    x = np.stack([obs, obs0[0]])
    embeds = table.embeddings[[0, 0]]
    np.testing.assert_array_equal(policy._input(x[1:], embeds[:1])[0], first[0])  # the dataset's row, exactly
    assert policy.act_batch(x, embeds).shape == (2,)
    np.testing.assert_array_equal(policy._input(x, embeds)[:, :d + EGOCENTRIC_DIM], policy_observation(x, True))
    save_learnable(learnable, tmp_path / "model.d3", egocentric=True)
    assert INPUT_FILE in (tmp_path / "SHA256SUMS").read_text()
    loaded = OfflinePolicy.load(tmp_path / "model.d3", table.embeddings[0])
    assert loaded.egocentric
    np.testing.assert_array_equal(loaded.act_batch(x, embeds), policy.act_batch(x, embeds))
    with pytest.raises(ValueError, match="egocentric"):
        OfflinePolicy(learnable, table.embeddings[0]).act_batch(x, embeds)


def test_sampled_actions_need_a_discrete_imitation_policy(tiny_goto):
    _goals, _settings, episodes, table = tiny_goto
    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteCQL", steps=10, config={"batch_size": 16})
    learnable = make_learnable(algo, 0)
    list(train_offline(learnable, build_dataset(episodes[:5], table, "babyai", egocentric=False), algo.steps, 10))
    x = episodes[0].observations["obs"][:2]
    with pytest.raises(ValueError, match="sampled actions need a discrete imitation policy"):
        OfflinePolicy(learnable, table.embeddings[0], name="dcql").action_probs(x, table.embeddings[[0, 0]])


def test_training_is_deterministic_per_seed(tiny_goto):
    _goals, _settings, episodes, table = tiny_goto
    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteCQL", steps=60, config={"batch_size": 32})
    runs = []
    for seed in (3, 3, 4):
        ds = build_dataset(episodes[:40], table, "babyai", egocentric=False)
        runs.append([r["loss"] for r in train_offline(make_learnable(algo, seed), ds, algo.steps, 30)])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_evaluate_benchmark_aggregates_over_training_seeds(tiny_goto, tmp_path):
    from llmrl.eval.kalm import evaluate_benchmark

    _goals, _settings, episodes, table = tiny_goto
    full = EmbeddingTable(
        [g.instruction for g in kl.goals("babyai", "easy")] + table.instructions,
        np.concatenate([np.zeros((len(kl.goals("babyai", "easy")), table.dim), np.float32), table.embeddings]))
    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteBC", steps=20, config={"batch_size": 16})
    runs = []
    for seed in (0, 1):
        learnable = make_learnable(algo, seed)
        list(train_offline(learnable, build_dataset(episodes[:20], table, "babyai", egocentric=False), algo.steps, 20))
        (tmp_path / f"dbc-real-{seed}").mkdir()
        save_learnable(learnable, tmp_path / f"dbc-real-{seed}" / "model.d3", egocentric=False)
        runs.append(("dbc-real", tmp_path / f"dbc-real-{seed}" / "model.d3"))
    easy = kl.goals("babyai", "easy")
    out = evaluate_benchmark("babyai", offline_runs=runs, table=full, levels=["easy"],
                             settings=kl.EnvSettings(max_steps=10), episodes=1, first_seed=20_000, random_seeds=3)
    rows = {r["row"]: r for r in out["rows"]}
    assert set(rows) == {"dbc-real", "dbc-sampled-real", "random"}  # DiscreteBC: greedy and sampled apart
    n = len(easy)  # every goal once per seed
    for row in ("dbc-real", "dbc-sampled-real"):
        assert rows[row]["n_seeds"] == 2 and rows[row]["episodes"] == 2 * n
    greedy = [(e["train_seed"], e["episode_seed"], e["length"]) for e in out["episodes"] if e["row"] == "dbc-real"]
    drawn = [(e["train_seed"], e["episode_seed"], e["length"]) for e in out["episodes"]
             if e["row"] == "dbc-sampled-real"]
    assert [g[:2] for g in greedy] == [d[:2] for d in drawn]  # the same starts
    assert rows["random"]["n_seeds"] == 3 and rows["random"]["episodes"] == 3 * n
    assert set(rows["random"]["success_by_goal"]) == {g.instruction for g in easy}
    played = [e["goal"] for e in out["episodes"] if e["row"] == "random"]
    assert all(played.count(g.instruction) == 3 for g in easy)
    assert all(kl.start_split(e["episode_seed"]).name == "test" for e in out["episodes"])
    assert rows["random"]["ci_low"] <= rows["random"]["value"] <= rows["random"]["ci_high"]
    for row in rows.values():  # success rates: never narrower than the pooled Wilson interval (0/12 is not [0, 0])
        assert row["ci_high"] > row["value"] or row["value"] == 1.0
    assert set(out["headline"]) == {"dbc-real", "dbc-sampled-real", "random"}
    assert out["headline"]["random"] == {"easy": rows["random"]["value"], "mean": rows["random"]["value"]}
    assert len(out["episodes"]) == 7 * n
    with pytest.raises(ValueError, match="kalm.eval.seed"):
        evaluate_benchmark("babyai", offline_runs=runs, table=full, levels=["easy"], settings=kl.EnvSettings(),
                           episodes=1, first_seed=0, random_seeds=1)
