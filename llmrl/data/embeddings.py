"""A cache of frozen text embeddings: instruction text -> vector, saved as ``.npz``.

Built by ``llmrl.llm.embed.build_table`` (mean-pooled last hidden state of a base LLM); read by KALM's offline RL
and evaluation, which therefore need no LLM import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["MissingEmbeddingError", "EmbeddingTable"]


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
