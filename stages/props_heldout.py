"""Stage props_heldout: the held-out test's claim: the GRPO-tuned optimizer against the base model, random search,
hill climbing and CEM on test functions it never saw, at equal evaluations, paired by function
(``llmrl.eval.props_heldout``).

Reads the runs of props_heldout_tuned@<seed> (every training seed of props.grpo.seeds) and props_heldout_reference
(data/props/heldout/), each training seed's summary (metrics/props/grpo/<seed>.json: its selected checkpoint and
validation scores) and props.heldout (interval level, bootstrap resamples). The test functions are the ``test``
split of ``llmrl.envs.functions``, disjoint by construction from the train split GRPO saw and the validation split
that chose its checkpoints and hill climbing's step. Writes metrics/props/heldout.json (per method the IQM with its
interval and the reply shares; per comparison rliable's probability of improvement and the paired difference,
functions and runs bootstrapped as crossed factors; the budget; the tuning gate,
``llmrl.eval.props_heldout.tuning_gate``: whether the fine-tune changed the optimizer on validation functions) and
plots/props/heldout.json (the same in full with the gate per seed, the hill step tuning table, per-function scores
and quoted replies before and after tuning).
"""

import json

from llmrl.config.props import PropsGRPOParams, PropsHeldoutParams
from llmrl.eval.props_heldout import heldout_table, tuning_gate
from llmrl.files import read_json, write_json
from llmrl.fingerprint import fingerprint_line
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.props_heldout()
COMPARISONS = (("props_tuned", "props_base"), ("props_tuned", "random_search"), ("props_tuned", "hill_climb"),
               ("props_tuned", "cem"), ("props_base", "random_search"), ("hill_climb", "random_search"))


def read_runs(folder) -> tuple[dict, list[dict]]:
    """A search stage's runs.json and its records."""
    if not (folder / "runs.json").is_file():
        raise SystemExit(f"props_heldout: no runs at {folder} (run the stage that writes it)")
    with (folder / "records.jsonl").open(encoding="utf-8") as f:
        return read_json(folder / "runs.json"), [json.loads(line) for line in f]


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_heldout", argv)
    g = stage_params("props.grpo", PropsGRPOParams)
    h = stage_params("props.heldout", PropsHeldoutParams)
    reference, records = read_runs(paths.props_heldout_reference().runs)
    runs = list(reference["runs"])
    hill_step, tuning = reference["hill_step"], reference["hill_step_tuning"]
    for seed in g.seeds:
        tuned, rec = read_runs(paths.props_heldout_tuned(seed).runs)
        runs += tuned["runs"]
        records += rec
    evaluations = {r["rows"][-1]["episodes"] for r in runs}
    if evaluations != {h.iterations}:
        raise SystemExit(f"props_heldout: the runs spent {sorted(evaluations)} evaluations per search, "
                         f"props.heldout.iterations is {h.iterations}: re-run props_heldout_tuned and "
                         "props_heldout_reference")

    table = heldout_table(runs, COMPARISONS, confidence=h.confidence, reps=h.reps_bootstrap)
    quoted = {}
    for name in ("props_base", "props_tuned"):
        mine = [r for r in records if r["method"] == name and r["rep"] == 0 and r["dim"] == min(h.dims)
                and r["function"] == 0]
        quoted[name] = [{"iteration": r["iteration"], "reply": e.get("reply"), "parse": (e.get("parse") or {}).get("error"),
                         "value": r.get("return_mean")} for r in mine[:6] for e in r["exchanges"][:1]]
    budget_note = {"evaluations_per_search": h.iterations, "test_functions": table["items"], "dims": h.dims,
                   "functions_per_dim": h.functions_per_dim, "base_runs_per_function": h.base_reps,
                   "tuned_runs_per_function": len(g.seeds), "baseline_runs_per_function": h.reps,
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
                               for k, v in table["comparisons"].items()}}
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
