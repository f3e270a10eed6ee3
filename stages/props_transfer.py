"""Stage props_transfer: ProPS with the GRPO-tuned optimizer (peft adapter models/props/grpo on the base model)
against the base model, on the GRPO training task and the transfer tasks.

Reads props.space, props.llm, props.search (budget per iteration, caps, hint, held-out seeds) and
props.transfer. Writes data/props/transfer/runs.json (per task, optimizer and seed: rows, best point, LLM
counters, held-out returns). Without the adapter (props_grpo not run yet) it runs the base model only when
props.transfer.require_adapter is false, and records ``"tuned": "missing"``.
"""

import gc
import time

import torch

from llmrl.algos.props_search import HeldOutEvaluation, build_optimizer_llm, props_search, search_task
from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams, PropsTransferParams
from llmrl.files import write_json
from llmrl.llm.faults import FaultGuard
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.paths import ROOT

ADAPTER = paths.props_grpo().adapter
OUT = paths.props_transfer()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_transfer", argv)
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    tr = stage_params("props.transfer", PropsTransferParams)
    torch.set_num_threads(llm_p.threads)
    have_adapter = (ADAPTER / "adapter_config.json").is_file()
    if not have_adapter and tr.require_adapter:
        raise SystemExit(f"props_transfer: no adapter at {ADAPTER} (run props_grpo) and require_adapter is true")
    adapter_name = ADAPTER.relative_to(ROOT).as_posix()  # as the metrics name it: models/props/grpo
    optimizers = {"base": None} | ({"tuned": adapter_name} if have_adapter else {})
    results: dict = {"adapter": adapter_name if have_adapter else "missing", "iterations": tr.iterations,
                     "method": tr.method, "runs": []}
    guard = FaultGuard(llm_p.faults, "props.llm.faults")  # one fault policy for both optimizers' requests
    for name, adapter in optimizers.items():
        seed_everything(0)
        opt = build_optimizer_llm(llm_p, adapter=adapter, cache_dir=OUT[f"replies_{name}"], guard=guard)
        for key in tr.tasks:
            task = search_task(search, key)
            states, rows = [], []
            start = time.perf_counter()
            for row in props_search(task, [tr.method], tr.seeds, opt, search, space, llm_p, iterations=tr.iterations,
                                    states_out=states):
                rows.append(row)
            with HeldOutEvaluation(task, search) as held_out:
                for st in states:
                    results["runs"].append({
                        "task": task.key, "optimizer": name, "method": f"{tr.method}_{name}", "seed": st.seed,
                        "rows": [r for r in rows if r["seed"] == st.seed], "best_return": st.best_return,
                        "final_params": [float(x) for x in st.best_params], "final_eval": held_out(st.best_params),
                        **st.counters()})
            log.info("transfer %s %s: %.1f s, parse failures %d / %d calls", name, task.key,
                     time.perf_counter() - start, sum(s.parse_failures for s in states),
                     sum(s.llm_calls for s in states))
        del opt
        gc.collect()
    write_json(OUT.runs / "runs.json", results)


if __name__ == "__main__":
    main()
