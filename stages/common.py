"""What every stage shares: its process set-up, its params section, its dvclive logger, model specs.

Importing this module changes nothing; the ``stages`` package calls ``prepare_stage_process()`` when Python runs a
stage module (``python -m stages.<name>``). Every stage lists this file as a dependency in dvc.yaml.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from llmrl.config import ParamsError, load_section, read_params
from llmrl.kernels import pin_cpu_kernels
from llmrl.process import keep_caches_under
from stages.paths import CACHE, PARAMS, ROOT

__all__ = ["log", "model_spec", "open_live", "prepare_stage_process", "stage_arguments", "stage_params"]


log = logging.getLogger("llmrl.stage")


def prepare_stage_process() -> None:
    """The stage process's set-up, before it imports torch, transformers or the HF hub (they read these variables
    at import): caches under the repo's .cache/ (nothing writes to $HOME) and ATen's and oneDNN's kernels pinned to
    one float path (``llmrl.kernels``; before torch's first kernel dispatch). Both are environment variables, so
    the worker processes a stage spawns inherit them."""
    keep_caches_under(CACHE)
    pin_cpu_kernels()


def stage_arguments(stage: str, argv: list[str] | None, **positional: str) -> argparse.Namespace:
    """The stage's command-line arguments (what follows ``python -m stages.<stage>`` in dvc.yaml's cmd), one
    positional per keyword, its value the help text; ``argv`` None reads ``sys.argv``. A wrong count is a usage
    error naming them (exit 2)."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{stage}")
    for name, text in positional.items():
        parser.add_argument(name, help=text)
    return parser.parse_args(argv)


def stage_params(section: str, model, params_file: str | os.PathLike = PARAMS):
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

    from llmrl.files import atomic_path

    with atomic_path(folder, is_dir=True) as tmp, Live(dir=str(tmp), save_dvc_exp=False, dvcyaml=None,
                                                     report=None) as live:
        yield live


def model_spec(spec: str) -> str:
    """A params model spec as ``load_model`` takes it: a folder of this repo (e.g. ``models/base_llm``, a DVC
    output) as its absolute path; anything else (``embedded:...``, a hub name, an absolute path) unchanged."""
    return str(ROOT / spec) if (ROOT / spec).is_dir() else spec
