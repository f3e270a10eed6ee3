"""Stage props_search@<task>: ProPS (numeric template) and ProPS+ (semantic template), every seed in lockstep.

Reads props.space, props.llm and props.search. Writes data/props/search/<task>/runs.json (per search: rows per
iteration, history, best point, counters, held-out evaluation returns of the best point) and records.jsonl
(every prompt, reply, parse result, re-ask, fault and fallback), a dvclive curve per method under
plots/props/search/<task>/. Replies are cached by content in data/props/replies/search-<task> (a persistent
DVC out), so the stage re-runs offline (props.llm.offline: true) with identical results.
"""

from common import log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import json
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

from llmrl.algos.props_search import build_optimizer_llm, held_out_seeds, props_search
from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import get_task
from llmrl.files import atomic_path, write_json
from llmrl.seeding import seed_everything

from props_common import log_curves  # isort: skip


def main(task_key: str) -> None:
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    task = get_task(task_key)
    out = paths.props_search(task_key)
    seed_everything(0)
    torch.set_num_threads(llm_p.threads)
    # The spec stays as written in params (relative to the repository root, where DVC runs the stage), so the
    # reply-cache keys are the same in every clone.
    optimizer = build_optimizer_llm(llm_p, cache_dir=out.replies)
    states = []
    rows = []
    start = time.perf_counter()
    n_rows = search.iterations * len(search.methods) * len(search.seeds)
    for row in tqdm(props_search(task, search.methods, search.seeds, optimizer, search, space, llm_p,
                                 states_out=states), total=n_rows, desc=f"props_search {task.key}", mininterval=5):
        rows.append(row)
    wall = time.perf_counter() - start
    from llmrl.agents.linear_policy import ParamEvaluator

    ev = ParamEvaluator(task, max_episode_steps=search.max_episode_steps.get(task.key))
    eval_seeds = held_out_seeds(search)
    runs = []
    for st in states:
        final = ev.returns(st.best_params, eval_seeds)[0]
        runs.append({"task": task.key, "method": st.method, "seed": st.seed,
                     "rows": [r for r in rows if r["method"] == st.method and r["seed"] == st.seed],
                     "final_params": [float(x) for x in st.best_params], "best_return": st.best_return,
                     "final_eval": [float(x) for x in final], "episodes": st.episodes, **st.counters(),
                     "history": [{"params": [float(x) for x in p], "return_mean": r} for p, r in st.history]})
        log.info("%s %s seed %d: best %.2f, held-out %.2f, parse failures %d / %d calls, fallbacks %d",
                 task.key, st.method, st.seed, st.best_return, float(np.mean(final)), st.parse_failures,
                 st.llm_calls, st.fallbacks)
    ev.close()
    with atomic_path(out.runs, is_dir=True) as tmp:
        write_json(tmp / "runs.json", {"task": task.key, "model": optimizer.label, "wall_seconds": wall,
                                       "iterations": search.iterations, "runs": runs})
        with (tmp / "records.jsonl").open("w") as fh:
            for st in states:
                for rec in st.records:
                    fh.write(json.dumps(rec) + "\n")
    log_curves(out.curves, runs)
    log.info("props_search %s: %d searches x %d iterations in %.1f s", task.key, len(states), search.iterations, wall)


if __name__ == "__main__":
    main(sys.argv[1])
