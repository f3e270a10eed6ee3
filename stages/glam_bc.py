"""Stage glam_bc: behavioural cloning of the LLM policy on BabyAI-bot demonstrations of the training level.

The demonstrations are recorded here, on glam.train.env_id with the BabyAI-Text wrapper, rather than replayed
from data/demos: those cover other levels (GoToLocal, PickupLoc) and hold image observations only, while
recording on the training level gives the exact text observations and missions the policy is trained and
evaluated on, with seeds (glam.bc.seed...) disjoint from the evaluation seeds.
"""

from common import ROOT, log, stage_params  # isort: skip

import time

import torch

from llmrl.agents import BabyAIBotPolicy
from llmrl.agents.llm_policy import build_agent, save_agent
from llmrl.algos.bc_llm import bc_samples, train_bc
from llmrl.config.glam import GlamParams
from llmrl.data import TrajectoryWriter, read_episodes
from llmrl.envs import make_env
from llmrl.envs.babyai_text import ACTIONS_EN
from llmrl.eval import evaluate
from llmrl.io import write_json

DEMOS = ROOT / "data" / "glam" / "bc_demos.h5"


def main() -> None:
    p = stage_params("glam", GlamParams)
    torch.set_num_threads(p.threads)
    start = time.perf_counter()
    env = make_env(p.train.env_id)
    with TrajectoryWriter(DEMOS) as writer:
        demo = evaluate(BabyAIBotPolicy(), env, range(p.bc.seed, p.bc.seed + p.bc.episodes), mode="greedy",
                        on_episode=writer.append, action_text=lambda a: ACTIONS_EN[int(a)])
    episodes = read_episodes(DEMOS)
    build = {"model": p.model, "variant": "lora", "lora_r": p.lora.r, "lora_alpha": p.lora.alpha,
             "lora_dropout": p.lora.dropout, "temperature": p.policy.temperature,
             "length_norm": p.policy.length_norm, "seed": p.bc.seed}
    agent = build_agent(**build)
    samples = bc_samples(agent, episodes, env.get_wrapper_attr("labels"), env.get_wrapper_attr("action_texts"),
                         p.policy.history)
    losses = train_bc(agent, samples, epochs=p.bc.epochs, batch_size=p.bc.batch_size, lr=p.bc.lr, seed=p.bc.seed)
    save_agent(agent, ROOT / "models" / "glam" / "bc", {"build": build, "history": p.policy.history,
                                                         "env_id": p.train.env_id})
    log.info("bc: %d samples from %d bot episodes (bot success %.2f), loss %.3f -> %.3f", len(samples),
             len(episodes), demo.summary()["success_rate"], losses[0], losses[-1])
    write_json(ROOT / "metrics" / "glam" / "bc.json",
               {"samples": len(samples), "episodes": len(episodes), "bot_success": demo.summary()["success_rate"],
                "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
                "wall_s": time.perf_counter() - start})


if __name__ == "__main__":
    main()
