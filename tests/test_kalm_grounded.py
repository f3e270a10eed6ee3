"""KALM grounded LLM: the four losses reach their projections and heads, save/load round trip, KV-cache
generation equals re-encoding, imagined rollouts stop by the level's rule and are rewarded by it, the LLM acts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from llmrl.algos import kalm_grounding as kg
from llmrl.algos import kalm_imagine as ki
from llmrl.config.kalm import KalmGroundParams, KalmImagineParams
from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.llm.grounded import GroundedLM, GroundingSpec, build_grounded, collate

D, A = 5, 3


def _episode(rng, T=6, discrete=False, mission="reach the red ball"):
    obs = rng.normal(size=(T + 1, D)).astype(np.float32)
    act = rng.integers(0, A, T) if discrete else rng.uniform(-1, 1, (T, A)).astype(np.float32)
    return Episode(observations={"obs": obs[:-1], "next_obs": obs[1:]}, actions=act, rewards=np.zeros(T),
                   terminated=np.zeros(T, bool), truncated=np.zeros(T, bool), mission=mission)


def _model(discrete=False, finetune="lora", obs_dim=D, action_dim=A):
    torch.manual_seed(0)
    return build_grounded(GroundingSpec(obs_dim=obs_dim, action_dim=action_dim, discrete=discrete,
                                        base_model="tiny", finetune=finetune))


def _params(**kw):
    base = dict(model="tiny", trajectory_samples=4, dynamics_samples=4, goal_samples=4, reverse_samples=4,
                window=4, steps=3, batch_size=4, dtype="float32", lr=3e-3, warmup=0)
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
    p = _params(trajectory_samples=8, dynamics_samples=8, goal_samples=4, reverse_samples=4, steps=30,
                batch_size=8, lr=1e-2)
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
    model.obs_mean.fill_(0.5)
    p = _params(steps=2)
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
    assert torch.equal(loaded.obs_mean, model.obs_mean)
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
    model = _model(True, obs_dim=kl.obs_dim("babyai"), action_dim=kl.action_spec("babyai").n)
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
    p = KalmImagineParams(rollouts=3, babyai_horizon=6, batch_size=3, seed=5)
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
    episodes = ki.imagine_level(model, [goal], p, settings)
    assert len(episodes) == 3 and calls["n"] >= 1
    for e in episodes:
        assert e.info["imaginary"] is True
        assert len(e) <= 3
        rewards, terminated = kl.label_rewards(goal, e.observations["next_obs"])
        np.testing.assert_array_equal(e.rewards, rewards)
        np.testing.assert_array_equal(e.terminated, terminated)
        assert e.terminated[-1] == kl.obs_success(goal, e.observations["next_obs"][-1])
        assert e.terminated[-1] or e.truncated[-1]
    summary, rows = ki.rollout_quality(episodes, None, settings, goals=[goal] * 3)
    assert summary["rollouts"] == 3 and 0 <= summary["true_success"] <= 1 and summary["step_mae"] >= 0
    assert len(rows) == 3


def test_imagine_horizon_without_success_truncates():
    goal = kl.goals("babyai", "hard")[0]
    model = _model(True, obs_dim=kl.obs_dim("babyai"), action_dim=kl.action_spec("babyai").n)
    p = KalmImagineParams(rollouts=2, babyai_horizon=4, batch_size=2)
    eps = ki.imagine_level(model, [goal], p, kl.EnvSettings(max_steps=8))
    for e in eps:
        assert len(e) <= 4
        if not e.terminated[-1]:
            assert len(e) == 4 and e.truncated[-1] and e.rewards.sum() == 0


def test_wrong_obs_size_raises_before_generation():
    model = _model(True)  # obs_dim 5
    with pytest.raises(kl.ObservationSizeError, match="obs_dim"):
        ki.imagine_level(model, kl.goals("babyai", "easy")[:1], KalmImagineParams(rollouts=1), None)


def test_grounded_policy_acts_in_the_real_env(tmp_path):
    from llmrl.agents.grounded_policy import GroundedAgent
    from llmrl.eval.harness import run_episode

    model = _model(True, obs_dim=kl.obs_dim("babyai"), action_dim=kl.action_spec("babyai").n)
    model.save(tmp_path / "babyai")
    agent = GroundedAgent.load(tmp_path)
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
