"""Stage props_heldout_reference: the held-out test's references on the same test functions as the tuned optimizer
(``llmrl.eval.props_heldout_runs``): the base model in the full ProPS search, and random search, hill climbing and
CEM at equal evaluations.

Reads props.space, props.llm, props.search, props.grpo (the model and the function families) and props.heldout.
Hill climbing's step is tuned on the validation functions only. The base model runs ``base_reps`` times per
function (sampling streams 0, 1, ...), each baseline ``reps`` times (random streams). Writes
data/props/heldout/reference/ (runs.json: every run, the hill step and its tuning table; records.jsonl: every prompt,
reply and parse result of the base model), replies cached by content under data/props/replies/heldout/base (a
persisted out: a re-run replays them).
"""

from llmrl.eval.props_heldout_runs import baseline_runs, tune_hill_step
from stages import paths
from stages.common import log, stage_arguments
from stages.props_heldout_common import HeldoutParams, run_optimizer, write_runs


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_heldout_reference", argv)
    p = HeldoutParams.load()
    out = paths.props_heldout_reference()
    hill_step, tuning = tune_hill_step(p.grpo, p.heldout, p.search, p.space)
    log.info("hill climbing step tuned on %d validation functions per dimension: %s -> %s",
             p.heldout.validation_functions_per_dim, tuning, hill_step)
    runs, records = [], []
    for rep in range(p.heldout.base_reps):
        r, rec = run_optimizer(p, out, "props_base", rep=rep, adapter=None, log=log)
        runs += r
        records += rec
    runs += baseline_runs(hill_step, p.grpo, p.heldout, p.search, p.space)
    write_runs(out.runs, runs, records, hill_step=hill_step, hill_step_tuning=tuning)


if __name__ == "__main__":
    main()
