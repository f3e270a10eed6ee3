"""Stage glam_symbolic: the Symbolic-PPO baseline (the project's PPO, MLP on the grid + mission words)."""

import time

import torch
from gymnasium.wrappers import TimeLimit

from llmrl.agents.symbolic import save_symbolic
from llmrl.algos.symbolic_ppo import train_symbolic
from llmrl.config.glam import GlamParams
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.files import write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.glam_symbolic()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("glam_symbolic", argv)
    p = stage_params("glam", GlamParams)
    s = p.symbolic
    torch.set_num_threads(p.threads)
    start = time.perf_counter()
    cfg = s.ppo

    def env():  # the LLM agents' training cap, as a time limit (bootstrapped by the PPO)
        e = make_env(p.train.env_id)
        return TimeLimit(e, p.train.max_steps) if p.train.max_steps else e

    finals, models = [], {}
    for seed in s.seeds:
        models[seed], history = train_symbolic(env, cfg, seed=seed)
        finals.append(history[-1])
        log.info("symbolic PPO seed %d: last training success %.3f", seed, history[-1].get("success_rate"))
    save_symbolic(OUT.model, models, {"env_id": p.train.env_id, "seeds": s.seeds, "cfg": cfg.model_dump()})
    mean = lambda key: round(sum(f[key] for f in finals) / len(finals), 4)  # noqa: E731
    write_json(OUT.metrics,
               {"env_steps": cfg.iterations * cfg.batch_size, "seeds": len(s.seeds),
                "success_rate": mean("success_rate"), "return_mean": mean("return_mean"),
                "policy_loss": mean("policy_loss"), "value_loss": mean("value_loss"),
                "entropy": mean("entropy"), "seconds": round(time.perf_counter() - start, 1)})


if __name__ == "__main__":
    main()
