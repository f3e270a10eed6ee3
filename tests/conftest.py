"""Shared fixtures. Tests never download: models are built from a config in-process (``tiny``), and the
embedded SmolLM2 comes from its PyPI package."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The suite's own state: Prefect's database, DVC's site cache and config, the HF hub, matplotlib and XDG caches live
# in a folder of this test session, never in the workspace's .cache/ (where `make prefect-ui` shows the pipeline's
# flows) nor in $HOME. Set here, at conftest import, because Prefect and the HF hub read these variables once, when a
# test module first imports them; set over what `make test` exports (the workspace's folders). A test that needs
# a server or home of its own (tests/hosts_lab.py, the pool tests) sets its own on top.
STATE = Path(tempfile.mkdtemp(prefix="llmrl-test-state-"))
STATE_VARIABLES = {"HF_HOME": "hf", "PREFECT_HOME": "prefect", "MPLCONFIGDIR": "matplotlib", "XDG_CACHE_HOME": "xdg",
                   "DVC_SITE_CACHE_DIR": "dvc-site", "DVC_GLOBAL_CONFIG_DIR": "dvc-global",
                   "DVC_SYSTEM_CONFIG_DIR": "dvc-system", "TORCHINDUCTOR_CACHE_DIR": "inductor",
                   "TRITON_CACHE_DIR": "triton"}
for var, sub in STATE_VARIABLES.items():
    os.environ[var] = str(STATE / sub)
    (STATE / sub).mkdir()
os.environ.pop("PREFECT_API_URL", None)  # a user's server (`make prefect-ui`) is not the tests' business
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def test_state():
    """The session's state folder (Prefect, DVC, HF, ...: ``STATE_VARIABLES``), removed when the session ends."""
    yield STATE
    shutil.rmtree(STATE, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_llm():
    from llmrl.llm.load import load_model

    return load_model("tiny")


@pytest.fixture(scope="session")
def embedded_llm():
    """SmolLM2-135M-Instruct from the packaged GGUF, loaded once for the whole session."""
    from llmrl.llm.load import load_model

    return load_model("embedded:smollm2-135m-instruct", device="cpu", dtype="float32")
