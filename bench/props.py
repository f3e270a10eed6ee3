"""Benchmark: ProPS search throughput with K lockstep searches batched vs K searches one after another, and
vectorised policy evaluation vs a plain Python loop.

1. Search iterations per second (one search advancing one iteration = one search-iteration): K = 4 searches of
   ProPS on Pendulum with the embedded SmolLM2 (``models/base_llm``; set LLMRL_BENCH_MODEL for another spec),
   greedy, no re-asks and no reply cache (every call is generated), 10-episode evaluations of its 200 steps.
   Batched: ``props_search`` with seeds 0..3 in lockstep (one generate call of 4 prompts per iteration). Sequential: the same four searches, one ``props_search`` call each. Both sides produce the
   same searches; the sides alternate over REPEATS pairs and the median paired ratio is reported (target >= 2).
2. Evaluation episodes per second: ``evaluate_params`` (all episodes of all parameter vectors stepped together,
   one batched policy call per step) vs ``evaluate_params_loop`` (one episode after another) on CartPole and
   MountainCarContinuous, 32 random parameter vectors × 10 episodes, capped at 200 steps, the median of 5
   alternating timings; returns are checked equal.

Writes bench/results/props.json with every raw timing.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from llmrl.kernels import pin_cpu_kernels  # noqa: E402
from llmrl.process import keep_caches_under  # noqa: E402

keep_caches_under(ROOT / ".cache")
pin_cpu_kernels()  # the stages' float path (stages/common.py)

from llmrl.agents.linear_policy import evaluate_params, evaluate_params_loop, policy_for  # noqa: E402
from llmrl.algos.props_search import build_optimizer_llm, props_search  # noqa: E402
from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams  # noqa: E402
from llmrl.fingerprint import environment_fingerprint  # noqa: E402
from llmrl.files import write_json  # noqa: E402

TARGET = 2.0
K = 4
ITERATIONS = int(os.environ.get("LLMRL_BENCH_ITERATIONS", 2))
REPEATS = int(os.environ.get("LLMRL_BENCH_REPEATS", 5))
EVAL_TASKS = ("cartpole", "mountaincar_continuous")  # short episodes (random CartPole policies fall in ~25 steps)
# and episodes that always run to the 200-step cap


def search_rate(optimizer, llm_p, search, space) -> dict:
    seeds = list(range(K))
    t0 = time.perf_counter()
    batched = list(props_search("pendulum", ["props"], seeds, optimizer, search, space, llm_p))
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    sequential = [r for s in seeds for r in props_search("pendulum", ["props"], [s], optimizer, search, space, llm_p)]
    t_seq = time.perf_counter() - t0
    same = sorted((r["seed"], r["step"], r["return_mean"]) for r in batched) == \
        sorted((r["seed"], r["step"], r["return_mean"]) for r in sequential)
    n = K * ITERATIONS
    return {"batched_s": t_batched, "sequential_s": t_seq, "batched_it_per_s": n / t_batched,
            "sequential_it_per_s": n / t_seq, "ratio": t_seq / t_batched, "same_results": same}


def evaluation_rate(task: str, vectors: int = 32, episodes: int = 10, timings: int = 5) -> dict:
    """Episodes/s of ``evaluate_params`` vs ``evaluate_params_loop`` on the same random parameter vectors (the
    median of ``timings`` alternating runs: one run of short CartPole episodes lasts a tenth of a second)."""
    params = np.random.default_rng(0).uniform(-6, 6, size=(vectors, policy_for(task).n_params))
    seeds = list(range(episodes))
    runs = []
    for _ in range(timings):
        t0 = time.perf_counter()
        vec = evaluate_params(task, params, seeds, max_episode_steps=200)
        t_vec = time.perf_counter() - t0
        t0 = time.perf_counter()
        loop = evaluate_params_loop(task, params, seeds, max_episode_steps=200)
        runs.append({"vectorised_s": t_vec, "loop_s": time.perf_counter() - t0,
                     "returns_equal": bool(np.array_equal(vec, loop))})
    n = vectors * episodes
    t_vec = statistics.median(r["vectorised_s"] for r in runs)
    t_loop = statistics.median(r["loop_s"] for r in runs)
    return {"episodes": n, "runs": runs, "vectorised_s": t_vec, "loop_s": t_loop, "vectorised_eps_per_s": n / t_vec,
            "loop_eps_per_s": n / t_loop, "ratio": t_loop / t_vec,
            "returns_equal": all(r["returns_equal"] for r in runs)}


def main() -> None:
    spec = os.environ.get("LLMRL_BENCH_MODEL", "models/base_llm")
    llm_p = PropsLLMParams(spec=spec, answer_prefix="params[0]:", batch_size=K,
                           temperature=0.0)  # greedy, so both sides produce the same searches
    search = PropsSearchParams(tasks=["pendulum"], iterations=ITERATIONS, episodes_per_eval=10, max_reasks=0,
                               prompt_token_budget=768)
    space = PropsSpaceParams()
    optimizer = build_optimizer_llm(llm_p, cache_dir=None)
    pairs = [search_rate(optimizer, llm_p, search, space) for _ in range(REPEATS)]
    ratio = statistics.median(p["ratio"] for p in pairs)

    evaluation = {task: evaluation_rate(task) for task in EVAL_TASKS}
    result = {
        "benchmark": "props", "machine": platform.machine(), "threads": torch.get_num_threads(),
        "env": environment_fingerprint(), "model": spec,
        "search": {"K": K, "iterations": ITERATIONS, "repeats": REPEATS, "pairs": pairs, "ratio": ratio,
                   "target": TARGET, "meets_target": ratio >= TARGET},
        "evaluation": evaluation,
    }
    write_json(ROOT / "bench" / "results" / "props.json", result)
    print(f"search: batched {pairs[-1]['batched_it_per_s']:.3f} it/s vs sequential "
          f"{pairs[-1]['sequential_it_per_s']:.3f} it/s, median ratio {ratio:.2f}x (target {TARGET}x)")
    for task, ev in evaluation.items():
        print(f"evaluation {task}: {ev['vectorised_eps_per_s']:.0f} vs {ev['loop_eps_per_s']:.0f} episodes/s, "
              f"median ratio {ev['ratio']:.2f}x")


if __name__ == "__main__":
    main()
