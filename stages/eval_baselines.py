"""Stage eval_baselines: the BabyAI bot and a random policy through the evaluation harness.

Writes metrics/baselines.json (rates with 95% CIs, greedy and sampled apart), a per-episode table, and
through dvclive a flat summary (for `dvc exp show`) and a bar plot of success per policy and level.
"""

from common import ROOT, log, stage_params  # isort: skip

from dvclive import Live

from llmrl.agents import BabyAIBotPolicy, RandomPolicy
from llmrl.config import DemosParams, EvalBaselinesParams
from llmrl.envs import make_env
from llmrl.eval import evaluate
from llmrl.io import write_json

POLICIES = {"bot": (BabyAIBotPolicy, "greedy"), "random": (lambda: RandomPolicy(n_actions=6), "sampled")}


def main() -> None:
    p = stage_params("eval_baselines", EvalBaselinesParams)
    envs = stage_params("demos", DemosParams).envs  # evaluate on the levels the demonstrations cover
    seeds = range(p.seed, p.seed + p.episodes)
    metrics: dict = {}
    rows = []
    with Live(dir=str(ROOT / "plots" / "eval_baselines"), save_dvc_exp=False, dvcyaml=None,
              report=None) as live:
        for env_id in envs:
            env = make_env(env_id)
            for name in p.policies:
                factory, mode = POLICIES[name]
                result = evaluate(factory(), env, seeds, mode=mode)
                s = result.summary()
                metrics.setdefault(env_id, {})[f"{name}_{mode}"] = s
                live.log_metric(f"{env_id}/{name}_{mode}/success_rate", s["success_rate"], plot=False)
                rows.append({"policy": f"{env_id.removeprefix('BabyAI-')}: {name} ({mode})", "level": env_id, "success_rate": s["success_rate"],
                             "ci_low": s["success_ci95"][0], "ci_high": s["success_ci95"][1]})
                write_json(ROOT / "metrics" / "baselines" / f"{env_id}_{name}_{mode}_episodes.json",
                           result.table())
                log.info("%s %s %s: success %.3f [%.3f, %.3f] over %d episodes", env_id, name, mode,
                         s["success_rate"], *s["success_ci95"], s["episodes"])
            env.close()
        live.log_plot("success_by_policy", rows, x="success_rate", y="policy", template="bar_horizontal",
                      title="Baselines: success rate")
    write_json(ROOT / "metrics" / "baselines.json", metrics)


if __name__ == "__main__":
    main()
