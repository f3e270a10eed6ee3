"""Stage glam_eval: every GLAM agent and baseline through the evaluation harness, greedy and sampled apart.

Agents: random (sampled only: it has no greedy mode), the BabyAI bot (greedy only: deterministic), the
zero-shot LLM, BC, Symbolic-PPO and every glam_train item. BC runs once per training seed (one model each); random
and the zero-shot LLM once per sampling stream, as many as GLAM's training seeds (their greedy mode once). Each
GLAM variant's success minus each reference's, paired by start (runs and starts crossed: ``llmrl.eval.glam``), goes
to plots/glam/eval/paired.json. LLM agents run ``glam.eval.batch`` episodes in
lockstep (``evaluate_batched``: same seeds and protocol as the harness, many prompts per forward). Episodes run
to the level's own step limit unless ``glam.eval.max_steps`` caps them. Writes one headline file per level and
agent, metrics/glam/eval/<level>/<agent>.json (success and return with intervals, greedy and sampled apart;
the training seeds of a glam_train variant are pooled as seeds), per-episode tables, the first rendered prompts
of each LLM agent and the protocol (seeds, timings, each LLM agent's compute dtype, the environment line) under
metrics/glam/episodes/ (a plain out), and a dvclive bar plot.
"""

import time
from pathlib import Path

import torch

from llmrl.agents.baselines import BabyAIBotPolicy, RandomPolicy
from llmrl.agents.llm_policy import LLMBatchPolicy, build_agent, load_agent
from llmrl.agents.symbolic import SymbolicPolicy, load_symbolic
from llmrl.config.glam import GlamParams
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.eval.harness import evaluate
from llmrl.eval.batched import evaluate_batched
from llmrl.eval.glam import paired_against, require_same_starts, success_matrix
from llmrl.eval.headline import headline_of_results, metrics_entry
from llmrl.eval.streams import SamplingStream
from llmrl.files import atomic_path, write_json
from llmrl.fingerprint import fingerprint_line
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params

OUT = paths.glam_eval()
# what each GLAM variant is compared with, paired by start (plots/glam/eval/paired.json)
REFERENCES = ("zero_shot", "bc", "random", "symbolic_ppo")


def agents(p: GlamParams):
    """(name, [policy factory per run], modes, greedy_once) of every agent, built lazily (one LLM at a time). A
    trained agent runs once per training seed; random and the zero-shot LLM, which have no training seed, run once
    per sampling stream (``llmrl.eval.streams``) of the same count, their greedy mode once (``greedy_once``: it is
    deterministic)."""
    yield "random", [lambda s=s: SamplingStream(RandomPolicy(n_actions=6), s) for s in p.train.seeds], \
        ["sampled"], False
    yield "bot", [BabyAIBotPolicy], ["greedy"], False

    def symbolic(seed: int):
        return SymbolicPolicy(load_symbolic(paths.glam_symbolic().model, seed), name=f"symbolic_ppo-{seed}")

    yield "symbolic_ppo", [lambda seed=seed: symbolic(seed) for seed in p.symbolic.seeds], p.eval.modes, False

    def zero_shot(stream: int):
        agent = build_agent(p.model, "lora", temperature=p.policy.temperature, length_norm=p.policy.length_norm,
                            frozen=True, dtype=p.dtype)
        return SamplingStream(LLMBatchPolicy(agent, "zero_shot", history=p.policy.history, record_steps=20), stream)

    yield "zero_shot", [lambda s=s: zero_shot(s) for s in p.train.seeds], p.eval.modes, True

    def trained(folder, name: str):
        agent, meta = load_agent(folder)
        return LLMBatchPolicy(agent, name, history=meta["history"], record_steps=20)

    yield "bc", [lambda s=s: trained(paths.glam_bc().model / str(s), f"bc-{s}") for s in p.train.seeds], \
        p.eval.modes, False
    for v in p.train.variants:
        yield f"glam_{v}", [lambda item=f"{v}-{s}": trained(paths.glam_train(item).model, f"glam_{item}")
                            for s in p.train.seeds], p.eval.modes, False


