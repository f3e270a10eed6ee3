"""Stage glam_eval: every GLAM agent and baseline through the evaluation harness, greedy and sampled apart.

Agents: random (sampled only: it has no greedy mode), the BabyAI bot (greedy only: deterministic), the
zero-shot LLM, BC, Symbolic-PPO and every glam_train item. LLM agents run ``glam.eval.batch`` episodes in
lockstep (``evaluate_batched``: same seeds and protocol as the harness, many prompts per forward). Writes
metrics/glam/eval.json (success rates with Wilson 95% CIs), per-episode tables and the first rendered prompts
of each LLM agent, and a dvclive bar plot.
"""

from common import ROOT, log, stage_params  # isort: skip

import time

import torch
from dvclive import Live

from llmrl.agents import BabyAIBotPolicy, RandomPolicy
from llmrl.agents.llm_policy import LLMBatchPolicy, build_agent, load_agent
from llmrl.agents.symbolic import SymbolicActorCritic, SymbolicPolicy
from llmrl.config.glam import GlamParams
from llmrl.envs import make_env
from llmrl.eval import evaluate
from llmrl.eval.batched import evaluate_batched
from llmrl.io import write_json

OUT = ROOT / "metrics" / "glam"


def agents(p: GlamParams):
    """(name, policy, modes) of every agent to evaluate, built lazily (one LLM in memory at a time)."""
    yield "random", lambda: RandomPolicy(n_actions=6), ["sampled"]
    yield "bot", BabyAIBotPolicy, ["greedy"]

    def symbolic():
        model = SymbolicActorCritic()
        model.load_state_dict(torch.load(ROOT / "models" / "glam" / "symbolic" / "model.pt", weights_only=True))
        return SymbolicPolicy(model)

    yield "symbolic_ppo", symbolic, p.eval.modes

    def zero_shot():
        agent = build_agent(p.model, "lora", temperature=p.policy.temperature, length_norm=p.policy.length_norm,
                            frozen=True)
        return LLMBatchPolicy(agent, "zero_shot", history=p.policy.history, record_steps=20)

    yield "zero_shot", zero_shot, p.eval.modes
    items = ["bc"] + [f"{v}-{s}" for v in p.train.variants for s in p.train.seeds]
    for item in items:
        name = item if item == "bc" else f"glam_{item}"

        def trained(item=item, name=name):
            agent, meta = load_agent(ROOT / "models" / "glam" / item)
            return LLMBatchPolicy(agent, name, history=meta["history"], record_steps=20)

        yield name, trained, p.eval.modes


def main() -> None:
    p = stage_params("glam", GlamParams)
    torch.set_num_threads(p.threads)
    seeds = range(p.eval.seed, p.eval.seed + p.eval.episodes)
    metrics: dict = {"protocol": {"episodes": p.eval.episodes, "seeds": f"{seeds[0]}-{seeds[-1]}",
                                  "max_steps": p.eval.max_steps, "confidence": 0.95}}
    rows, timing = [], {}
    with Live(dir=str(ROOT / "plots" / "glam_eval"), save_dvc_exp=False, dvcyaml=None, report=None) as live:
        for name, factory, modes in agents(p):
            start = time.perf_counter()
            policy = factory()
            for env_id in p.eval.env_ids:
                env = make_env(env_id)
                for mode in modes:
                    if isinstance(policy, LLMBatchPolicy):
                        result = evaluate_batched(policy, lambda env_id=env_id: make_env(env_id), seeds, mode=mode,
                                                  max_steps=p.eval.max_steps, n_envs=p.eval.batch)
                    else:
                        result = evaluate(policy, env, seeds, mode=mode, max_steps=p.eval.max_steps)
                    s = result.summary()
                    metrics.setdefault(env_id, {})[f"{name}_{mode}"] = s
                    rows.append({"agent": f"{name} ({mode})", "level": env_id, "success_rate": s["success_rate"],
                                 "ci_low": s["success_ci95"][0], "ci_high": s["success_ci95"][1]})
                    write_json(OUT / "eval" / f"{env_id}_{name}_{mode}_episodes.json", result.table())
                    log.info("%s %s %s: success %.3f [%.3f, %.3f] over %d episodes", env_id, name, mode,
                             s["success_rate"], *s["success_ci95"], s["episodes"])
                env.close()
            if isinstance(policy, LLMBatchPolicy):
                write_json(OUT / "eval" / f"{name}_prompts.json", policy.records)
                metrics.setdefault("distinct_prompts_scored", {})[name] = len(policy.memo)
            timing[name] = time.perf_counter() - start
            del policy
        live.log_plot("success_by_agent", rows, x="success_rate", y="agent", template="bar_horizontal",
                      title="GLAM agents: success rate")
    metrics["wall_s"] = timing
    write_json(OUT / "eval.json", metrics)


if __name__ == "__main__":
    main()
