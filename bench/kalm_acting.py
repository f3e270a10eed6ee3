"""Benchmark: KALM's grounded LLM acting in real Meta-World episodes, one batch for all episodes vs one at a time.

``kalm_eval``'s grounded-LLM row steps a level's episodes in lockstep (``llmrl.eval.kalm.grounded_act``: one
left-padded KV cache, rows dropped as episodes end); the reference plays the same episodes one after another
through the harness policy (``GroundedPolicy``: one KV cache per episode). Same goals, initial states and greedy
actions, so the outcomes (success, length per episode) must be equal. Rates are environment steps per CPU second
of the process, wall-clock beside them; the ratio is the median over alternating repeats. Target: ratio >= 2.

Usage: python bench/kalm_acting.py [--model models/kalm/grounded/metaworld/0] [--per-goal 1] [--max-steps 60]
Without a trained model folder it builds an untrained grounded model on models/base_llm (speed and equality do
not depend on the weights). Writes bench/results/kalm_acting.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrl.agents.grounded_policy import GroundedPolicy  # noqa: E402
from llmrl.envs import kalm_levels as kl  # noqa: E402
from llmrl.eval.harness import run_episode  # noqa: E402
from llmrl.eval.kalm import grounded_act, run_level  # noqa: E402
from llmrl.fingerprint import environment_fingerprint  # noqa: E402
from llmrl.files import write_json  # noqa: E402
from llmrl.llm.grounded import GroundedLM  # noqa: E402

from kalm_rollouts import metaworld_model  # noqa: E402  (this folder is on sys.path when a bench runs)

TARGET = 2.0
FIRST_SEED = 20_000  # kalm_eval's evaluation seeds (the test initial-state split)


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def one_at_a_time(model: GroundedLM, goals, pool: kl.GoalEnvPool, per_goal: int) -> list[tuple[bool, int]]:
    out = []
    for j, (g, seed) in enumerate(kl.goal_schedule(len(goals), per_goal, FIRST_SEED)):
        rec, _ = run_episode(pool.env(goals[g], j // len(goals), seed), GroundedPolicy(model, goals[g]), seed,
                             greedy=True)
        out.append((bool(rec.success), int(rec.length)))
    return out


def batched(model: GroundedLM, goals, pool: kl.GoalEnvPool, per_goal: int) -> list[tuple[bool, int]]:
    return [(o.success, o.length) for o in run_level(grounded_act(model, goals), goals, pool, per_goal, FIRST_SEED)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "kalm" / "grounded" / "metaworld" / "0"))
    ap.add_argument("--base", default=str(ROOT / "models" / "base_llm"))
    ap.add_argument("--level", default="easy")
    ap.add_argument("--per-goal", type=int, default=1, help="episodes per goal (kalm.eval.grounded_episodes / goals)")
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="as kalm_eval (kalm.eval.threads)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "kalm_acting.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, source = metaworld_model(a.model, a.base)
    goals = kl.goals("metaworld", a.level)
    pool = kl.GoalEnvPool(kl.EnvSettings(max_steps=a.max_steps))
    for j, (g, seed) in enumerate(kl.goal_schedule(len(goals), a.per_goal, FIRST_SEED)):
        pool.env(goals[g], j // len(goals), seed)  # build the environments before timing
    runs = []
    for r in range(a.repeats):
        ref, cpu_r, wall_r = timed(lambda: one_at_a_time(model, goals, pool, a.per_goal))
        ours, cpu_b, wall_b = timed(lambda: batched(model, goals, pool, a.per_goal))
        steps = sum(n for _, n in ref)
        runs.append({"env_steps": steps, "one_at_a_time_cpu_s": round(cpu_r, 3), "batched_cpu_s": round(cpu_b, 3),
                     "one_at_a_time_wall_s": round(wall_r, 3), "batched_wall_s": round(wall_b, 3),
                     "ratio_cpu": round(cpu_r / cpu_b, 2), "ratio_wall": round(wall_r / wall_b, 2),
                     "same_outcomes": ours == ref})
        print(f"repeat {r}: {runs[-1]}", flush=True)
    pool.close()
    steps = runs[0]["env_steps"]
    ratio = statistics.median(x["ratio_cpu"] for x in runs)
    same = all(x["same_outcomes"] for x in runs)
    result = {
        "model": source, "level": a.level, "episodes": len(goals) * a.per_goal, "max_steps": a.max_steps,
        "threads": a.threads,
        "env_steps": steps,
        "batched_steps_per_cpu_s": round(steps / statistics.median(x["batched_cpu_s"] for x in runs), 1),
        "one_at_a_time_steps_per_cpu_s": round(steps / statistics.median(x["one_at_a_time_cpu_s"] for x in runs), 1),
        "batched_steps_per_wall_s": round(steps / statistics.median(x["batched_wall_s"] for x in runs), 1),
        "one_at_a_time_steps_per_wall_s": round(steps / statistics.median(x["one_at_a_time_wall_s"] for x in runs),
                                                1),
        "ratio_cpu": ratio, "ratio_wall": statistics.median(x["ratio_wall"] for x in runs),
        "same_outcomes": same, "target_ratio": TARGET, "meets_target": bool(ratio >= TARGET and same),
        "runs": runs, "env": environment_fingerprint(),
    }
    write_json(a.out, result)
    print({k: v for k, v in result.items() if k not in ("runs", "env")})


if __name__ == "__main__":
    main()
