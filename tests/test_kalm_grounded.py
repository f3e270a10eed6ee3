"""KALM grounded LLM: the four losses reach their projections and heads, save/load round trip, KV-cache
generation equals re-encoding, imagined rollouts stop by the level's rule and are rewarded by it, the LLM acts."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from llmrl.algos import kalm_grounding as kg
from llmrl.algos import kalm_imagine as ki
from llmrl.config.kalm import KalmGroundParams, KalmImagineParams
from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.eval.kalm import rollout_quality
from llmrl.llm.grounded import ACTION, STATE, GroundedLM, GroundingSpec, build_grounded, collate

D, A = 5, 3


def _episode(rng, T=6, discrete=False, mission="reach the red ball"):
    obs = rng.normal(size=(T + 1, D)).astype(np.float32)
    act = rng.integers(0, A, T) if discrete else rng.uniform(-1, 1, (T, A)).astype(np.float32)
    return Episode(observations={"obs": obs[:-1], "next_obs": obs[1:]}, actions=act, rewards=np.zeros(T),
                   terminated=np.zeros(T, bool), truncated=np.zeros(T, bool), mission=mission)


def _model(discrete=False, finetune="lora", obs_dim=D, action_dim=A, obs_fields=(), field_copy_logit=0.0):
    torch.manual_seed(0)
    return build_grounded(GroundingSpec(obs_dim=obs_dim, action_dim=action_dim, discrete=discrete,
                                        base_model="tiny", finetune=finetune, obs_fields=[list(f) for f in obs_fields],
                                        field_copy_logit=field_copy_logit))


def _babyai_model():
    return _model(True, obs_dim=kl.obs_dim("babyai"), action_dim=kl.action_spec("babyai").n,
                  obs_fields=kl.obs_fields("babyai"), field_copy_logit=kg.FIELD_COPY_LOGIT)


def _params(**kw):
    base = dict(model="tiny", trajectory_samples=4, dynamics_samples=4, goal_samples=4, reverse_samples=4,
                window=4, epochs=1.0, batch_size=4, dtype="float32", lr=3e-3, warmup=0)
    return KalmGroundParams(**{**base, **kw})


@pytest.mark.parametrize("discrete", [False, True])
def test_each_pattern_loss_reaches_its_projection_and_head(discrete):
    rng = np.random.default_rng(0)
    model = _model(discrete)
    samples = kg.build_samples(model, [_episode(rng, discrete=discrete)], _params(), rng)
    pad = model.llm.tokenizer.pad_token_id
    lora = [p for n, p in model.lm.named_parameters() if "lora_B" in n]
    # which losses each pattern carries, and which parts must then get a gradient
    expect = {"trajectory": ("obs_loss", "act_loss"), "dynamics": ("obs_loss",), "goal": ("obs_loss",),
              "reverse": ("token_loss",)}
    for pattern, seqs in samples.items():
        batch = collate(seqs, pad)
        assert batch["ids"].shape == batch["kind"].shape == batch["labels"].shape
        assert batch["obs"].shape[-1] == D
        losses = model.losses(batch)
        for name in ("obs_loss", "act_loss", "token_loss"):
            assert (float(losses[name]) > 0) == (name in expect[pattern]), (pattern, name)
        for name in expect[pattern]:
            model.zero_grad(set_to_none=True)
            losses = model.losses(batch)
            losses[name].backward()
            head = model.io.obs_head if name == "obs_loss" else model.io.act_head if name == "act_loss" else None
            if head is not None:
                assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0, (pattern, name)
            assert model.io.state_proj.weight.grad.abs().sum() > 0, (pattern, name)  # every pattern reads states
            if pattern != "goal":  # the goal pattern holds no action
                assert model.io.action_proj.weight.grad.abs().sum() > 0, (pattern, name)
            assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in lora), (pattern, name)


def test_loss_falls_on_a_toy_dataset():
    rng = np.random.default_rng(1)
    model = _model()
    eps = [_episode(rng) for _ in range(3)]
    p = _params(trajectory_samples=8, dynamics_samples=8, goal_samples=4, reverse_samples=4, epochs=10.0,
                batch_size=8, lr=1e-2)  # 24 samples / 8 per batch x 10 epochs = 30 updates
    samples = kg.build_samples(model, eps, p, rng)
    before = kg.evaluate_losses(model, samples, p)
    rows = list(kg.train_grounding(model, samples, p, rng))
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert {"step", "loss", "obs_loss", "act_loss", "token_loss", "lr"} <= rows[0].keys()
    after = kg.evaluate_losses(model, samples, p)
    # the regression heads fit the toy data; the random tiny LM's token loss (~ln 50k) moves less
    assert after["loss"] < before["loss"]
    for k in ("obs_loss", "act_loss"):
        assert after[k] < 0.7 * before[k], (k, before, after)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_save_load_round_trip(tmp_path, finetune):
    rng = np.random.default_rng(2)
    model = _model(finetune=finetune)
    model.codec.mean.fill_(0.5)
    p = _params(epochs=0.5)
    samples = kg.build_samples(model, [_episode(rng)], p, rng)
    list(kg.train_grounding(model, samples, p, rng))  # adapter and heads move away from their init
    model.eval()
    batch = collate(samples["trajectory"] + samples["reverse"], model.llm.tokenizer.pad_token_id)
    with torch.no_grad():
        ref = {k: float(v) for k, v in model.losses(batch).items()}
    model.save(tmp_path / "g")
    loaded = GroundedLM.load(tmp_path / "g")
    with torch.no_grad():
        got = {k: float(v) for k, v in loaded.losses(batch).items()}
    assert got == pytest.approx(ref, abs=1e-5)
    assert torch.equal(loaded.codec.mean, model.codec.mean)
    fresh = _model(finetune=finetune)
    with torch.no_grad():
        assert float(fresh.losses(batch)["obs_loss"]) != pytest.approx(ref["obs_loss"], abs=1e-5)
    if finetune == "lora":  # the adapter names no local path and lists its modules in a fixed order
        import json

        config = json.loads((tmp_path / "g" / "adapter" / "adapter_config.json").read_text())
        assert config["target_modules"] == sorted(config["target_modules"])
        for f in (tmp_path / "g" / "adapter").iterdir():
            if f.suffix in (".json", ".md"):
                assert str(tmp_path) not in f.read_text() and "/tmp" not in f.read_text(), f.name


def test_load_names_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="grounding.json"):
        GroundedLM.load(tmp_path)


@pytest.mark.parametrize("discrete", [False, True])
def test_kv_cache_generation_equals_reencoding(discrete):
    model = _model(discrete)
    rng = np.random.default_rng(3)
    obs0 = rng.normal(size=(3, D)).astype(np.float32)
    instr = ["go", "pick up the blue key please", "open the door"]  # different lengths: left padding
    a1, s1, _ = model.imagine(instr, obs0, 5, reuse_cache=True)
    a2, s2, _ = model.imagine(instr, obs0, 5, reuse_cache=False)
    assert a1.shape == ((3, 5) if discrete else (3, 5, A)) and s1.shape == (3, 5, D)
    np.testing.assert_allclose(s1, s2, atol=1e-4)
    np.testing.assert_allclose(a1, a2, atol=1e-4)
    # a row alone gives the same rollout as inside the padded batch
    a3, s3, _ = model.imagine(instr[1:2], obs0[1:2], 5)
    np.testing.assert_allclose(s3[0], s1[1], atol=1e-4)


def test_imagined_rollouts_stop_by_the_rule_and_rewards_follow_it():
    goal = kl.goals("babyai", "easy")[0]
    model = _babyai_model()
    # make the obs head emit a state that satisfies the goal's rule from the 3rd imagined state on
    settings = kl.EnvSettings(max_steps=16)
    env = kl.make_goal_env(goal, 0, settings)
    target = None
    from llmrl.envs.kalm_episodes import expert_episodes
    ep = next(iter(expert_episodes("babyai", [goal], 1, seed=0, settings=settings, action_noise=0.0)))
    if ep.terminated[-1]:
        target = ep.observations["next_obs"][-1]
    env.close()
    assert target is not None and kl.obs_success(goal, target)
    p = KalmImagineParams(rollouts=3, babyai_horizon=6, batch_size=3, seed=30_005)
    calls = {"n": 0}
    real_imagine = model.imagine

    def imagine(*args, stop=None, **kw):  # wrap the stop rule to check it is the level's rule
        def spy(t, nxt):
            calls["n"] += 1
            if t == 2:
                nxt = np.repeat(target[None], len(nxt), 0)
                out = stop(t, nxt)
                assert all(out)
                return out
            out = stop(t, nxt)
            assert list(out) == [kl.obs_success(goal, o) for o in nxt]
            return out
        acts, nexts, lengths = real_imagine(*args, stop=spy, **kw)
        for j in range(len(lengths)):
            if lengths[j] == 3:
                nexts[j, 2] = target
        return acts, nexts, lengths

    model.imagine = imagine
    episodes = ki.imagine_level(model, [goal], p, settings, 6)
    assert len(episodes) == 3 and calls["n"] >= 1
    for e in episodes:
        assert e.info["imaginary"] is True
        assert len(e) <= 3
        rewards, terminated = kl.label_rewards(goal, e.observations["next_obs"])
        np.testing.assert_array_equal(e.rewards, rewards)
        np.testing.assert_array_equal(e.terminated, terminated)
        assert e.terminated[-1] == kl.obs_success(goal, e.observations["next_obs"][-1])
        assert e.terminated[-1] or e.truncated[-1]
    summary, rows, curve = rollout_quality(episodes, [goal] * 3, settings, consistent=[True, False, True])
    assert summary["rollouts"] == 3 and 0 <= summary["replay_success"] <= 1 and summary["step_mae"] >= 0
    assert summary["consistent"] == 2 and len(rows) == 3 and [r["consistent"] for r in rows] == [True, False, True]
    assert [c["step"] for c in curve] == list(range(1, len(curve) + 1)) and curve[0]["rollouts"] == 3


def test_imagine_horizon_without_success_truncates():
    goal = kl.goals("babyai", "hard")[0]
    model = _babyai_model()
    p = KalmImagineParams(rollouts=2, babyai_horizon=4, batch_size=2)
    eps = ki.imagine_level(model, [goal], p, kl.EnvSettings(max_steps=8), 4)
    for e in eps:
        assert len(e) <= 4
        if not e.terminated[-1]:
            assert len(e) == 4 and e.truncated[-1] and e.rewards.sum() == 0


def test_wrong_obs_size_raises_before_generation():
    model = _model(True)  # obs_dim 5
    with pytest.raises(kl.ObservationSizeError, match="obs_dim"):
        ki.imagine_level(model, kl.goals("babyai", "easy")[:1], KalmImagineParams(rollouts=1), None, 4)


def test_grounded_policy_acts_in_the_real_env(tmp_path):
    from llmrl.agents.grounded_policy import GroundedAgent
    from llmrl.eval.harness import run_episode

    model = _model(True, obs_dim=kl.obs_dim("babyai"), action_dim=kl.action_spec("babyai").n)
    model.save(tmp_path / "babyai" / "0")
    with pytest.raises(FileNotFoundError, match="metaworld"):
        GroundedAgent.load({"babyai": tmp_path / "babyai" / "0", "metaworld": tmp_path / "metaworld" / "0"})
    agent = GroundedAgent.load({"babyai": tmp_path / "babyai" / "0"})
    goal = kl.goals("babyai", "easy")[0]
    env = kl.make_goal_env(goal, 0, kl.EnvSettings(max_steps=5))
    policy = agent.policy(goal)
    rec, _ = run_episode(env, policy, 0, greedy=True)
    assert 1 <= rec.length <= 5
    with pytest.raises(LookupError, match="metaworld"):
        agent.policy(kl.goals("metaworld", "easy")[0])


@pytest.mark.parametrize("discrete", [False, True])
def test_episodes_stepped_as_one_batch_act_as_each_alone(discrete):
    """kalm_eval's grounded row (``grounded_act``): the episodes of a level share one left-padded KV cache and
    rows leave it as episodes end; every episode's actions equal those of the same episode run alone."""
    from llmrl.eval.kalm import grounded_act

    model = _model(discrete)
    rng = np.random.default_rng(5)
    goals = [SimpleNamespace(instruction=i) for i in ["go", "pick up the blue key please", "open the door"]]
    T = 4
    obs = rng.normal(size=(T, 3, D)).astype(np.float32)
    act = grounded_act(model, goals)
    batched = {j: [] for j in range(3)}
    for t in range(T):
        live = [0, 1, 2] if t < 2 else [0, 2]  # episode 1 ends after two steps
        out = act(obs[t, live], np.asarray(live), np.asarray(live))
        for k, j in enumerate(live):
            batched[j].append(out[k])
    for j in range(3):
        alone = grounded_act(model, goals[j:j + 1])
        steps = len(batched[j])
        solo = [alone(obs[t, [j]], np.asarray([0]), np.asarray([0]))[0] for t in range(steps)]
        np.testing.assert_allclose(np.asarray(solo, np.float64), np.asarray(batched[j], np.float64), atol=1e-4)


