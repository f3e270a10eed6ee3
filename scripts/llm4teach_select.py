"""Select LLM4Teach's CPU settings on validation levels only; writes metrics/llm4teach/selection.json.

Each part trains every candidate setting (overrides on top of params.yaml's ``llm4teach`` section) on tuning seeds
that are not the final training seeds, scores it on the validation levels/episodes (``llm4teach.validation``,
disjoint from the test levels ``llm4teach.eval.seed``.. and from the learning-curve levels), and picks by the
rule of ``llmrl.eval.llm4teach.select_setting``. The test levels are never touched here. The picked
settings are copied into params.yaml by hand, with a comment pointing at the record this script writes
(a plain file, not a DVC metric).

Parts:
  mpe      MAPPO (no teacher) on simple_spread: score = greedy validation return; pick = the highest mean.
  doorkey  budget and λ schedule of the DoorKey students (oracle teacher): score = greedy validation
           success; pick = the cheapest candidate whose every tuning seed reaches llm4teach.eval.success_target,
           else the best mean.
  ppo      pure PPO's learning rate on the first DoorKey task (no teacher), at the students' frame budget
           (llm4teach.train.ppo.total_frames): score = greedy validation success, ties by sampled success; pick =
           the best mean, copied to llm4teach.train.pure_ppo_lr.

Usage: python scripts/llm4teach_select.py mpe|doorkey|ppo [--seeds 100 101] [--episodes N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrl.kernels import pin_cpu_kernels  # noqa: E402

pin_cpu_kernels()  # the stages' float path (stages/common.py), before torch's first kernel

import numpy as np  # noqa: E402
import torch  # noqa: E402

from llmrl.agents.student import StudentPolicy  # noqa: E402
from llmrl.agents.teacher import ENV_KIND, OraclePlanner, TeacherPolicy  # noqa: E402
from llmrl.algos.mappo import greedy_joint_policy  # noqa: E402
from llmrl.algos.llm4teach_runs import train_grid_student, train_spread_student  # noqa: E402
from llmrl.config import load_section, read_params  # noqa: E402
from llmrl.config.llm4teach import LLM4TeachParams  # noqa: E402
from llmrl.envs.make import make_env
from llmrl.envs.doorkey import ENV_IDS  # noqa: E402
from llmrl.eval.batched import evaluate_batched  # noqa: E402
from llmrl.eval.llm4teach import evaluate_spread, select_setting  # noqa: E402
from llmrl.fingerprint import fingerprint_line  # noqa: E402
from llmrl.files import write_json  # noqa: E402

OUT = ROOT / "metrics" / "llm4teach" / "selection.json"

# Candidate overrides per part (a few, kept small for a shared 2-core machine). DoorKey: the λ schedule keeps
# the original's form (λ0 − δ·k, floor, switched off from an iteration) with constants that reach the floor
# within the budget; "cost" = frames, the tie-breaker towards cheap runs.
CANDIDATES: dict[str, list[dict]] = {
    "mpe": [
        {"name": "lr1e-3_vclip", "ppo": {"lr": 1e-3, "clip_value": True, "reward_scale": 1.0}},
        {"name": "lr1e-3_vclip_rs0.1", "ppo": {"lr": 1e-3, "clip_value": True, "reward_scale": 0.1}},
        {"name": "lr1e-3_novclip_rs0.1", "ppo": {"lr": 1e-3, "clip_value": False, "reward_scale": 0.1}},
        {"name": "lr3e-4_novclip_rs0.1", "ppo": {"lr": 3e-4, "clip_value": False, "reward_scale": 0.1}},
        {"name": "lr3e-3_novclip_rs0.1", "ppo": {"lr": 3e-3, "clip_value": False, "reward_scale": 0.1}},
    ],
    "doorkey": [
        {"name": "lr2e-3", "ppo": {"total_frames": 40960, "lr": 2e-3}, "distill": {"decrement": 0.33, "until_iteration": 45}},
        {"name": "lr1e-3", "ppo": {"total_frames": 40960, "lr": 1e-3}, "distill": {"decrement": 0.33, "until_iteration": 45}},
    ],
}
# Pure PPO's learning rates, around the students' 1e-3 (one of them: on a tie it is kept). Only the learning rate is searched: the frame budget is the
# comparison's (every learner gets the students' frames), not a knob to tune.
PPO_LRS = (5e-4, 1e-3, 2e-3, 4e-3)
PARTS = ("doorkey", "mpe", "ppo")
# DoorKey budgets scored along each run (iterations of 512 frames): λ = 10 − 0.33·k reaches its floor 0.1 at
# iteration 30 (15,360 frames) and the teacher term is off from iteration 45 (23,040 frames), so at every
# candidate budget the student has trained its last 15+ iterations as plain PPO.
DOORKEY_BUDGETS = (30720, 40960)


def with_overrides(section: dict, cand: dict) -> dict:
    out = {**section, "ppo": {**section["ppo"], **cand.get("ppo", {})}}
    if "distill" in cand:
        out["distill"] = {**section.get("distill", {}), **cand["distill"]}
    return out


def run_mpe(raw: dict, p: LLM4TeachParams, seeds: list[int], episodes: int) -> dict:
    v = p.validation
    kw = dict(n_agents=p.mpe.n_agents, max_cycles=p.mpe.max_cycles, local_ratio=p.mpe.local_ratio)
    rng = np.random.default_rng(v.seed)
    random_returns = evaluate_spread(lambda obs: rng.integers(0, 5, len(obs)), episodes, v.seed, **kw)
    rows = []
    for cand in CANDIDATES["mpe"]:
        m = load_section({"mpe": with_overrides(raw["mpe"], cand)}, "mpe", type(p.mpe))
        per_seed, secs = [], []
        for seed in seeds:
            start = time.perf_counter()
            run = train_spread_student(None, m, seed, progress=False)
            secs.append(time.perf_counter() - start)
            per_seed.append(float(np.mean(evaluate_spread(greedy_joint_policy(run.agent), episodes, v.seed, **kw))))
            print(f"mpe {cand['name']} seed {seed}: validation return {per_seed[-1]:.2f} ({secs[-1]:.0f} s)",
                  flush=True)
        rows.append({**cand, "cost": m.ppo.total_frames, "per_seed": per_seed, "mean": float(np.mean(per_seed)),
                     "seconds_per_run": float(np.mean(secs))})
    pick = select_setting(rows, higher_is_better=True)
    return {"score": "greedy mean episode return on validation episodes", "random_validation_return":
            float(np.mean(random_returns)), "candidates": rows, "pick": pick}


def run_doorkey(raw: dict, p: LLM4TeachParams, seeds: list[int], episodes: int, only: list[str] | None) -> dict:
    """One run per (candidate, tuning seed) at the largest budget, scored on the validation levels at every
    budget of ``DOORKEY_BUDGETS`` along the way; each (candidate, budget) is a row."""
    v = p.validation
    key = p.train.envs[0]
    eid = ENV_IDS[key]
    val_seeds = range(v.seed, v.seed + episodes)
    rows = []
    for cand in CANDIDATES["doorkey"]:
        if only and cand["name"] not in only:
            continue
        t = load_section({"train": with_overrides(raw["train"], cand)}, "train", type(p.train))
        iters = t.ppo.total_frames // (t.ppo.num_envs * t.ppo.num_steps)
        # curve points every 10 iterations, so every candidate budget is a curve point
        t = t.model_copy(update={"curve_points": iters // 10})

        def validation(agent, frames: int) -> dict:
            if frames not in DOORKEY_BUDGETS:
                return {"success_rate": None}
            r = evaluate_batched(StudentPolicy(agent), lambda: make_env(eid), val_seeds, mode="greedy",
                                 n_envs=len(val_seeds), progress=False)
            return {"success_rate": r.summary()["success_rate"]}

        per_budget: dict[int, list[float]] = {b: [] for b in DOORKEY_BUDGETS}
        secs = []
        for seed in seeds:
            teacher = TeacherPolicy(ENV_KIND[eid], OraclePlanner(ENV_KIND[eid]), 7)
            start = time.perf_counter()
            run = train_grid_student(eid, teacher, t, seed, measure=validation, progress=False)
            secs.append(time.perf_counter() - start)
            coef = {h["frames"]: h["distill_coef"] for h in run.history}
            for c in run.curve:
                if c["frames"] in per_budget:
                    per_budget[c["frames"]].append(c["success_rate"])
            print(f"doorkey {cand['name']} seed {seed}: validation success "
                  f"{ {b: v[-1] for b, v in per_budget.items()} } ({secs[-1]:.0f} s)", flush=True)
        for b, scores in per_budget.items():
            rows.append({"name": f"{b}f_{cand['name']}", "cost": b, "ppo": {**cand["ppo"], "total_frames": b},
                         "distill": cand["distill"], "per_seed": scores, "mean": float(np.mean(scores)),
                         "distill_coef_at_budget": coef[b], "seconds_per_run_at_largest_budget": float(np.mean(secs))})
    existing = json.loads(OUT.read_text()).get("doorkey", {}).get("candidates", []) if OUT.is_file() else []
    names = {r["name"] for r in rows}
    rows = [r for r in existing if r["name"] not in names] + rows
    pick = select_setting(rows, higher_is_better=True, target=p.eval.success_target)
    return {"env": key, "teacher": "oracle", "score": "greedy success rate on validation levels",
            "target": p.eval.success_target, "schedule": "λ_k = max(0.1, 10 − 0.33·k), off from k = 45",
            "candidates": rows, "pick": pick}


def run_ppo(p: LLM4TeachParams, seeds: list[int], episodes: int) -> dict:
    """One pure-PPO run per (learning rate, tuning seed) at the students' frame budget, scored at its end."""
    v = p.validation
    key = p.train.envs[0]
    eid = ENV_IDS[key]
    val_seeds = range(v.seed, v.seed + episodes)
    rows = []
    for lr in PPO_LRS:
        t = p.train.model_copy(update={"pure_ppo_lr": lr}).for_teacher("none")
        scores: dict[str, list[float]] = {"greedy": [], "sampled": []}
        secs = []
        for seed in seeds:
            start = time.perf_counter()
            run = train_grid_student(eid, None, t, seed, progress=False)
            secs.append(time.perf_counter() - start)
            run.agent.eval()
            for mode in scores:
                r = evaluate_batched(StudentPolicy(run.agent), lambda: make_env(eid), val_seeds, mode=mode,
                                     n_envs=len(val_seeds), progress=False)
                scores[mode].append(r.summary()["success_rate"])
            print(f"ppo lr {lr:g} seed {seed}: validation success greedy {scores['greedy'][-1]:.2f}, sampled "
                  f"{scores['sampled'][-1]:.2f} ({secs[-1]:.0f} s)", flush=True)
        rows.append({"name": f"lr{lr:g}", "cost": t.ppo.total_frames, "ppo": {"lr": lr},
                     "per_seed": scores["greedy"], "mean": float(np.mean(scores["greedy"])),
                     "tiebreak_per_seed": scores["sampled"], "sampled_mean": float(np.mean(scores["sampled"])),
                     "seconds_per_run": float(np.mean(secs))})
    return {"task": key, "teacher": "none", "frames": p.train.ppo.total_frames,
            "score": "greedy success rate on validation levels; ties: sampled success rate",
            "candidates": rows, "pick": select_setting(rows, higher_is_better=True, keep=f"lr{p.train.ppo.lr:g}")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=PARTS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 101], help="tuning seeds (not the final ones)")
    ap.add_argument("--episodes", type=int, default=None, help="validation episodes (default llm4teach.validation)")
    ap.add_argument("--only", nargs="+", default=None, help="doorkey: run only these candidates (rows merge)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    raw = read_params(ROOT / "params.yaml")["llm4teach"]
    p = load_section({"llm4teach": raw}, "llm4teach", LLM4TeachParams)
    if set(args.seeds) & set(p.train.seeds + p.mpe.seeds):
        raise SystemExit(f"--seeds {args.seeds}: tuning seeds must differ from the final training seeds")
    episodes = args.episodes or p.validation.episodes
    start = time.perf_counter()
    if args.part == "mpe":
        record = run_mpe(raw, p, args.seeds, episodes)
    elif args.part == "ppo":
        record = run_ppo(p, args.seeds, episodes)
    else:
        record = run_doorkey(raw, p, args.seeds, episodes, args.only)
    record.update(tuning_seeds=args.seeds, validation={"seed": p.validation.seed, "episodes": episodes},
                  test_levels_used=False, seconds=round(time.perf_counter() - start, 1), env=fingerprint_line())
    existing = json.loads(OUT.read_text()) if OUT.is_file() else {}
    write_json(OUT, {**existing, args.part: record})
    print(f"{args.part}: pick {record['pick']['name']}", flush=True)


if __name__ == "__main__":
    main()
