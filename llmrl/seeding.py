"""One seed for Python, NumPy and torch (environments and LLM sampling take it explicitly)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything"]


def seed_everything(seed: int, *, deterministic_torch: bool = True) -> np.random.Generator:
    """Seed Python, NumPy and torch; return a NumPy Generator derived from the same seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    if deterministic_torch:
        # warn_only: some CUDA kernels have no deterministic variant; CPU runs are exact either way.
        torch.use_deterministic_algorithms(True, warn_only=True)
    return np.random.default_rng(seed)
