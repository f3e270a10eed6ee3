"""Stage props_grpo: the GRPO-tuned ProPS optimizer of one training seed, published from the last part of its run
(``props_grpo_part``): the adapter chosen on validation data, every record of the run, its metrics and curves.

``python -m stages.props_grpo <seed> <parts>`` reads the last part, ``models/props/grpo_parts/<parts>/<seed>/`` and writes the LoRA
adapter ``models/props/grpo/<seed>`` (the validation-best one, byte-stable), ``data/props/grpo/<seed>/`` (every
sampled completion with its rewards, every validation reply, TRL's metrics per step, the selection, the base
model's search exchanges the examples were taken from where searched, and the rendered first prompt), ``metrics/props/grpo/<seed>.json`` (steps, completions, the validation score at step 0,
i.e. the base model, and at the selected step, the last step's gain over step 0 paired by validation episode with
its interval, and the shares of training and validation replies that improve on
their history's best, repeat a history point or fail to parse, first against last) and dvclive curves under
``plots/props/grpo/<seed>`` (``train/*`` per step, ``validation/*`` per validation).
"""

import json
import shutil

from llmrl.config.props import PropsGRPOParams
from llmrl.eval.props_heldout import grpo_summary
from llmrl.files import atomic_path, write_json
from llmrl.fingerprint import fingerprint_line
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("props_grpo", argv, seed="training seed (props.grpo.seeds)",
                           parts="the parts the run was cut into: the last one is read")
    seed, of = int(args.seed), int(args.parts)
    p = stage_params("props.grpo", PropsGRPOParams)
    if seed not in p.seeds:
        raise SystemExit(f"props_grpo: seed {seed} is not among props.grpo.seeds {p.seeds}")
    state = paths.props_grpo_part(of, of, seed).state
    out = paths.props_grpo(seed)
    part = json.loads((state / "part.json").read_text())
    selection = json.loads((state / "selection.json").read_text())
    rows = read_jsonl(state / "rows.jsonl")
    completions = read_jsonl(state / "completions.jsonl")
    validation = read_jsonl(state / "validation.jsonl")
    summary = grpo_summary(rows, completions, selection["history"], functions=part["data"] == "functions",
                           replies=validation)
    with atomic_path(out.adapter, is_dir=True) as tmp:
        shutil.copytree(state / "best", tmp, dirs_exist_ok=True)
    with atomic_path(out.data, is_dir=True) as tmp:
        for name in ("rows.jsonl", "completions.jsonl", "validation.jsonl", "selection.json", "search_examples.json"):
            if name != "search_examples.json" or (state / name).is_file():  # the base model's searches, where run
                shutil.copy2(state / name, tmp / name)
    with open_live(out.live) as live:
        for row in rows:
            live.step = row["step"]
            for key, value in row.items():
                if key != "step":
                    live.log_metric(f"train/{key}", value)
        for v in selection["history"]:
            live.step = v["step"]
            for key, value in v.items():
                if key != "step":
                    live.log_metric(f"validation/{key}", value)
    write_json(out.metrics, {**{k: v for k, v in part.items() if k not in ("part", "seconds")}, "seed": seed,
                             "parts": of, **summary, "validation_replies": len(validation), "env": fingerprint_line()})
    log.info("props_grpo seed %d: %d steps, %d completions; validation reward %.3f at step 0, %.3f at the selected "
             "step %s", seed, summary["steps"], summary["completions"], summary["validation_score_base"],
             summary["validation_score_selected"], summary["selected_step"])


if __name__ == "__main__":
    main()
