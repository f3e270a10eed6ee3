"""Symbolic-PPO baseline's training: the project's CleanRL-style PPO (``llmrl.algos.distilled_ppo``, shared with LLM4Teach's
student, no teacher) on BabyAI(-Text) envs seen through ``llmrl.agents.symbolic.SymbolicObs``."""

from __future__ import annotations

import torch

from llmrl.agents.symbolic import SymbolicActorCritic, SymbolicObs
from llmrl.algos.distilled_ppo import make_vector_env, train
from llmrl.config.ppo import PPOParams

__all__ = ["train_symbolic"]


def train_symbolic(make_env, cfg: PPOParams, *, seed: int, progress: bool = True
                   ) -> tuple[SymbolicActorCritic, list[dict]]:
    """A fresh ``SymbolicActorCritic`` trained on ``cfg.num_envs`` copies of ``make_env()``; returns it and the
    per-iteration stats."""
    torch.manual_seed(seed)
    agent = SymbolicActorCritic()
    envs = make_vector_env(lambda: SymbolicObs(make_env()), cfg.num_envs)
    history = list(train(agent, envs, cfg, seed=seed, progress=progress))
    envs.close()
    return agent, history