def test_constant_training_dims_stay_bounded_when_they_vary_later():
    """A dim that never varies in the training states (a second object's slots) enters as d / floor when it
    varies later, not d / 1e-3, and the codec writes such a state back exactly."""
    from llmrl.llm.grounded import ObsCodec, observation_scale

    rng = np.random.default_rng(7)
    train = rng.normal(size=(200, D)).astype(np.float32)
    train[:, 1] = 0.25  # never varies
    train[:, 3] = 0.0
    mean, scale = observation_scale(train, floor=0.05)
    assert scale[1] == pytest.approx(0.05) and scale[3] == pytest.approx(0.05) and scale[0] > 0.9
    codec = ObsCodec(GroundingSpec(obs_dim=D, action_dim=A, discrete=False, obs_mean=mean, obs_std=scale))
    later = train[:4].copy()
    later[:, 1] = 0.25 + np.array([0.3, -0.2, 0.1, 0.0])  # the constant dims vary at evaluation
    later[:, 3] = np.array([0.5, 0.4, -0.3, 0.2])
    z = codec.encode(torch.from_numpy(later))
    assert torch.isfinite(z).all() and z[:, 1].abs().max() <= 0.3 / 0.05 + 1e-4 and z[:, 3].abs().max() <= 10.0 + 1e-4
    torch.testing.assert_close(codec.decode(z), torch.from_numpy(later), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="floor"):
        observation_scale(train, floor=0.0)


