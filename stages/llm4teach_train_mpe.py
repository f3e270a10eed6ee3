"""Stage llm4teach_train_mpe@<teacher>: MAPPO on MPE simple_spread (N=3) with a per-agent LLM teacher, the oracle
teacher, or none (pure MAPPO with a centralised critic), for the same frame budget, one per seed of
``llm4teach.mpe.seeds`` (``llm4teach.workers`` at a time, each alone in a single-threaded process).

Usage: python -m stages.llm4teach_train_mpe <teacher: llm|llm_score|uniform|random_score|oracle|none>
Writes, per seed k, models/llm4teach/mpe-<teacher>/seed-k/student.pt, metrics/llm4teach/train/mpe-<teacher>/seed-k.json
and dvclive curves under plots/llm4teach/train/mpe-<teacher>/seed-k/.
"""

import functools
import time
from pathlib import Path

import torch

from llmrl.algos.llm4teach_runs import gradient_steps, train_spread_student
from llmrl.config.llm4teach import LLM4TeachParams
from llmrl.envs.mpe import N_ACTIONS
from stages.common import log, open_live, stage_arguments, stage_params
from stages.llm4teach_common import (MPE_KEY, THREADS, item_outputs, log_iteration, make_teacher, save_run,
                                     teacher_record, train_group)


def run_seed(teacher_kind: str, seed: int, *, models: Path, records: Path, plots: Path) -> None:
    torch.set_num_threads(THREADS)  # also in a worker process of its own (llmrl.parallel)
    p = stage_params("llm4teach", LLM4TeachParams)
    m = p.mpe
    run = f"mpe-{teacher_kind}-{seed}"
    teacher = make_teacher(MPE_KEY, teacher_kind, p.teacher, N_ACTIONS) if teacher_kind != "none" else None
    start, cpu_start = time.perf_counter(), time.process_time()
    with open_live(plots / f"seed-{seed}") as live:
        result = train_spread_student(teacher, m, seed, on_iteration=log_iteration(live))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    history = result.history
    returns = [h["return_mean"] for h in history if "return_mean" in h]
    metrics = {"run": run, "env_id": "simple_spread_v3", "teacher": teacher_kind, "seed": seed,
               "frames": history[-1]["frames"], "iterations": len(history),
               "updates": gradient_steps(m.ppo, history[-1]["frames"], len(history)), "lr": m.ppo.lr,
               "seconds": round(seconds, 1),
               "cpu_seconds": round(cpu_seconds, 1),
               "final_distill_coef": history[-1]["distill_coef"],
               "train_return_first": returns[0] if returns else None,
               "train_return_last": returns[-1] if returns else None,
               "train_return_curve": [(h["frames"], h["return_mean"]) for h in history if "return_mean" in h]}
    metrics.update(teacher_record(teacher))
    save_run(seed, result.agent, metrics, models=models, records=records, ppo=m.ppo.model_dump(),
             n_agents=m.n_agents)
    log.info("%s: %d frames in %.0f s, train return %s → %s", run, metrics["frames"], seconds,
             metrics["train_return_first"], metrics["train_return_last"])


def main(argv: list[str] | None = None) -> None:
    teacher_kind = stage_arguments("llm4teach_train_mpe", argv,
                                   teacher="one of llm4teach.mpe.teachers (none: pure MAPPO)").teacher
    torch.set_num_threads(THREADS)
    p = stage_params("llm4teach", LLM4TeachParams)
    if teacher_kind not in p.mpe.teachers:
        raise SystemExit(f"llm4teach_train_mpe: {teacher_kind} is not in llm4teach.mpe.teachers")
    train_group(item_outputs(MPE_KEY, teacher_kind), p.mpe.seeds, p.workers,
                functools.partial(run_seed, teacher_kind))


if __name__ == "__main__":
    main()
