"""Stage eval_baselines: the BabyAI bot and a random policy through the evaluation harness.

Writes one headline file per level and policy, metrics/baselines/eval/<level>/<policy>.json (success and
return with intervals, greedy and sampled apart), per-episode tables and the protocol (seeds, the environment line)
under metrics/baselines/episodes/ (a plain out), and a dvclive bar plot of success per policy and level.
"""

from llmrl.agents.baselines import BabyAIBotPolicy, RandomPolicy
from llmrl.config import DemosParams, EvalBaselinesParams
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.eval.harness import evaluate
from llmrl.eval.headline import headline_of_results, metrics_entry
from llmrl.files import atomic_path, write_json
from llmrl.fingerprint import fingerprint_line
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params

POLICIES = {"bot": (BabyAIBotPolicy, "greedy"), "random": (lambda: RandomPolicy(n_actions=6), "sampled")}


def main(argv: list[str] | None = None) -> None:
    stage_arguments("eval_baselines", argv)
    p = stage_params("eval_baselines", EvalBaselinesParams)
    envs = stage_params("demos", DemosParams).envs  # evaluate on the levels the demonstrations cover
    seeds = range(p.seed, p.seed + p.episodes)
    rows = []
    out = paths.eval_baselines()
    with open_live(out.live) as live, atomic_path(out.eval, is_dir=True) as eval_dir, \
            atomic_path(out.episodes, is_dir=True) as episodes_dir:
        for env_id in envs:
            env = make_env(env_id)
            for name in p.policies:
                factory, mode = POLICIES[name]
                result = evaluate(factory(), env, seeds, mode=mode)
                h = headline_of_results([result])
                write_json(eval_dir / env_id / f"{name}.json", metrics_entry({mode: h}))
                rows.append({"policy": f"{env_id.removeprefix('BabyAI-')}: {name} ({mode})", "level": env_id,
                             "success_rate": h["success"], "ci_low": h["success_lo"], "ci_high": h["success_hi"]})
                write_json(episodes_dir / f"{env_id}_{name}_{mode}.json", result.table())
                log.info("%s %s %s: success %.3f [%.3f, %.3f] over %d episodes", env_id, name, mode,
                         h["success"], h["success_lo"], h["success_hi"], h["episodes"])
            env.close()
        live.log_plot("success_by_policy", rows, x="success_rate", y="policy", template="bar_horizontal",
                      title="Baselines: success rate")
        write_json(episodes_dir / "protocol.json", {"episodes": p.episodes, "seeds": f"{seeds[0]}-{seeds[-1]}",
                                                    "env": fingerprint_line()})


if __name__ == "__main__":
    main()