def test_babyai_states_are_categorical_and_imagined_codes_are_exact():
    """BabyAI's compact state is categorical fields: one head block per field of kalm_babyai.compact_fields; real
    states round-trip through the codec; the observation head's argmax writes a code in range for every field, so
    the success rule reads an imagined state exactly (and fires on a decoded success state); training raises the
    accuracy."""
    from llmrl.envs import kalm_babyai as bab
    from llmrl.envs.kalm_episodes import expert_episodes

    model = _babyai_model()
    goal = kl.goals("babyai", "train")[0]
    settings = kl.EnvSettings(max_steps=16)
    eps = list(expert_episodes("babyai", [goal], 3, seed=0, settings=settings))
    obs = torch.from_numpy(np.concatenate([e.observations["next_obs"] for e in eps]))
    codec = model.codec
    fields = bab.compact_fields()
    assert model.spec.obs_dim == bab.OBS_DIM == len(fields) and [list(f) for f in fields] == model.spec.obs_fields
    # agent x, y, direction, carried type, colour; per (type, colour) slot x, y: no continuous dim
    assert codec.categorical and codec.features == codec.out_features == (16 + 16 + 4 + 11 + 6 + 18 * (16 + 16))
    prev = torch.from_numpy(np.concatenate([e.observations["obs"] for e in eps]))
    # one-hot logits decode to the codes, over the copy prior on another current state
    torch.testing.assert_close(codec.decode(codec.encode(obs) * 10.0, prev), obs)
    assert float(codec.loss(codec.encode(obs) * 50.0, obs, prev)) < 1e-6
    # the copy prior: a head that outputs nothing keeps every field, and what it must learn are the changes
    zero = torch.zeros(len(obs), codec.out_features)
    torch.testing.assert_close(codec.decode(zero, prev), prev)
    torch.testing.assert_close(codec.decode(codec.target_features(obs, prev), prev), obs)
    assert float(codec.loss(zero, prev, prev)) < float(codec.loss(zero, obs, prev))
    assert float(codec.accuracy(zero, prev, prev)) == 1.0 > float(codec.accuracy(zero, obs, prev))
    with pytest.raises(ValueError, match="current state"):
        codec.decode(zero)
    done = [e.observations["next_obs"][-1] for e in eps if e.terminated[-1]]
    assert done and all(kl.obs_success(goal, codec.decode(codec.encode(torch.from_numpy(s[None])) * 10.0,
                                                          torch.from_numpy(s[None]))[0].numpy())
                        for s in done)
    _, nexts, _ = model.imagine([goal.instruction], obs[:1].numpy(), 3)
    assert np.array_equal(nexts, np.round(nexts))
    for start, classes, _kind in fields:
        assert ((0 <= nexts[..., start]) & (nexts[..., start] < classes)).all()
    for state in nexts.reshape(-1, bab.OBS_DIM):
        assert isinstance(kl.obs_success(goal, state), bool) and bab.read_compact(state)["agent"]
    rng = np.random.default_rng(0)
    p = _params(trajectory_samples=12, dynamics_samples=12, goal_samples=4, reverse_samples=0, epochs=6.0,
                batch_size=8, lr=1e-2, window=8)
    samples = kg.build_samples(model, eps, p, rng)
    before = kg.evaluate_losses(model, samples, p)
    list(kg.train_grounding(model, samples, p, rng))
    after = kg.evaluate_losses(model, samples, p)
    assert after["obs_accuracy"] > before["obs_accuracy"] and after["obs_loss"] < before["obs_loss"]


