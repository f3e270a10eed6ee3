"""Symbolic-PPO baseline: a small MLP on the 7x7 grid encoding, the direction and the mission's words.

The original used BabyAI's FiLM-CNN; on 7x7 views a small flat MLP is enough and trains in seconds on a CPU.
The mission is a bag of words over BabyAI's vocabulary, so the network sees the same goal the LLM reads.
Trained with the project's PPO by ``llmrl.algos.symbolic_ppo.train_symbolic``; ``SymbolicPolicy`` plugs it into
the harness.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from llmrl.files import atomic_path, save_torch, verify_checksums, write_checksums

__all__ = ["SymbolicObs", "SymbolicActorCritic", "SymbolicPolicy", "save_symbolic", "load_symbolic"]

VOCAB = ("go", "to", "pick", "up", "open", "put", "next", "the", "a", "then", "after", "you", "and", "red", "green",
         "blue", "purple", "yellow", "grey", "key", "ball", "box", "door", "object", "on", "your", "left", "right",
         "in", "front", "of", "behind")
_INDEX = {w: i for i, w in enumerate(VOCAB)}
OBS_DIM = 7 * 7 * 3 + 4 + len(VOCAB)


def encode(obs: dict[str, Any]) -> np.ndarray:
    """[7*7*3 grid scaled to ~0..1, 4 direction one-hot, |VOCAB| word counts] as float32."""
    image = np.asarray(obs["image"], dtype=np.float32) / np.array([10.0, 5.0, 2.0], dtype=np.float32)
    direction = np.zeros(4, dtype=np.float32)
    direction[int(obs["direction"])] = 1.0
    words = np.zeros(len(VOCAB), dtype=np.float32)
    for w in obs["mission"].replace(",", " ").split():
        if w in _INDEX:
            words[_INDEX[w]] += 1.0
    return np.concatenate([image.reshape(-1), direction, words])


class SymbolicObs(gym.ObservationWrapper):
    """BabyAI(-Text) dict observations -> the flat vector of ``encode``."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = spaces.Box(0.0, 10.0, shape=(OBS_DIM,), dtype=np.float32)
        self.action_space = spaces.Discrete(6)

    def observation(self, obs: dict[str, Any]) -> np.ndarray:
        return encode(obs)


class SymbolicActorCritic(nn.Module):
    """Two-layer tanh MLP trunk with policy and value heads: ``obs [B, D] -> (logits [B, 6], value [B])``."""

    def __init__(self, obs_dim: int = OBS_DIM, n_actions: int = 6, hidden: int = 64):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs.float())
        return self.pi(h), self.v(h).squeeze(-1)


class SymbolicPolicy:
    """Harness policy over a trained ``SymbolicActorCritic``; sampled mode draws from a per-episode seed."""

    def __init__(self, model: SymbolicActorCritic, name: str = "symbolic_ppo"):
        self.model, self.name = model.eval(), name
        self.gen = torch.Generator().manual_seed(0)

    def reset(self, env: gym.Env, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(int(seed))

    def act(self, obs: dict[str, Any], *, greedy: bool) -> int:
        with torch.no_grad():
            logits, _ = self.model(torch.as_tensor(encode(obs))[None])
        probs = torch.softmax(logits[0], -1)
        return int(probs.argmax()) if greedy else int(torch.multinomial(probs, 1, generator=self.gen))


def save_symbolic(folder: str | Path, models: dict[int, SymbolicActorCritic], meta: dict) -> None:
    """One ``<seed>/model.pt`` per trained model, ``meta.json`` and their checksums (``SHA256SUMS``, checked by
    ``load_symbolic``), written atomically into ``folder``."""
    with atomic_path(folder, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        for seed, model in models.items():
            (tmp / str(seed)).mkdir()
            save_torch(model.state_dict(), tmp / str(seed) / "model.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        write_checksums(tmp)


def load_symbolic(folder: str | Path, seed: int) -> SymbolicActorCritic:
    """Seed ``seed``'s model saved by ``save_symbolic``; a damaged file is a ``DamagedFileError`` naming it, raised
    before the file is read."""
    folder = Path(folder)
    verify_checksums(folder, [f"{seed}/model.pt"])
    model = SymbolicActorCritic()
    model.load_state_dict(torch.load(folder / str(seed) / "model.pt", weights_only=True))
    return model
