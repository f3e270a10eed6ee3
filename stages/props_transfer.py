"""Stage props_transfer: the GRPO-tuned optimizer in the ProPS search on one control task, at the search's budget, on
one seed of props.transfer.seeds, so that props_eval tables it beside the base model's ProPS runs (props_search) and
the baselines of the same task. No environment reward reached the tuned optimizer's training (it learned on objective functions at the CPU
tiers), so this is a test of transfer.

The control: the same base model without the adapter, run exactly as the tuned optimizer is (``<method>_untuned``:
one search seed per call). A search's replies depend on which prompts share its batch, so the base model's rows in
props_search (its seeds batched) are no control for a search run alone: at the default, with the adapter at its
step-0 weights (the base model's), the two differed by 35 in mean return on MountainCarContinuous.

``python -m stages.props_transfer <task> <seed>``: one search seed (of props.transfer.seeds) per call, so that no
stage runs a task's six searches in a row. Transfer seed ``props.transfer.seeds[i]`` is run by the adapter of
training seed ``props.grpo.seeds[i mod n]`` (``models/props/grpo/<seed>``), on the model it was trained on
(``props.grpo.model``, in-process: an adapter applies to a local model; props.llm's sampling, caps and fault
policy). Reads props.space, props.llm, props.search (budget, caps, hint, held-out seeds), props.grpo.seeds
and props.transfer. Writes data/props/transfer/<task>/<seed>/runs.json (the tuned and untuned run: rows, best
point, LLM counters, held-out returns, the adapter) and caches replies by content under
data/props/replies/transfer-<task>-<seed>.
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
from stages.paths import ROOT


def main(argv: list[str] | None = None) -> None:
    task_key, seed, i, tr = transfer_item("props_transfer", argv)
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    g = stage_params("props.grpo", PropsGRPOParams)
    out = paths.props_transfer(task_key, seed)
    torch.set_num_threads(llm_p.threads)
    task = search_task(search, task_key)
    guard = FaultGuard(llm_p.faults, "props.llm.faults")
    local = llm_p.model_copy(update={"backend": "local", "spec": g.model})
    runs = []
    start = time.perf_counter()
    train_seed = g.seeds[i % len(g.seeds)]
    adapter = paths.props_grpo(train_seed).adapter
    if not (adapter / "adapter_config.json").is_file():
        raise SystemExit(f"props_transfer: no adapter at {adapter} (run props_grpo)")
    for kind, name in (("untuned", None), ("tuned", adapter.relative_to(ROOT).as_posix())):
        seed_everything(0)
        method = f"{tr.method}_{kind}"
        opt = build_optimizer_llm(local, adapter=name, cache_dir=out.replies, guard=guard)
        run = single_search(task, tr.method, method, seed, opt, search, space, local, adapter=name)
        runs.append(run)
        log.info("transfer %s %s seed %d (adapter %s): best %.2f, parse failures %d / %d calls", task.key, kind,
                 seed, name, run["best_return"], run["parse_failures"], run["llm_calls"])
        del opt
    write_json(out.runs / "runs.json", {"task": task.key, "method": tr.method, "seed": seed,
                                        "seconds": time.perf_counter() - start, "runs": runs})


if __name__ == "__main__":
    main()
