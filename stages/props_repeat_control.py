"""Stage props_repeat_control: a control for props_transfer. The base model (the one the tuned optimizer's adapters
were trained on, without them) in the ProPS search of one control task and search seed, run alone as
props_transfer runs it, except that each proposal repeating a point of its history is evaluated as a uniform random
point instead (``props_search(repeats="random")``).

Why: the tuned optimizer repeats almost no point and the base model repeats many. If the base model with its repeats
replaced does as well as the tuned one, the tuning's gain is the repeats it removed, not better points;
props_eval tables the three runs, paired by search seed.

``python -m stages.props_repeat_control <task> <seed>``: a task of props.transfer.tasks, a seed of props.transfer.seeds.
Reads props.space, props.llm, props.search, props.grpo.model and props.transfer. Writes
data/props/repeat_control/<task>/<seed>/runs.json (one run, method ``<method>_untuned_repeats_random``) and caches
replies by content under data/props/replies/repeat_control-<task>-<seed>.
"""

import time

import torch

from llmrl.algos.props_search import build_optimizer_llm, search_task, single_search
from llmrl.config.props import PropsGRPOParams, PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.files import write_json
from llmrl.llm.faults import FaultGuard
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_params
from stages.props_transfer_common import transfer_item

REPEAT_CONTROL = "untuned_repeats_random"  # the run's method suffix, beside props_transfer's _tuned and _untuned


def main(argv: list[str] | None = None) -> None:
    task_key, seed, _, tr = transfer_item("props_repeat_control", argv)
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    g = stage_params("props.grpo", PropsGRPOParams)
    out = paths.props_repeat_control(task_key, seed)
    torch.set_num_threads(llm_p.threads)
    task = search_task(search, task_key)
    local = llm_p.model_copy(update={"backend": "local", "spec": g.model})
    start = time.perf_counter()
    seed_everything(0)  # as props_transfer's untuned run
    opt = build_optimizer_llm(local, cache_dir=out.replies, guard=FaultGuard(llm_p.faults, "props.llm.faults"))
    run = single_search(task, tr.method, f"{tr.method}_{REPEAT_CONTROL}", seed, opt, search, space, local,
                        repeats="random")
    replaced = sum(r["proposal"] == "replaced" for r in run["rows"])
    log.info("repeat control %s seed %d: best %.2f, %d repeats replaced, parse failures %d / %d calls", task.key,
             seed, run["best_return"], replaced, run["parse_failures"], run["llm_calls"])
    write_json(out.runs / "runs.json", {"task": task.key, "method": tr.method, "seed": seed,
                                        "seconds": time.perf_counter() - start, "runs": [run]})


if __name__ == "__main__":
    main()
