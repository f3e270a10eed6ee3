"""Where the pipeline's artifacts live: one folder per kind and method, named here once.

Every stage writes under ``<kind>/<method>/`` (kind: data, models, metrics, plots; method: the names of the
params sections, see README "Layout"); a stage script takes its folders from here and adds only its own leaf
names, which dvc.yaml declares as the stage's outs (tests/test_stage_paths.py checks that every out of dvc.yaml
lies in a folder named here, and that no stage script spells a folder itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("data", "models", "metrics", "plots")


@dataclass(frozen=True)
class Folders:
    """The four artifact folders of one method (or of the shared stages' group)."""

    name: str

    @property
    def data(self) -> Path:
        return ROOT / "data" / self.name

    @property
    def models(self) -> Path:
        return ROOT / "models" / self.name

    @property
    def metrics(self) -> Path:
        return ROOT / "metrics" / self.name

    @property
    def plots(self) -> Path:
        return ROOT / "plots" / self.name


GLAM, LLM_RL, LLM4TEACH, KALM, PROPS = (Folders(n) for n in ("glam", "llm_rl", "llm4teach", "kalm", "props"))
BASELINES = Folders("baselines")  # the BabyAI bot and random policy (stage eval_baselines)
BASE_LLM = ROOT / "models" / "base_llm"  # the base model every LLM stage starts from (stage base_llm)
DEMOS = ROOT / "data" / "demos"  # BabyAI bot demonstrations (stage demos)
REPORTS = ROOT / "reports"  # the results page (stage report)
CACHE = ROOT / ".cache"  # library caches (HF, Prefect, matplotlib, ...): ignored by git and DVC
RESUME = CACHE / "resume"  # restart points of long trainings: scratch, never a DVC out
FOLDERS = (GLAM, LLM_RL, LLM4TEACH, KALM, PROPS, BASELINES)
