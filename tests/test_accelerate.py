"""REINFORCE-KL under accelerate: 2 CPU processes (DDP over gloo) give the update of one process, same global batch."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from llmrl.llm import LoraSettings, load_model
from llmrl.algos.reinforce_kl import ReinforceKL
from tests.test_reinforce_kl import PROBLEMS, _episode, _params

WORLD = 2
# Measured max |Δ| between the 2-process and the 1-process trainable weights after the two updates below: 3.2e-7
# (float32 rounding: each rank batches, pads and prefix-splits its share apart). The tolerance sits a little above.
ATOL = 1e-6
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
