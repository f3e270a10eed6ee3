"""Stage llm4teach_eval: students trained with the LLM teachers, the scoring teacher's controls, the oracle teacher
and none (pure PPO / MAPPO), the teachers alone and a random policy, on the held-out test levels (the same levels
for every agent); seeds as the unit (``aggregate_seeds``).

Writes one headline file per agent, metrics/llm4teach/eval/<env>/<agent>.json (success and return with seed-level
intervals, greedy and sampled apart, AULC, ``beats_random``, and a learner's budget: frames, updates and seeds;
MPE: return only); as plain outs, the verdicts: the result check metrics/llm4teach/result/<env>.json
(``met_oracle``, ``met_llm``) and the claim that the LLM's scores help, metrics/llm4teach/claims/<env>.json (the
scoring-taught student's paired difference from each control-taught student, per mode); the full report with per-seed values, budgets and planner statistics
and the environment line metrics/llm4teach/report.json and per-episode tables under metrics/llm4teach/episodes/
(plain outs), and a dvclive bar plot of greedy success (MPE: mean return).
"""

import numpy as np
import torch

from llmrl.agents.baselines import RandomPolicy
from llmrl.agents.student import StudentPolicy, load_student
from llmrl.algos.mappo import greedy_joint_policy
from llmrl.config.llm4teach import SCORE_CONTROLS, LLM4TeachParams
from llmrl.envs.make import make_env
from llmrl.envs.mpe import N_ACTIONS as MPE_ACTIONS
from llmrl.eval.harness import evaluate
from llmrl.eval.seeds import aggregate_seeds
from llmrl.eval.batched import evaluate_batched
from llmrl.eval.headline import headline_of_results, metrics_entry
from llmrl.eval.llm4teach import beats_random, evaluate_spread, result_check, return_headline, scores_help
from llmrl.files import atomic_path, read_json, write_json
from llmrl.fingerprint import fingerprint_line
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params
from stages.llm4teach_common import (MPE_KEY, THREADS, env_id, item_outputs, make_teacher, student_file,
                                     train_record_file)


def train_record(item: paths.Outputs, seed: int) -> dict:
    return read_json(train_record_file(item.records, seed))


def successes(results) -> list[list[float]]:
    return [[float(e.success) for e in r.episodes] for r in results]


def budget(records: list[dict]) -> dict:
    """A learner's budget from its seeds' training records: every seed trains the same frames and updates."""
    first = records[0]
    if any((r["frames"], r["updates"]) != (first["frames"], first["updates"]) for r in records):
        raise ValueError(f"training records of {first['run']}: seeds trained different budgets")
    return {"frames": first["frames"], "iterations": first["iterations"], "updates": first["updates"],
            "seeds": len(records), "lr": first["lr"], "final_distill_coef": first["final_distill_coef"]}


def claim_entry(scores: dict[str, dict[str, list[list[float]]]], *, higher_is_better: bool = True
                ) -> tuple[dict, dict] | None:
    """The scores-help claim per mode from each teacher's per-seed, per-episode scores: a metrics entry (numbers
    and booleans) and the full record; None when the scoring teacher is not among them."""
    if "llm_score" not in scores:
        return None
    entry, full = {}, {}
    for mode, scoring in scores["llm_score"].items():
        result = scores_help(np.asarray(scoring), {c: np.asarray(scores[c][mode]) for c in SCORE_CONTROLS},
                             higher_is_better=higher_is_better)
        full[mode] = result
        entry[mode] = {"llm_scores_help": result["claim"], "seeds": len(scoring), "episodes": len(scoring[0])}
        for control, d in result["vs"].items():
            entry[mode].update({f"vs_{control}": d["difference"], f"vs_{control}_lo": d["ci_low"],
                                f"vs_{control}_hi": d["ci_high"]})
    return entry, full


