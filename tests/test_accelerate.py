"""REINFORCE-KL, GLAM's PPO and KALM's grounding fine-tune under accelerate: 2 CPU processes (DDP over gloo) give the
updates of one process at the same global batch; so does GRPO (TRL's own DDP) with per-completion seeds."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from llmrl.config.lora import LoraSettings
from llmrl.llm.load import load_model
from llmrl.algos.reinforce_kl import ReinforceKL
from tests.test_reinforce_kl import PROBLEMS, _episode, _params

WORLD = 2
# Measured max |Δ| between the 2-process and the 1-process trainable weights after the two updates below: 3.2e-7 on
# one host, 1.9e-6 on CI's and a Xeon host (float32 rounding: each rank batches, pads and prefix-splits its share
# apart, and Adam divides by the root of tiny second moments, so the rounding differs by CPU kernel). The updates
# move weights by more than 1e-3, and a rank loss missing its factor N moves them apart by 3.3e-3: the tolerance
# sits well under both.
ATOL = 1e-5
SETTINGS = {"micro_batch": 4, "baseline": "batch", "beta": 0.25}


def _trainer(llm, accelerator=None, **kw):
    """tests/test_reinforce_kl.py's ``_trainer`` (the same settings), with an accelerator."""
    cfg = _params(**{"problems_per_iteration": 2, "group_size": 2, "max_steps": 2, "line_tokens": 6,
                     "answer_tokens": 12, "micro_batch": 4, "lr": 1e-2, "baseline": "none", "beta": 0.0, **kw})
    return ReinforceKL(llm, cfg, PROBLEMS[1:], PROBLEMS[:1], accelerator=accelerator)


def _llm():
    torch.manual_seed(0)
    return load_model("tiny:3", lora=LoraSettings(r=4, alpha=8, dropout=0.0))


def _episodes(llm):
    """9 usable episodes (micro-batches of 4, 4 and 1: rank 1's share of the last is empty) and one without lines."""
    lines = [["3 + 2 = 5\n", "The answer is: 5\n"], ["The answer is: 9\n"], ["2 apples\n", "The answer is: 4\n"]]
    eps = [_episode(llm, PROBLEMS[i % 4], lines[i % 3], float(i % 2), group=i % 4) for i in range(9)]
    return eps + [_episode(llm, PROBLEMS[0], [], 0.0, group=0)]


def _train(algo, llm):
    eps = _episodes(llm)
    stats = [algo.update(eps) for _ in range(2)]  # the second with the policy away from the reference
    return [p.detach().clone() for p in algo.params], stats


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    assert acc.num_processes == WORLD and acc.distributed_type.name == "MULTI_CPU"
    llm = _llm()
    with pytest.raises(ValueError, match="common.micro_batch"):
        _trainer(llm, **{**SETTINGS, "micro_batch": 3}, accelerator=acc)
    algo = _trainer(llm, **SETTINGS, accelerator=acc)
    initial = [p.detach().clone() for p in algo.params]
    params, stats = _train(algo, llm)
    gathered = [None] * WORLD
    torch.distributed.all_gather_object(gathered, (params, stats))
    if rank == 0:
        torch.save({"initial": initial, "ranks": gathered}, out)
    acc.end_training()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_match_one_process(tmp_path):
    out = str(tmp_path / "ddp.pt")
    mp.spawn(_worker, args=(_free_port(), out), nprocs=WORLD, join=True)
    res = torch.load(out)

    llm = _llm()
    algo = _trainer(llm, **SETTINGS)
    initial = [p.detach().clone() for p in algo.params]
    params, stats = _train(algo, llm)

    for a, b in zip(initial, res["initial"], strict=True):
        assert torch.equal(a, b)  # both runs start from the same weights
    assert max(float((a - b).abs().max()) for a, b in zip(params, initial)) > 1e-3  # the updates did train
    for rank_params, rank_stats in res["ranks"]:
        diff = max(float((a - b).abs().max()) for a, b in zip(params, rank_params, strict=True))
        print(f"max |2 processes - 1 process| = {diff:.3g}")
        assert diff <= ATOL
        for one, many in zip(stats, rank_stats, strict=True):
            assert one.keys() == many.keys()
            for k in one:
                assert many[k] == pytest.approx(one[k], rel=1e-4, abs=1e-6), k


