"""A cache of frozen text embeddings: instruction text -> vector, saved as ``.npz``, and the low-dimensional
projection of them that KALM's offline learners read.

Built by ``llmrl.llm.embed.build_table`` (mean-pooled last hidden state of a base LLM); read by KALM's offline RL
and evaluation, which therefore need no LLM import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["MissingEmbeddingError", "EmbeddingTable", "InstructionProjection"]


class MissingEmbeddingError(KeyError):
    """An instruction that is not in the embedding table."""

    def __str__(self) -> str:
        return str(self.args[0])


class EmbeddingTable:
    """Instruction text -> frozen embedding vector."""

    def __init__(self, instructions: Sequence[str], embeddings: np.ndarray):
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or len(embeddings) != len(instructions):
            raise ValueError(f"EmbeddingTable: {len(instructions)} instructions but embeddings of shape "
                             f"{embeddings.shape}")
        self.instructions = list(instructions)
        self.embeddings = embeddings
        self._index = {t: i for i, t in enumerate(self.instructions)}

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def get(self, text: str) -> np.ndarray:
        try:
            return self.embeddings[self._index[text]]
        except KeyError:
            raise MissingEmbeddingError(f"instruction {text!r} is not in the embedding table "
                                        f"({len(self)} instructions)") from None

    def lookup(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.get(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def __len__(self) -> int:
        return len(self.instructions)

    def __contains__(self, text: str) -> bool:
        return text in self._index

    def save(self, path: str | os.PathLike) -> None:
        from llmrl.files import atomic_path

        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, instructions=np.asarray(self.instructions, dtype=str), embeddings=self.embeddings)

    @classmethod
    def load(cls, path: str | os.PathLike) -> EmbeddingTable:
        """The table saved at ``path``. The ``.npz`` is a zip archive: every member's CRC-32 is checked before
        numpy parses it, so a damaged file is a ``DamagedFileError`` naming it, never other vectors."""
        import zipfile

        from llmrl.files import DamagedFileError

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"embedding table {path} not found")
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                raise DamagedFileError(f"{path}: member {bad!r} fails its CRC-32: the file is damaged")
            with np.load(path, allow_pickle=False) as z:
                return cls([str(t) for t in z["instructions"]], z["embeddings"])
        except DamagedFileError:
            raise
        except Exception as err:  # noqa: BLE001 - a damaged archive fails in zipfile or numpy in many ways; named
            raise DamagedFileError(f"{path}: not a readable embedding table ({type(err).__name__}: {err}); the file "
                                   "is damaged") from err


class InstructionProjection:
    """The first ``k`` principal components of a set of instruction embeddings: ``apply(x) = (x - mean) @ W``.

    Why: SmolLM2's 576-dim embeddings are constant within an episode, have one dimension with a mean of about 20 and
    a norm of about 36; beside 41 small state fields they swamp an MLP's input, and gate 0's BC could not fit its
    own training transitions (0.585 vs the majority action's 0.580; 0.95 with 8 components and standardised inputs,
    docs/measurements.md).
    Fitted on the distinct instructions of the data a learner trains on, saved with the model, applied at
    evaluation to any instruction (unseen ones land in the same subspace). Components are sign-fixed (largest
    entry positive) so a refit on the same instructions gives the same columns on every host. With fewer distinct
    instructions than ``k`` the trailing columns are zero (a fixed input size per config).
    """

    def __init__(self, mean: np.ndarray, components: np.ndarray):
        self.mean = np.asarray(mean, dtype=np.float32).reshape(-1)
        self.components = np.asarray(components, dtype=np.float32)
        if self.components.ndim != 2 or self.components.shape[0] != self.mean.shape[0]:
            raise ValueError(f"InstructionProjection: mean of size {self.mean.shape[0]} but components of shape "
                             f"{self.components.shape} (expected [{self.mean.shape[0]}, k])")

    @classmethod
    def fit(cls, embeddings: np.ndarray, k: int) -> InstructionProjection:
        """Principal components of the rows of ``embeddings`` (one per distinct instruction)."""
        x = np.asarray(embeddings, dtype=np.float64)
        if k < 1:
            raise ValueError(f"InstructionProjection: k must be at least 1, got {k}")
        if x.ndim != 2 or len(x) == 0:
            raise ValueError(f"InstructionProjection: need a non-empty [n, d] array of embeddings, got {x.shape}")
        mean = x.mean(0)
        _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
        rank = min(k, len(x) - 1, x.shape[1])
        w = np.zeros((x.shape[1], k))
        w[:, :rank] = vt[:rank].T
        signs = np.sign(w[np.abs(w).argmax(0), np.arange(k)])
        return cls(mean, w * np.where(signs == 0, 1.0, signs))

    @property
    def dim(self) -> int:
        return int(self.components.shape[1])

    @property
    def input_dim(self) -> int:
        return int(self.mean.shape[0])

    def apply(self, embeddings: np.ndarray) -> np.ndarray:
        x = np.asarray(embeddings, dtype=np.float32)
        if x.shape[-1] != self.input_dim:
            raise ValueError(f"InstructionProjection: embeddings of size {x.shape[-1]}, fitted on size "
                             f"{self.input_dim}")
        return ((x - self.mean) @ self.components).astype(np.float32)

    def save(self, path: str | os.PathLike) -> None:
        from llmrl.files import atomic_path

        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, mean=self.mean, components=self.components)

    @classmethod
    def load(cls, path: str | os.PathLike) -> InstructionProjection:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["mean"], z["components"])
