"""Stage props_eval: ProPS, ProPS+, the GRPO-tuned optimizer and every baseline side by side, per task, at equal
episode budgets, with seed-level intervals of the held-out return of each run's final policy.

Writes metrics/props/eval/<task>/<method>.json (headline: held-out return with interval, parse-failure rate of the
LLM methods), metrics/props/eval/transfer/<task>/<base|tuned>.json (base vs tuned optimizer per task), the full report
plots/props/report.json (best search return, episodes, LLM calls, tokens, re-asks, parse-failure, duplicate and
fallback rates, seconds per iteration, per-seed values; a plain out), curves of best return vs episodes per
method (dvclive, plots/props/curves/<task>/<method>/) and an MP4 of the best LLM-found policy's held-out
evaluation episode per task (plots/props/videos/<task>.mp4; rgb_array frames → imageio-ffmpeg).
"""

from common import log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

from props_common import log_curves  # isort: skip

import json

import imageio
import numpy as np

from llmrl.agents.linear_policy import render_episode
from llmrl.algos.props_search import held_out_seeds
from llmrl.config.props import PropsEvalParams, PropsSearchParams
from llmrl.eval.props import headline
from llmrl.fingerprint import environment_fingerprint, fingerprint_line
from llmrl.files import atomic_path, write_json

OUT = paths.props_eval()


def compact(h: dict) -> dict:
    """The few numbers per method that go into `dvc metrics show`, in the project's headline vocabulary
    (held-out greedy return of the final policies; one file per method, so one row each)."""
    f = h["final"]
    out = {"greedy": {"return": f["value"], "return_lo": f["ci_low"], "return_hi": f["ci_high"],
                      "seeds": f["n_seeds"], "episodes": f["episodes"]},
           "train_episodes": h["episodes"]}
    if "llm" in h:
        out["parse_failure"] = h["llm"]["parse_failure_rate"]
    return {**out, "env": fingerprint_line()}


def main() -> None:
    search = stage_params("props.search", PropsSearchParams)
    ev = stage_params("props.eval", PropsEvalParams)
    kw = dict(statistic=ev.statistic, confidence=ev.confidence, reps=ev.reps)
    report: dict = {"env": fingerprint_line(), "statistic": ev.statistic, "confidence": ev.confidence,
                    "held_out_episodes": search.eval_episodes, "tasks": {}}
    transfer = json.loads((paths.props_transfer().runs / "runs.json").read_text())
    with atomic_path(OUT.metrics, is_dir=True) as mdir, atomic_path(OUT.videos, is_dir=True) as vdir:
        for key in search.tasks:
            runs = json.loads((paths.props_search(key).runs / "runs.json").read_text())["runs"]
            runs += json.loads((paths.props_baselines().runs / f"{key}.json").read_text())["runs"]
            runs += [r for r in transfer["runs"] if r["task"] == key and r["optimizer"] == "tuned"]
            methods = list(dict.fromkeys(r["method"] for r in runs))
            table = {m: headline([r for r in runs if r["method"] == m], **kw) for m in methods}
            report["tasks"][key] = table
            for m, h in table.items():
                write_json(mdir / key / f"{m}.json", compact(h))
            log_curves(OUT.curves / key, runs)
            for m, h in table.items():
                log.info("%s %-14s held-out %.2f [%.2f, %.2f], best in search %.2f, %d episodes%s", key, m,
                         h["final"]["value"], h["final"]["ci_low"], h["final"]["ci_high"], h["best_search_return"],
                         h["episodes"], f", parse failures {h['llm']['parse_failure_rate']}" if "llm" in h else "")
            if search.video:
                llm_runs = [r for r in runs if r["method"] in ("props", "props_plus")]
                best = max(llm_runs, key=lambda r: float(np.mean(r["final_eval"])))
                frames, ret = render_episode(key, np.asarray(best["final_params"]), int(held_out_seeds(search)[0]),
                                             max_episode_steps=search.max_episode_steps.get(key))
                imageio.mimwrite(vdir / f"{key}.mp4", frames, fps=30, codec="libx264", macro_block_size=8)
                log.info("%s: video of %s seed %d (return %.1f, %d frames)", key, best["method"], best["seed"], ret,
                         len(frames))
        tr_table = {}
        for key in dict.fromkeys(r["task"] for r in transfer["runs"]):
            for opt in ("base", "tuned"):
                mine = [r for r in transfer["runs"] if r["task"] == key and r["optimizer"] == opt]
                if mine:
                    tr_table.setdefault(key, {})[opt] = headline(mine, **kw)
        report["transfer"] = {"adapter": transfer["adapter"], "iterations": transfer["iterations"], "tasks": tr_table}
        for k, v in tr_table.items():
            for o, h in v.items():
                write_json(mdir / "transfer" / k / f"{o}.json", compact(h))
    write_json(OUT.report, report)
    write_json(OUT.environment, environment_fingerprint())


if __name__ == "__main__":
    main()
