"""Stage props_search@<task>: ProPS (numeric template) and ProPS+ (semantic template), every seed in lockstep.

Reads props.space, props.llm and props.search. Writes data/props/search/<task>/runs.json (per search: rows per
iteration, history, best point, counters, held-out evaluation returns of the best point) and records.jsonl
(every prompt, reply, parse result, re-ask, fault and fallback), a dvclive curve per method under
plots/props/search/<task>/. Replies are cached by content in data/props/replies/search-<task> (a persistent
DVC out), so the stage re-runs offline (props.llm.offline: true) with identical results.
"""

import json
import time

import numpy as np
import torch
from tqdm import tqdm

from llmrl.algos.props_search import HeldOutEvaluation, build_optimizer_llm, props_search, search_task
from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.files import atomic_path, write_json
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.props_common import log_curves


def main(argv: list[str] | None = None) -> None:
    task_key = stage_arguments("props_search", argv, task="one of props.search.tasks").task
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    task = search_task(search, task_key)  # at its horizon: the one its prompts state
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
    runs = []
    with HeldOutEvaluation(task, search) as held_out:
        for st in states:
            final = held_out(st.best_params)
            runs.append({"task": task.key, "method": st.method, "seed": st.seed,
                         "rows": [r for r in rows if r["method"] == st.method and r["seed"] == st.seed],
                         "final_params": [float(x) for x in st.best_params], "best_return": st.best_return,
                         "final_eval": final, "episodes": st.episodes, **st.counters(),
                         "history": [{"params": [float(x) for x in p], "return_mean": r} for p, r in st.history]})
            log.info("%s %s seed %d: best %.2f, held-out %.2f, LLM-proposed %d / %d, parse failures %d / %d "
                     "replies (%s), example copies %d", task.key, st.method, st.seed, st.best_return,
                     float(np.mean(final)), st.llm_proposals, len(st.history), st.parse_failures, st.llm_calls,
                     {k: v for k, v in st.parse_errors.items() if v}, st.example_copies)
    with atomic_path(out.runs, is_dir=True) as tmp:
        write_json(tmp / "runs.json", {"task": task.key, "model": optimizer.label, "wall_seconds": wall,
                                       "horizon": task.episode_steps, "iterations": search.iterations, "runs": runs})
        with (tmp / "records.jsonl").open("w") as fh:
            for st in states:
                for rec in st.records:
                    fh.write(json.dumps(rec) + "\n")
    log_curves(out.curves, runs)
    log.info("props_search %s: %d searches x %d iterations in %.1f s", task.key, len(states), search.iterations, wall)


if __name__ == "__main__":
    main()
