"""Stage props_heldout: the GRPO-tuned optimizer in the full ProPS search on test functions it never saw, against
the base model, random search, hill climbing and CEM at equal evaluations, paired by function.

Reads props.space, props.llm (sampling, caps, fault policy; the model is props.grpo.model in-process, the one the
adapters were trained on, for the base and the tuned optimizer alike), props.search (re-asks, optimum hint), props.grpo
(its training seeds' adapters ``models/props/grpo/<seed>`` and the function families) and props.heldout. The test
functions are the ``test`` split of ``llmrl.envs.functions`` (``functions_per_dim`` per dimension), disjoint by
construction from the train split GRPO saw and the validation split that chose its checkpoints; hill climbing's
step is tuned on the validation split only. Every method spends ``iterations`` evaluations per search; the search
is props_search's own loop (same prompt, parser, re-asks and fallback), one search per function, all of a
dimension in lockstep. The base model runs ``base_reps`` times per function (sampling streams 0, 1, ...), the adapter
of the i-th training seed once (stream i), each baseline ``reps`` times (random streams).

Writes data/props/heldout/ (runs.json: every run's rows, best point and score; records.jsonl: every prompt, reply
and parse result), replies cached by content under data/props/replies/heldout/<optimizer>, metrics/props/heldout.json
(per method the IQM with its interval and the reply shares; per comparison rliable's probability of improvement and
the paired difference, functions and runs bootstrapped as crossed factors; the budget; the tuning gate,
``llmrl.eval.props_heldout.tuning_gate``: whether the fine-tune changed the optimizer on validation functions) and
plots/props/heldout.json (the same in full with the gate per seed, the hill step tuning table, per-function scores
and quoted replies before and after tuning).
"""

import gc
import json
import time

import numpy as np
import torch

from llmrl.algos.blackbox import cem, hill_climb, random_search
from llmrl.algos.props_search import build_optimizer_llm, props_search
from llmrl.config.props import PropsGRPOParams, PropsHeldoutParams, PropsLLMParams, PropsSearchParams, \
    PropsSpaceParams
from llmrl.envs.functions import FunctionTask, gap_closed
from llmrl.eval.props_heldout import heldout_table, tuning_gate
from llmrl.files import atomic_path, read_json, write_json
from llmrl.fingerprint import fingerprint_line
from llmrl.llm.faults import FaultGuard
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.paths import ROOT

OUT = paths.props_heldout()
COMPARISONS = (("props_tuned", "props_base"), ("props_tuned", "random_search"), ("props_tuned", "hill_climb"),
               ("props_tuned", "cem"), ("props_base", "random_search"), ("hill_climb", "random_search"))


def function_task(split: str, dim: int, g: PropsGRPOParams) -> FunctionTask:
    f = g.functions
    return FunctionTask(split, dim, step_size=f.step_size, centre_range=f.centre_range, curvature=tuple(f.curvature))


