"""A d3rlpy policy conditioned on a frozen instruction embedding, usable by the evaluation harness.

The input is the flat observation, then BabyAI's egocentric features of it when the policy was trained with them
(``policy_observation``; ``policy_input.json`` beside the model records it), then the instruction's embedding (the
layout ``llmrl.algos.kalm_offline.build_dataset`` trains on), projected by the model's ``InstructionProjection``
when it was trained with one (``projection.npz`` beside the model: callers pass the raw table embedding either way).
d3rlpy's ``predict`` is greedy (the mean action of a continuous policy, the arg-max of a discrete one); a DiscreteBC
policy's action distribution is ``action_probs``, what a sampled evaluation draws from
(``llmrl.eval.kalm.offline_act``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from llmrl.data.embeddings import InstructionProjection
from llmrl.envs.kalm_egocentric import EGOCENTRIC_DIM, egocentric_features

__all__ = ["OfflinePolicy", "save_learnable", "policy_observation", "PROJECTION_FILE", "INPUT_FILE"]

PROJECTION_FILE = "projection.npz"
INPUT_FILE = "policy_input.json"  # {"egocentric": bool}: the observation columns the policy was trained on


def policy_observation(obs: np.ndarray, egocentric: bool) -> np.ndarray:
    """A policy's observation columns [..., d (+ EGOCENTRIC_DIM)]: ``obs`` followed, with ``egocentric``, by BabyAI's
    egocentric features of it (``kalm_egocentric.egocentric_features``); what training and acting both read."""
    obs = np.asarray(obs, dtype=np.float32)
    return np.concatenate([obs, egocentric_features(obs)], -1) if egocentric else obs


def _listed(folder: Path, name: str) -> bool:
    """``name`` is in ``folder`` or in its checksum manifest (a deleted listed file must fail the checksum check,
    not later as a size mismatch)."""
    from llmrl.files import CHECKSUMS_FILE

    manifest = folder / CHECKSUMS_FILE
    return (folder / name).is_file() or (manifest.is_file() and any(
        line.endswith(f"  {name}") for line in manifest.read_text().splitlines()))


class OfflinePolicy:
    """Harness ``Policy`` for one instruction; ``act_batch`` serves lockstep evaluation of many episodes."""

    def __init__(self, learnable, embedding: np.ndarray, name: str = "offline", obs_dim: int | None = None,
                 projection: InstructionProjection | None = None, *, egocentric: bool = False):
        self.learnable = learnable
        self.embedding = np.asarray(embedding, dtype=np.float32).reshape(-1)
        self.name = name
        self.obs_dim = obs_dim
        self.projection = projection
        self.egocentric = egocentric

    @classmethod
    def load(cls, path: str | os.PathLike, embedding: np.ndarray, name: str = "offline") -> OfflinePolicy:
        """The d3rlpy model saved at ``path``, once its folder's ``SHA256SUMS`` vouches for it (d3rlpy's file is a
        pickle with no checksum: a damaged one is a ``DamagedFileError`` naming it, never unpickled)."""
        import d3rlpy

        from llmrl.files import read_json, verify_checksums

        path = Path(path)
        extras = [f for f in (PROJECTION_FILE, INPUT_FILE) if _listed(path.parent, f)]
        verify_checksums(path.parent, [path.name, *extras])
        projection = InstructionProjection.load(path.parent / PROJECTION_FILE) if PROJECTION_FILE in extras else None
        # a folder without the record holds a policy of the observation and instruction alone
        egocentric = bool(read_json(path.parent / INPUT_FILE)["egocentric"]) if INPUT_FILE in extras else False
        return cls(d3rlpy.load_learnable(str(path), device=False), embedding, name, projection=projection,
                   egocentric=egocentric)

    def with_instruction(self, embedding: np.ndarray) -> OfflinePolicy:
        return OfflinePolicy(self.learnable, embedding, self.name, self.obs_dim, self.projection,
                             egocentric=self.egocentric)

    def reset(self, env: gym.Env, seed: int) -> None:
        pass  # greedy and stateless

    def act(self, obs: Any, *, greedy: bool = True) -> Any:
        return self.act_batch(np.asarray(obs, dtype=np.float32)[None], self.embedding[None])[0]

    def act_batch(self, obs: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` [n, d] under per-row instruction ``embeddings`` [n, e]."""
        return self.learnable.predict(self._input(obs, embeddings))

    def action_probs(self, obs: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
        """The action distribution [n, actions] of a discrete imitation policy (d3rlpy's DiscreteBC) for ``obs``
        under ``embeddings``: what a sampled evaluation draws from. d3rlpy's own ``sample_action`` is the arg-max for
        BC, so the logits are read from its imitator; other algorithms raise ``ValueError``."""
        import torch
        from d3rlpy.models.torch import CategoricalPolicy

        imitator = getattr(getattr(self.learnable.impl, "modules", None), "imitator", None)
        if not isinstance(imitator, CategoricalPolicy):
            raise ValueError(f"OfflinePolicy {self.name}: sampled actions need a discrete imitation policy "
                             f"(DiscreteBC), not {type(self.learnable).__name__}")
        x = torch.as_tensor(self._input(obs, embeddings))
        with torch.no_grad():
            if self.learnable.observation_scaler is not None:
                x = self.learnable.observation_scaler.transform(x)
            return torch.softmax(imitator(x).logits, dim=-1).numpy()

    def _input(self, obs: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if self.projection is not None:
            embeddings = self.projection.apply(embeddings)
        x = np.concatenate([policy_observation(obs, self.egocentric), embeddings], 1)
        expected = self.learnable.observation_shape[0] if self.learnable.impl is not None else x.shape[1]
        if x.shape[1] != expected:
            ego = f" + egocentric {EGOCENTRIC_DIM}" if self.egocentric else ""
            raise ValueError(f"OfflinePolicy {self.name}: input size {x.shape[1]} (obs {obs.shape[1]}{ego} + "
                             f"instruction {embeddings.shape[1]}) but the model takes {expected}: egocentric="
                             f"{self.egocentric} ({INPUT_FILE}, from kalm.env.babyai_egocentric_input) or the "
                             "instruction projection is not what the model was trained with")
        return x


def save_learnable(learnable, path: str | os.PathLike, projection: InstructionProjection | None = None, *,
                   egocentric: bool) -> None:
    """d3rlpy's ``save`` to ``path`` (a pickle that carries no checksum), the instruction ``projection`` it was
    trained with and whether its input carries the egocentric features (``INPUT_FILE``) beside it, then the
    checksums of its folder (``SHA256SUMS``), which ``OfflinePolicy.load`` checks before unpickling."""
    from llmrl.files import write_checksums, write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    learnable.save(str(path))
    if projection is not None:
        projection.save(path.parent / PROJECTION_FILE)
    write_json(path.parent / INPUT_FILE, {"egocentric": bool(egocentric)})
    write_checksums(path.parent)
