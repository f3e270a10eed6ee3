"""KALM goals, splits, levels and goal environments (Meta-World fixed tasks, BabyAI goal rooms)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from llmrl.envs.kalm_episodes import expert_episodes, labelled_episode, rule_agreement
from llmrl.data.trajectories import TrajectoryWriter
from llmrl.envs import kalm_babyai as bab
from llmrl.envs import kalm_levels as kl
from llmrl.envs import metaworld_tasks as mw


@pytest.mark.parametrize("benchmark", kl.BENCHMARKS)
def test_splits_disjoint_and_levels_complete(benchmark):
    by_split = {s: kl.goals(benchmark, s) for s in kl.SPLITS}
    pairs = {s: {(g.task, g.instruction) for g in gs} for s, gs in by_split.items()}
    assert all(pairs.values())
    assert not pairs["train"] & pairs["validation"]
    assert not pairs["train"] & pairs["test"]
    assert not pairs["validation"] & pairs["test"]
    train_texts = {g.instruction for g in by_split["train"]}
    # held-out phrasings never occur in training, under any task
    assert not train_texts & {g.instruction for g in by_split["validation"]}
    assert not train_texts & {g.instruction for g in by_split["test"]}
    train_tasks = {g.task for g in by_split["train"]}
    assert {g.task for g in kl.goals(benchmark, "rephrase")} <= train_tasks
    assert not {g.task for g in kl.goals(benchmark, "easy")} & train_tasks
    assert not {g.task for g in kl.goals(benchmark, "hard")} & train_tasks
    assert sum(len(kl.goals(benchmark, lv)) for lv in kl.LEVELS) == len(by_split["test"])
    for g in by_split["test"]:
        assert g.split == "test" and g.level in kl.LEVELS


def test_metaworld_levels_are_kalms_tasks():
    train = {g.task for g in kl.goals("metaworld", "train")}
    assert train == set(kl.METAWORLD_TRAIN_TASKS) and len(train) == 10
    assert {g.task for g in kl.goals("metaworld", "easy")} == set(kl.METAWORLD_EASY_TASKS)
    assert {g.task for g in kl.goals("metaworld", "hard")} == {"hammer", "soccer", "make-coffee", "locked-door-open"}
    for task, phrasings in kl.METAWORLD_PHRASINGS.items():
        assert len(set(phrasings)) >= 10, task


def test_babyai_easy_is_unseen_combinations_and_hard_is_composition():
    train_combos = {tuple(g.task.split(":")[1:]) for g in kl.goals("babyai", "train")}
    easy_combos = {tuple(g.task.split(":")[1:]) for g in kl.goals("babyai", "easy")}
    assert easy_combos and not easy_combos & train_combos
    assert {g.task.split(":")[0] for g in kl.goals("babyai", "easy")} <= {"goto", "pickup"}
    assert all(">" in g.task for g in kl.goals("babyai", "hard"))
    assert not any(">" in g.task for g in kl.goals("babyai", "train"))


def test_unknown_level_benchmark_and_task_raise_named_errors():
    with pytest.raises(kl.UnknownLevelError, match="'medium'"):
        kl.goals("babyai", "medium")
    with pytest.raises(kl.UnknownLevelError, match="'atari'"):
        kl.goals("atari", "easy")
    with pytest.raises(bab.BadTaskError, match="goto:red:dragon"):
        bab.parse_task("goto:red:dragon")
    with pytest.raises(mw.UnknownTaskError):
        mw.make_task_env("juggle")


def test_wrong_observation_size_raises_before_anything_is_written(tmp_path):
    goal = kl.goals("babyai", "train")[0]
    with pytest.raises(kl.ObservationSizeError, match=f"size {bab.OBS_DIM}"):
        kl.obs_success(goal, np.zeros(39, np.float32))
    with pytest.raises(kl.ObservationSizeError, match="observations_next"):
        kl.label_rewards(goal, np.zeros((3, 150), np.float32))
    path = tmp_path / "kalm.h5"
    with pytest.raises(kl.ObservationSizeError, match="observations"):
        with TrajectoryWriter(path) as writer:
            writer.append(labelled_episode(goal, np.zeros((4, 39)), np.zeros(4, int), np.zeros((4, 39)),
                                           seed=0, policy="bad", info={"success": False}))
    assert not path.exists() and not list(tmp_path.iterdir())


def _one_goal_per_task(benchmark):
    seen, out = set(), []
    for g in kl.all_goals(benchmark):
        if g.task not in seen:
            seen.add(g.task)
            out.append(g)
    return out


def _determinism(env, actions, seed):
    runs = []
    for _ in range(2):
        obs, _ = env.reset(seed=seed)
        trace = [obs]
        for a in actions:
            obs, r, term, trunc, _info = env.step(a)
            trace.append(np.append(obs, [r, term, trunc]))
            if term or trunc:
                break
        runs.append(np.concatenate(trace))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_every_babyai_goal_env_passes_check_env_and_is_deterministic():
    rng = np.random.default_rng(0)
    for goal in _one_goal_per_task("babyai"):
        env = kl.make_goal_env(goal, seed=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env, skip_render_check=True)
        obs, _ = env.reset(seed=3)
        assert obs.shape == (kl.obs_dim("babyai"),) and obs.dtype == np.float32
        assert env.unwrapped.mission == goal.instruction
        _determinism(env, rng.integers(0, 7, 20), seed=5)
        # two envs built apart give the same episode for the same seed
        other = kl.make_goal_env(goal, seed=3)
        np.testing.assert_array_equal(other.reset(seed=11)[0], env.reset(seed=11)[0])


@pytest.mark.parametrize("goal", _one_goal_per_task("metaworld"), ids=lambda g: g.task)
def test_every_metaworld_goal_env_passes_check_env_and_is_deterministic(goal):
    rng = np.random.default_rng(0)
    settings = kl.EnvSettings(max_steps=12)
    env = kl.make_goal_env(goal, seed=0, settings=settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (39,) and obs.dtype == np.float32
    _determinism(env, rng.uniform(-1, 1, (12, 4)).astype(np.float32), seed=7)
    a, _ = env.reset(seed=2)
    b, _ = env.reset(seed=27)  # the train split's 25 variations in turn: seed 27 starts where seed 2 does
    np.testing.assert_allclose(a[36:39], b[36:39])
    env.close()


def test_babyai_rule_equals_env_success_at_every_step_of_random_episodes():
    """The rule reads success off the observation exactly as BabyAI's verifier decides it (all levels)."""
    rng = np.random.default_rng(1)
    fired = 0
    for level in ("train", "easy", "hard"):
        for i, goal in enumerate(kl.goals("babyai", level)[::5]):
            env = kl.make_goal_env(goal, seed=i, settings=kl.EnvSettings(max_steps=60, room_size=6,
                                                                         num_distractors=1))
            obs, _ = env.reset(seed=i)
            assert not kl.obs_success(goal, obs)
            while True:
                obs, _r, term, trunc, info = env.step(int(rng.integers(0, 4)))
                assert kl.obs_success(goal, obs) == info["success"], (goal, level)
                fired += info["success"]
                if term or trunc:
                    break
    assert fired > 5  # the check met successes, not only failures


