"""Stage props_quadratic: does the optimizer LLM optimise in context at all? ProPS against random search (and CEM
where asked) on f(params) = 100 - 10 ||params - c||^2, a centre c unknown to every method and drawn per seed: no
environment and no episodes, only proposals and their values.

Reads props.space, props.llm (the embedded model by default; an OpenAI-compatible endpoint goes through the same
code path: props.llm.backend openai), props.search (re-asks, prompt budget, optimum hint, held-out seed base) and
props.quadratic (dimension, iterations, seeds, baselines). Writes data/props/quadratic/runs.json (per method and
seed: rows, the best point and its value, the LLM counters) and records.jsonl (every prompt, reply, parse result
and fallback); replies are cached by content in data/props/replies/quadratic. props_eval tables the runs beside
the control tasks, with the paired ProPS - random search verdict.
"""

import json
import time

import numpy as np
import torch

from llmrl.algos.blackbox import cem, random_search
from llmrl.algos.props_search import build_optimizer_llm, props_search
from llmrl.config.props import PropsLLMParams, PropsQuadraticParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import QuadraticTask
from llmrl.files import atomic_path, write_json
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.props_quadratic()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_quadratic", argv)
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    q = stage_params("props.quadratic", PropsQuadraticParams)
    task = QuadraticTask(n_params=q.n_params)
    # f is exact: one evaluation per proposal, every method at q.iterations evaluations per seed
    budget = search.model_copy(update={"tasks": ["quadratic"], "methods": ["props"], "seeds": q.seeds,
                                       "iterations": q.iterations, "episodes_per_eval": 1})
    seed_everything(0)
    torch.set_num_threads(llm_p.threads)
    optimizer = build_optimizer_llm(llm_p, cache_dir=OUT.replies)
    start = time.perf_counter()
    states, rows = [], []
    for row in props_search(task, ["props"], q.seeds, optimizer, budget, space, llm_p, states_out=states):
        rows.append(row)
    wall = time.perf_counter() - start
    runs = []
    for st in states:
        runs.append({"task": task.key, "method": "props", "seed": st.seed,
                     "rows": [r for r in rows if r["seed"] == st.seed],
                     "centre": task.centre(st.seed).tolist(), "final_params": [float(x) for x in st.best_params],
                     "best_return": st.best_return, "final_eval": [st.best_return], "episodes": st.episodes,
                     **st.counters(),
                     "history": [{"params": [float(x) for x in p], "return_mean": r} for p, r in st.history]})
        log.info("quadratic props seed %d: best f %.2f (centre %s), LLM-proposed %d / %d, parse failures %d / %d "
                 "replies, example copies %d", st.seed, st.best_return, task.centre(st.seed).tolist(),
                 st.llm_proposals, len(st.history), st.parse_failures, st.llm_calls, st.example_copies)
    for method in q.baselines:
        found = []
        gen = (random_search(task, q.seeds, budget, space, states_out=found) if method == "random_search"
               else cem(task, q.seeds, budget, space, q.cem, states_out=found))
        base_rows = list(gen)
        for st in found:
            # the final policy of each method as it defines it (random search: the best point; CEM: its mean)
            final = float(task.values(st.final_params, st.seed))
            runs.append({"task": task.key, "method": method, "seed": st.seed,
                         "rows": [r for r in base_rows if r["seed"] == st.seed],
                         "centre": task.centre(st.seed).tolist(), "final_params": [float(x) for x in st.final_params],
                         "best_return": st.best_return, "final_eval": [final]})
        log.info("quadratic %s: final f %.2f mean over %d seeds", method,
                 float(np.mean([r["final_eval"][0] for r in runs if r["method"] == method])), len(found))
    with atomic_path(OUT.runs, is_dir=True) as tmp:
        write_json(tmp / "runs.json", {"task": task.key, "n_params": task.n_params, "model": optimizer.label,
                                       "wall_seconds": wall, "iterations": q.iterations, "runs": runs})
        with (tmp / "records.jsonl").open("w") as fh:
            for st in states:
                for rec in st.records:
                    fh.write(json.dumps(rec) + "\n")
    log.info("props_quadratic: %d ProPS searches x %d iterations in %.1f s", len(states), q.iterations, wall)


if __name__ == "__main__":
    main()