def test_egocentric_input_blocks_extend_the_features_and_survive_save_load(tmp_path):
    """With ``obs_egocentric`` the codec's input ends with the egocentric one-hot blocks of each state
    (``kalm_egocentric.egocentric_onehot``) and the heads still predict the compact state's fields; the spec
    keeps the flag through save and load, and a spec written without the key loads as off."""
    import json

    from llmrl.envs import kalm_babyai as bab
    from llmrl.envs import kalm_egocentric as ke
    from llmrl.envs.kalm_episodes import expert_episodes
    from llmrl.llm.grounded import CONFIG_FILE, ObsCodec

    eps = list(expert_episodes("babyai", kl.goals("babyai", "train")[:1], 2, seed=0,
                               settings=kl.EnvSettings(max_steps=16)))
    spec = kg.grounding_spec("babyai", eps, _params(), egocentric=True)
    assert spec.obs_egocentric
    plain = ObsCodec(dataclasses.replace(spec, obs_egocentric=False))
    codec = ObsCodec(spec)
    assert codec.features == plain.features + ke.EGOCENTRIC_ONEHOT_DIM and codec.out_features == plain.out_features
    obs = np.concatenate([e.observations["obs"] for e in eps])
    feats = codec.encode(torch.from_numpy(obs)).numpy()
    np.testing.assert_array_equal(feats[:, :plain.features], plain.encode(torch.from_numpy(obs)).numpy())
    np.testing.assert_array_equal(feats[:, plain.features:], ke.egocentric_onehot(obs))
    turned = obs[:1].copy()
    turned[0, 2] = (turned[0, 2] + 1) % 4  # the same state but for the agent's direction
    both = codec.encode(torch.from_numpy(np.concatenate([obs[:1], turned]))).numpy()[:, plain.features:]
    assert (both[0] != both[1]).any()
    with pytest.raises(ValueError, match="obs_egocentric"):
        ObsCodec(GroundingSpec(obs_dim=D, action_dim=A, discrete=True, obs_egocentric=True))
    with pytest.raises(ValueError, match="babyai_egocentric_input"):
        kg.grounding_spec("metaworld", [_episode(np.random.default_rng(0))], _params(), egocentric=True)

    torch.manual_seed(0)
    model = build_grounded(spec)  # _params(): the tiny LM with LoRA
    assert model.io.state_proj.in_features == codec.features
    rng = np.random.default_rng(0)
    samples = kg.build_samples(model, eps, _params(), rng)
    batch = collate(samples["trajectory"] + samples["dynamics"], model.llm.tokenizer.pad_token_id)
    model.eval()
    with torch.no_grad():
        ref = {k: float(v) for k, v in model.losses(batch).items()}
    assert np.isfinite(list(ref.values())).all() and ref["obs_loss"] > 0
    _actions, nexts, _lengths = model.imagine([eps[0].mission], obs[:1], 2)
    assert nexts.shape == (1, 2, bab.OBS_DIM)
    model.save(tmp_path / "g")
    assert json.loads((tmp_path / "g" / CONFIG_FILE).read_text())["obs_egocentric"] is True
    loaded = GroundedLM.load(tmp_path / "g")
    assert loaded.spec.obs_egocentric and loaded.codec.features == codec.features
    with torch.no_grad():
        assert {k: float(v) for k, v in loaded.losses(batch).items()} == pytest.approx(ref, abs=1e-5)
    saved = json.loads((tmp_path / "g" / CONFIG_FILE).read_text())
    del saved["obs_egocentric"]
    assert not GroundingSpec(**saved).obs_egocentric


def test_instruction_scores_with_a_shared_prompt_equal_whole_sequences():
    """``instruction_logprobs`` runs the trajectory prompt once and the candidates from its cache: the same
    log-probabilities as scoring each whole sequence alone."""
    from llmrl.llm.grounded import reverse_prompt

    model = _model(True)
    rng = np.random.default_rng(4)
    ep = _episode(rng, T=7, discrete=True)
    cands = ["go to the red ball", "open the door", "pick up the blue key and then go to the box"]
    got = model.instruction_logprobs(ep.observations["obs"], ep.actions, ep.observations["next_obs"][-1], cands, 4)
    tok = model.llm.tokenizer
    for c, value in zip(cands, got):
        seq = reverse_prompt(model.builder, ep.observations["obs"], ep.actions, ep.observations["next_obs"][-1], 4)
        seq = seq.text(" " + c, target=True).eos(target=True).build()
        with torch.no_grad():
            token_loss = float(model.losses(collate([seq], tok.pad_token_id))["token_loss"])
        assert value == pytest.approx(-token_loss, abs=1e-4)


def test_consistency_ranks_the_own_instruction_against_other_tasks():
    model = _babyai_model()
    goals = kl.goals("babyai", "easy")[:2]
    p = KalmImagineParams(rollouts=1, babyai_horizon=3, batch_size=4)
    eps = ki.imagine_level(model, goals, p, kl.EnvSettings(max_steps=8), 3)
    cands = ki.consistency_candidates("babyai", "easy")
    tasks = [c.task for c in cands]
    assert len(tasks) == len(set(tasks))  # one instruction per task
    assert set(tasks) == {g.task for g in kl.goals("babyai", "easy")} | {g.task for g in kl.goals("babyai", "train")}
    every = ki.consistency(model, eps, cands, states=4)
    drawn = ki.consistency(model, eps, cands, states=4, others=3, seed=1)
    assert [v["competitors"] for v in every] == [len(cands) - 1] * 2 and [v["competitors"] for v in drawn] == [3, 3]
    assert drawn == ki.consistency(model, eps, cands, states=4, others=3, seed=1)  # seeded draw
    for v in every + drawn:
        assert v["consistent"] == (v["own_rank"] == 1) and 1 <= v["own_rank"] <= v["competitors"] + 1
    assert [g.instruction for g in ki.level_goals("babyai", "train")] == \
        [next(g for g in kl.goals("babyai", "train") if g.task == t).instruction
         for t in dict.fromkeys(g.task for g in kl.goals("babyai", "train"))]


def test_imagination_may_not_run_past_the_trained_window():
    ground = _params(window=8)
    assert ki.check_horizon(KalmImagineParams(babyai_horizon=8), ground, "babyai") == 8
    with pytest.raises(ValueError, match="kalm.imagine.metaworld_horizon = 40 exceeds kalm.ground.window = 8"):
        ki.check_horizon(KalmImagineParams(metaworld_horizon=40), ground, "metaworld")


def test_imagined_rollouts_cover_every_goal_equally_from_imagine_starts():
    model = _babyai_model()
    goals = kl.goals("babyai", "hard")[:3]
    p = KalmImagineParams(rollouts=5, babyai_horizon=2, batch_size=4)  # 3 goals: 2 each
    eps = ki.imagine_level(model, goals, p, kl.EnvSettings(max_steps=8), 2)
    counts = {g.instruction: sum(e.mission == g.instruction for e in eps) for g in goals}
    assert counts == dict.fromkeys(counts, 2)
    assert all(kl.start_split(e.seed).name == "imagine" for e in eps)
    with pytest.raises(ValueError, match="kalm.imagine.seed"):
        ki.imagine_level(model, goals, p.model_copy(update={"seed": 20_000}), kl.EnvSettings(max_steps=8), 2)


