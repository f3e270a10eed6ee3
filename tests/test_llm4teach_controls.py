"""LLM4Teach's controls: the scoring teacher's candidate plans with uniform or random scores,
the claim that the LLM's scores help, pure PPO's own learning rate, the random check by intervals and the
learners' budgets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmrl.agents.teacher import (OraclePlanner, PlanDistribution, RandomScorePlanner, TablePlanner, TeacherPolicy,
                                  UniformPlanner, admissible_plans, describe, observation_texts)
from llmrl.config.llm4teach import LLM4TeachMPEParams, LLM4TeachTeacherParams, LLM4TeachTrainParams
from llmrl.envs.doorkey import ENV_IDS
from llmrl.envs.make import make_env
from llmrl.eval.llm4teach import beats_random, scores_help, select_setting
from llmrl.eval.seeds import aggregate_seeds

KINDS = ["doorkey", "coloreddoorkey", "twodoor", "simple_spread"]
SMALL_PPO = {"total_frames": 512, "num_envs": 2, "num_steps": 64, "minibatch_size": 100}


# ----------------------------------------------------------------------------------------- control teachers


@pytest.mark.parametrize("kind", KINDS)
def test_uniform_teacher_weighs_every_candidate_plan_equally(kind):
    for text in observation_texts(kind):
        dist = UniformPlanner(kind).plan(text)
        assert dist.plans == tuple(admissible_plans(kind, text))
        np.testing.assert_allclose(dist.probs, 1.0 / len(dist.plans))


def test_uniform_teachers_action_distribution_is_the_mean_over_its_candidates():
    """π_T(a|s) of the uniform teacher = the average of what each candidate plan's skill does alone."""
    env = make_env(ENV_IDS["simpledoorkey"])
    n = int(env.action_space.n)
    teacher = TeacherPolicy("doorkey", UniformPlanner("doorkey"), n)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        if checked >= 5:
            break
        text = describe(obs, "doorkey").text
        plans = admissible_plans("doorkey", text)
        alone = [TeacherPolicy("doorkey", TablePlanner("doorkey", {text: PlanDistribution((p,), (1.0,), n_plan=1)},
                                                       "one"), n).distribution(obs) for p in plans]
        np.testing.assert_allclose(teacher.distribution(obs), np.mean(alone, axis=0), atol=1e-6)
        checked += len({tuple(a) for a in alone}) > 1  # candidates that act differently
        obs, _, done, trunc, _ = env.step(int(rng.integers(n)))
        if done or trunc:
            obs, _ = env.reset(seed=4)
    assert checked >= 5  # states where the candidates disagreed


@pytest.mark.parametrize("kind", KINDS)
def test_random_scores_are_fixed_per_text_and_seeded(kind):
    texts = observation_texts(kind)
    a, b = RandomScorePlanner(kind, seed=0), RandomScorePlanner(kind, seed=0)
    for text in texts:
        dist = a.plan(text)
        assert dist.plans == tuple(admissible_plans(kind, text))
        assert abs(sum(dist.probs) - 1) < 1e-9 and min(dist.probs) > 0
        assert a.plan(text) == dist == b.plan(text)  # the same scores at every call and in every instance
    several = [t for t in texts if len(admissible_plans(kind, t)) > 1]
    other = RandomScorePlanner(kind, seed=1)
    assert any(other.plan(t).probs != a.plan(t).probs for t in several)
    # neither uniform nor one plan only
    assert all(not np.allclose(a.plan(t).probs, 1 / len(a.plan(t).probs)) for t in several)
    assert all(max(a.plan(t).probs) < 1 for t in several)
    with pytest.raises(ValueError, match="seed"):
        RandomScorePlanner(kind, seed=-1)


def test_random_scores_spread_over_the_simplex():
    """Over many texts' draws, each candidate's mean probability is 1/n (a flat Dirichlet), not skewed to one."""
    text = "Agent sees <key>, <door>, holds <nothing>."
    n = len(admissible_plans("doorkey", text))
    probs = np.array([RandomScorePlanner("doorkey", seed=s).plan(text).probs for s in range(2000)])
    # Dirichlet(1): each probability has variance (n-1)/(n^2 (n+1)); 5 standard errors of the mean
    tol = 5 * np.sqrt((n - 1) / (n * n * (n + 1)) / len(probs))
    np.testing.assert_allclose(probs.mean(axis=0), 1 / n, atol=tol)


