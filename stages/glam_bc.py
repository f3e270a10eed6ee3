"""Stage glam_bc: behavioural cloning of the LLM policy on the BabyAI bot's demonstrations of the training level.

The demonstrations come from the ``demos`` stage (data/demos/<glam.train.env_id>.h5, which therefore lists the
training level in ``demos.envs``): the first ``glam.bc.episodes`` episodes, recorded with the BabyAI-Text
wrapper, so their text observations and missions are the ones the policy is trained and evaluated on. The
demos' seeds (``demos.seed``...) are disjoint from GLAM's evaluation seeds.
"""

import time

import torch

from llmrl.agents.llm_policy import build_agent, save_agent
from llmrl.algos.bc_llm import bc_samples, train_bc
from llmrl.config import DemosParams
from llmrl.config.glam import GlamParams
from llmrl.data.trajectories import TrajectoryReader
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.files import write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.glam_bc()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("glam_bc", argv)
    p = stage_params("glam", GlamParams)
    demos = stage_params("demos", DemosParams)
    if p.train.env_id not in demos.envs:
        raise SystemExit(f"glam_bc: demos.envs must include glam.train.env_id {p.train.env_id!r} (BC trains on the "
                         f"demos stage's data); it lists {demos.envs}")
    torch.set_num_threads(p.threads)
    start = time.perf_counter()
    with TrajectoryReader(paths.demos().demos / f"{p.train.env_id}.h5") as reader:
        if len(reader) < p.bc.episodes:
            raise SystemExit(f"glam.bc.episodes: {p.bc.episodes} asked, data/demos has {len(reader)} episodes")
        episodes = [reader[i] for i in range(p.bc.episodes)]
    env = make_env(p.train.env_id)
    build = {"model": p.model, "variant": "lora", "lora_r": p.lora.r, "lora_alpha": p.lora.alpha,
             "lora_dropout": p.lora.dropout, "lora_layers": p.lora.layers, "temperature": p.policy.temperature,
             "length_norm": p.policy.length_norm, "dtype": p.dtype, "seed": p.bc.seed}
    agent = build_agent(**build)
    samples = bc_samples(agent, episodes, env.get_wrapper_attr("labels"), env.get_wrapper_attr("action_texts"),
                         p.policy.history)
    losses = [row["loss"] for row in train_bc(agent, samples, epochs=p.bc.epochs, batch_size=p.bc.batch_size,
                                              lr=p.bc.lr, seed=p.bc.seed)]
    save_agent(agent, OUT.model, {"build": build, "history": p.policy.history, "env_id": p.train.env_id})
    bot_success = sum(ep.success for ep in episodes) / len(episodes)
    log.info("bc: %d samples from %d bot episodes (bot success %.2f), loss %.3f -> %.3f", len(samples),
             len(episodes), bot_success, losses[0], losses[-1])
    write_json(OUT.metrics,
               {"samples": len(samples), "episodes": len(episodes), "loss_first": round(losses[0], 4),
                "loss": round(losses[-1], 4), "dtype": agent.llm.dtype_name,
                "seconds": round(time.perf_counter() - start, 1)})


if __name__ == "__main__":
    main()