def test_replay_says_whether_the_model_imagines_at_all():
    """Imagined actions that solve their goals when replayed clear the random reference; actions no better than
    random do not: the gate before any claim about unseen goals."""
    from llmrl.envs.kalm_episodes import expert_episodes

    settings = kl.EnvSettings(max_steps=20, room_size=6, num_distractors=1)
    goals = [g for g in ki.level_goals("babyai", "train") if g.task.startswith("goto")][:4]
    solved = list(expert_episodes("babyai", goals, 4, seed=30_000, settings=settings))  # as if imagined
    ep_goals = [g for g in goals for _ in range(4)]
    good, _, _ = rollout_quality(solved, ep_goals, settings)
    assert good["replay_success"] == 1.0 and good["random_replay_success"] < 0.6 and good["imagines"] is True
    rng = np.random.default_rng(0)
    noise = [Episode(observations=e.observations, actions=rng.integers(0, 7, len(e)), rewards=e.rewards,
                     terminated=e.terminated, truncated=e.truncated, mission=e.mission, seed=e.seed, info=e.info)
             for e in solved]
    bad, _, _ = rollout_quality(noise, ep_goals, settings)
    assert bad["imagines"] is False


def test_the_validation_split_picks_the_grounding_weights():
    """With eval_every, the held-out action and observation losses are measured along training and the model ends
    with the weights where their weighted sum was lowest; the unseen phrasings' token loss is only reported."""
    rng = np.random.default_rng(11)
    model = _model()
    train = [_episode(rng, mission="reach the red ball") for _ in range(2)]
    val = [_episode(rng, mission="open the blue door") for _ in range(2)]
    p = _params(epochs=6.0, batch_size=4, lr=3e-2, eval_every=2)  # 16 samples: 24 updates, measured 12 times
    samples = kg.build_samples(model, train, p, rng)
    held = kg.build_samples(model, val, p.model_copy(update={"reverse_samples": 0}), np.random.default_rng(1))
    unseen = kg.build_samples(model, val, p.model_copy(update={"trajectory_samples": 0, "dynamics_samples": 0,
                                                               "goal_samples": 0}), np.random.default_rng(2))
    rows = list(kg.train_grounding(model, samples, p, rng, validation=held, unseen=unseen))
    measured = {r["step"]: r["heldout_selection_loss"] for r in rows if "heldout_selection_loss" in r}
    assert sorted(measured) == list(range(2, 25, 2))
    assert all("unseen_token_loss" in r and "heldout_act_loss" in r for r in rows if r["step"] in measured)
    best = min(measured, key=measured.get)
    assert rows[-1]["selected"] == best and sum("selected" in r for r in rows) == 1
    assert kg.evaluate_losses(model, held, p)["selection_loss"] == pytest.approx(measured[best], abs=1e-4)
    plain = list(kg.train_grounding(_model(), samples, _params(epochs=1.0), rng, validation=held))
    assert not any("heldout_selection_loss" in r or "selected" in r for r in plain)  # eval_every 0: the last weights


def test_selection_prefers_lower_action_and_observation_loss_over_token_loss():
    """A checkpoint with lower held-out action + observation losses wins even where its token loss on unseen
    phrasings is far worse (the old selector, token-dominated, took the other)."""
    p = _params()
    acting = {"obs_loss": 0.20, "act_loss": 0.40, "token_loss": 3.0}
    talking = {"obs_loss": 0.25, "act_loss": 0.60, "token_loss": 1.0}
    evaluations = [(55, talking), (550, acting)]
    assert kg.select_checkpoint(evaluations, p) == 550
    assert kg.selection_loss(acting, p) == pytest.approx(0.30)
    old = lambda t: p.obs_weight * t["obs_loss"] + p.act_weight * t["act_loss"] + p.token_weight * t["token_loss"]
    assert min(evaluations, key=lambda e: old(e[1]))[0] == 55  # what the token-weighted loss would have kept
    assert kg.select_checkpoint([(10, acting), (20, dict(acting))], p) == 10  # a tie keeps the earlier
    with pytest.raises(ValueError, match="no evaluations"):
        kg.select_checkpoint([], p)


def test_held_out_selection_uses_training_phrasings_and_tokens_the_unseen_ones():
    from llmrl.envs.kalm_episodes import expert_episodes

    val_goals = [g for g in kl.goals("babyai", "validation") if g.task == "goto:red:box"]
    eps = list(expert_episodes("babyai", val_goals, 3, seed=10_000, settings=kl.EnvSettings(max_steps=12)))
    relabelled = kg.training_phrasing_episodes(eps, "babyai")
    train_phrasings = [g.instruction for g in kl.goals("babyai", "train") if g.task == "goto:red:box"]
    assert [e.mission for e in relabelled] == train_phrasings[:3]  # the k-th episode of a task: its k-th phrasing
    assert all(e.mission not in train_phrasings for e in eps)
    for a, b in zip(eps, relabelled):
        assert a.seed == b.seed and np.array_equal(a.observations["obs"], b.observations["obs"])
    model = _babyai_model()
    selection, unseen = kg.heldout_samples(model, eps, "babyai", _params(trajectory_samples=16, reverse_samples=16),
                                           np.random.default_rng(0))
    assert not selection["reverse"] and selection["trajectory"] and selection["dynamics"]
    assert unseen["reverse"] and not (unseen["trajectory"] or unseen["dynamics"] or unseen["goal"])
    tok = model.llm.tokenizer
    texts = [tok.decode([t for t in s.labels if t != -100]) for s in unseen["reverse"]]
    assert all(any(e.mission in t for e in eps) for t in texts)  # token targets: the unseen phrasings
    wrong = [dataclasses.replace(eps[0], info={**eps[0].info, "task": "goto:red:ball"})]  # a held-out combination
    with pytest.raises(ValueError, match="not a babyai training task"):
        kg.training_phrasing_episodes(wrong, "babyai")