# GLAM's PPO: 11 frames in minibatches of 6 and 5, micro-batches of 2. In the minibatch of 5 one process runs
# micro-batches of 2, 2 and 1; over 2 processes rank 0 takes 3 samples (2 + 1) and rank 1 takes 2 plus a weight-0
# micro-batch, so both run the same number of backward passes. LoRA on the top layer only: the frozen trunk's
# cached states are reused.
GLAM_CFG = dict(n_envs=1, frames_per_env=11, updates=2, epochs=2, minibatch_size=6, micro_batch=2, lr=1e-3)
GLAM_ENV = "BabyAI-Text-GoToObjS4-v0"
# Measured max |Δ| of the trainable weights, 2 processes vs 1, after the 2 updates: 2.2e-8 (without the factor N
# on the rank losses: 3.3e-3). The tolerance is REINFORCE-KL's.
GLAM_ATOL = 1e-6


def _glam_run(accelerator=None):
    from llmrl.agents.llm_policy import build_agent
    from llmrl.algos.ppo_llm import train
    from llmrl.config.glam import GlamPPO
    import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
    from llmrl.envs.make import make_env

    agent = build_agent("tiny", "lora", seed=0, lora_layers=1, temperature=1.0)
    assert agent.trunk_start is not None
    initial = agent.trainable_state()
    rows = list(train(agent, lambda: make_env(GLAM_ENV), GlamPPO(**GLAM_CFG), history=1, seed=0, progress=False,
                      accelerator=accelerator))
    return initial, agent.trainable_state(), rows


def _glam_job(acc):
    from llmrl.agents.llm_policy import build_agent
    from llmrl.algos.ppo_llm import train
    from llmrl.config.glam import GlamPPO

    with pytest.raises(ValueError, match="checkpoint=None"):
        next(train(build_agent("tiny", "lora", seed=0), lambda: None, GlamPPO(**GLAM_CFG), history=1, seed=0,
                   checkpoint="unused.ckpt", accelerator=acc))
    return _glam_run(acc)


def _ddp_worker(rank: int, port: int, out: str, job) -> None:
    """One of WORLD processes: ``job(accelerator)`` -> (initial, final, rows); rank 0 saves every rank's result."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    initial, final, rows = job(acc)
    gathered = [None] * WORLD
    torch.distributed.all_gather_object(gathered, (final, rows))
    if rank == 0:
        torch.save({"initial": initial, "ranks": gathered}, out)
    acc.end_training()


def _compare_with_one_process(tmp_path, job, run, atol: float, name: str, trained: float):
    """Runs ``job`` on WORLD processes and ``run()`` on one; checks both start from the same weights, that the
    updates trained (some weight moved by more than ``trained``) and every rank's weights are within ``atol``.
    Returns the one-process rows and every rank's rows."""
    out = str(tmp_path / "ddp.pt")
    mp.spawn(_ddp_worker, args=(_free_port(), out, job), nprocs=WORLD, join=True)
    res = torch.load(out)
    torch.set_num_threads(1)
    initial, final, rows = run()
    assert initial.keys() == res["initial"].keys()
    for k in initial:
        assert torch.equal(initial[k], res["initial"][k])  # both runs start from the same weights
    assert max(float((final[k] - initial[k]).abs().max()) for k in final) > trained  # the updates did train
    for rank_final, _ in res["ranks"]:
        diff = max(float((final[k] - rank_final[k]).abs().max()) for k in final)
        print(f"{name}: max |{WORLD} processes - 1 process| = {diff:.3g}")
        assert diff <= atol
    return rows, [rank_rows for _, rank_rows in res["ranks"]]


def test_glam_ppo_on_two_cpu_processes_matches_one_process(tmp_path):
    rows, ranks = _compare_with_one_process(tmp_path, _glam_job, _glam_run, GLAM_ATOL, "GLAM", 1e-4)
    for rank_rows in ranks:
        assert len(rank_rows) == len(rows) == GLAM_CFG["updates"]
        for one, many in zip(rows, rank_rows, strict=True):
            for k in ("frames", "episodes", "success_rate", "return_mean"):  # the same rollouts
                assert many[k] == one[k], k
            for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "loss", "grad_norm"):
                assert many[k] == pytest.approx(one[k], rel=1e-4, abs=1e-6), k


# KALM's grounding fine-tune: batches of 5 sequences from all four patterns, shared 3 + 2 over the two processes,
# so a rank's share may lack a term's targets (its head then gets no gradient on that rank). Measured max |Δ| of the
# trainable weights after 4 AdamW steps: 3.6e-6 (Adam's normalised steps carry the shares' float rounding; each
# rank's plain mean instead of its target-weighted share: 4.3e-2).
GROUNDING_ATOL = 2e-5


