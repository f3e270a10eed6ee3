"""Process-wide settings a program makes once, at its start, before torch, transformers or the HF hub are imported.

Called by the stage scripts (``stages/common.prepare_stage_process``), the benchmarks and the selection scripts;
importing this module changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["keep_caches_under"]

# Libraries that keep state under $HOME read these variables once, at import.
CACHE_VARIABLES = {"HF_HOME": "hf", "PREFECT_HOME": "prefect", "MPLCONFIGDIR": "matplotlib", "XDG_CACHE_HOME": "xdg",
                   "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
QUIET_VARIABLES = {"HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "DVC_NO_ANALYTICS": "1"}


def keep_caches_under(folder: str | os.PathLike) -> None:
    """Point HF, Prefect, matplotlib, XDG, inductor and triton caches into ``folder`` (created), so nothing writes
    to $HOME; variables the user exported win. Also turns telemetry and tokenizer fork warnings off."""
    for var, sub in CACHE_VARIABLES.items():
        os.environ.setdefault(var, str(Path(folder) / sub))
        Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
    for var, value in QUIET_VARIABLES.items():
        os.environ.setdefault(var, value)
