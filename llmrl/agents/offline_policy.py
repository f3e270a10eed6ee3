"""A d3rlpy policy conditioned on a frozen instruction embedding, usable by the evaluation harness.

The input is the flat observation followed by the instruction's embedding (the layout
``llmrl.algos.kalm_offline.build_dataset`` trains on). d3rlpy's ``predict`` is greedy (the mean action of a
continuous policy, the arg-max of a discrete one), so this policy has no sampled mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["OfflinePolicy", "save_learnable"]


class OfflinePolicy:
    """Harness ``Policy`` for one instruction; ``act_batch`` serves lockstep evaluation of many episodes."""

    def __init__(self, learnable, embedding: np.ndarray, name: str = "offline", obs_dim: int | None = None):
        self.learnable = learnable
        self.embedding = np.asarray(embedding, dtype=np.float32).reshape(-1)
        self.name = name
        self.obs_dim = obs_dim

    @classmethod
    def load(cls, path: str | os.PathLike, embedding: np.ndarray, name: str = "offline") -> OfflinePolicy:
        """The d3rlpy model saved at ``path``, once its folder's ``SHA256SUMS`` vouches for it (d3rlpy's file is a
        pickle with no checksum: a damaged one is a ``DamagedFileError`` naming it, never unpickled)."""
        import d3rlpy

        from llmrl.files import verify_checksums

        verify_checksums(Path(path).parent, [Path(path).name])
        return cls(d3rlpy.load_learnable(str(path), device=False), embedding, name)

    def with_instruction(self, embedding: np.ndarray) -> OfflinePolicy:
        return OfflinePolicy(self.learnable, embedding, self.name, self.obs_dim)

    def reset(self, env: gym.Env, seed: int) -> None:
        pass  # greedy and stateless

    def act(self, obs: Any, *, greedy: bool = True) -> Any:
        return self.act_batch(np.asarray(obs, dtype=np.float32)[None], self.embedding[None])[0]

    def act_batch(self, obs: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` [n, d] under per-row instruction ``embeddings`` [n, e]."""
        x = np.concatenate([np.asarray(obs, dtype=np.float32), np.asarray(embeddings, dtype=np.float32)], 1)
        expected = self.learnable.observation_shape[0] if self.learnable.impl is not None else x.shape[1]
        if x.shape[1] != expected:
            raise ValueError(f"OfflinePolicy {self.name}: input size {x.shape[1]} (obs {obs.shape[1]} + "
                             f"embedding {embeddings.shape[1]}) but the model takes {expected}")
        return self.learnable.predict(x)


def save_learnable(learnable, path: str | os.PathLike) -> None:
    """d3rlpy's ``save`` to ``path`` (a pickle that carries no checksum), then the checksums of its folder
    (``SHA256SUMS``), which ``OfflinePolicy.load`` checks before unpickling."""
    from llmrl.files import write_checksums

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    learnable.save(str(path))
    write_checksums(path.parent)
