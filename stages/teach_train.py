"""Stage teach_train@<env>-<teacher>-<seed>: a PPO student on a DoorKey-family task, with an LLM teacher, the
oracle teacher, or none (pure PPO), for the same frame budget.

Usage: python stages/teach_train.py <env> <llm|oracle|none> <seed>
Writes models/teach/<run>/student.pt (state_dict + config), metrics/teach/train/<run>.json (a plain out: the
learning curve of greedy success on the curve levels, its area (AULC), the teacher's text and LLM reply
statistics) and dvclive curves under plots/teach/train/<run>/.
"""

from common import log, stage_params  # isort: skip
from teach_common import PLOTS, env_id, make_teacher, save_run  # isort: skip

import sys
import time

from dvclive import Live

from llmrl.algos.teach_runs import train_grid_student
from llmrl.config.teach import TeachParams
from llmrl.envs import make_env
from llmrl.eval.curves import aulc, grid_curve_measure


def main(key: str, teacher_kind: str, seed: int) -> None:
    p = stage_params("teach", TeachParams)
    t = p.train
    if key not in t.envs or teacher_kind not in t.teachers or seed not in t.seeds:
        raise SystemExit(f"teach_train: {key}-{teacher_kind}-{seed} is not in teach.train envs/teachers/seeds")
    run = f"{key}-{teacher_kind}-{seed}"
    eid = env_id(key)
    n_actions = int(make_env(eid).action_space.n)
    teacher = make_teacher(key, teacher_kind, p.teacher, n_actions) if teacher_kind != "none" else None
    curve_measure = grid_curve_measure(eid, range(t.curve_seed, t.curve_seed + t.curve_episodes))

    start, cpu_start = time.perf_counter(), time.process_time()
    with Live(dir=str(PLOTS / "train" / run), save_dvc_exp=False, dvcyaml=None, report=None) as live:
        def measure(agent, frames: int) -> dict:
            point = curve_measure(agent, frames)
            live.log_metric("curve/success", point["success_rate"], plot=False)
            log.info("%s: %d frames, greedy success %.2f", run, frames, point["success_rate"])
            return point

        def on_iteration(stats: dict) -> None:
            live.step = stats["frames"]
            for k, v in stats.items():
                if k not in ("iteration", "frames"):
                    live.log_metric(k, v)
            live.next_step()

        live.step = 0
        result = train_grid_student(eid, teacher, t, seed, measure=measure, on_iteration=on_iteration)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    history, curve = result.history, result.curve

    metrics = {"run": run, "env_id": eid, "teacher": teacher_kind, "seed": seed,
               "frames": history[-1]["frames"], "iterations": len(history), "seconds": round(seconds, 1),
               "cpu_seconds": round(cpu_seconds, 1),
               "fps": round(history[-1]["frames"] / seconds, 1), "final_distill_coef": history[-1]["distill_coef"],
               "curve_success_final": curve[-1]["success_rate"], "aulc": aulc(curve, history[-1]["frames"]),
               "curve": curve}
    if teacher is not None:
        metrics["teacher_texts"] = dict(teacher.text_counts.most_common())
        if hasattr(teacher.planner, "stats"):
            metrics["llm"] = teacher.planner.stats()
    save_run(run, result.agent, metrics, ppo=t.ppo.model_dump(), distill=t.distill.model_dump())
    log.info("%s: %d frames in %.0f s, final λ %.3f, final greedy success %.2f, AULC %.3f", run, metrics["frames"],
             seconds, metrics["final_distill_coef"], metrics["curve_success_final"], metrics["aulc"])


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: teach_train.py <env> <llm|oracle|none> <seed>")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