def run_entry(task: FunctionTask, space: PropsSpaceParams, method: str, rep: int, state, rows: list[dict]) -> dict:
    fn = task.function(state.seed)
    best = float(state.best_return)
    entry = {"method": method, "rep": rep, "dim": task.n_params, "function": int(state.seed), "family": fn.family,
             "best_return": best, "score": round(gap_closed(best, fn, space.low, space.high), 6),
             "best_params": [float(x) for x in state.best_params],
             "rows": [r for r in rows if r["seed"] == state.seed]}
    if hasattr(state, "counters"):
        entry.update(state.counters())
    return entry


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_heldout", argv)
    search = stage_params("props.search", PropsSearchParams)
    llm_p = stage_params("props.llm", PropsLLMParams)
    space = stage_params("props.space", PropsSpaceParams)
    g = stage_params("props.grpo", PropsGRPOParams)
    h = stage_params("props.heldout", PropsHeldoutParams)
    adapters = {s: paths.props_grpo(s).adapter for s in g.seeds}
    missing = [str(a) for a in adapters.values() if not (a / "adapter_config.json").is_file()]
    if missing:
        raise SystemExit(f"props_heldout: no tuned adapter at {missing} (run props_grpo)")
    budget = search.model_copy(update={"tasks": ["quadratic"], "methods": ["props"], "iterations": h.iterations,
                                       "episodes_per_eval": 1, "prompt_token_budget": h.prompt_token_budget})
    seeds = list(range(h.functions_per_dim))
    seed_everything(0)
    torch.set_num_threads(llm_p.threads)
    t0 = time.perf_counter()

    # hill climbing's step, tuned on the validation functions (the mean gap-closed score over dims and reps)
    tuning = {}
    for step in h.hill_steps:
        scores = []
        for dim in h.dims:
            task = function_task("validation", dim, g)
            vseeds = list(range(h.validation_functions_per_dim))
            for rep in range(h.reps):
                found = []
                rows = list(hill_climb(task, vseeds, budget.model_copy(update={"seeds": vseeds}), space, step,
                                       states_out=found, rep=rep))
                scores += [run_entry(task, space, "hill_climb", rep, st, rows)["score"] for st in found]
        tuning[str(step)] = round(float(np.mean(scores)), 4)
    hill_step = float(max(h.hill_steps, key=lambda s: tuning[str(s)]))
    log.info("hill climbing step tuned on %d validation functions per dimension: %s -> %s",
             h.validation_functions_per_dim, tuning, hill_step)

    runs: list[dict] = []
    records: list[dict] = []
    guard = FaultGuard(llm_p.faults, "props.llm.faults")
    llm_p = llm_p.model_copy(update={"backend": "local", "spec": g.model})
    optimizers = [("props_base", None, rep) for rep in range(h.base_reps)] + \
                 [("props_tuned", a, i) for i, a in enumerate(adapters.values())]
    for name, adapter, rep in optimizers:
        seed_everything(0)
        label = "base" if adapter is None else f"tuned-{adapter.name}"
        opt = build_optimizer_llm(llm_p, adapter=adapter.relative_to(ROOT).as_posix() if adapter else None,
                                  cache_dir=OUT.replies / label, guard=guard)
        for dim in h.dims:
            task = function_task("test", dim, g)
            states, rows = [], []
            start = time.perf_counter()
            # tuned adapter i samples stream i, as base repetition i does: paired by stream where both exist
            for row in props_search(task, ["props"], seeds, opt, budget, space, llm_p, states_out=states, rep=rep):
                rows.append(row)
            for st in states:
                runs.append(run_entry(task, space, name, rep, st, rows))
                records += [{"method": name, "rep": rep, "dim": dim, "function": st.seed, **r} for r in st.records]
            log.info("%s rep %d, %d-d: %.0f s, mean score %.3f, parse failures %d / %d replies", name, rep, dim,
                     time.perf_counter() - start, np.mean([r["score"] for r in runs[-len(states):]]),
                     sum(s.parse_failures for s in states), sum(s.llm_calls for s in states))
        del opt
        gc.collect()
    for method in ("random_search", "hill_climb", "cem"):
        for dim in h.dims:
            task = function_task("test", dim, g)
            for rep in range(h.reps):
                found = []
                b = budget.model_copy(update={"seeds": seeds})
                gen = (random_search(task, seeds, b, space, states_out=found, rep=rep) if method == "random_search"
                       else hill_climb(task, seeds, b, space, hill_step, states_out=found, rep=rep)
                       if method == "hill_climb" else cem(task, seeds, b, space, h.cem, states_out=found, rep=rep))
                rows = list(gen)
                runs += [run_entry(task, space, method, rep, st, rows) for st in found]

    table = heldout_table(runs, COMPARISONS, confidence=h.confidence, reps=h.reps_bootstrap)
    quoted = {}
    for name in ("props_base", "props_tuned"):
        mine = [r for r in records if r["method"] == name and r["rep"] == 0 and r["dim"] == min(h.dims)
                and r["function"] == 0]
        quoted[name] = [{"iteration": r["iteration"], "reply": e.get("reply"), "parse": (e.get("parse") or {}).get("error"),
                         "value": r.get("return_mean")} for r in mine[:6] for e in r["exchanges"][:1]]
    seconds = round(time.perf_counter() - t0, 1)
    with atomic_path(OUT.runs, is_dir=True) as tmp:
        write_json(tmp / "runs.json", {"hill_step": hill_step, "runs": runs})
        (tmp / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    budget_note = {"evaluations_per_search": h.iterations, "test_functions": table["items"], "dims": h.dims,
                   "functions_per_dim": h.functions_per_dim, "base_runs_per_function": h.base_reps,
                   "tuned_runs_per_function": len(adapters), "baseline_runs_per_function": h.reps,
                   "training_seeds": list(g.seeds)}
    # which checkpoint each adapter is (step 0 would be the base model's weights: the tuned row is then the base's)
    summaries = [{"seed": s, **read_json(paths.props_grpo(s).metrics)} for s in g.seeds]
    selected = [{"seed": s["seed"], "step": s["selected_step"]} for s in summaries]
    gate = tuning_gate(summaries)  # read beside the held-out comparison: did tuning change the optimizer at all
    concise = {"budget": budget_note, "hill_step": hill_step, "selected_steps": selected,
               "gate": {k: v for k, v in gate.items() if k != "per_seed"},
               "methods": {m: {"iqm": e["iqm"]["value"], "iqm_lo": e["iqm"]["ci_low"], "iqm_hi": e["iqm"]["ci_high"],
                               "mean": e["mean"], "runs": e["runs"], "items": e["items"], **e.get("replies", {})}
                           for m, e in table["methods"].items()},
               "comparisons": {k: {"poi": v["probability_of_improvement"]["value"],
                                   "poi_lo": v["probability_of_improvement"]["ci_low"],
                                   "poi_hi": v["probability_of_improvement"]["ci_high"],
                                   "paired_difference": v["paired_difference"]["difference"],
                                   "paired_lo": v["paired_difference"]["ci_low"],
                                   "paired_hi": v["paired_difference"]["ci_high"],
                                   "verdict": v["paired_difference"]["verdict"]}
                               for k, v in table["comparisons"].items()},
               "seconds": seconds}
    write_json(OUT.metrics, concise)
    write_json(OUT.report, {"env": fingerprint_line(), "budget": budget_note, "selected_steps": selected, "gate": gate,
                            "hill_step_tuning": tuning,
                            "hill_step": hill_step, "table": table, "quoted_replies": quoted,
                            "per_function": [{k: r[k] for k in ("method", "rep", "dim", "function", "family", "score")}
                                             for r in runs]})
    for m, e in concise["methods"].items():
        log.info("%-14s IQM %.3f [%.3f, %.3f] over %d runs x %d functions%s", m, e["iqm"], e["iqm_lo"], e["iqm_hi"],
                 e["runs"], e["items"], f"; improve {e.get('improve_share')}, repeat {e.get('repeat_share')}, parse "
                                        f"failures {e.get('parse_failure_share')}" if "improve_share" in e else "")
    for k, v in concise["comparisons"].items():
        log.info("%s: P(improvement) %.3f [%.3f, %.3f]; paired difference %.3f [%.3f, %.3f] (%s)", k, v["poi"],
                 v["poi_lo"], v["poi_hi"], v["paired_difference"], v["paired_lo"], v["paired_hi"], v["verdict"])


if __name__ == "__main__":
    main()