def test_stages_build_the_control_teachers_without_a_model():
    from stages.llm4teach_common import make_planner

    p = LLM4TeachTeacherParams(spec="no/such/model", random_score_seed=7)
    assert isinstance(make_planner("simpledoorkey", "uniform", p, offline=True), UniformPlanner)
    planner = make_planner("simple_spread", "random_score", p, offline=True)
    assert isinstance(planner, RandomScorePlanner) and planner.seed == 7 and planner.kind == "simple_spread"
    assert isinstance(make_planner("simpledoorkey", "oracle", p, offline=True), OraclePlanner)


# ----------------------------------------------------------------------------------------- params


def test_scoring_teacher_needs_its_controls_beside_it():
    base = dict(envs=["simpledoorkey"], seeds=[0], ppo=SMALL_PPO)
    with pytest.raises(ValueError, match=r"llm4teach.train.teachers: llm_score needs its controls \['random_score'\]"):
        LLM4TeachTrainParams(teachers=["llm_score", "uniform", "none"], **base)
    LLM4TeachTrainParams(teachers=["llm_score", "uniform", "random_score"], **base)
    LLM4TeachTrainParams(teachers=["oracle", "none"], **base)  # no scoring teacher, no controls needed
    with pytest.raises(ValueError, match="llm4teach.mpe.teachers: llm_score needs its controls"):
        LLM4TeachMPEParams(teachers=["llm_score"], seeds=[0], ppo=SMALL_PPO)


def test_pure_ppo_takes_its_own_learning_rate_and_the_students_keep_theirs():
    t = LLM4TeachTrainParams(envs=["simpledoorkey"], teachers=["oracle", "none"], seeds=[0],
                             ppo={**SMALL_PPO, "lr": 1e-3}, pure_ppo_lr=4e-3)
    assert t.for_teacher("none").ppo.lr == 4e-3 and t.for_teacher("none").ppo.total_frames == 512
    assert t.for_teacher("oracle").ppo.lr == 1e-3 and t.ppo.lr == 1e-3
    assert t.model_copy(update={"pure_ppo_lr": None}).for_teacher("none").ppo.lr == 1e-3
    with pytest.raises(ValueError, match="pure_ppo_lr"):
        LLM4TeachTrainParams(envs=["simpledoorkey"], teachers=["none"], seeds=[0], ppo=SMALL_PPO, pure_ppo_lr=0)


def test_the_repository_params_train_the_controls_beside_the_scoring_teacher():
    from llmrl.config import load_section, read_params
    from llmrl.config.llm4teach import LLM4TeachParams

    from tests.conftest import ROOT

    for file in ("params.yaml", "study/params.yaml"):
        p = load_section(read_params(ROOT / file), "llm4teach", LLM4TeachParams)
        for teachers in (p.train.teachers, p.mpe.teachers):
            assert {"llm_score", "uniform", "random_score", "none"} <= set(teachers), file


# ----------------------------------------------------------------------------------------- the claim


def _scores(rate: float, seeds: int = 5, episodes: int = 100, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((seeds, episodes)) < rate).astype(float)


def test_scores_help_only_where_every_control_is_left_behind():
    scoring = _scores(0.9)
    clear = scores_help(scoring, {"uniform": _scores(0.3, seed=1), "random_score": _scores(0.2, seed=2)}, reps=500)
    assert clear["claim"] and set(clear["vs"]) == {"uniform", "random_score"}
    assert all(v["ci_low"] > 0 for v in clear["vs"].values())
    # one control as good as the scoring student: its paired interval holds 0, so no claim
    close = scores_help(scoring, {"uniform": _scores(0.9, seed=3), "random_score": _scores(0.2, seed=2)}, reps=500)
    assert not close["claim"] and close["vs"]["uniform"]["ci_low"] <= 0 <= close["vs"]["uniform"]["ci_high"]
    # a control better than the scoring student
    assert not scores_help(_scores(0.2), {"uniform": _scores(0.9, seed=4)}, reps=500)["claim"]


