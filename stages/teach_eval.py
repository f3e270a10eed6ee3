"""Stage teach_eval: students trained with the LLM teacher, the oracle teacher and none (pure PPO), and the
teachers alone, on held-out levels; success and return with 95% CIs, greedy and sampled apart, AULC.

Writes metrics/teach.json (the three-way comparison per environment, MPE included, and the result check:
student-with-teacher success >= target where pure PPO stays below the ceiling at the same frame budget),
per-episode tables under metrics/teach/eval/ and a dvclive bar plot of greedy success.
"""

from common import ROOT, log, stage_params  # isort: skip
from teach_common import METRICS, MODELS, MPE_KEY, PLOTS, env_id, make_teacher  # isort: skip

import json

import numpy as np
import torch
from dvclive import Live

from llmrl.agents.student import StudentPolicy, load_student
from llmrl.algos.mappo import evaluate_spread, mappo_inputs
from llmrl.config.teach import TeachParams
from llmrl.envs import make_env
from llmrl.eval import EvalResult, evaluate, mean_interval, wilson_interval
from llmrl.eval.batched import evaluate_batched
from llmrl.io import write_json


def pooled(results: list[EvalResult]) -> dict:
    """Success and return over all episodes of all seeds, with the per-seed rates alongside."""
    eps = [e for r in results for e in r.episodes]
    wins = sum(e.success for e in eps)
    return {"success_rate": wins / len(eps), "success_ci95": list(wilson_interval(wins, len(eps))),
            "mean_return": float(np.mean([e.episode_return for e in eps])),
            "return_ci95": list(mean_interval([e.episode_return for e in eps])),
            "episodes": len(eps), "per_seed_success": [r.summary()["success_rate"] for r in results]}


def train_metrics(run: str) -> dict:
    return json.loads((METRICS / "train" / f"{run}.json").read_text())


def eval_grid(p: TeachParams, key: str, seeds: range, rows: list[dict]) -> dict:
    env = make_env(env_id(key))
    out: dict = {}
    for teacher in p.train.teachers:
        label = "ppo" if teacher == "none" else f"student_{teacher}"
        entry: dict = {}
        for mode in ("greedy", "sampled"):
            results = []
            for seed in p.train.seeds:
                model, _ = load_student(MODELS / f"{key}-{teacher}-{seed}" / "student.pt")
                r = evaluate_batched(StudentPolicy(model, f"{label}-{seed}"), lambda: make_env(env_id(key)), seeds,
                                     mode=mode, n_envs=len(seeds))
                write_json(METRICS / "eval" / f"{key}_{label}_{seed}_{mode}.json", r.table())
                results.append(r)
            entry[mode] = pooled(results)
        runs = [train_metrics(f"{key}-{teacher}-{seed}") for seed in p.train.seeds]
        aulcs = [r["aulc"] for r in runs]
        entry["aulc"] = {"mean": float(np.mean(aulcs)), "ci95": list(mean_interval(aulcs)), "per_seed": aulcs}
        entry["frames"] = runs[0]["frames"]
        out[label] = entry
        rows.append({"policy": f"{key} {label}", "success_rate": entry["greedy"]["success_rate"]})
        if teacher != "none":
            tp = make_teacher(key, teacher, p.teacher, int(env.action_space.n))
            out[f"teacher_{teacher}"] = {mode: evaluate(tp, env, seeds, mode=mode).summary()
                                         for mode in ("greedy", "sampled")}
            if hasattr(tp.planner, "stats"):
                out[f"teacher_{teacher}"]["llm"] = tp.planner.stats()
            rows.append({"policy": f"{key} teacher_{teacher}",
                         "success_rate": out[f"teacher_{teacher}"]["greedy"]["success_rate"]})
        log.info("%s %s: greedy success %.3f %s", key, label, entry["greedy"]["success_rate"],
                 entry["greedy"]["success_ci95"])
    return out


