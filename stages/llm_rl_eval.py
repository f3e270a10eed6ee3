"""Stage llm_rl_eval: accuracy on the fixed test split before (base model) and after training (each variant).

Every model answers the same first ``llm_rl.eval.n_problems`` test problems; greedy and sampled decoding are reported
apart. A variant is every model llm_rl_train wrote for it, one per training seed of llm_rl.train.seeds. Every
response, its parsed answer and correctness go to metrics/llm_rl/responses/<model>_<mode>.jsonl (a variant's model:
<variant>_seed-<seed>; a plain out). The headline per model, metrics/llm_rl/eval/<model>.json, holds per mode the
accuracy as ``success`` with its 95% interval (seeds and problems as crossed factors; the base model, one run: over
problems), the parse-failure rate, and for a variant its paired gain over the base model on the same problems
(``gain``, ``gain_lo``, ``gain_hi``; ``llmrl.eval.llm_rl``). Beside the responses,
metrics/llm_rl/responses/<model>.json holds the whole entry: mean tokens per answer, the share cut by the token cap,
each seed's accuracy, what the interval is
over, for a variant ``vs_base`` (the paired verdict and gain as one line) and ``gain_over_base`` (the whole paired
comparison), accuracy on problems with unseen and seen arithmetic (generated data: ``by_arithmetic``), the token
cap, the compute dtype and the environment line.
"""

import json
import time

import torch

from llmrl.agents.math_solver import load_policy, solve
from llmrl.config.llm_rl import MathEvalParams, ReinforceTrainParams
from llmrl.envs.word_problems.datasets import read_jsonl
from llmrl.eval.headline import headline_part, metrics_entry
from llmrl.envs.word_problems.generator import seen_arithmetic
from llmrl.eval.llm_rl import accuracy_by_arithmetic, accuracy_entry, against_base
from llmrl.files import atomic_path, write_json
from llmrl.fingerprint import fingerprint_line
from llmrl.llm.generate import SamplingConfig
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, model_spec, open_live, stage_arguments, stage_params

# the answer-quality figure of an accuracy entry that joins the headline in the metrics file (answer tokens and the
# share cut by the cap stay in the whole entry under metrics/llm_rl/responses: dvc metrics show stays one table)
ANSWER_KEYS = ("parse_failure",)


def main(argv: list[str] | None = None) -> None:
    stage_arguments("llm_rl_eval", argv)
    p = stage_params("llm_rl.eval", MathEvalParams)
    train = stage_params("llm_rl.train", ReinforceTrainParams)
    common = train.common  # same model, prompt and few-shot
    seed_everything(p.seed)
    torch.set_num_threads(p.threads)
    test = read_jsonl(paths.llm_rl_data().data / "test.jsonl")[: p.n_problems]
    train_problems = read_jsonl(paths.llm_rl_data().data / "train.jsonl")
    shots = train_problems[: common.few_shot]
    # the generator's records name their calculations: which test problems' arithmetic training saw
    seen = (seen_arithmetic(train_problems, test)
            if all(r.get("source") == "generated" for r in train_problems + test) else None)
    base = model_spec(common.model)
    cap = p.max_new_tokens or common.answer_tokens  # the budget both variants trained with
    modes = {"greedy": SamplingConfig(max_new_tokens=cap, temperature=0.0, seed=p.seed),
             "sampled": SamplingConfig(max_new_tokens=cap, temperature=p.temperature, top_p=p.top_p, seed=p.seed)}
    # every model to score: (model name, training seed or None for the base model, policy folder or None)
    runs = {name: [(None, None)] if name == "base" else
            [(seed, paths.llm_rl_train(name, seed).model) for seed in train.seeds] for name in p.models}
    for name, seeds in runs.items():
        for seed, folder in seeds:
            if folder is not None and not folder.is_dir():
                raise SystemExit(f"llm_rl.eval.models: {name!r} seed {seed} has no trained policy at {folder}")
    entries: dict[str, dict] = {}
    answered: dict[str, dict[str, list[list[dict]]]] = {}  # model -> mode -> one list of records per seed
    out = paths.llm_rl_eval()
    with open_live(out.live) as live, atomic_path(out.responses, is_dir=True) as resp_dir, \
            atomic_path(out.eval, is_dir=True) as eval_dir:
        for name, seeds in runs.items():
            records: dict[str, list[list[dict]]] = {mode: [] for mode in modes}  # mode -> one list per seed
            for seed, folder in seeds:
                llm = load_policy(base, folder, device=common.device, dtype=common.dtype)
                model = name if seed is None else f"{name}_seed-{seed}"
                for mode, sampling in modes.items():
                    t0 = time.perf_counter()
                    answers = solve(llm, test, shots, sampling, batch_size=p.batch_size)
                    records[mode].append(answers)
                    with (resp_dir / f"{model}_{mode}.jsonl").open("w", encoding="utf-8") as f:
                        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in answers)
                    log.info("%s %s: %.3f on %d problems in %.0f s", model, mode,
                             sum(r["correct"] for r in answers) / len(answers), len(answers),
                             time.perf_counter() - t0)
                dtype = llm.dtype_name
                del llm
            entry = {mode: accuracy_entry(per_seed) for mode, per_seed in records.items()}
            if seen is not None:
                for mode, per_seed in records.items():
                    entry[mode]["by_arithmetic"] = accuracy_by_arithmetic(per_seed, seen)
            answered[name] = records
            entries[name] = {"modes": entry, "extra": {"max_new_tokens": cap, "dtype": dtype}}
            for mode, h in entry.items():
                log.info("%s %s: %.3f [%.3f, %.3f] (%s) over %d seeds x %d problems, %.1f%% truncated", name, mode,
                         h["success"], h["success_lo"], h["success_hi"], h["interval"], h["seeds"], len(test),
                         100 * h["truncated"])
                if h["truncated"] > p.max_truncated:
                    log.warning("llm_rl.eval.max_new_tokens: the cap of %d tokens cuts %.0f%% of %s's %s answers "
                                "(> max_truncated %.0f%%); raise it for a fair comparison", cap,
                                100 * h["truncated"], name, mode, 100 * p.max_truncated)
        rows = []
        for name, e in entries.items():
            gains = {}
            for mode, h in e["modes"].items():
                if name != "base" and "base" in entries:
                    g = against_base(answered[name][mode], answered["base"][mode])
                    h["gain_over_base"] = g
                    h["vs_base"] = f"{g['verdict']}: {g['difference']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]"
                    gains[mode] = {"gain": g["difference"], "gain_lo": g["ci_low"], "gain_hi": g["ci_high"]}
                    log.info("%s %s against the base model, paired on the same problems: %s", name, mode,
                             h["vs_base"])
                rows.append({"model": f"{name} ({mode})", "accuracy": h["success"], "ci_low": h["success_lo"],
                             "ci_high": h["success_hi"]})
            write_json(eval_dir / f"{name}.json", metrics_entry(
                {m: {**headline_part(h), **{k: h[k] for k in ANSWER_KEYS}, **gains.get(m, {})}
                 for m, h in e["modes"].items()}))
            write_json(resp_dir / f"{name}.json", {**e["modes"], **e["extra"], "env": fingerprint_line()})
        live.log_plot("accuracy_by_model", rows, x="accuracy", y="model", template="bar_horizontal",
                      title="Math test accuracy (95% intervals over seeds and problems in metrics/llm_rl/eval/)")


if __name__ == "__main__":
    main()
