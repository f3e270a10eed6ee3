"""One truth per task: every figure a ProPS prompt states about a task (its horizon, its maximum return, the optimum
hint) comes from the task at its horizon and agrees with the environment ProPS runs; horizons that would make a
statement false are refused; every profile's ``props:`` section validates."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmrl.agents.linear_policy import ParamEvaluator, policy_for
from llmrl.algos.props_prompts import PromptSettings, render_search_prompt
from llmrl.config import load_section
from llmrl.config.props import PropsParams
from llmrl.envs.control import TASKS, get_task, make_control_env

ROOT = Path(__file__).resolve().parents[1]

# horizons each task is rendered at: its own limit, and a cap where its optimum rule allows one
HORIZONS = [(key, None) for key in sorted(TASKS)] + [
    (key, 200) for key, t in sorted(TASKS.items()) if t.optimum_rule != "own_horizon" and t.own_horizon > 200]


def _prompts(task) -> dict[str, str]:
    policy = policy_for(task)
    settings = PromptSettings(-6, 6, 1, task.step_size, task.optimum, 10)
    hist = [(np.zeros(policy.n_params), -1.5)]
    return {t: render_search_prompt(t, task=task, policy=policy, history=hist, iteration=1, total_iterations=4,
                                    settings=settings) for t in ("numeric", "semantic")}


def _figures(pattern: str, text: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


@pytest.mark.parametrize("key,horizon", HORIZONS)
def test_every_stated_figure_agrees_with_the_environment(key, horizon):
    task = get_task(key, horizon)
    env = make_control_env(task)
    limit = env.spec.max_episode_steps  # what the environment ProPS builds actually truncates at
    env.close()
    assert task.episode_steps == limit == (horizon or task.own_horizon)
    prompts = _prompts(task)
    for name, prompt in prompts.items():
        hinted = _figures(r"global maximum of f is about (-?[\d.]+)", prompt)
        assert hinted == [task.optimum], name
    semantic = prompts["semantic"]
    # every step count stated is the environment's own truncation
    steps = _figures(r"(?:after|last|Episodes last) (\d+) steps", semantic)
    assert steps == [limit], semantic
    # every maximum stated is the hinted one (no second, contradicting figure)
    stated = _figures(r"maximum return is (?:a little below )?(-?[\d.]+)", semantic)
    stated += _figures(r"; (-?[\d.]+) is the best possible step and return", semantic)
    stated += _figures(r"(-?[\d.]+) on reaching the goal", semantic)
    stated += _figures(r"scores about (-?[\d.]+)", semantic)
    assert stated == [task.optimum], semantic


@pytest.mark.parametrize("key,horizon", [("cartpole", None), ("cartpole", 200), ("inverted_pendulum", 200),
                                         ("mountaincar_continuous", None)])
def test_the_stated_maximum_is_reachable_and_not_exceeded(key, horizon):
    """A known linear policy comes close to the stated maximum at the task's horizon (within 15 %: MountainCar's
    "about 100" less its force cost), and no episode exceeds it: the hint is a true statement about this horizon."""
    good = {"cartpole": [-0.1, 0.1, -0.5, 0.5, -5, 5, -1, 1, 0, 0],  # push towards where the pole leans
            "inverted_pendulum": [0, 3, 0.5, 1, 0],
            "mountaincar_continuous": [0, 5, 0]}[key]  # the best integer point at 999 steps
    task = get_task(key, horizon)
    ev = ParamEvaluator(task)
    returns = ev.returns(np.asarray(good, dtype=float), np.arange(10))[0]
    ev.close()
    assert returns.max() <= task.optimum + 1e-9
    assert returns.mean() >= 0.85 * task.optimum, (returns.mean(), task.optimum)


def test_mountaincar_at_a_cap_is_refused_and_statements_rescale():
    with pytest.raises(ValueError, match="max_episode_steps.mountaincar_continuous: MountainCarContinuous-v0 runs "
                                         "at its own 999 steps"):
        get_task("mountaincar_continuous", 200)
    with pytest.raises(ValueError, match="exceeds CartPole-v1's own limit 500"):
        get_task("cartpole", 600)
    assert get_task("cartpole").optimum == 500 and get_task("cartpole", 200).optimum == 200
    assert "after 200 steps" in get_task("cartpole", 200).description
    assert get_task("pendulum", 100).optimum == 0  # fixed: the best step reward, at any horizon
    assert get_task("cartpole", 500).horizon is None  # the own limit is the task itself


def _profiles() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "props").glob("*.yaml"))


def test_profiles_exist():
    assert set(_profiles()) >= {"default", "study", "paper", "endpoint"}


@pytest.mark.parametrize("profile", _profiles())
def test_every_profile_validates_with_the_props_model(profile):
    """conf/props/<profile>.yaml, composed (`dvc exp run -S props=<profile>`), passes the same model (budgets,
    horizons, fields)."""
    from llmrl.config.profiles import compose

    params = compose(ROOT / "conf", [f"props={profile}"])
    props = load_section(params, "props", PropsParams)
    for key in props.search.tasks:  # every task's horizon makes true statements
        get_task(key, props.search.max_episode_steps.get(key))


def test_params_yaml_validates_and_a_cem_generation_must_fill_the_budget():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    props = load_section(params, "props", PropsParams)
    bad = params["props"] | {"baselines": props.baselines.model_dump() | {"cem": props.baselines.cem.model_dump()
                                                                          | {"population": 7}}}
    from llmrl.config import ParamsError

    with pytest.raises(ParamsError, match="must divide the search budget"):
        load_section({"props": bad}, "props", PropsParams)