def test_babyai_bot_data_is_labelled_by_the_rule():
    goals = kl.goals("babyai", "train")[:12] + kl.goals("babyai", "easy")[:4]
    eps = list(expert_episodes("babyai", goals, 2, seed=0, settings=kl.EnvSettings(max_steps=64)))
    assert len(eps) == 2 * len({g.task for g in goals})
    for ep in eps:
        assert ep.info["success"] and ep.info["rule_success"]
        assert ep.rewards[-1] == 1.0 and ep.terminated[-1] and ep.rewards[:-1].sum() == 0
        np.testing.assert_array_equal(ep.observations["obs"][1:], ep.observations["next_obs"][:-1])
    assert rule_agreement(eps)["agreement"] == 1.0


def test_babyai_compact_states_round_trip_through_the_data_format(tmp_path):
    """What kalm_data records for BabyAI is the compact state: the bot's episodes written and read back hold, at
    every step, the env's agent, carried object and objects, and the rule on the stored states labels them."""
    from llmrl.data.trajectories import read_episodes

    settings = kl.EnvSettings(max_steps=64)
    goals = kl.one_per_task([g for g in kl.goals("babyai", "train") if g.task.startswith("pickup")])[:2]
    eps = list(expert_episodes("babyai", goals, 1, seed=3, settings=settings))
    with TrajectoryWriter(tmp_path / "babyai.h5") as writer:
        writer.extend(eps)
    back = read_episodes(tmp_path / "babyai.h5")
    assert len(back) == len(eps)
    for ep, got in zip(eps, back):
        obs, nxt = got.observations["obs"], got.observations["next_obs"]
        assert obs.shape == (len(ep), bab.OBS_DIM) and np.array_equal(obs, ep.observations["obs"])
        np.testing.assert_array_equal(nxt, ep.observations["next_obs"])
        env = kl.make_goal_env(kl.Goal("babyai", ep.info["task"], ep.mission, "train", "train"), ep.seed, settings)
        start = bab.read_compact(obs[0])
        level = env.unwrapped
        assert start["agent"] == (*map(int, level.agent_pos), int(level.agent_dir)) and start["carrying"] is None
        assert sorted(o[:2] for o in start["objects"]) == sorted((o.type, o.color) for o in level.room_grid[0][0].objs)
        kind, colour = ep.info["task"].split(":")[2], ep.info["task"].split(":")[1]
        assert bab.read_compact(nxt[-1])["carrying"] == (kind, colour)  # the bot picked the goal object up
        assert [kl.obs_success(kl.Goal("babyai", ep.info["task"], ep.mission, "train", "train"), o)
                for o in nxt] == [False] * (len(ep) - 1) + [True]