def test_scores_help_keeps_the_seed_spread():
    """A control whose seeds disagree (two of five solve everything) is not left behind by a scoring student
    that beats its mean: seeds are a factor of the paired interval, not pooled away."""
    scoring = np.full((5, 100), 0.6)
    shaky = np.vstack([np.ones((2, 100)), np.zeros((3, 100))])  # mean 0.4
    assert not scores_help(scoring, {"uniform": shaky}, reps=1000)["claim"]
    steady = np.full((5, 100), 0.4)
    steady[:, ::2] = 0.35
    assert scores_help(scoring, {"uniform": steady}, reps=1000)["claim"]


def test_scores_help_where_lower_is_better_and_bad_input():
    costs = np.full((3, 20), 5.0) + np.random.default_rng(0).normal(0, 0.1, (3, 20))
    assert scores_help(costs, {"uniform": costs + 3}, higher_is_better=False, reps=300)["claim"]
    assert not scores_help(costs, {"uniform": costs + 3}, reps=300)["claim"]
    with pytest.raises(ValueError, match="controls"):
        scores_help(costs, {})
    with pytest.raises(ValueError, match="same >= 2 items"):
        scores_help(costs, {"uniform": costs[:, :10]})


def test_eval_claim_entry_is_numbers_per_mode():
    from llmrl.eval.headline import metrics_entry
    from stages.llm4teach_eval import claim_entry

    scores = {"llm_score": {"greedy": _scores(0.9).tolist(), "sampled": _scores(0.95).tolist()},
              "uniform": {"greedy": _scores(0.9, seed=5).tolist(), "sampled": _scores(0.3, seed=6).tolist()},
              "random_score": {"greedy": _scores(0.1, seed=7).tolist(), "sampled": _scores(0.2, seed=8).tolist()},
              "none": {"greedy": _scores(0.0).tolist(), "sampled": _scores(0.0).tolist()}}
    entry, full = claim_entry(scores)
    metrics_entry(entry)  # numbers and booleans only
    assert entry["greedy"]["llm_scores_help"] is False and entry["sampled"]["llm_scores_help"] is True
    assert entry["greedy"]["seeds"] == 5 and entry["greedy"]["episodes"] == 100
    assert entry["greedy"]["vs_uniform_lo"] <= entry["greedy"]["vs_uniform"] <= entry["greedy"]["vs_uniform_hi"]
    assert full["sampled"]["vs"]["random_score"]["verdict"] == "higher"
    assert claim_entry({k: v for k, v in scores.items() if k != "llm_score"}) is None


# ----------------------------------------------------------------------------------------- random, selection, budget


def test_beats_random_needs_the_intervals_apart():
    agent = aggregate_seeds([[0.3] * 100] * 5)  # a tight 0.3
    point = aggregate_seeds([[0.2] * 100])  # random at 0.2, no spread
    wide = aggregate_seeds([[1.0] * 25 + [0.0] * 75])  # random at 0.25 over 100 episodes: its interval reaches 0.3
    assert beats_random(agent, point)
    assert agent.ci_low > wide.value and wide.ci_high >= agent.ci_low and not beats_random(agent, wide)
    # lower is better: the agent's high end below random's low end
    assert beats_random(aggregate_seeds([[1.0]] * 5), aggregate_seeds([[3.0, 4.0, 5.0]]), higher_is_better=False)
    assert not beats_random(aggregate_seeds([[1.0]] * 5), aggregate_seeds([[0.5, 4.0, 5.0]]), higher_is_better=False)