def _grounding_run(accelerator=None):
    import numpy as np

    from llmrl.algos import kalm_grounding as kg
    from llmrl.llm.grounded import GroundingSpec, build_grounded
    from tests.test_kalm_grounded import A, D, _episode, _params

    rng = np.random.default_rng(3)
    torch.manual_seed(0)
    # LoRA dropout 0: the default's masks would be drawn from each process's own random stream
    model = build_grounded(GroundingSpec(obs_dim=D, action_dim=A, discrete=True, base_model="tiny", finetune="lora"),
                           lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    eps = [_episode(rng, discrete=True) for _ in range(3)]
    p = _params(epochs=1.25, batch_size=5, lr=1e-2)  # 16 samples: 4 updates
    samples = kg.build_samples(model, eps, p, rng)
    initial = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    rows = list(kg.train_grounding(model, samples, p, rng, accelerator=accelerator))
    return initial, {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}, rows


def _grounding_job(acc):
    from llmrl.algos import kalm_grounding as kg
    from tests.test_kalm_grounded import _model, _params

    with pytest.raises(ValueError, match="kalm.ground.batch_size"):
        next(kg.train_grounding(_model(), {}, _params(batch_size=1), None, accelerator=acc))
    return _grounding_run(acc)


def test_kalm_grounding_on_two_cpu_processes_matches_one_process(tmp_path):
    rows, ranks = _compare_with_one_process(tmp_path, _grounding_job, _grounding_run, GROUNDING_ATOL,
                                            "KALM grounding", 1e-3)
    for rank_rows in ranks:
        for one, many in zip(rows, rank_rows, strict=True):
            assert one.keys() == many.keys()
            for k in ("loss", "obs_loss", "act_loss", "token_loss", "lr"):
                assert many[k] == pytest.approx(one[k], rel=1e-5, abs=1e-6), k


# TRL's GRPO runs DDP itself: each process samples and scores its half of every micro-batch of 4 completions. With
# per-completion seeds (the default) the halves are one process's completions, so the run equals one process's.
# Measured max |Δ| of the trainable weights after 3 steps at lr 1e-2: 9.6e-6 (each rank pads and scores its half
# apart; Adam's normalised steps carry the rounding); without per-completion seeds 4.0e-2.
GRPO_ATOL = 5e-5


def _grpo_run(accelerator=None, *, batch: int = 4, generations: int = 2):
    """(initial, final, {"steps": logged steps, "completions": recorded completions per step, "gathered": every
    process's (step, completion, reward)}) of 3 GRPO steps."""
    import tempfile
    from collections import Counter

    from datasets import Dataset

    from llmrl.algos.grpo import build_grpo_trainer, completion_text, gather_records, recording, train
    from llmrl.config.grpo import GRPOTrainParams
    from llmrl.llm.load import load_model

    def length_reward(completions, **_):  # varies within a group, so the steps move the adapter
        return [len(completion_text(c)) / 10 for c in completions]

    torch.manual_seed(0)
    cfg = GRPOTrainParams(learning_rate=1e-2, num_generations=generations, per_device_train_batch_size=batch,
                          max_steps=3, max_completion_length=6, seed=0,
                          lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    prompts = Dataset.from_list([{"prompt": f"Count to {i}:"} for i in range(8)])
    record: list[dict] = []
    run = build_grpo_trainer(load_model("tiny"), prompts, recording([length_reward], record), cfg,
                             tempfile.mkdtemp(prefix="grpo-ddp-"))
    trainable = [(n, p) for n, p in run.trainer.model.named_parameters() if p.requires_grad]
    initial = {n: p.detach().clone() for n, p in trainable}
    steps = [row["step"] for row in train(run)]
    final = {n: p.detach().clone() for n, p in trainable}
    gathered = sorted((r["step"], r["completion"], r["reward_length_reward"]) for r in gather_records(record))
    return initial, final, {"steps": steps, "completions": sorted(Counter(r["step"] for r in record).values()),
                            "gathered": gathered}


def _grpo_job(acc):
    with pytest.raises(ValueError, match="divisible by the 2 processes"):
        _grpo_run(acc, batch=3, generations=3)
    return _grpo_run(acc)


def test_grpo_on_two_cpu_processes_matches_one_process(tmp_path):
    rows, ranks = _compare_with_one_process(tmp_path, _grpo_job, _grpo_run, GRPO_ATOL, "GRPO", 1e-4)
    assert rows["steps"] == [1, 2, 3] and all(r["steps"] == [1, 2, 3] for r in ranks)
    # 4 completions per step: all 4 sampled and scored by one process, or 2 by each of the two
    assert rows["completions"] == [4, 4, 4] and all(r["completions"] == [2, 2, 2] for r in ranks)
    assert len(rows["gathered"]) == 12 and len({c for _, c, _ in rows["gathered"]}) > 1
    for r in ranks:  # the same completions and rewards, every process's gathered on every process
        assert r["gathered"] == rows["gathered"]