def test_metaworld_scripted_push_and_two_stage_make_coffee():
    settings = kl.EnvSettings(max_steps=150)
    push = kl.Goal("metaworld", "push", "push the puck to the goal", "train", "train")
    eps = list(expert_episodes("metaworld", [push], 2, seed=0, settings=settings, action_noise=0.1))
    for ep in eps:
        assert ep.info["success"] and ep.info["rule_success"]
        assert ep.observations["obs"].shape[1] == 39 and ep.actions.shape[1] == 4
        assert np.abs(ep.actions).max() <= 1.0
    coffee = kl.goals("metaworld", "hard")[4]
    assert coffee.task == "make-coffee"
    env = kl.make_goal_env(coffee, seed=0, settings=settings)
    expert = mw.ScriptedPolicy("make-coffee")
    obs, info = env.reset(seed=0)
    stages, rule_steps = [], []
    for t in range(150):
        obs, _r, term, trunc, info = env.step(expert.act(obs, info))
        stages.append(info["stage"])
        if kl.obs_success(coffee, obs):
            rule_steps.append(t)
        if term or trunc:
            break
    assert info["success"] and term
    assert 0 in stages and 1 in stages and stages[-1] == 1
    assert rule_steps == [t]  # the rule fires on the final (second-stage) success only


def test_label_rewards_cuts_at_first_rule_success():
    goal = kl.Goal("metaworld", "reach", "reach the goal position", "train", "train")
    obs = np.zeros((5, 39), np.float32)
    obs[:, 36:39] = [0.1, 0.8, 0.2]
    obs[:, 0:3] = [0.5, 0.5, 0.5]
    obs[3, 0:3] = [0.1, 0.8, 0.21]  # within 0.05 of the goal at step 3
    obs[4, 0:3] = [0.1, 0.8, 0.2]
    rewards, terminated = kl.label_rewards(goal, obs)
    np.testing.assert_array_equal(rewards, [0, 0, 0, 1])
    np.testing.assert_array_equal(terminated, [False, False, False, True])
    rewards, terminated = kl.label_rewards(goal, obs[:3])
    assert rewards.sum() == 0 and not terminated.any() and len(rewards) == 3


