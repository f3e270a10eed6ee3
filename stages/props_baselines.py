"""Stage props_baselines: uniform random search, CEM and SB3 PPO at ProPS's episode budget, every search task.

Reads props.space, props.search (tasks, seeds, budget = iterations × episodes_per_eval, caps, held-out seeds)
and props.baselines. Writes data/props/baselines/<task>.json (per method and seed: rows, final policy, held-out
evaluation returns) and dvclive curves of best return vs episodes under plots/props/baselines/<task>/.
"""

import time

import numpy as np
import torch

from llmrl.algos.blackbox import cem, random_search
from llmrl.algos.props_ppo import ppo_baseline
from llmrl.algos.props_search import HeldOutEvaluation, search_task
from llmrl.config.props import PropsBaselinesParams, PropsSearchParams, PropsSpaceParams
from llmrl.eval.props import evaluate_ppo
from llmrl.files import atomic_path, write_json
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.props_common import log_curves


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_baselines", argv)
    search = stage_params("props.search", PropsSearchParams)
    base = stage_params("props.baselines", PropsBaselinesParams)
    space = stage_params("props.space", PropsSpaceParams)
    budget = search.iterations * search.episodes_per_eval
    # PPO's 64x64 MLP gains nothing from several threads; on a shared CPU they only add synchronisation waits.
    torch.set_num_threads(1)
    outputs = paths.props_baselines()
    with atomic_path(outputs.runs, is_dir=True) as out:
        for key in search.tasks:
            task = search_task(search, key)  # at the horizon the LLM methods' prompts state
            runs = []
            with HeldOutEvaluation(task, search) as held_out:
                for method in base.methods:
                    start = time.perf_counter()
                    seed_everything(0)
                    if method in ("random_search", "cem"):
                        states = []
                        gen = (random_search(task, search.seeds, search, space, states_out=states)
                               if method == "random_search" else
                               cem(task, search.seeds, search, space, base.cem, states_out=states))
                        rows = list(gen)
                        for st in states:
                            runs.append({"task": task.key, "method": method, "seed": st.seed,
                                         "rows": [r for r in rows if r["seed"] == st.seed],
                                         "final_params": [float(x) for x in st.final_params],
                                         "best_return": st.best_return, "final_eval": held_out(st.final_params)})
                    else:
                        for seed in search.seeds:
                            seed_everything(seed)
                            models = []
                            rows = list(ppo_baseline(task, seed, budget, base.ppo, model_out=models))
                            final = evaluate_ppo(models[0], task, held_out.seeds)
                            runs.append({"task": task.key, "method": "ppo", "seed": seed, "rows": rows,
                                         "best_return": max(r["best_return"] for r in rows),
                                         "final_eval": [float(x) for x in final]})
                    mine = [r for r in runs if r["method"] == method]
                    log.info("%s %s: held-out %.2f over %d seeds, %d episodes each, %.1f s", task.key, method,
                             float(np.mean([np.mean(r["final_eval"]) for r in mine])), len(mine),
                             mine[0]["rows"][-1]["episodes"], time.perf_counter() - start)
            write_json(out / f"{task.key}.json", {"task": task.key, "budget_episodes": budget, "runs": runs})
            log_curves(outputs.curves / task.key, runs)


if __name__ == "__main__":
    main()
