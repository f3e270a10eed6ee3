"""Where the pipeline's artifacts live, named here once: one folder per kind and method, and every stage's outputs.

Every stage writes under ``<kind>/<method>/`` (kind: data, models, metrics, plots; method: the names of the
params sections, see README "Layout"). Each stage has a function here, named like the stage and taking the
arguments of its ``cmd`` in dvc.yaml, that returns its outputs by role; the stage module writes there, and a stage
reading another's results asks that stage's function (``glam_symbolic().model``). dvc.yaml declares the same paths
as the stage's outs, metrics and plots, which DVC needs spelled out; tests/test_stage_paths.py resolves every
stage of dvc.yaml (foreach items included) and checks that its declared outputs and this module's agree both ways,
and that no stage module spells a folder or reaches into the method folders itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("data", "models", "metrics", "plots")
# The tier whose pipeline runs this stage: the default pipeline (dvc.yaml) writes under the repository root, the
# study pipeline (study/dvc.yaml, LLMRL_TIER=study; pipelines/tiers.py) under study/, with study/params.yaml.
TIERS = ("default", "study")
TIER = os.environ.get("LLMRL_TIER", "default")
if TIER not in TIERS:
    raise SystemExit(f"LLMRL_TIER={TIER!r}: known tiers with a pipeline of their own are {list(TIERS)}")
OUT = ROOT if TIER == "default" else ROOT / TIER
PARAMS = OUT / "params.yaml"
CACHE = ROOT / ".cache"  # library caches (HF, Prefect, matplotlib, ...): ignored by git and DVC
RESUME = CACHE / ("resume" if TIER == "default" else f"resume-{TIER}")  # restart points of long trainings


@dataclass(frozen=True)
class Folders:
    """The four artifact folders of one method (or of the shared stages' group)."""

    name: str

    @property
    def data(self) -> Path:
        return OUT / "data" / self.name

    @property
    def models(self) -> Path:
        return OUT / "models" / self.name

    @property
    def metrics(self) -> Path:
        return OUT / "metrics" / self.name

    @property
    def plots(self) -> Path:
        return OUT / "plots" / self.name


GLAM, LLM_RL, LLM4TEACH, KALM, PROPS = (Folders(n) for n in ("glam", "llm_rl", "llm4teach", "kalm", "props"))
BASELINES = Folders("baselines")  # the BabyAI bot and random policy (stage eval_baselines)
FOLDERS = (GLAM, LLM_RL, LLM4TEACH, KALM, PROPS, BASELINES)
# The shared stages' outputs are the default pipeline's in every tier; each tier has its own results page.
SHARED = {"base_llm": ROOT / "models" / "base_llm", "demos": ROOT / "data" / "demos", "reports": OUT / "reports"}


class Outputs(dict):
    """One stage's outputs by role (``out.model`` or ``out["model"]``); a dvclive folder's role is ``live``."""

    def __init__(self, stage: str, **paths: Path):
        super().__init__(paths)
        self.stage = stage

    def __getattr__(self, role: str) -> Path:
        try:
            return self[role]
        except KeyError:
            raise AttributeError(f"stage {self.stage} has no output {role!r} (it has {sorted(self)})") from None


# --- shared stages ---------------------------------------------------------------------------------------------
def base_llm() -> Outputs:
    return Outputs("base_llm", model=SHARED["base_llm"])


def demos() -> Outputs:
    return Outputs("demos", demos=SHARED["demos"])


def eval_baselines() -> Outputs:
    return Outputs("eval_baselines", eval=BASELINES.metrics / "eval", episodes=BASELINES.metrics / "episodes",
                   live=BASELINES.plots / "eval")


def report() -> Outputs:
    return Outputs("report", page=SHARED["reports"])


# --- LLM_RL ------------------------------------------------------------------------------------------------------
def llm_rl_data() -> Outputs:
    return Outputs("llm_rl_data", data=LLM_RL.data)


def llm_rl_train(variant: str, seed: int | str) -> Outputs:
    run = f"seed-{seed}"
    return Outputs(f"llm_rl_train@{variant}-{seed}", model=LLM_RL.models / variant / run,
                   metrics=LLM_RL.metrics / "train" / variant / f"{run}.json",
                   live=LLM_RL.plots / "train" / variant / run)


def llm_rl_eval() -> Outputs:
    return Outputs("llm_rl_eval", responses=LLM_RL.metrics / "responses", eval=LLM_RL.metrics / "eval",
                   live=LLM_RL.plots / "eval")


# --- GLAM --------------------------------------------------------------------------------------------------------
def glam_train(item: str) -> Outputs:
    return Outputs(f"glam_train@{item}", model=GLAM.models / item, metrics=GLAM.metrics / "train" / f"{item}.json",
                   live=GLAM.plots / "train" / item)


def glam_bc() -> Outputs:
    return Outputs("glam_bc", model=GLAM.models / "bc", metrics=GLAM.metrics / "bc.json")


def glam_symbolic() -> Outputs:
    return Outputs("glam_symbolic", model=GLAM.models / "symbolic", metrics=GLAM.metrics / "symbolic.json")


def glam_eval() -> Outputs:
    return Outputs("glam_eval", eval=GLAM.metrics / "eval", episodes=GLAM.metrics / "episodes",
                   live=GLAM.plots / "eval")


def glam_generalisation() -> Outputs:
    return Outputs("glam_generalisation", metrics=GLAM.metrics / "generalisation",
                   prompts=GLAM.metrics / "generalisation_prompts", live=GLAM.plots / "generalisation")


# --- LLM4Teach ---------------------------------------------------------------------------------------------------
def llm4teach_plans() -> Outputs:
    return Outputs("llm4teach_plans", replies=LLM4TEACH.data / "replies", plans=LLM4TEACH.data / "plans",
                   metrics=LLM4TEACH.metrics / "plans")


def llm4teach_train(env: str, teacher: str) -> Outputs:
    group = f"{env}-{teacher}"
    return Outputs(f"llm4teach_train@{group}", models=LLM4TEACH.models / group,
                   records=LLM4TEACH.metrics / "train" / group, plots=LLM4TEACH.plots / "train" / group)


def llm4teach_train_mpe(teacher: str) -> Outputs:
    return Outputs(f"llm4teach_train_mpe@{teacher}", **llm4teach_train("mpe", teacher))


def llm4teach_eval() -> Outputs:
    return Outputs("llm4teach_eval", eval=LLM4TEACH.metrics / "eval", episodes=LLM4TEACH.metrics / "episodes",
                   result=LLM4TEACH.metrics / "result", claims=LLM4TEACH.metrics / "claims",
                   report=LLM4TEACH.metrics / "report.json",
                   live=LLM4TEACH.plots / "eval")


# --- KALM --------------------------------------------------------------------------------------------------------
def kalm_data() -> Outputs:
    return Outputs("kalm_data", real=KALM.data / "real", metrics=KALM.metrics / "data.json")


def kalm_ground(benchmark: str, seed: int | str) -> Outputs:
    """Grounding seed ``seed`` of ``benchmark``: its model, curves and metrics (gate 0's episodes included)."""
    return Outputs(f"kalm_ground@{benchmark}-{seed}", model=KALM.models / "grounded" / benchmark / str(seed),
                   plots=KALM.plots / "ground" / benchmark / str(seed),
                   metrics=KALM.metrics / "ground" / benchmark / f"{seed}.json")


def kalm_gate0(benchmark: str) -> Outputs:
    """Gate 0 of ``benchmark`` pooled over its grounding seeds (kalm_ground@<benchmark>-<seed>)."""
    return Outputs(f"kalm_gate0@{benchmark}", metrics=KALM.metrics / "gate0" / f"{benchmark}.json")


def kalm_imagine(benchmark: str, level: str) -> Outputs:
    name = f"{benchmark}_{level}"
    return Outputs(f"kalm_imagine@{benchmark}-{level}", data=KALM.data / "imagine" / benchmark / f"{level}.h5",
                   report=KALM.data / "imagine_report" / f"{name}.json", metrics=KALM.metrics / f"imagine_{name}.json")


def kalm_offline(benchmark: str, algo: str, data: str) -> Outputs:
    """Offline run ``algo`` (a key of kalm.offline.algos) of ``benchmark`` on ``data`` (real, or real + imagined),
    under the benchmark's folder so that each benchmark's evaluation depends on its own runs only."""
    group = f"{algo}-{data}"
    return Outputs(f"kalm_offline_{data}@{algo}", models=KALM.models / "offline" / benchmark / group,
                   plots=KALM.plots / "offline" / benchmark / group)


def kalm_offline_real(benchmark: str, algo: str) -> Outputs:
    return kalm_offline(benchmark, algo, "real")


def kalm_offline_imagine(benchmark: str, algo: str) -> Outputs:
    return kalm_offline(benchmark, algo, "imagine")


def kalm_eval(benchmark: str) -> Outputs:
    """Evaluation of ``benchmark``'s policies (kalm_eval@<benchmark>): one benchmark is evaluated, and re-run,
    without the other's stages."""
    return Outputs(f"kalm_eval@{benchmark}", eval=KALM.metrics / "eval" / benchmark,
                   success=KALM.metrics / "success" / benchmark, live=KALM.plots / "eval" / benchmark)


# --- ProPS -------------------------------------------------------------------------------------------------------
def props_search(task: str) -> Outputs:
    return Outputs(f"props_search@{task}", runs=PROPS.data / "search" / task,
                   replies=PROPS.data / "replies" / f"search-{task}", curves=PROPS.plots / "search" / task)


def props_baselines() -> Outputs:
    return Outputs("props_baselines", runs=PROPS.data / "baselines", curves=PROPS.plots / "baselines")


def props_grpo_part(part: int | str, parts: int | str, seed: int | str) -> Outputs:
    """Part ``part`` (of ``parts``, the stage's command arguments; the path is the part's) of the GRPO run of
    training seed ``seed``: its checkpoint, best adapter and records."""
    return Outputs(f"props_grpo_part@part{int(part) - 1}-{seed}",
                   state=PROPS.models / "grpo_parts" / str(int(part)) / str(seed))


def props_grpo(seed: int | str, parts: int | str | None = None) -> Outputs:
    """The published run of training seed ``seed`` (``parts``: its command's part count, not in the path)."""
    return Outputs(f"props_grpo@{seed}", adapter=PROPS.models / "grpo" / str(seed), data=PROPS.data / "grpo" / str(seed),
                   metrics=PROPS.metrics / "grpo" / f"{seed}.json", live=PROPS.plots / "grpo" / str(seed))


def props_heldout_tuned(seed: int | str) -> Outputs:
    return Outputs(f"props_heldout_tuned@{seed}", runs=PROPS.data / "heldout" / "tuned" / str(seed),
                   replies=PROPS.data / "replies" / "heldout" / f"tuned-{seed}")


def props_heldout_reference() -> Outputs:
    return Outputs("props_heldout_reference", runs=PROPS.data / "heldout" / "reference",
                   replies=PROPS.data / "replies" / "heldout" / "base")


def props_heldout() -> Outputs:
    return Outputs("props_heldout", metrics=PROPS.metrics / "heldout.json", report=PROPS.plots / "heldout.json")


def props_transfer(task: str, seed: int) -> Outputs:
    return Outputs(f"props_transfer@{task}-{seed}", runs=PROPS.data / "transfer" / task / str(seed),
                   replies=PROPS.data / "replies" / f"transfer-{task}-{seed}")


def props_repeat_control(task: str, seed: int) -> Outputs:
    return Outputs(f"props_repeat_control@{task}-{seed}", runs=PROPS.data / "repeat_control" / task / str(seed),
                   replies=PROPS.data / "replies" / f"repeat_control-{task}-{seed}")


def props_quadratic() -> Outputs:
    return Outputs("props_quadratic", runs=PROPS.data / "quadratic", replies=PROPS.data / "replies" / "quadratic")


def props_eval() -> Outputs:
    return Outputs("props_eval", metrics=PROPS.metrics / "eval", report=PROPS.plots / "report.json",
                   environment=PROPS.plots / "environment.json", videos=PROPS.plots / "videos",
                   curves=PROPS.plots / "curves")