def result_check(p: TeachParams, grid: dict) -> dict:
    """Item 7: with a teacher the student reaches the target where pure PPO is below the ceiling (same frames)."""
    check: dict = {"target": p.eval.success_target, "ppo_ceiling": p.eval.ppo_ceiling, "mode": "greedy"}
    ppo = grid.get("ppo", {}).get("greedy", {}).get("success_rate")
    check["ppo_success"] = ppo
    for teacher in ("oracle", "llm"):
        s = grid.get(f"student_{teacher}", {}).get("greedy", {})
        if s:
            check[f"student_{teacher}_success"] = s["success_rate"]
            check[f"student_{teacher}_min_seed"] = min(s["per_seed_success"])
            check[f"met_{teacher}"] = bool(ppo is not None and s["success_rate"] >= p.eval.success_target
                                           and ppo < p.eval.ppo_ceiling)
    return check


def eval_mpe(p: TeachParams, rows: list[dict]) -> dict:
    m, e = p.mpe, p.eval
    kw = dict(n_agents=m.n_agents, max_cycles=m.max_cycles, local_ratio=m.local_ratio)
    out: dict = {}

    def summary(returns: list[float]) -> dict:
        return {"mean_return": float(np.mean(returns)), "return_ci95": list(mean_interval(returns)),
                "episodes": len(returns)}

    for teacher in m.teachers:
        label = "mappo" if teacher == "none" else f"student_{teacher}"
        returns = []
        for seed in m.seeds:
            model, _ = load_student(MODELS / f"mpe-{teacher}-{seed}" / "student.pt")
            model.eval()

            def act(obs, model=model):
                with torch.no_grad():
                    return model(torch.as_tensor(mappo_inputs(obs[None])[0]))[0].argmax(-1).numpy()

            returns += evaluate_spread(act, e.episodes, e.seed, **kw)
        out[label] = summary(returns)
        rows.append({"policy": f"mpe {label} (return)", "success_rate": out[label]["mean_return"]})
        if teacher != "none":
            tp = make_teacher(MPE_KEY, teacher, p.teacher, 5)
            out[f"teacher_{teacher}"] = summary(
                evaluate_spread(lambda obs, tp=tp: tp.distributions(obs).argmax(1), e.episodes, e.seed, **kw))
    rng = np.random.default_rng(e.seed)
    out["random"] = summary(evaluate_spread(lambda obs: rng.integers(0, 5, len(obs)), e.episodes, e.seed, **kw))
    log.info("mpe: %s", {k: round(v["mean_return"], 2) for k, v in out.items()})
    return out


def main() -> None:
    p = stage_params("teach", TeachParams)
    seeds = range(p.eval.seed, p.eval.seed + p.eval.episodes)
    rows: list[dict] = []
    metrics: dict = {"protocol": {"episodes": p.eval.episodes, "seeds": f"{seeds.start}-{seeds.stop - 1}",
                                  "train_seeds": list(p.train.seeds), "ci": "Wilson 95% (success), t 95% (return)"}}
    for key in p.train.envs:
        grid = eval_grid(p, key, seeds, rows)
        grid["result"] = result_check(p, grid)
        metrics[key] = grid
    if p.mpe.teachers:
        metrics["mpe"] = eval_mpe(p, rows)
    plans = ROOT / "metrics" / "teach" / "plans.json"
    if plans.is_file():
        metrics["llm_planner"] = {k: {f: v[f] for f in ("invalid_rate", "error_rate", "mean_p_oracle_plan")}
                                  for k, v in json.loads(plans.read_text()).items()}
    with Live(dir=str(PLOTS / "eval"), save_dvc_exp=False, dvcyaml=None, report=None) as live:
        live.log_plot("success_by_policy", rows, x="success_rate", y="policy", template="bar_horizontal",
                      title="LLM4Teach: greedy success (MPE: mean return)")
    write_json(ROOT / "metrics" / "teach.json", metrics)


if __name__ == "__main__":
    main()
