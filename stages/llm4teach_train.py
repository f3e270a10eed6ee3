"""Stage llm4teach_train@<env>-<teacher>: PPO students on a DoorKey-family task, with an LLM teacher, the oracle
teacher, the scoring teacher's controls, or none (pure PPO, at its own learning rate), for the same frame budget,
one per seed of ``llm4teach.train.seeds``.

Usage: python -m stages.llm4teach_train <env> <teacher: llm|llm_score|uniform|random_score|oracle|none>
The seeds train ``llm4teach.workers`` at a time, each alone in a single-threaded process. Writes, per seed k,
models/llm4teach/<env>-<teacher>/seed-k/student.pt (state_dict + config), metrics/llm4teach/train/<env>-<teacher>/seed-k.json
(the learning curve of greedy success on the curve levels, its area (AULC), the teacher's text and LLM reply
statistics) and dvclive curves under plots/llm4teach/train/<env>-<teacher>/seed-k/.
"""

import functools
import time
from pathlib import Path

import torch

from llmrl.algos.llm4teach_runs import gradient_steps, train_grid_student
from llmrl.config.llm4teach import LLM4TeachParams
from llmrl.envs.make import make_env
from llmrl.eval.curves import aulc, grid_curve_measure
from stages.common import log, open_live, stage_arguments, stage_params
from stages.llm4teach_common import (THREADS, env_id, item_outputs, log_iteration, make_teacher, save_run,
                                     teacher_record, train_group)


def run_seed(key: str, teacher_kind: str, seed: int, *, models: Path, records: Path, plots: Path) -> None:
    torch.set_num_threads(THREADS)  # also in a worker process of its own (llmrl.parallel)
    p = stage_params("llm4teach", LLM4TeachParams)
    t = p.train.for_teacher(teacher_kind)
    run = f"{key}-{teacher_kind}-{seed}"
    eid = env_id(key)
    n_actions = int(make_env(eid).action_space.n)
    teacher = make_teacher(key, teacher_kind, p.teacher, n_actions) if teacher_kind != "none" else None
    curve_measure = grid_curve_measure(eid, range(t.curve_seed, t.curve_seed + t.curve_episodes))

    start, cpu_start = time.perf_counter(), time.process_time()
    with open_live(plots / f"seed-{seed}") as live:
        def measure(agent, frames: int) -> dict:
            point = curve_measure(agent, frames)
            live.log_metric("curve/success", point["success_rate"], plot=False)
            log.info("%s: %d frames, greedy success %.2f", run, frames, point["success_rate"])
            return point

        live.step = 0
        result = train_grid_student(eid, teacher, t, seed, measure=measure, on_iteration=log_iteration(live))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    history, curve = result.history, result.curve

    metrics = {"run": run, "env_id": eid, "teacher": teacher_kind, "seed": seed,
               "frames": history[-1]["frames"], "iterations": len(history),
               "updates": gradient_steps(t.ppo, history[-1]["frames"], len(history)), "lr": t.ppo.lr,
               "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1),
               "fps": round(history[-1]["frames"] / seconds, 1), "final_distill_coef": history[-1]["distill_coef"],
               "curve_success_final": curve[-1]["success_rate"], "aulc": aulc(curve, history[-1]["frames"]),
               "curve": curve}
    metrics.update(teacher_record(teacher))
    save_run(seed, result.agent, metrics, models=models, records=records, ppo=t.ppo.model_dump(),
             distill=t.distill.model_dump())
    log.info("%s: %d frames in %.0f s, final λ %.3f, final greedy success %.2f, AULC %.3f", run, metrics["frames"],
             seconds, metrics["final_distill_coef"], metrics["curve_success_final"], metrics["aulc"])


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("llm4teach_train", argv, env="a key of llm4teach.train.envs",
                           teacher="one of llm4teach.train.teachers (none: pure PPO)")
    key, teacher_kind = args.env, args.teacher
    torch.set_num_threads(THREADS)
    p = stage_params("llm4teach", LLM4TeachParams)
    if key not in p.train.envs or teacher_kind not in p.train.teachers:
        raise SystemExit(f"llm4teach_train: {key}-{teacher_kind} is not in llm4teach.train envs/teachers")
    train_group(item_outputs(key, teacher_kind), p.train.seeds, p.workers,
                functools.partial(run_seed, key, teacher_kind))


if __name__ == "__main__":
    main()