def test_all_transitions_tiles_every_episode_into_windows():
    rng = np.random.default_rng(3)
    eps = [_episode(rng, T=T) for T in (3, 9, 4)]
    model = _model()
    samples = kg.build_samples(model, eps, _params(window=4, all_transitions=True, trajectory_samples=1), rng)
    assert len(samples["trajectory"]) == 1 + 3 + 1  # ceil(T / window) windows per episode
    assert sum(int(s.act_target.sum()) for s in samples["trajectory"]) == 3 + 9 + 4  # every action once


def test_gate0_passes_only_clearly_above_random():
    from llmrl.eval.kalm import gate0

    random = [True] * 5 + [False] * 95
    good = gate0([[True] * 40 + [False] * 60] * 3, random)
    assert good["passed"] and all(s["passed"] for s in good["per_seed"]) and good["grounded"]["episodes"] == 300
    assert good["grounded"]["ci_low"] > good["random"]["ci_high"]
    near = gate0([[True] * 9 + [False] * 91] * 3, random)  # 9 % against 5 %: intervals overlap
    assert not near["passed"]
    mixed = gate0([[True] * 40 + [False] * 60, [False] * 100, [False] * 100], random)
    assert [s["passed"] for s in mixed["per_seed"]] == [True, False, False]
    with pytest.raises(ValueError, match="grounded"):
        gate0([], random)
    with pytest.raises(ValueError, match="random"):
        gate0([[True]], [])


def test_gate0_pooled_over_seeds_trained_apart():
    """kalm_gate0 pools the episodes each kalm_ground item recorded: the grounded episodes of every seed against
    the random episodes of every seed, each seed's own verdict under its seed."""
    from llmrl.eval.kalm import pool_gate0

    seeds = {3: {"grounded": [True] * 40 + [False] * 60, "random": [True] * 3 + [False] * 97, "bc": [True] * 100},
             7: {"grounded": [False] * 100, "random": [True] * 7 + [False] * 93, "bc": [False] * 100}}
    pooled = pool_gate0(seeds)
    assert pooled["grounded"]["episodes"] == 200 and pooled["grounded"]["success"] == 0.2
    assert pooled["random"]["success"] == 0.05 and pooled["bc"]["success"] == 0.5 and pooled["seeds"] == [3, 7]
    assert [(s["seed"], s["passed"]) for s in pooled["per_seed"]] == [(3, True), (7, False)]
    assert pooled["passed"]  # 20 % [15, 26] over 200 episodes against 5 % [3, 8]
    assert "bc_sampled" not in pooled and "reads_goal" not in pooled  # rows recorded only where they apply
    # the swapped-instruction control: paired by start over the seeds; a policy blind to its goal shows no difference
    both = {s: {**rows, "grounded": [True] * 30 + [False] * 70, "grounded_swapped": [False] * 100,
                "bc_sampled": [True] * 30 + [False] * 70, "bc_sampled_swapped": [True] * 30 + [False] * 70}
            for s, rows in seeds.items()}
    pooled = pool_gate0(both)
    assert pooled["bc_sampled"]["success"] == 0.3 and pooled["bc_sampled"]["episodes"] == 200
    assert pooled["grounded_swapped"]["success"] == 0.0
    reads = pooled["reads_goal"]
    assert reads["grounded"]["difference"] == 0.3 and reads["grounded"]["verdict"] == "higher"
    assert reads["grounded"]["starts"] == 100 and reads["grounded"]["seeds"] == 2
    assert reads["grounded"]["starts_higher"] == 30 and reads["grounded"]["starts_lower"] == 0
    assert reads["bc_sampled"]["difference"] == 0.0 and reads["bc_sampled"]["verdict"] == "no difference"
    # the difference is taken within each seed: seeds that differ from each other do not widen it
    uneven = {3: {**both[3], "grounded": [True] * 60 + [False] * 40, "grounded_swapped": [True] * 50 + [False] * 50},
              7: {**both[7], "grounded": [True] * 10 + [False] * 90, "grounded_swapped": [False] * 100}}
    assert pool_gate0(uneven)["reads_goal"]["grounded"]["verdict"] == "higher"
    with pytest.raises(ValueError, match=r"seed 7 has no episodes of \['bc'\]"):
        pool_gate0({**seeds, 7: {**seeds[7], "bc": []}})
    with pytest.raises(ValueError, match="no grounding seed"):
        pool_gate0({})


@pytest.mark.parametrize("benchmark", ["babyai", "metaworld"])
def test_swapped_goals_share_nothing_with_the_own_goal(benchmark):
    from llmrl.eval.kalm import gate_goals, swapped_goals

    goals = gate_goals(benchmark)
    swapped = swapped_goals(goals)
    assert len(swapped) == len(goals) and all(s.task != g.task for g, s in zip(goals, swapped, strict=True))
    if benchmark == "babyai":  # first steps differ in verb, colour and object type
        for g, s in zip(goals, swapped, strict=True):
            assert all(a != b for a, b in zip(g.task.split(">")[0].split(":"), s.task.split(">")[0].split(":"),
                                              strict=True)), (g.task, s.task)


def test_gate0_plays_training_goals_from_validation_starts():
    from llmrl.eval.kalm import closed_loop, gate_goals, grounded_act, random_act

    goals = gate_goals("babyai")
    assert len(goals) == len({g.task for g in kl.goals("babyai", "train")}) and all(g.split == "train" for g in goals)
    goals = goals[:2]
    model = _babyai_model()
    settings = kl.EnvSettings(max_steps=3, room_size=6, num_distractors=1)
    out = closed_loop({"grounded": grounded_act(model, goals), "random": random_act("babyai", 0)}, goals, settings,
                      3, 10_000)
    for outcomes in out.values():
        assert [o.goal for o in outcomes] == [0, 1] * 2  # every goal equally: ceil(3 / 2) rounds
        assert all(kl.start_split(o.seed).name == "validation" for o in outcomes)
        assert all(1 <= o.length <= 3 for o in outcomes)
    with pytest.raises(ValueError, match="kalm.ground.gate_seed"):
        closed_loop({"random": random_act("babyai", 0)}, goals, settings, 3, 20_000)