def eval_grid(p: LLM4TeachParams, key: str, seeds: range, eval_dir, result_dir, claims_dir, episodes_dir,
              rows: list[dict]) -> dict:
    """One environment: every agent's headline file; returns the detailed report for the environment."""
    eid = env_id(key)
    env = make_env(eid)
    n_actions = int(env.action_space.n)
    report: dict = {}

    rand = evaluate(RandomPolicy(n_actions), env, seeds, mode="sampled")
    random_success = aggregate_seeds(successes([rand]), rate=True)
    write_json(eval_dir / key / "random.json", metrics_entry({"sampled": headline_of_results([rand])}))
    report["random"] = {"sampled_success": random_success.summary()}

    students: dict = {}
    scores: dict = {}
    ppo = None
    for teacher in p.train.teachers:
        label = "ppo" if teacher == "none" else f"student_{teacher}"
        item = item_outputs(key, teacher)
        by_mode = {}
        for mode in ("greedy", "sampled"):
            by_mode[mode] = []
            for seed in p.train.seeds:
                model, _ = load_student(student_file(item.models, seed))
                r = evaluate_batched(StudentPolicy(model, f"{label}-{seed}"), lambda: make_env(eid), seeds,
                                     mode=mode, n_envs=len(seeds), progress=False)
                write_json(episodes_dir / f"{key}_{label}_{seed}_{mode}.json", r.table())
                by_mode[mode].append(r)
        scores[teacher] = {mode: successes(r) for mode, r in by_mode.items()}
        greedy = aggregate_seeds(scores[teacher]["greedy"], rate=True)
        records = [train_record(item, seed) for seed in p.train.seeds]
        aulc = aggregate_seeds([[r["aulc"]] for r in records])  # one value per seed: a bootstrap over seeds
        flag = beats_random(greedy, random_success)
        spent = budget(records)
        write_json(eval_dir / key / f"{label}.json",
                   metrics_entry({m: headline_of_results(by_mode[m]) for m in by_mode},
                                 aulc=round(aulc.value, 4), beats_random=flag, frames=spent["frames"],
                                 updates=spent["updates"]))
        report[label] = {"greedy_success": greedy.summary(),
                         "sampled_success": aggregate_seeds(scores[teacher]["sampled"], rate=True).summary(),
                         "aulc": aulc.summary(), "beats_random": flag, "budget": spent,
                         "train_seconds": [r["seconds"] for r in records]}
        if teacher == "none":
            ppo = greedy
        else:
            students[teacher] = greedy
        rows.append({"policy": f"{key} {label}", "success_rate": round(greedy.value, 4)})
        log.info("%s %s: greedy success %.3f [%.3f, %.3f] per seed %s, beats random %s", key, label, greedy.value,
                 greedy.ci_low, greedy.ci_high, [round(x, 2) for x in greedy.per_seed], flag)
        if teacher != "none":
            tp = make_teacher(key, teacher, p.teacher, n_actions)
            alone = {mode: evaluate(tp, env, seeds, mode=mode) for mode in ("greedy", "sampled")}
            write_json(eval_dir / key / f"teacher_{teacher}.json",
                       metrics_entry({m: headline_of_results([r]) for m, r in alone.items()}))
            report[f"teacher_{teacher}"] = {m: r.summary() for m, r in alone.items()}
            if hasattr(tp.planner, "stats"):
                report[f"teacher_{teacher}"]["llm"] = tp.planner.stats()
            rows.append({"policy": f"{key} teacher_{teacher}", "success_rate": alone["greedy"].summary()["success_rate"]})
    check = result_check(students, ppo, target=p.eval.success_target, ceiling=p.eval.ppo_ceiling)
    write_json(result_dir / f"{key}.json", check)
    claim = claim_entry(scores)
    if claim is not None:
        write_json(claims_dir / f"{key}.json", metrics_entry(claim[0]))
        report["scores_help"] = claim[1]
        log.info("%s: the LLM's scores help (greedy, sampled): %s", key,
                 [claim[0][m]["llm_scores_help"] for m in claim[0]])
    report["result"] = {**check, "target": p.eval.success_target, "ppo_ceiling": p.eval.ppo_ceiling,
                        "mode": "greedy", "statistic": "mean over seeds of per-seed success"}
    return report