def main(argv: list[str] | None = None) -> None:
    stage_arguments("glam_eval", argv)
    p = stage_params("glam", GlamParams)
    torch.set_num_threads(p.threads)
    seeds = range(p.eval.seed, p.eval.seed + p.eval.episodes)
    protocol = {"episodes": p.eval.episodes, "seeds": f"{seeds[0]}-{seeds[-1]}", "max_steps": p.eval.max_steps}
    rows, timing, dtypes = [], {}, {}
    successes: dict = {}  # (agent, env_id) -> {mode: [runs, episodes] successes}
    paired: dict = {}  # env_id -> GLAM variant -> reference -> mode -> the paired difference
    starts: dict = {}  # (agent, env_id) -> the episode seeds it played
    with open_live(OUT.live) as live, \
            atomic_path(OUT.eval, is_dir=True) as eval_dir, atomic_path(OUT.episodes, is_dir=True) as ep_dir:
        for name, factories, modes, greedy_once in agents(p):
            start = time.perf_counter()
            results: dict = {}  # (env_id, mode) -> one EvalResult per run (training seed or sampling stream)
            for run, factory in enumerate(factories):
                policy = factory()
                batched = isinstance(getattr(policy, "policy", policy), LLMBatchPolicy)
                for env_id in p.eval.env_ids:
                    env = make_env(env_id)
                    for mode in modes:
                        if mode == "greedy" and greedy_once and run > 0:
                            continue
                        if batched:
                            result = evaluate_batched(policy, lambda env_id=env_id: make_env(env_id), seeds,
                                                      mode=mode, max_steps=p.eval.max_steps, n_envs=p.eval.batch)
                        else:
                            result = evaluate(policy, env, seeds, mode=mode, max_steps=p.eval.max_steps)
                        results.setdefault((env_id, mode), []).append(result)
                        write_json(ep_dir / f"{env_id}_{policy.name}_{mode}.json", result.table())
                    env.close()
                if batched:
                    llm_policy = getattr(policy, "policy", policy)
                    write_json(ep_dir / f"{policy.name}_prompts.json", llm_policy.records)
                    dtypes[name] = llm_policy.agent.llm.dtype_name
                del policy
            for env_id in p.eval.env_ids:
                entry = {mode: headline_of_results(results[env_id, mode]) for mode in modes}
                successes[name, env_id] = {mode: success_matrix(results[env_id, mode]) for mode in modes}
                starts[name, env_id] = [e.seed for e in results[env_id, modes[0]][0].episodes]
                if name.startswith("glam_"):  # the references come first in agents(): paired on the same starts
                    require_same_starts({a: starts[a, env_id] for a in (name, *REFERENCES)})
                    paired.setdefault(env_id, {})[name] = paired_against(
                        successes[name, env_id], {ref: successes[ref, env_id] for ref in REFERENCES})
                write_json(eval_dir / env_id / f"{name}.json", metrics_entry(entry))
                for mode, h in entry.items():
                    rows.append({"agent": f"{name} ({mode})", "level": env_id, "success_rate": h["success"],
                                 "ci_low": h["success_lo"], "ci_high": h["success_hi"]})
                    log.info("%s %s %s: success %.3f [%.3f, %.3f] over %d seeds x %d episodes", env_id, name, mode,
                             h["success"], h["success_lo"], h["success_hi"], h["seeds"], p.eval.episodes)
            timing[name] = round(time.perf_counter() - start, 1)
        live.log_plot("success_by_agent", rows, x="success_rate", y="agent", template="bar_horizontal",
                      title="GLAM agents: success rate")
        # beside the plot, not in the metrics: `dvc metrics show` keeps one headline vocabulary
        write_json(Path(live.dir) / "paired.json", paired)
        write_json(ep_dir / "protocol.json", {**protocol, "seconds": timing, "dtype": dtypes,
                                              "env": fingerprint_line()})


if __name__ == "__main__":
    main()