def test_start_splits_are_disjoint_ranges_and_variations():
    splits = list(kl.START_SPLITS.values())
    for i, a in enumerate(splits):
        assert a.first_seed < a.end_seed and a.metaworld_variations
        for b in splits[i + 1:]:
            assert a.end_seed <= b.first_seed or b.end_seed <= a.first_seed, (a.name, b.name)
            assert not set(a.metaworld_variations) & set(b.metaworld_variations), (a.name, b.name)
    assert kl.metaworld_variation(20_000) in kl.START_SPLITS["test"].metaworld_variations
    with pytest.raises(ValueError, match="no initial-state split"):
        kl.start_split(10**6)
    with pytest.raises(ValueError, match="kalm.eval.seed: seeds 19990..20009 must lie in the test"):
        kl.check_seed_range("test", 19_990, 20, "kalm.eval.seed")
    assert kl.goal_schedule(3, 2, 5) == [(0, 5), (1, 6), (2, 7), (0, 8), (1, 9), (2, 10)]


def _initial_states(benchmark, tasks_goals, seeds, settings):
    """Initial-state fingerprints: Meta-World's observation (object and goal positions), BabyAI's whole room."""
    out = set()
    with kl.GoalEnvPool(settings) as pool:
        for goal in tasks_goals:
            for seed in seeds(goal):
                env, obs = pool.reset(goal, seed)
                if benchmark == "metaworld":
                    out.add((goal.task, tuple(np.round(obs, 5))))
                else:
                    u = env.unwrapped
                    out.add((goal.task, u.grid.encode().tobytes(), tuple(u.agent_pos), u.agent_dir))
    return out


@pytest.mark.parametrize("benchmark", kl.BENCHMARKS)
def test_no_evaluation_start_equals_a_training_or_imagination_start(benchmark):
    """At the pipeline's parameters (params.yaml): the initial states of the training data, the grounding's
    validation episodes, the imagined rollouts and the evaluation episodes of every level never coincide."""
    from llmrl.config import load_section, read_params
    from llmrl.config.kalm import KalmDataParams, KalmEnvParams, KalmEvalParams, KalmImagineParams

    params = read_params("params.yaml")
    data = load_section(params, "kalm.data", KalmDataParams)
    ev = load_section(params, "kalm.eval", KalmEvalParams)
    im = load_section(params, "kalm.imagine", KalmImagineParams)
    settings = kl.EnvSettings.for_benchmark(load_section(params, "kalm.env", KalmEnvParams), benchmark)
    per_task = data.metaworld_episodes_per_task if benchmark == "metaworld" else data.babyai_episodes_per_task
    by_task = {}
    for g in kl.goals(benchmark, "train") + kl.goals(benchmark, "validation"):
        by_task.setdefault((g.task, g.split), g)
    train = _initial_states(benchmark, [g for (t, s), g in by_task.items() if s == "train"],
                            lambda g: range(data.seed, data.seed + per_task), settings)
    validation = _initial_states(benchmark, [g for (t, s), g in by_task.items() if s == "validation"],
                                 lambda g: range(data.validation_seed,
                                                 data.validation_seed + data.validation_episodes_per_task), settings)
    imagine, evaluation = set(), set()
    episodes = ev.metaworld_episodes if benchmark == "metaworld" else ev.babyai_episodes
    for level in kl.LEVELS:
        goals = kl.goals(benchmark, level)
        for starts, first, n in ((imagine, im.seed, im.rollouts), (evaluation, ev.seed, episodes)):
            schedule = kl.goal_schedule(len(goals), kl.per_goal(len(goals), n), first)
            seeds = {}
            for g, seed in schedule:
                seeds.setdefault(goals[g], []).append(seed)
            starts |= _initial_states(benchmark, list(seeds), lambda goal: seeds[goal], settings)
    assert train and validation and imagine and evaluation
    assert not evaluation & train and not evaluation & imagine and not evaluation & validation
    assert not imagine & train and not imagine & validation and not validation & train


