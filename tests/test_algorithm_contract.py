"""One tester every algorithm passes, as d3rlpy's shared algorithm tests: for each entry of
``ALGORITHMS``, the smallest run its config allows

- changes every trainable parameter (TRL's check: a parameter left alone is a bug in the update),
- is saved and loaded back with identical outputs on a fixed input, and
- gives the same parameters for the same seed, other parameters for another.

Adding an algorithm is one ``Case`` below: ``run(seed)`` returns the trained object and its parameters before
the update; ``params``, ``save_load`` and ``predict`` read it.

Gradient-free searches (ProPS's LLM search and its baselines) have no trainable parameters: each entry of
``SEARCHES`` passes the searches' own checks at the end of this file (the shared row vocabulary, the best point
inside the parameter space and scoring what the history says, same seed same search, another seed another).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from llmrl.agents.math_solver import load_policy, write_policy
from llmrl.agents.student import GridStudent, load_student, save_student
from llmrl.algos.distilled_ppo import make_vector_env, train
from llmrl.algos.mappo import make_mappo_agent
from llmrl.algos.mappo import train as train_mappo
from llmrl.config.ppo import PPOParams
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.envs.doorkey import ENV_IDS
from llmrl.envs.mpe import SpreadBatch
from llmrl.envs.kalm_babyai import OBS_DIM as BABYAI_OBS
from llmrl.config.lora import LoraSettings
from llmrl.llm.load import load_model


@dataclass
class Case:
    run: Callable[[int], tuple[Any, list[torch.Tensor]]]  # seed -> (trained object, trainable params before)
    params: Callable[[Any], list[torch.Tensor]]  # the trainable parameters of a trained object
    save_load: Callable[[Any, Path], Any]  # a trained object -> the object loaded back from disk
    predict: Callable[[Any], torch.Tensor]  # outputs on a fixed input
    atol: float = 0.0  # the round trip's output tolerance: exact unless the loaded form computes differently


def _snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


# ---- LLM4Teach's distilled PPO (pure PPO: no teacher) ----------------------------------------------------------
def _ppo_run(seed):
    torch.manual_seed(seed)
    cfg = PPOParams(total_frames=2 * 64, num_envs=2, num_steps=64, epochs=1, minibatch_size=64)
    agent = GridStudent(10, 10, 7)
    before = _snapshot(agent.parameters())
    list(train(agent, make_vector_env(lambda: make_env(ENV_IDS["simpledoorkey"]), 2), cfg, seed=seed, progress=False))
    return agent, before


def _student_save_load(agent, tmp):
    save_student(tmp / "student.pt", agent)
    return load_student(tmp / "student.pt")[0]


def _grid_obs() -> torch.Tensor:
    env = make_env(ENV_IDS["simpledoorkey"])
    return torch.as_tensor(np.stack([env.reset(seed=s)[0] for s in range(4)]))


# ---- MAPPO on simple_spread ---------------------------------------------------------------------------------
def _mappo_run(seed):
    torch.manual_seed(seed)
    envs = SpreadBatch(2)
    agent = make_mappo_agent(envs.obs_dim, envs.n_agents, envs.n_actions, (16, 16))
    before = _snapshot(agent.parameters())
    cfg = PPOParams(total_frames=25 * 2 * envs.n_agents, num_envs=2, num_steps=25, epochs=1, minibatch_size=50)
    list(train_mappo(agent, envs, cfg, seed=seed, progress=False))
    return agent, before


def _mappo_input(agent):
    width = agent.config()["obs_dim"] + agent.config()["critic_dim"]  # [actor input | critic input]
    return torch.as_tensor(np.random.default_rng(1).normal(size=(4, width)), dtype=torch.float32)


# ---- LLM_RL's REINFORCE-KL on the tiny LM with a LoRA adapter ------------------------------------------------------
PROBLEMS = [{"id": f"p{i}", "problem": f"Tom has {i} apples and gets 2 more. How many apples?",
             "solution": f"{i} + 2 = {i + 2}\nThe answer is: {i + 2}", "answer": str(i + 2)} for i in range(1, 6)]
LM_INPUT = torch.tensor([[5, 17, 29, 41, 53, 65]])


def _reinforce_run(seed):
    from llmrl.algos.reinforce_kl import ReinforceKL
    from llmrl.config.llm_rl import ReinforceTrainParams
    from llmrl.seeding import seed_everything

    seed_everything(seed)
    llm = load_model("tiny:4", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    cfg = ReinforceTrainParams(common={"iterations": 1, "problems_per_iteration": 2, "group_size": 2, "line_tokens": 6,
                                       "answer_tokens": 12, "micro_batch": 2, "lr": 1e-2, "temperature": 1.0,
                                       "seed": seed},
                               reinforce_kl={"max_steps": 2, "baseline": "none"})
    algo = ReinforceKL(llm, cfg, PROBLEMS[1:], PROBLEMS[:1])
    before = _snapshot(algo.params)
    list(algo.train(progress=False))
    return algo, before


def _reinforce_save_load(algo, tmp):
    write_policy(algo.llm, tmp / "policy", base_model="tiny:4")
    return load_policy("tiny:4", tmp / "policy")


def _lm_logits(obj):
    model = obj.llm.model if hasattr(obj, "llm") else obj.model
    model.eval()  # TRL leaves the model in training mode (dropout on)
    with torch.no_grad():
        return model(input_ids=LM_INPUT).logits


# ---- TRL's GRPO as LLM_RL runs it (the adapter attached by TRL) -----------------------------------------------------
def _length_reward(prompts, completions, **_) -> list[float]:
    # The correctness reward is 0 for every tiny-model answer, and GRPO with equal rewards has no gradient:
    # a reward that varies within a group (the answer's length) makes one step move the adapter.
    from llmrl.algos.grpo import completion_text

    return [float(len(completion_text(c))) for c in completions]


def _grpo_run(seed):
    import tempfile

    from llmrl.algos.grpo import build_grpo_trainer
    from llmrl.algos.grpo import train as train_grpo
    from llmrl.algos.llm_rl_grpo import build_dataset, trainer_params
    from llmrl.config.llm_rl import CommonTrainParams, GRPOParams
    from llmrl.seeding import seed_everything

    seed_everything(seed)
    llm = load_model("tiny:4")  # the base _reinforce_save_load loads back
    # two optimiser steps of 2 completions: LoRA's A first gets a gradient in the second
    common = CommonTrainParams(iterations=1, problems_per_iteration=2, group_size=2, micro_batch=2, answer_tokens=6,
                               line_tokens=6, lr=1e-2, temperature=1.0, seed=seed,
                               lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    run = build_grpo_trainer(llm, build_dataset(PROBLEMS[1:], PROBLEMS[:1]), [_length_reward],
                             trainer_params(common, GRPOParams()), tempfile.mkdtemp(prefix="grpo-contract-"))
    before = _snapshot(p for p in run.trainer.model.parameters() if p.requires_grad)
    list(train_grpo(run))
    llm.model = run.trainer.model
    return SimpleNamespace(llm=llm), before  # what the stage keeps: the LLM with its trained adapter


# ---- KALM's grounding of the tiny LM (LoRA, projections and heads) ---------------------------------------------------
def _grounding_episode(seed):
    from llmrl.data.trajectories import Episode

    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(7, 5)).astype(np.float32)
    return Episode(observations={"obs": obs[:-1], "next_obs": obs[1:]}, actions=rng.uniform(-1, 1, (6, 3)),
                   rewards=np.zeros(6), terminated=np.zeros(6, bool), truncated=np.zeros(6, bool),
                   mission="reach the red ball")


def _grounding_params():
    from llmrl.config.kalm import KalmGroundParams

    return KalmGroundParams(model="tiny", trajectory_samples=4, dynamics_samples=4, goal_samples=4, reverse_samples=4,
                            window=4, epochs=0.5, batch_size=4, dtype="float32", lr=3e-3, warmup=0, seeds=[0])


def _grounding_run(seed):
    from llmrl.algos import kalm_grounding as kg
    from llmrl.llm.grounded import GroundingSpec, build_grounded

    torch.manual_seed(seed)
    model = build_grounded(GroundingSpec(obs_dim=5, action_dim=3, discrete=False, base_model="tiny", finetune="lora"))
    rng = np.random.default_rng(seed)
    samples = kg.build_samples(model, [_grounding_episode(0)], _grounding_params(), rng)
    before = _snapshot(p for p in model.parameters() if p.requires_grad)
    list(kg.train_grounding(model, samples, _grounding_params(), rng))
    return model, before


def _grounding_save_load(model, tmp):
    from llmrl.llm.grounded import GroundedLM

    model.save(tmp / "grounded")
    return GroundedLM.load(tmp / "grounded")


def _grounding_losses(model):
    from llmrl.algos import kalm_grounding as kg
    from llmrl.llm.grounded import collate

    samples = kg.build_samples(model, [_grounding_episode(1)], _grounding_params(), np.random.default_rng(9))
    batch = collate(samples["trajectory"] + samples["reverse"], model.llm.tokenizer.pad_token_id)
    model.eval()
    with torch.no_grad():
        return torch.stack([v.float() for _, v in sorted(model.losses(batch).items())])


# ---- GLAM's PPO over the tiny LM's action scores (LoRA + value head) -------------------------------------------------
GLAM_PROMPT = ("Goal of the agent: go to the red ball\nObservation 0: You see a wall 2 steps forward\n"
               "Action 0: ")


def _glam_run(seed):
    from llmrl.agents.llm_policy import build_agent
    from llmrl.algos.ppo_llm import train as train_glam
    from llmrl.config.glam import GlamPPO

    agent = build_agent("tiny", "lora", seed=seed)
    before = _snapshot(p for p in agent.parameters() if p.requires_grad)
    # two minibatches: LoRA's B starts at 0, so its A first gets a gradient in the second step
    cfg = GlamPPO(n_envs=2, frames_per_env=4, updates=1, epochs=1, minibatch_size=4, micro_batch=4, lr=1e-3)
    list(train_glam(agent, lambda: make_env("BabyAI-Text-GoToObjS4-v0"), cfg, history=1, seed=seed, progress=False))
    return agent, before


def _glam_save_load(agent, tmp):
    from llmrl.agents.llm_policy import load_agent, save_agent

    save_agent(agent, tmp / "glam", {"build": {"model": "tiny", "variant": "lora", "seed": 0}})
    return load_agent(tmp / "glam")[0]


def _glam_predict(agent):
    from llmrl.envs.babyai_text.languages import ACTIONS_EN

    with torch.no_grad():
        out = agent([GLAM_PROMPT], [list(ACTIONS_EN)])
    return torch.cat([out.logits.flatten(), out.values.flatten()])


# ---- GLAM's behaviour cloning of the tiny LM's action scores ----------------------------------------------------------
def _bc_params(agent):
    # BC's cross-entropy reads the action scores only: the value head is PPO's and is left out on purpose
    return [p for n, p in agent.named_parameters() if p.requires_grad and not n.startswith("value_head")]


def _bc_run(seed):
    from llmrl.agents.llm_policy import build_agent
    from llmrl.algos.bc_llm import train_bc
    from llmrl.envs.babyai_text.languages import ACTIONS_EN

    agent = build_agent("tiny", "lora", seed=seed)
    before = _snapshot(_bc_params(agent))
    samples = [(GLAM_PROMPT.replace("red ball", goal), list(ACTIONS_EN), i)
               for i, goal in enumerate(("red ball", "blue key", "green box", "grey door"))]
    rows = list(train_bc(agent, samples, epochs=1, batch_size=2, lr=1e-3, seed=seed, progress=False))
    assert [r["step"] for r in rows] == [1, 2]  # two steps: LoRA's A moves
    return agent, before


# ---- KALM's offline RL through d3rlpy (DiscreteBC) -------------------------------------------------------------------
def _d3rlpy_modules(learnable):
    return [m for m in vars(learnable.impl.modules).values() if isinstance(m, torch.nn.Module)]


def _offline_dataset():
    from llmrl.algos.kalm_offline import build_dataset
    from llmrl.data.embeddings import EmbeddingTable
    from llmrl.data.trajectories import Episode

    rng = np.random.default_rng(0)
    episodes = []
    for n in (6, 8, 5, 7):
        term = np.zeros(n, bool)
        term[-1] = True
        obs = rng.integers(0, 6, (n, BABYAI_OBS)).astype(np.float32)
        episodes.append(Episode(observations={"obs": obs, "next_obs": obs}, actions=rng.integers(0, 7, n),
                                rewards=term.astype(np.float32), terminated=term, truncated=np.zeros(n, bool),
                                mission="go to the red box", info={}))
    return build_dataset(episodes, EmbeddingTable(["go to the red box"], np.ones((1, 4), np.float32)), "babyai",
                         egocentric=False)


def _offline_run(seed):
    from llmrl.algos.kalm_offline import make_learnable, train_offline
    from llmrl.config.kalm import OfflineAlgo

    algo = OfflineAlgo(benchmark="babyai", algo="DiscreteBC", steps=1, config={"batch_size": 8})
    learnable = make_learnable(algo, seed)
    dataset = _offline_dataset()
    learnable.build_with_dataset(dataset)
    before = _snapshot(p for m in _d3rlpy_modules(learnable) for p in m.parameters())
    list(train_offline(learnable, dataset, algo.steps, log_every=1))
    return learnable, before


def _offline_save_load(learnable, tmp):
    import d3rlpy

    learnable.save(str(tmp / "model.d3"))
    return d3rlpy.load_learnable(str(tmp / "model.d3"))


# ---- ProPS's GRPO fine-tuning of the optimizer LLM (its data, prompts and reward functions) ---------------------------
def _props_grpo_run(seed):
    import tempfile

    from datasets import Dataset

    from llmrl.algos.grpo import build_grpo_trainer
    from llmrl.algos.grpo import train as train_grpo
    from llmrl.algos.props_grpo import RewardSettings, build_records, make_reward_funcs, sample_scored_vectors
    from llmrl.algos.props_prompts import PromptSettings
    from llmrl.config.grpo import GRPOTrainParams
    from llmrl.envs.control import get_task
    from llmrl.seeding import seed_everything

    seed_everything(seed)
    task = get_task("mountaincar_continuous")
    data = sample_scored_vectors(task, 4, 1, low=-6, high=6, decimals=1, seed=0)
    settings = PromptSettings(low=-6, high=6, decimals=1, step_size=0.5, optimum=100.0, episodes=1)
    records = build_records(task, data, range(4), settings, iteration=1, total_iterations=30, rollout_seed_base=9)
    rewards = RewardSettings(task=task, n_params=3, low=-6.0, high=6.0, return_floor=-200.0, return_span=300.0)
    # ProPS's rewards are 0 for every tiny-model reply (no parsable proposal), and equal rewards give GRPO no
    # gradient: the length reward beside them varies within a group, so the steps move the adapter.
    cfg = GRPOTrainParams(learning_rate=1e-2, max_steps=2, max_completion_length=8, seed=seed,
                          lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    llm = load_model("tiny:4")
    run = build_grpo_trainer(llm, Dataset.from_list(records), [*make_reward_funcs(rewards), _length_reward], cfg,
                             tempfile.mkdtemp(prefix="props-grpo-contract-"))
    before = _snapshot(p for p in run.trainer.model.parameters() if p.requires_grad)
    list(train_grpo(run))
    llm.model = run.trainer.model
    return SimpleNamespace(llm=llm), before


OFFLINE_INPUT = np.random.default_rng(2).integers(0, 6, (4, BABYAI_OBS + 4)).astype(np.float32)  # obs + embedding


ALGORITHMS = {
    "distilled_ppo": Case(_ppo_run, lambda a: list(a.parameters()), _student_save_load, lambda a: torch.cat(
        [t.flatten() for t in a(_grid_obs())])),
    "mappo": Case(_mappo_run, lambda a: list(a.parameters()), _student_save_load,
                  lambda a: torch.cat([t.flatten() for t in a(_mappo_input(a))])),
    # the loaded policy has its LoRA adapter merged into the base weights (W + BA summed once), which rounds
    # differently from the adapter applied beside W at run time
    "glam_ppo_llm": Case(_glam_run, lambda a: [p for p in a.parameters() if p.requires_grad], _glam_save_load,
                         _glam_predict),
    "glam_bc_llm": Case(_bc_run, _bc_params, _glam_save_load, _glam_predict),
    "reinforce_kl": Case(_reinforce_run, lambda algo: algo.params, _reinforce_save_load, _lm_logits, atol=1e-5),
    "grpo_llm_rl": Case(_grpo_run, lambda r: [p for p in r.llm.model.parameters() if p.requires_grad],
                        _reinforce_save_load, _lm_logits, atol=1e-5),  # merged adapter, as reinforce_kl
    "kalm_grounding": Case(_grounding_run, lambda m: [p for p in m.parameters() if p.requires_grad],
                           _grounding_save_load, _grounding_losses, atol=1e-5),  # the adapter is merged on load
    "props_grpo": Case(_props_grpo_run, lambda r: [p for p in r.llm.model.parameters()
                                                                     if p.requires_grad],
                       _reinforce_save_load, _lm_logits, atol=1e-5),
    "kalm_offline_dbc": Case(_offline_run, lambda l: [p for m in _d3rlpy_modules(l) for p in m.parameters()],
                             _offline_save_load, lambda l: torch.as_tensor(l.predict(OFFLINE_INPUT))),
}


@pytest.fixture(scope="module", params=sorted(ALGORITHMS))
def trained(request):
    case = ALGORITHMS[request.param]
    obj, before = case.run(0)
    return request.param, case, obj, before


def test_one_update_changes_every_trainable_parameter(trained):
    name, case, obj, before = trained
    after = case.params(obj)
    assert after and len(after) == len(before), name
    unchanged = [i for i, (a, b) in enumerate(zip(after, before)) if torch.equal(a.detach(), b)]
    assert not unchanged, f"{name}: parameters {unchanged} of {len(after)} did not change"


def test_save_load_round_trip_gives_the_same_outputs(trained, tmp_path):
    name, case, obj, _ = trained
    loaded = case.save_load(obj, tmp_path)
    torch.testing.assert_close(case.predict(loaded), case.predict(obj), rtol=0, atol=case.atol, msg=name)


def test_same_seed_same_parameters_other_seed_others(trained):
    name, case, obj, _ = trained
    again, _ = case.run(0)
    for a, b in zip(case.params(obj), case.params(again)):
        assert torch.equal(a.detach(), b.detach()), name
    other, _ = case.run(1)
    assert any(not torch.equal(a.detach(), b.detach()) for a, b in zip(case.params(obj), case.params(other))), name


# ================================================================================ gradient-free searches (ProPS)
SEARCH = dict(tasks=["pendulum"], iterations=3, episodes_per_eval=2, max_episode_steps={"pendulum": 50},
              prompt_token_budget=900)


def _props_search_run(seed):
    import tempfile

    from llmrl.algos.props_search import build_optimizer_llm, props_search
    from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams

    lp = PropsLLMParams(spec="tiny", answer_prefix="params[0]:", faults={"max_retries": 0})
    optimizer = build_optimizer_llm(lp, cache_dir=Path(tempfile.mkdtemp(prefix="props-contract-")) / "replies")
    states = []
    rows = list(props_search("pendulum", ["props"], [seed], optimizer,
                             PropsSearchParams(**SEARCH, max_reasks=1), PropsSpaceParams(), lp, states_out=states))
    return rows, states


def _random_search_run(seed):
    from llmrl.algos.blackbox import random_search
    from llmrl.config.props import PropsSearchParams, PropsSpaceParams

    states = []
    rows = list(random_search("pendulum", [seed], PropsSearchParams(**SEARCH), PropsSpaceParams(),
                              states_out=states))
    return rows, states


def _cem_run(seed):
    from llmrl.algos.blackbox import cem
    from llmrl.config.props import CEMParams, PropsSearchParams, PropsSpaceParams

    states = []
    rows = list(cem("pendulum", [seed], PropsSearchParams(**SEARCH), PropsSpaceParams(),
                    CEMParams(population=3, episodes_per_candidate=1), states_out=states))
    return rows, states


SEARCHES = {"props_search": _props_search_run, "random_search": _random_search_run, "cem": _cem_run}


@pytest.fixture(scope="module", params=sorted(SEARCHES))
def searched(request):
    return request.param, *SEARCHES[request.param](0)


def _rows(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_search_rows_and_best_point(searched):
    from llmrl.config.props import PropsSpaceParams

    name, rows, states = searched
    space = PropsSpaceParams()
    assert rows and all({"step", "episodes", "return_mean", "best_return"} <= r.keys() for r in rows), name
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows), name
    assert all(b["episodes"] > a["episodes"] for a, b in zip(rows, rows[1:])), f"{name}: budget must grow"
    (state,) = states
    assert state.best_params is not None and space.low <= state.best_params.min() <= state.best_params.max() <= space.high
    assert rows[-1]["best_return"] == state.best_return == max(r["best_return"] for r in rows), name
    if hasattr(state, "history"):  # ProPS keeps (params, mean return) per iteration: the best is the history's best
        assert state.best_return == max(ret for _, ret in state.history), name


def test_search_same_seed_same_search_other_seed_another(searched):
    name, rows, states = searched
    again_rows, again = SEARCHES[name](0)
    assert _rows(again_rows) == _rows(rows) and np.array_equal(again[0].best_params, states[0].best_params), name
    other_rows, other = SEARCHES[name](1)
    assert not np.array_equal(other[0].best_params, states[0].best_params), f"{name}: another seed, same search"