@pytest.mark.parametrize("discrete", [False, True])
def test_a_step_appends_its_action_and_state_placeholders(discrete):
    """Imagination appends a_t and s_{t+1} one forward pass apart, acting in a real environment both in one block:
    each placeholder carries its own value, the other slot zeros (a block of two rounds like two blocks of one to the
    last bit of float32 only: the projections run as one matrix product)."""
    model = _model(discrete=discrete)
    rng = np.random.default_rng(0)
    B = 3
    action = torch.as_tensor(rng.integers(0, A, B) if discrete else rng.normal(size=(B, A)).astype(np.float32))
    state = torch.as_tensor(rng.normal(size=(B, D)).astype(np.float32))
    ids = model.builder.placeholder_ids
    zero_act = torch.zeros((B, 1), dtype=torch.long) if discrete else torch.zeros((B, 1, A))
    alone_a = model.embed(torch.full((B, 1), ids["action"]), torch.full((B, 1), ACTION), torch.zeros((B, 1, D)),
                          action.reshape(B, 1) if discrete else action.reshape(B, 1, A))
    alone_s = model.embed(torch.full((B, 1), ids["state"]), torch.full((B, 1), STATE), state.reshape(B, 1, D),
                          zero_act)
    torch.testing.assert_close(model.step_embeds(B, action=action), alone_a, rtol=0, atol=0)
    torch.testing.assert_close(model.step_embeds(B, state=state), alone_s, rtol=0, atol=0)
    both = model.step_embeds(B, action=action, state=state)
    torch.testing.assert_close(both, torch.cat([alone_a, alone_s], 1), rtol=0, atol=1e-6)


def test_the_held_out_set_takes_an_eighth_of_each_patterns_samples():
    p = _params(trajectory_samples=160, dynamics_samples=17, goal_samples=4, reverse_samples=8)
    v = kg.validation_params(p)
    assert (v.trajectory_samples, v.dynamics_samples, v.goal_samples, v.reverse_samples) == (20, 2, 1, 1)
    assert v.model_dump(exclude={"trajectory_samples", "dynamics_samples", "goal_samples", "reverse_samples"}) == \
        p.model_dump(exclude={"trajectory_samples", "dynamics_samples", "goal_samples", "reverse_samples"})


def test_length_batches_cover_every_sample_once_in_full_batches():
    from llmrl.algos.kalm_grounding import length_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, size=103)
    batches = length_batches(lengths, 8, np.random.default_rng(1), window=4)
    assert sorted(int(i) for b in batches for i in b) == list(range(103))  # every sample once
    assert min(len(b) for b in batches) >= 8  # a remainder joins its neighbour: N <= 8 processes share every batch
    # bucketed: the length spread inside a batch is far below the pool's
    assert np.mean([np.ptp(lengths[b]) for b in batches]) < 0.5 * np.ptp(lengths)


def _metaworld_like_episodes(rng, n=3, T=6):
    """39-d episodes with Meta-World's layout: [18:36] of s' is [0:18] of s, the goal [36:39] constant."""
    eps = []
    for _ in range(n):
        frames = [np.concatenate([rng.normal(size=18), np.zeros(18), rng.normal(size=3)]).astype(np.float32)]
        frames[0][18:36] = frames[0][:18]
        for _t in range(T):
            prev = frames[-1]
            nxt = prev.copy()
            nxt[:18] = prev[:18] + rng.normal(scale=0.01, size=18)
            nxt[18:36] = prev[:18]
            frames.append(nxt.astype(np.float32))
        obs = np.stack(frames)
        eps.append(Episode(observations={"obs": obs[:-1], "next_obs": obs[1:]},
                           actions=rng.uniform(-1, 1, (T, 4)).astype(np.float32), rewards=np.zeros(T),
                           terminated=np.zeros(T, bool), truncated=np.zeros(T, bool), mission="reach the goal"))
    return eps


def test_metaworld_copy_indices_match_the_simulator():
    """A real Meta-World step: s'[18:36] == s[0:18] exactly and the goal stays (the dims the model copies)."""
    goal = kl.goals("metaworld", "train")[8]  # push
    env = kl.make_goal_env(goal, 0, kl.EnvSettings(max_steps=10))
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(4):
        nxt, *_ = env.step(rng.uniform(-1, 1, 4).astype(np.float32))
        for to, frm in kl.obs_copies("metaworld"):
            assert nxt[to] == obs[frm], (to, frm)
        assert np.abs(nxt[:3] - obs[:3]).max() > 0  # the hand moved: the copies are not trivially constant
        obs = nxt
    assert kl.obs_copies("babyai") == []


def test_metaworld_states_are_predicted_as_changes_with_deterministic_dims_copied():
    rng = np.random.default_rng(4)
    eps = _metaworld_like_episodes(rng)
    spec = kg.grounding_spec("metaworld", eps, _params(), egocentric=False)
    assert spec.obs_delta and sorted(map(tuple, spec.obs_copy)) == sorted(kl.obs_copies("metaworld"))
    torch.manual_seed(0)
    model = build_grounded(spec)
    codec = model.codec
    assert codec.out_features == 39 - 21 and model.io.obs_head.out_features == 18
    cur = torch.from_numpy(np.concatenate([e.observations["obs"] for e in eps]))
    nxt = torch.from_numpy(np.concatenate([e.observations["next_obs"] for e in eps]))
    torch.testing.assert_close(codec.decode(codec.target_features(nxt, cur), cur), nxt, atol=1e-5, rtol=0)
    garbage = codec.decode(torch.randn(len(cur), codec.out_features), cur)
    assert torch.equal(garbage[:, 18:36], cur[:, :18]) and torch.equal(garbage[:, 36:], cur[:, 36:])
    # a change of 0.01 is a target of 0.01 / scale, not a position far from the mean
    assert codec.target_features(nxt, cur).abs().max() < 1.0
    with pytest.raises(ValueError, match="current state"):
        codec.decode(torch.zeros(1, codec.out_features))
    # the loss reads each target's own last state: a zero head scores exactly the changes' squared size
    dyn = kg.build_samples(model, eps, _params(trajectory_samples=0, goal_samples=0, reverse_samples=0,
                                               dynamics_samples=6), rng)["dynamics"]
    with torch.no_grad():
        model.io.obs_head.weight.zero_()
        model.io.obs_head.bias.zero_()
    batch = collate(dyn, model.llm.tokenizer.pad_token_id)
    s = torch.stack([torch.from_numpy(q.obs[q.kind.index(STATE)]) for q in dyn])
    s_next = torch.stack([torch.from_numpy(q.obs[-1]) for q in dyn])
    expected = ((s_next[:, codec.pred] - s[:, codec.pred]) / codec.scale[codec.pred]).pow(2).mean()
    torch.testing.assert_close(model.losses(batch)["obs_loss"], expected, rtol=1e-5, atol=1e-7)
    # a zero head predicts "nothing changes" and copies the previous frame right: it beats copying s
    err = kg.state_error(model, eps)
    assert err["metric"] == "mae" and err["transitions"] == 18
    assert err["model"] < err["copy_last_state"] and err["beats_copy"]
    # imagination: every imagined s_{t+1} carries s_t's frame in [18:36] and the goal of s_0
    torch.manual_seed(1)
    model = build_grounded(spec)
    s0 = eps[0].observations["obs"][:1]
    _, nexts, _ = model.imagine(["reach the goal"], s0, 4)
    states = np.concatenate([s0[:, None], nexts], 1)[0]
    np.testing.assert_array_equal(states[1:, 18:36], states[:-1, :18])
    np.testing.assert_array_equal(states[1:, 36:], np.repeat(s0[:, 36:], 4, 0))
    saved = model.predict_next(eps[0].observations["obs"], eps[0].actions)
    np.testing.assert_array_equal(saved[:, 18:36], eps[0].observations["obs"][:, :18])


