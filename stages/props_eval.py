"""Stage props_eval: ProPS, ProPS+ and every baseline side by side, per task, with seed-level intervals of the
held-out return of each run's final policy; the quadratic check (ProPS against random search without an
environment); the GRPO-tuned optimizer (props_transfer, at the search's budget, on props.transfer.seeds) in the table of each
transfer task beside the same base model run the same way (``<method>_untuned``), and their seed-paired
difference; the repeat control (props_repeat_control: the base model with its repeated points replaced by random
ones, ``<method>_untuned_repeats_random``) in the same table, paired with both. Every table compares
its methods at one episode budget: a table whose methods spent different budgets is an error
(``check_equal_budgets``).

Writes metrics/props/eval/<task>/<method>.json (headline, ``llmrl.eval.props.metrics_of``: held-out return with
interval, training episodes, and for the LLM methods the share of proposals the LLM made, ``llm_proposed``, the rest
being random fallbacks, and the parse-failure rate), metrics/props/eval/quadratic/<method>.json (the same), the full report plots/props/report.json (best search return,
episodes, LLM calls, tokens, re-asks, parse failures by reason, example copies, duplicate and fallback rates, seconds
per iteration, per-seed values, the quadratic check's seed-paired verdict against random search, the tuned optimizer's seed-paired
difference to the base model per transfer task and the repeat control's to both (``repeat_control``), the
environment line; a plain out), curves of best
return vs episodes per method (dvclive, plots/props/curves/<task>/<method>/; LLM methods' points carry
``fallbacks``, the seeds whose point there was a random fallback) and an MP4 of the best LLM-found policy's
held-out evaluation episode per task (plots/props/videos/<task>.mp4; rgb_array frames → imageio-ffmpeg), listed
with the run each shows in plots/props/videos/index.json (written with ``props.search.video`` off too).
"""

import imageio
import numpy as np

from llmrl.agents.linear_policy import render_episode
from llmrl.algos.props_search import held_out_seeds, search_task
from llmrl.config.props import PropsEvalParams, PropsSearchParams, PropsTransferParams
from llmrl.eval.props import check_equal_budgets, headline, metrics_of, paired_difference
from llmrl.fingerprint import environment_fingerprint, fingerprint_line
from llmrl.files import atomic_path, read_json, write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.props_common import log_curves

OUT = paths.props_eval()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_eval", argv)
    search = stage_params("props.search", PropsSearchParams)
    ev = stage_params("props.eval", PropsEvalParams)
    tr = stage_params("props.transfer", PropsTransferParams)
    kw = dict(statistic=ev.statistic, confidence=ev.confidence, reps=ev.reps)
    report: dict = {"env": fingerprint_line(), "statistic": ev.statistic, "confidence": ev.confidence,
                    "held_out_episodes": search.eval_episodes, "tasks": {}}
    videos: dict = {}
    report["transfer"] = {}
    report["repeat_control"] = {}
    with atomic_path(OUT.metrics, is_dir=True) as mdir, atomic_path(OUT.videos, is_dir=True) as vdir:
        for key in search.tasks:
            runs = read_json(paths.props_search(key).runs / "runs.json")["runs"]
            runs += read_json(paths.props_baselines().runs / f"{key}.json")["runs"]
            if key in tr.tasks:
                tuned = [r for seed in tr.seeds
                         for r in read_json(paths.props_transfer(key, seed).runs / "runs.json")["runs"]]
                runs += tuned
                pair = ([r for r in tuned if r["method"] == f"{tr.method}_tuned"],
                        [r for r in tuned if r["method"] == f"{tr.method}_untuned"])
                report["transfer"][key] = paired_difference(*pair, confidence=ev.confidence, reps=ev.reps,
                                                            group_by="adapter")
                control = [r for seed in tr.seeds
                           for r in read_json(paths.props_repeat_control(key, seed).runs / "runs.json")["runs"]]
                runs += control
                report["repeat_control"][key] = {
                    "control_minus_untuned": paired_difference(control, pair[1], confidence=ev.confidence,
                                                               reps=ev.reps),
                    "tuned_minus_control": paired_difference(pair[0], control, confidence=ev.confidence,
                                                             reps=ev.reps, group_by="adapter"),
                    "repeats_replaced": [sum(x["proposal"] == "replaced" for x in r["rows"]) for r in control]}
            methods = list(dict.fromkeys(r["method"] for r in runs))
            table = {m: headline([r for r in runs if r["method"] == m], **kw) for m in methods}
            check_equal_budgets(table, name=f"props_eval {key}")
            report["tasks"][key] = table
            for m, h in table.items():
                write_json(mdir / key / f"{m}.json", metrics_of(h))
            log_curves(OUT.curves / key, runs)
            for m, h in table.items():
                log.info("%s %-14s held-out %.2f [%.2f, %.2f], best in search %.2f, %d episodes%s", key, m,
                         h["final"]["value"], h["final"]["ci_low"], h["final"]["ci_high"], h["best_search_return"],
                         h["episodes"], f", LLM-proposed {h['llm']['llm_proposed']}, parse failures "
                                        f"{h['llm']['parse_failure_rate']}" if "llm" in h else "")
            if search.video:
                llm_runs = [r for r in runs if r["method"] in ("props", "props_plus")]
                best = max(llm_runs, key=lambda r: float(np.mean(r["final_eval"])))
                frames, ret = render_episode(search_task(search, key), np.asarray(best["final_params"]),
                                             int(held_out_seeds(search)[0]))
                imageio.mimwrite(vdir / f"{key}.mp4", frames, fps=30, codec="libx264", macro_block_size=8)
                videos[key] = {"file": f"{key}.mp4", "method": best["method"], "seed": best["seed"],
                               "return": round(float(ret), 4), "frames": len(frames)}
                log.info("%s: video of %s seed %d (return %.1f, %d frames)", key, best["method"], best["seed"], ret,
                         len(frames))
        # git keeps no empty folder, and this out is git-tracked: without a file here a fresh clone lacks it
        write_json(vdir / "index.json", {"video": search.video, "videos": videos})
        quad = read_json(paths.props_quadratic().runs / "runs.json")
        q_methods = list(dict.fromkeys(r["method"] for r in quad["runs"]))
        q_table = {m: headline([r for r in quad["runs"] if r["method"] == m], **kw) for m in q_methods}
        check_equal_budgets(q_table, name="props_eval quadratic")
        verdict = paired_difference([r for r in quad["runs"] if r["method"] == "props"],
                                    [r for r in quad["runs"] if r["method"] == "random_search"],
                                    confidence=ev.confidence, reps=ev.reps)
        report["quadratic"] = {"n_params": quad["n_params"], "model": quad["model"], "table": q_table,
                               "props_minus_random_search": verdict}
        for m, h in q_table.items():
            write_json(mdir / "quadratic" / f"{m}.json", metrics_of(h))
        log_curves(OUT.curves / "quadratic", quad["runs"])
        log.info("quadratic (%d parameters): ProPS - random search %.2f [%.2f, %.2f] over %d seeds (%d won): %s",
                 quad["n_params"], verdict["difference"], verdict["ci_low"], verdict["ci_high"], verdict["seeds"],
                 verdict["seeds_won"], verdict["verdict"])
    write_json(OUT.report, report)
    write_json(OUT.environment, environment_fingerprint())


if __name__ == "__main__":
    main()