def test_babyai_compact_state_round_trips_and_its_rule_is_the_envs_success():
    """env -> compact state -> fields gives the env's agent, carried object and objects; the success rule on the
    compact state says success exactly where BabyAI's verifier does, at every step of bot and random episodes."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    from llmrl.envs import kalm_babyai as bab

    settings = kl.EnvSettings(max_steps=24, room_size=8, num_distractors=4)
    fields = bab.compact_fields(settings.room_size)
    assert [f[0] for f in fields] == list(range(bab.compact_dim()))  # every dim one categorical field
    goals = [g for g in kl.goals("babyai", "train") if g.task in ("goto:green:ball", "pickup:blue:key")]
    goals = kl.one_per_task(goals) + kl.one_per_task(kl.goals("babyai", "hard"))[:1]
    checked = successes = 0
    for goal in goals:
        for seed, policy in ((0, "bot"), (1, "bot"), (2, "random")):
            env = kl.make_goal_env(goal, seed, settings)
            env.reset(seed=seed)
            level = env.unwrapped
            bot, rng = BabyAIBot(level), np.random.default_rng(seed)
            while True:
                state = bab.compact_state(env)
                read = bab.read_compact(state)
                assert read["agent"] == (*map(int, level.agent_pos), int(level.agent_dir))
                assert read["carrying"] == (None if level.carrying is None
                                            else (level.carrying.type, level.carrying.color))
                placed = sorted(((o.type, o.color, tuple(map(int, o.cur_pos)))
                                 for o in level.room_grid[0][0].objs if o is not level.carrying),
                                key=lambda o: bab.SLOTS.index(o[:2]))
                assert read["objects"] == placed
                action = int(bot.replan()) if policy == "bot" else int(rng.integers(0, 6))
                _obs, _r, terminated, truncated, info = env.step(action)
                after = bab.compact_state(env)
                assert bab.compact_success(goal.task, after) == info["success"], (goal.task, seed, policy)
                checked += 1
                successes += info["success"]
                if terminated or truncated:
                    break
    assert successes >= 4 and checked > 30  # the bot solves its episodes: the rule fired where the env's did
    with pytest.raises(ValueError, match="compact state has"):
        bab.read_compact(np.zeros(3))


def test_babyai_state_layout_does_not_say_which_object_is_the_goal():
    """Each (type, colour) has its own slot, as each object has in CLEVR-Robot: the goal object (placed first by
    the generator) sits in its own slot, which across tasks is every slot in turn, and the rooms' objects are
    distinct; a room that cannot hold distinct objects is refused by name."""
    from llmrl.envs import kalm_babyai as bab

    settings = kl.EnvSettings(max_steps=8, room_size=8, num_distractors=4)
    goal_slots = set()
    for goal in kl.one_per_task(kl.goals("babyai", "train")):
        _verb, colour, kind = goal.task.split(":")
        env = kl.make_goal_env(goal, 0, settings)
        state, _ = env.reset(seed=0)
        objs = env.unwrapped.room_grid[0][0].objs
        assert len({(o.type, o.color) for o in objs}) == len(objs) == 5
        slot = bab.SLOTS.index((kind, colour))
        assert tuple(state[5 + 2 * slot:7 + 2 * slot]) == tuple(objs[0].cur_pos)  # the goal object, placed first
        goal_slots.add(slot)
    assert len(goal_slots) > 10
    with pytest.raises(ValueError, match="num_distractors 18"):
        bab.make_babyai_env("goto:red:ball", "go to the red ball", num_distractors=18)


def test_expert_episodes_of_different_tasks_start_from_different_seeds():
    """Every expert episode has a seed of its own, consecutive from ``seed`` (``episode_seeds`` of them): BabyAI
    draws the agent's pose from the seed, so tasks sharing seeds would share starts."""
    from llmrl.envs.kalm_episodes import episode_seeds

    goals = [g for g in kl.goals("babyai", "validation") if g.task.startswith("goto:")][:6]
    eps = list(expert_episodes("babyai", goals, 2, seed=10_000, settings=kl.EnvSettings(max_steps=8)))
    assert sorted(e.seed for e in eps) == list(range(10_000, 10_000 + episode_seeds(goals, 2)))
    assert len({tuple(e.observations["obs"][0][:3]) for e in eps}) > 2  # agent poses: not one per episode index
