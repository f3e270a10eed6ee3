"""Stage props_transfer: ProPS with the GRPO-tuned optimizer (peft adapter models/props/grpo on the base model)
against the base model, on the GRPO training task and the transfer tasks.

Reads props.space, props.llm, props.search (budget per iteration, caps, hint, held-out seeds) and
props.transfer. Writes data/props/transfer/runs.json (per task, optimizer and seed: rows, best point, LLM
counters, held-out returns). Without the adapter (props_grpo not run yet) it runs the base model only when
props.transfer.require_adapter is false, and records ``"tuned": "missing"``.
"""

from common import log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip
from paths import ROOT  # isort: skip

import gc
import time

import torch

from llmrl.agents.linear_policy import ParamEvaluator
from llmrl.algos.props_search import build_optimizer_llm, held_out_seeds, props_search
from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams, PropsTransferParams
from llmrl.envs.control import get_task
from llmrl.files import write_json
from llmrl.seeding import seed_everything

ADAPTER = paths.props_grpo().adapter
OUT = paths.props_transfer()


def main() -> None:
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
    eval_seeds = held_out_seeds(search)
    for name, adapter in optimizers.items():
        seed_everything(0)
        opt = build_optimizer_llm(llm_p, adapter=adapter, cache_dir=OUT[f"replies_{name}"])
        for key in tr.tasks:
            task = get_task(key)
            states, rows = [], []
            start = time.perf_counter()
            for row in props_search(task, [tr.method], tr.seeds, opt, search, space, llm_p, iterations=tr.iterations,
                                    states_out=states):
                rows.append(row)
            ev = ParamEvaluator(task, max_episode_steps=search.max_episode_steps.get(task.key))
            for st in states:
                results["runs"].append({
                    "task": task.key, "optimizer": name, "method": f"{tr.method}_{name}", "seed": st.seed,
                    "rows": [r for r in rows if r["seed"] == st.seed], "best_return": st.best_return,
                    "final_params": [float(x) for x in st.best_params],
                    "final_eval": [float(x) for x in ev.returns(st.best_params, eval_seeds)[0]], **st.counters()})
            ev.close()
            log.info("transfer %s %s: %.1f s, parse failures %d / %d calls", name, task.key,
                     time.perf_counter() - start, sum(s.parse_failures for s in states),
                     sum(s.llm_calls for s in states))
        del opt
        gc.collect()
    write_json(OUT.runs / "runs.json", results)


if __name__ == "__main__":
    main()