def test_select_setting_breaks_ties_with_the_second_score():
    rows = [{"name": "a", "cost": 1, "per_seed": [0.0, 0.0], "tiebreak_per_seed": [0.01, 0.0]},
            {"name": "b", "cost": 1, "per_seed": [0.0, 0.0], "tiebreak_per_seed": [0.05, 0.03]},
            {"name": "c", "cost": 1, "per_seed": [0.0, 0.0]}]
    pick = select_setting(rows)
    assert pick["name"] == "b" and "tied with 2 other(s), broken by the second score" in pick["rule"]
    assert select_setting(rows + [{"name": "d", "cost": 2, "per_seed": [0.1, 0.0]}])["name"] == "d"  # first score first
    # a full tie keeps the setting in use
    flat = [{"name": n, "cost": 1, "per_seed": [0.0, 0.0], "tiebreak_per_seed": [0.0, 0.0]} for n in ("x", "y", "z")]
    assert select_setting(flat)["name"] == "x" and select_setting(flat, keep="y")["name"] == "y"
    assert select_setting(flat, keep="y")["rule"].endswith("broken by cost and the setting in use")
    assert select_setting(rows, keep="a")["name"] == "b"  # not against the scores
    with pytest.raises(ValueError, match="keep"):
        select_setting(flat, keep="w")


def test_gradient_steps_count_the_optimizer_steps_of_a_run():
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from llmrl.algos.llm4teach_runs import gradient_steps, train_grid_student

    t = LLM4TeachTrainParams(envs=["simpledoorkey"], teachers=["none"], seeds=[0], curve_points=1,
                             ppo={**SMALL_PPO, "epochs": 2}, student={"channels": [4], "hidden": 8})
    steps = []
    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: steps.append(1))
    try:
        torch.set_num_threads(1)
        run = train_grid_student(ENV_IDS["simpledoorkey"], None, t, 0, progress=False)
    finally:
        handle.remove()
    frames, iterations = run.history[-1]["frames"], len(run.history)
    # 4 iterations of 128 samples, 2 epochs of minibatches of 100 (one short): 4 * 2 * 2
    assert gradient_steps(t.ppo, frames, iterations) == len(steps) == 16
    with pytest.raises(ValueError, match="iterations"):
        gradient_steps(t.ppo, 10, 0)


def test_eval_budget_needs_every_seed_at_the_same_budget():
    from stages.llm4teach_eval import budget

    rec = {"run": "x-0", "frames": 512, "iterations": 4, "updates": 16, "lr": 1e-3, "final_distill_coef": 0.0}
    assert budget([rec, {**rec, "run": "x-1"}]) == {"frames": 512, "iterations": 4, "updates": 16, "seeds": 2,
                                                    "lr": 1e-3, "final_distill_coef": 0.0}
    with pytest.raises(ValueError, match="different budgets"):
        budget([rec, {**rec, "updates": 8}])


def test_docs_claims_table_reads_each_task_and_mode(tmp_path):
    from llmrl.files import write_json
    from llmrl.report.collect import MissingResultError
    from llmrl.report.docs_tables import llm4teach_claims_table, to_markdown

    def entry(help_: bool, d: float) -> dict:
        return {"llm_scores_help": help_, "seeds": 5, "episodes": 100, "vs_random_score": d,
                "vs_random_score_lo": d - 0.1, "vs_random_score_hi": d + 0.1, "vs_uniform": 0.02,
                "vs_uniform_lo": -0.05, "vs_uniform_hi": 0.09}

    with pytest.raises(MissingResultError, match="claims/simpledoorkey.json"):
        llm4teach_claims_table(tmp_path)
    write_json(tmp_path / "metrics/llm4teach/claims/simpledoorkey.json",
               {"greedy": entry(False, 0.3), "sampled": entry(True, 0.5)})
    write_json(tmp_path / "metrics/llm4teach/claims/mpe.json", {"greedy": entry(False, 1.5)})
    table = llm4teach_claims_table(tmp_path)
    md = to_markdown(table)
    assert table.columns[2:4] == ["minus `student_random_score` [95 % CI]", "minus `student_uniform` [95 % CI]"]
    assert "| simpledoorkey | sampled | 0.5 [0.4, 0.6] | 0.02 [-0.05, 0.09] | yes | 5 | 100 |" in md
    assert "| mpe | greedy | 1.5 [1.4, 1.6] |" in md and len(table.rows) == 3
