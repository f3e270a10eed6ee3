"""Stage props_heldout_tuned@<seed>: the GRPO-tuned optimizer of one training seed in the full ProPS search on the
test functions it never saw (the held-out test; ``llmrl.eval.props_heldout_runs``).

Reads props.space, props.llm (sampling, caps, fault policy; the model is props.grpo.model in-process, the one the
adapter was trained on), props.search (re-asks, optimum hint), props.grpo (the seed's adapter
``models/props/grpo/<seed>`` and the function families) and props.heldout (dimensions, test functions, evaluations).
The adapter of the i-th training seed samples stream i. Writes data/props/heldout/tuned/<seed>/ (runs.json: every
run's rows, best point and score; records.jsonl: every prompt, reply and parse result), replies cached by content
under data/props/replies/heldout/tuned-<seed> (a persisted out: a re-run replays them).
"""

from stages import paths
from stages.common import log, stage_arguments
from stages.props_heldout_common import HeldoutParams, run_optimizer, write_runs


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("props_heldout_tuned", argv, seed="training seed (props.grpo.seeds)")
    p = HeldoutParams.load()
    seed = int(args.seed)
    if seed not in p.grpo.seeds:
        raise SystemExit(f"props_heldout_tuned: seed {seed} is not one of props.grpo.seeds {p.grpo.seeds}")
    adapter = paths.props_grpo(seed).adapter
    if not (adapter / "adapter_config.json").is_file():
        raise SystemExit(f"props_heldout_tuned: no tuned adapter at {adapter} (run props_grpo@{seed})")
    out = paths.props_heldout_tuned(seed)
    runs, records = run_optimizer(p, out, "props_tuned", rep=p.grpo.seeds.index(seed), adapter=adapter, log=log)
    write_runs(out.runs, runs, records, seed=seed)


if __name__ == "__main__":
    main()
