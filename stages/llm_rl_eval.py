"""Stage llm_rl_eval: accuracy on the fixed test split before (base model) and after training (each variant).

Greedy and sampled decoding are reported apart. Every response, its parsed answer and correctness go to
metrics/llm_rl/responses/<model>_<mode>.jsonl (a plain out); the headline per model, metrics/llm_rl/eval/<model>.json,
holds accuracy as ``success`` with its 95% interval (one training seed: the interval is over problems), the
parse-failure and truncation rates and mean tokens per answer.
"""

from common import log, model_spec, open_live, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import json
import time

import torch

from llmrl.agents.math_solver import load_policy, solve
from llmrl.config.llm_rl import MathEvalParams, ReinforceTrainParams
from llmrl.envs.word_problems.datasets import read_jsonl
from llmrl.eval.headline import headline, metrics_entry
from llmrl.files import atomic_path, write_json
from llmrl.llm import SamplingConfig
from llmrl.seeding import seed_everything


def main() -> None:
    p = stage_params("llm_rl.eval", MathEvalParams)
    common = stage_params("llm_rl.train", ReinforceTrainParams).common  # same model, prompt and few-shot
    seed_everything(p.seed)
    torch.set_num_threads(p.threads)
    test = read_jsonl(paths.llm_rl_data().data / "test.jsonl")[: p.n_problems]
    shots = read_jsonl(paths.llm_rl_data().data / "train.jsonl")[: common.few_shot]
    base = model_spec(common.model)
    cap = p.max_new_tokens or common.answer_tokens  # the budget both variants trained with
    modes = {"greedy": SamplingConfig(max_new_tokens=cap, temperature=0.0, seed=p.seed),
             "sampled": SamplingConfig(max_new_tokens=cap, temperature=p.temperature, top_p=p.top_p, seed=p.seed)}
    rows = []
    out = paths.llm_rl_eval()
    with open_live(out.live) as live, atomic_path(out.responses, is_dir=True) as resp_dir, \
            atomic_path(out.eval, is_dir=True) as eval_dir:
        for name in p.models:
            folder = None if name == "base" else paths.llm_rl_train(name).model
            if folder is not None and not folder.is_dir():
                raise SystemExit(f"llm_rl.eval.models: {name!r} has no trained policy at {folder}")
            llm = load_policy(base, folder, device=common.device, dtype=common.dtype)
            entry = {}
            for mode, sampling in modes.items():
                t0 = time.perf_counter()
                records = solve(llm, test, shots, sampling, batch_size=p.batch_size)
                seconds = time.perf_counter() - t0
                n = len(records)
                h = headline([[float(r["correct"]) for r in records]])
                entry[mode] = {**h, "parse_failure": round(sum(r["parsed_answer"] is None for r in records) / n, 4),
                               "truncated": round(sum(r["finish_reason"] == "length" for r in records) / n, 4),
                               "tokens": round(sum(r["n_tokens"] for r in records) / n, 1)}
                with (resp_dir / f"{name}_{mode}.jsonl").open("w", encoding="utf-8") as f:
                    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
                rows.append({"model": f"{name} ({mode})", "accuracy": h["success"], "ci_low": h["success_lo"],
                             "ci_high": h["success_hi"]})
                log.info("%s %s: %.3f [%.3f, %.3f] on %d problems, %.1f%% truncated, in %.0f s", name, mode,
                         h["success"], h["success_lo"], h["success_hi"], n, 100 * entry[mode]["truncated"], seconds)
                if entry[mode]["truncated"] > p.max_truncated:
                    log.warning("llm_rl.eval.max_new_tokens: the cap of %d tokens cuts %.0f%% of %s's %s answers "
                                "(> max_truncated %.0f%%); raise it for a fair comparison", cap,
                                100 * entry[mode]["truncated"], name, mode, 100 * p.max_truncated)
            write_json(eval_dir / f"{name}.json", metrics_entry(entry, max_new_tokens=cap, dtype=llm.dtype_name))
            del llm
        live.log_plot("accuracy_by_model", rows, x="accuracy", y="model", template="bar_horizontal",
                      title="Math test accuracy (95% intervals in metrics/llm_rl/eval/)")

if __name__ == "__main__":
    main()
