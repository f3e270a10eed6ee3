"""Shared start of every stage script: keep caches inside the repo, read and validate one params section.

Every stage lists this file as a dependency in dvc.yaml.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Nothing writes to $HOME: HF, Prefect, matplotlib and friends keep their state under .cache/ (ignored).
_CACHE = ROOT / ".cache"
for var, sub in [("HF_HOME", "hf"), ("PREFECT_HOME", "prefect"), ("MPLCONFIGDIR", "matplotlib"),
                 ("XDG_CACHE_HOME", "xdg"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                 ("TRITON_CACHE_DIR", "triton")]:
    os.environ.setdefault(var, str(_CACHE / sub))
    Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

# Before anything dispatches a torch kernel: the same float path on AVX2 and AVX-512 CPUs (llmrl/kernels.py).
from llmrl.kernels import pin_cpu_kernels  # noqa: E402

pin_cpu_kernels()

from llmrl.config import ParamsError, load_section, read_params  # noqa: E402

log = logging.getLogger("llmrl.stage")


def stage_params(section: str, model, params_file: str | os.PathLike = ROOT / "params.yaml"):
    """The validated params section; on invalid params print the key paths and exit 2 before any write."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpx2", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return load_section(read_params(params_file), section, model)
    except ParamsError as err:
        print(f"invalid params for stage {section!r}:\n{err}", file=sys.stderr)
        raise SystemExit(2) from None


@contextlib.contextmanager
def open_live(folder: str | os.PathLike) -> Iterator:
    """A dvclive logger writing curves and plots under ``folder`` only: the pipeline's dvc.yaml declares them,
    so dvclive writes no dvc.yaml, report or experiment of its own. It writes into a temporary sibling that
    replaces ``folder`` when the block ends without an error: a killed or failed stage leaves the previous
    run's curves beside the previous run's models and metrics."""
    from dvclive import Live

    from llmrl.io import atomic_path

    with atomic_path(folder, is_dir=True) as tmp, Live(dir=str(tmp), save_dvc_exp=False, dvcyaml=None,
                                                     report=None) as live:
        yield live


def model_spec(spec: str) -> str:
    """A params model spec as ``load_model`` takes it: a folder of this repo (e.g. ``models/base_llm``, a DVC
    output) as its absolute path; anything else (``embedded:...``, a hub name, an absolute path) unchanged."""
    return str(ROOT / spec) if (ROOT / spec).is_dir() else spec
