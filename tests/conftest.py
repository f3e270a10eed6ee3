"""Shared fixtures. Tests never download: models are built from a config in-process (``tiny``), and the
embedded SmolLM2 comes from its PyPI package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_CACHE = ROOT / ".cache" / "tests"
for var, sub in [("HF_HOME", "hf"), ("PREFECT_HOME", "prefect"), ("MPLCONFIGDIR", "matplotlib"),
                 ("XDG_CACHE_HOME", "xdg")]:
    os.environ.setdefault(var, str(_CACHE / sub))
    Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_llm():
    from llmrl.llm import load_model

    return load_model("tiny")


@pytest.fixture(scope="session")
def embedded_llm():
    """SmolLM2-135M-Instruct from the packaged GGUF, loaded once for the whole session."""
    from llmrl.llm import load_model

    return load_model("embedded:smollm2-135m-instruct", device="cpu", dtype="float32")
