"""Stage kalm_gate0@<benchmark>: gate 0 of one benchmark pooled over its grounding seeds.

Reads metrics/kalm/ground/<benchmark>/<seed>.json of every seed in kalm.ground.seeds
(kalm_ground@<benchmark>-<seed>: each seed's gate-0 episodes of the grounded model, random actions and BC) and
writes metrics/kalm/gate0/<benchmark>.json:
the pooled verdict (llmrl.eval.kalm.pool_gate0: the grounded model's episodes over all seeds clearly above random's,
by separated Wilson intervals), each seed's own verdict and its selection and state-error figures. A stage of its
own, right after grounding, so the verdict exists before imagination is read and costs seconds to refresh when one
seed re-runs (kalm_eval, the other candidate, runs after all of offline RL). With kalm.ground.gate_episodes = 0 the
record says that no gate ran.
"""

from llmrl.config.kalm import KalmGroundParams
from llmrl.eval.kalm import pool_gate0
from llmrl.fingerprint import fingerprint_line
from llmrl.files import read_json, write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params

# each seed's figures beside its gate-0 verdict: what chose its weights and how well it predicts states
SEED_KEYS = ("selected_update", "heldout_selection_loss_after", "heldout_act_loss_after", "heldout_obs_loss_after",
             "state_error", "goal_sensitivity")


def main(argv: list[str] | None = None) -> None:
    benchmark = stage_arguments("kalm_gate0", argv, benchmark="one of kalm.ground.benchmarks").benchmark
    p = stage_params("kalm.ground", KalmGroundParams)
    if benchmark not in p.benchmarks:
        raise SystemExit(f"kalm_gate0: benchmark {benchmark!r} is not in kalm.ground.benchmarks {p.benchmarks}")
    records = {}
    for seed in p.seeds:
        path = paths.kalm_ground(benchmark, seed).metrics
        if not path.is_file():
            raise SystemExit(f"kalm_gate0: {path} is missing: run kalm_ground@{benchmark}-{seed} first")
        records[seed] = read_json(path)
    result = {"benchmark": benchmark,
              "seeds": [{"seed": s, **{k: r[k] for k in SEED_KEYS if k in r},
                         **({"bc_goal_sensitivity": r["gate0"]["bc_goal_sensitivity"]}
                            if "bc_goal_sensitivity" in (r.get("gate0") or {}) else {})}
                        for s, r in records.items()]}
    if p.gate_episodes:
        stale = [s for s, r in records.items() if "episodes" not in r.get("gate0", {})]
        if stale:
            raise SystemExit(f"kalm_gate0: grounding seeds {stale} of {benchmark} recorded no gate-0 episodes "
                             "although kalm.ground.gate_episodes > 0: re-run their kalm_ground items")
        first = records[p.seeds[0]]["gate0"]
        verdict = pool_gate0({s: r["gate0"]["episodes"] for s, r in records.items()})
        result |= {"gate0": {**verdict, "goals": first["goals"], "first_seed": first["first_seed"]},
                   "gate0_passed": verdict["passed"]}
    else:
        result |= {"gate0": None, "gate0_passed": None, "why": "kalm.ground.gate_episodes is 0: no gate ran"}
    write_json(paths.kalm_gate0(benchmark).metrics, {**result, "env": fingerprint_line()})
    log.info("%s gate 0 over seeds %s: %s", benchmark, p.seeds, result.get("gate0_passed"))


if __name__ == "__main__":
    main()