def eval_mpe(p: LLM4TeachParams, eval_dir, claims_dir, rows: list[dict]) -> dict:
    m, e = p.mpe, p.eval
    kw = dict(n_agents=m.n_agents, max_cycles=m.max_cycles, local_ratio=m.local_ratio)
    report: dict = {}
    rng = np.random.default_rng(e.seed)
    rand = evaluate_spread(lambda obs: rng.integers(0, MPE_ACTIONS, len(obs)), e.episodes, e.seed, **kw)
    random_return = aggregate_seeds([rand])
    write_json(eval_dir / "mpe" / "random.json", metrics_entry({"sampled": return_headline([rand])}))
    report["random"] = random_return.summary()
    scores: dict = {}
    for teacher in m.teachers:
        label = "mappo" if teacher == "none" else f"student_{teacher}"
        per_seed = []
        for seed in m.seeds:
            model, _ = load_student(student_file(item_outputs(MPE_KEY, teacher).models, seed))
            per_seed.append(evaluate_spread(greedy_joint_policy(model), e.episodes, e.seed, **kw))
        scores[teacher] = {"greedy": per_seed}
        agg = aggregate_seeds(per_seed)
        flag = beats_random(agg, random_return)
        records = [train_record(item_outputs(MPE_KEY, teacher), seed) for seed in m.seeds]
        spent = budget(records)
        write_json(eval_dir / "mpe" / f"{label}.json",
                   metrics_entry({"greedy": return_headline(per_seed)}, beats_random=flag, frames=spent["frames"],
                                 updates=spent["updates"]))
        report[label] = {"greedy_return": agg.summary(), "beats_random": flag, "budget": spent,
                         "train_seconds": [r["seconds"] for r in records]}
        rows.append({"policy": f"mpe {label} (return)", "success_rate": round(agg.value, 4)})
        log.info("mpe %s: greedy return %.2f [%.2f, %.2f] per seed %s, beats random (%.2f [%.2f, %.2f]) %s", label,
                 agg.value, agg.ci_low, agg.ci_high, [round(x, 2) for x in agg.per_seed], random_return.value,
                 random_return.ci_low, random_return.ci_high, flag)
        if teacher != "none":
            tp = make_teacher(MPE_KEY, teacher, p.teacher, MPE_ACTIONS)
            alone = evaluate_spread(lambda obs, tp=tp: tp.distributions(obs).argmax(1), e.episodes, e.seed, **kw)
            write_json(eval_dir / "mpe" / f"teacher_{teacher}.json",
                       metrics_entry({"greedy": return_headline([alone])}))
            report[f"teacher_{teacher}"] = aggregate_seeds([alone]).summary()
    claim = claim_entry(scores)
    if claim is not None:
        write_json(claims_dir / "mpe.json", metrics_entry(claim[0]))
        report["scores_help"] = claim[1]
    return report


def main(argv: list[str] | None = None) -> None:
    stage_arguments("llm4teach_eval", argv)
    torch.set_num_threads(THREADS)
    p = stage_params("llm4teach", LLM4TeachParams)
    seeds = range(p.eval.seed, p.eval.seed + p.eval.episodes)
    rows: list[dict] = []
    report: dict = {"protocol": {"test_levels": f"{seeds.start}-{seeds.stop - 1}", "episodes": p.eval.episodes,
                                 "train_seeds": list(p.train.seeds), "mpe_seeds": list(p.mpe.seeds),
                                 "validation_levels": f"{p.validation.seed}-"
                                                      f"{p.validation.seed + p.validation.episodes - 1}",
                                 "selection": p.validation.selection,
                                 "interval": "95% hierarchical bootstrap over seeds, then episodes "
                                             "(llmrl.eval.seeds.aggregate_seeds)",
                                 "beats_random": "the agent's seed-level interval's low end above the high end of "
                                                 "random's interval (one run, interval over episodes)",
                                 "scores_help": "the scoring-taught student's paired difference from each "
                                                "control-taught student (same test episodes; seeds and episodes "
                                                "drawn as crossed factors, llmrl.eval.paired) above 0 for every "
                                                "control",
                                 "budget": "every learner of a task trains the same frames; updates = optimizer "
                                           "steps; pure PPO at its own learning rate (llm4teach.train.pure_ppo_lr)"},
                    "env": fingerprint_line()}
    out = paths.llm4teach_eval()
    with atomic_path(out.eval, is_dir=True) as eval_dir, atomic_path(out.episodes, is_dir=True) as episodes_dir, \
            atomic_path(out.result, is_dir=True) as result_dir, atomic_path(out.claims, is_dir=True) as claims_dir:
        for key in p.train.envs:
            report[key] = eval_grid(p, key, seeds, eval_dir, result_dir, claims_dir, episodes_dir, rows)
        if p.mpe.teachers:
            report["mpe"] = eval_mpe(p, eval_dir, claims_dir, rows)
    plans = paths.llm4teach_plans().metrics
    if plans.is_dir():
        report["llm_planner"] = {f.stem: read_json(f) for f in sorted(plans.glob("*.json"))}
    with open_live(out.live) as live:
        live.log_plot("success_by_policy", rows, x="success_rate", y="policy", template="bar_horizontal",
                      title="LLM4Teach: greedy success, mean over seeds (MPE: mean return)")
    write_json(out.report, report)


if __name__ == "__main__":
    main()