def test_babyai_state_error_counts_fields_against_copying():
    from llmrl.envs.kalm_episodes import expert_episodes

    goal = kl.goals("babyai", "train")[0]
    eps = list(expert_episodes("babyai", [goal], 2, seed=0, settings=kl.EnvSettings(max_steps=10)))
    err = kg.state_error(_babyai_model(), eps)
    assert err["metric"] == "field_error" and err["transitions"] == sum(len(e) for e in eps)
    assert 0 <= err["model"] <= 1 and 0 < err["copy_last_state"] < 1  # a step changes some fields, not all


def test_action_agreement_of_episodes_stepped_together_equals_each_alone():
    """``action_agreement`` steps episodes of different lengths as one batch; the share of agreeing steps equals the
    step-weighted mean of each episode scored alone."""
    rng = np.random.default_rng(3)
    model = _model(True)
    eps = [_episode(rng, T=T, discrete=True) for T in (2, 5, 3)]
    missions = ["go", "pick up the blue key please", "open the door"]
    together = kg.action_agreement(model, eps, missions)
    alone = [kg.action_agreement(model, [e], [m]) for e, m in zip(eps, missions)]
    assert together["steps"] == 10 and [a["steps"] for a in alone] == [2, 5, 3]
    assert together["value"] == pytest.approx(sum(a["value"] * a["steps"] for a in alone) / 10, abs=1e-6)
    with pytest.raises(ValueError, match="2 instructions for 3 episodes"):
        kg.action_agreement(model, eps, missions[:2])


def test_goal_sensitivity_tells_a_goal_conditioned_policy_from_one_that_ignores_its_goal():
    """Trained where the instruction alone decides the action (two tasks on the same states, one action each), the
    model agrees with the expert under its own goal, and less under the other task's."""
    from llmrl.envs.kalm_episodes import expert_episodes

    goals = kl.goals("babyai", "train")
    tasks = sorted({g.task for g in goals})[:2]
    ep = next(iter(expert_episodes("babyai", [next(g for g in goals if g.task == tasks[0])], 1, seed=0,
                                   settings=kl.EnvSettings(max_steps=4))))
    action_of = {tasks[0]: 0, tasks[1]: 2}  # a toy expert: one action per task, whatever the state
    eps = [dataclasses.replace(ep, info={**ep.info, "task": t}, actions=np.full(len(ep), action_of[t])) for t in tasks]
    model = _babyai_model()
    before = kg.goal_sensitivity(model, eps, "babyai")
    assert before["own_goal"]["steps"] == before["other_goal"]["steps"] == sum(len(e) for e in eps)
    relabelled = kg.training_phrasing_episodes(eps, "babyai")
    p = _params(trajectory_samples=16, dynamics_samples=0, goal_samples=0, reverse_samples=0, epochs=30.0,
                batch_size=8, window=4)
    rng = np.random.default_rng(0)
    for _ in kg.train_grounding(model, kg.build_samples(model, relabelled, p, rng), p, rng):
        pass
    after = kg.goal_sensitivity(model, eps, "babyai")
    assert after["own_goal"]["value"] == 1.0, after
    # the same states under both tasks: a model that ignores its instruction scores both alike, and at most 0.5
    assert after["other_goal"]["value"] < after["own_goal"]["value"], after
    assert after["majority_action"] == pytest.approx(max(sum(action_of[e.info["task"]] == a for e in eps
                                                             for _ in range(len(e))) for a in (0, 2))
                                                     / sum(len(e) for e in eps))


def test_offline_goal_sensitivity_scores_the_policy_under_its_own_goal_and_another():
    """BC's figure of ``goal_sensitivity``: a policy whose action follows the instruction embedding agrees with
    the expert under its own goal, and not under the swapped one, on the same states."""
    from llmrl.data.embeddings import EmbeddingTable
    from llmrl.envs.kalm_episodes import expert_episodes
    goals = kl.goals("babyai", "train")
    tasks = sorted({g.task for g in goals})[:2]
    eps = [e for t in tasks for e in expert_episodes("babyai", [next(g for g in goals if g.task == t)], 1, seed=0,
                                                     settings=kl.EnvSettings(max_steps=4))]
    action_of = {tasks[0]: 0, tasks[1]: 2}
    eps = [dataclasses.replace(e, actions=np.full(len(e), action_of[e.info["task"]])) for e in eps]
    texts = [g.instruction for g in goals]
    table = EmbeddingTable(texts, np.stack([np.eye(7, dtype=np.float32)[action_of.get(g.task, 1)] for g in goals]))
    policy = SimpleNamespace(act_batch=lambda obs, emb: emb.argmax(-1))
    out = kg.offline_goal_sensitivity(policy, eps, "babyai", table)
    assert out["own_goal"] == {"metric": "agreement", "value": 1.0, "steps": sum(len(e) for e in eps)}
    assert out["other_goal"]["value"] == 0.0 and out["majority_action"] == 0.5
