"""Stage teach_train@<env>-<teacher>-<seed>: a PPO student on a DoorKey-family task, with an LLM teacher, the
oracle teacher, or none (pure PPO), for the same frame budget.

Usage: python stages/teach_train.py <env> <llm|oracle|none> <seed>
Writes models/teach/<run>/student.pt (state_dict + config), metrics/teach/train/<run>.json (learning curve of
greedy success on held-out levels, its area (AULC), the teacher's text and LLM reply statistics) and dvclive
curves under plots/teach/train/<run>/.
"""

from common import log, stage_params  # isort: skip
from teach_common import PLOTS, env_id, make_teacher, save_run  # isort: skip

import sys
import time

import numpy as np
from dvclive import Live

from llmrl.agents.student import GridStudent, StudentPolicy
from llmrl.algos.ppo import DistillSchedule, PPOConfig, make_vector_env, train
from llmrl.config.teach import TeachParams
from llmrl.envs import make_env
from llmrl.eval.batched import evaluate_batched
from llmrl.seeding import seed_everything


def aulc(curve: list[dict], total_frames: int) -> float:
    """Area under the success-vs-frames curve divided by the frame budget (mean success over training)."""
    x = np.array([c["frames"] for c in curve], dtype=float)
    y = np.array([c["success_rate"] for c in curve], dtype=float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / total_frames)


def main(key: str, teacher_kind: str, seed: int) -> None:
    p = stage_params("teach", TeachParams)
    t = p.train
    if key not in t.envs or teacher_kind not in t.teachers or seed not in t.seeds:
        raise SystemExit(f"teach_train: {key}-{teacher_kind}-{seed} is not in teach.train envs/teachers/seeds")
    run = f"{key}-{teacher_kind}-{seed}"
    seed_everything(seed)
    cfg = PPOConfig(**t.ppo.model_dump())
    distill = DistillSchedule(**t.distill.model_dump())
    eid = env_id(key)
    envs = make_vector_env(lambda: make_env(eid), cfg.num_envs)
    width, height, _ = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    agent = GridStudent(width, height, n_actions, tuple(t.student.channels), t.student.hidden, t.student.embed_dim)
    teacher = make_teacher(key, teacher_kind, p.teacher, n_actions) if teacher_kind != "none" else None

    curve_seeds = range(t.curve_seed, t.curve_seed + t.curve_episodes)
    every = max(1, cfg.iterations // t.curve_points)
    curve: list[dict] = []

    def measure(frames: int) -> None:
        agent.eval()
        s = evaluate_batched(StudentPolicy(agent), lambda: make_env(eid), curve_seeds, mode="greedy",
                             n_envs=len(curve_seeds), progress=False).summary()
        agent.train()
        curve.append({"frames": frames, "success_rate": s["success_rate"], "mean_return": s["mean_return"]})
        live.log_metric("curve/success", s["success_rate"], plot=False)
        log.info("%s: %d frames, greedy success %.2f", run, frames, s["success_rate"])

    def on_iteration(stats: dict) -> None:
        live.step = stats["frames"]
        for k, v in stats.items():
            if k not in ("iteration", "frames"):
                live.log_metric(k, v)
        if (stats["iteration"] + 1) % every == 0 or stats["iteration"] + 1 == cfg.iterations:
            measure(stats["frames"])
            live.log_metric("curve/success", curve[-1]["success_rate"])
        live.next_step()

    start = time.perf_counter()
    with Live(dir=str(PLOTS / "train" / run), save_dvc_exp=False, dvcyaml=None, report=None) as live:
        live.step = 0
        measure(0)
        history = train(envs, agent, cfg, seed=seed, teacher=teacher.distributions if teacher else None,
                        distill=distill, on_iteration=on_iteration)
    seconds = time.perf_counter() - start
    envs.close()

    metrics = {"run": run, "env_id": eid, "teacher": teacher_kind, "seed": seed,
               "frames": history[-1]["frames"], "iterations": len(history), "seconds": round(seconds, 1),
               "fps": round(history[-1]["frames"] / seconds, 1), "final_distill_coef": history[-1]["distill_coef"],
               "curve_success_final": curve[-1]["success_rate"], "aulc": aulc(curve, history[-1]["frames"]),
               "curve": curve}
    if teacher is not None:
        metrics["teacher_texts"] = dict(teacher.text_counts.most_common())
        if hasattr(teacher.planner, "stats"):
            metrics["llm"] = teacher.planner.stats()
    save_run(run, agent, metrics, ppo=t.ppo.model_dump(), distill=t.distill.model_dump())
    log.info("%s: %d frames in %.0f s, final greedy success %.2f, AULC %.3f", run, metrics["frames"], seconds,
             metrics["curve_success_final"], metrics["aulc"])


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: teach_train.py <env> <llm|oracle|none> <seed>")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
