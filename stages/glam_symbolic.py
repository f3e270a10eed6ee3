"""Stage glam_symbolic: the Symbolic-PPO baseline (the project's PPO, MLP on the grid + mission words)."""

from common import ROOT, log, stage_params  # isort: skip

import json
import time
from pathlib import Path

import torch
from gymnasium.wrappers import TimeLimit

from llmrl.agents.symbolic import train_symbolic
from llmrl.algos.ppo import PPOConfig
from llmrl.config.glam import GlamParams
from llmrl.envs import make_env
from llmrl.io import atomic_path, write_json

OUT = ROOT / "models" / "glam" / "symbolic"


def main() -> None:
    p = stage_params("glam", GlamParams)
    s = p.symbolic
    torch.set_num_threads(p.threads)
    start = time.perf_counter()
    cfg = PPOConfig(total_frames=s.timesteps, num_envs=s.n_envs, num_steps=s.n_steps, epochs=s.epochs,
                    minibatch_size=s.minibatch_size, lr=s.lr, gae_lambda=0.95, entropy_coef=0.01)

    def env():  # the LLM agents' training cap, as a time limit (bootstrapped by the PPO)
        e = make_env(p.train.env_id)
        return TimeLimit(e, p.train.max_steps) if p.train.max_steps else e

    model, history = train_symbolic(env, cfg, seed=s.seed)
    with atomic_path(OUT, is_dir=True) as tmp:
        torch.save(model.state_dict(), Path(tmp) / "model.pt")
        (Path(tmp) / "meta.json").write_text(json.dumps({"env_id": p.train.env_id, "cfg": cfg.__dict__}, indent=2))
    wall = time.perf_counter() - start
    last = history[-1]
    log.info("symbolic PPO: %d frames in %.1f s, last training success %.3f", cfg.iterations * cfg.batch_size,
             wall, last.get("train/success", float("nan")))
    write_json(ROOT / "metrics" / "glam" / "symbolic.json",
               {"frames": cfg.iterations * cfg.batch_size, "wall_s": wall, "final": last})


if __name__ == "__main__":
    main()
