"""A whole parameter set (params.yaml, study/params.yaml, any composed profile), validated section by section by
the same models the stages use, and the tiers a method's section can come from (``conf/<method>/<tier>.yaml``).

The models' defaults are the default tier: ``default_profile(name)`` is a section as ``conf/<method>/default.yaml``
(generated from it by ``python -m pipelines.tiers --write``) lists it, so ``GlamParams()`` in Python holds the values
the pipeline's default runs."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, Field, model_validator
from pydantic_core import to_jsonable_python

from llmrl.config import (TIER_HELP, BaseLLMParams, DemosParams, EvalBaselinesParams, ParamsError, Section, TierName,
                          load_section)
from llmrl.config.glam import GlamParams
from llmrl.config.kalm import (KalmDataParams, KalmEnvParams, KalmEvalParams, KalmGroundParams, KalmImagineParams,
                               KalmOfflineParams)
from llmrl.config.llm4teach import LLM4TeachParams
from llmrl.config.llm_rl import MathDataParams, MathEvalParams, ReinforceTrainParams
from llmrl.config.props import PropsParams
from llmrl.config.report import ReportParams

__all__ = ["GENERATED_KEY", "KalmParams", "LLMRLParams", "SECTIONS", "validate_params", "compose", "listed",
           "default_profile"]


class KalmParams(Section):
    """The whole ``kalm:`` section of a profile."""

    tier: TierName = Field("default", description=TIER_HELP)
    env: KalmEnvParams = Field(default_factory=KalmEnvParams, description="horizons, the BabyAI room and its "
                              "policies' inputs")
    data: KalmDataParams = Field(default_factory=KalmDataParams, description="offline data (stage kalm_data)")
    offline: KalmOfflineParams = Field(default_factory=KalmOfflineParams, description="offline RL (stages "
                                       "kalm_offline_real, kalm_offline_imagine)")
    eval: KalmEvalParams = Field(default_factory=KalmEvalParams, description="evaluation (stage kalm_eval@<benchmark>)")
    ground: KalmGroundParams = Field(default_factory=KalmGroundParams, description="grounding (stage kalm_ground)")
    imagine: KalmImagineParams = Field(default_factory=KalmImagineParams, description="imagined rollouts (stage "
                                       "kalm_imagine)")

    @model_validator(mode="after")
    def _benchmarks_agree(self) -> KalmParams:
        # kalm_eval@<b> runs for each grounded benchmark and evaluates its learners; kalm_offline_imagine@<algo> reads
        # its benchmark's imagined data and every benchmark trains on recorded data: one list each, and they must agree
        learners = sorted({a.benchmark for a in self.offline.algos.values()})
        if learners != sorted(self.ground.benchmarks):
            raise ValueError(f"kalm.offline.algos train on {learners} but kalm.ground.benchmarks is "
                             f"{sorted(self.ground.benchmarks)}: each grounded benchmark needs a learner (its "
                             "kalm_eval@<benchmark>) and each learner its benchmark's imagined data")
        missing = sorted(set(learners) - set(self.data.benchmarks))
        if missing:
            raise ValueError(f"kalm.data.benchmarks lacks {missing}, which kalm.offline.algos and kalm.ground train on")
        return self


class LLMRLParams(Section):
    """The whole ``llm_rl:`` section of a profile."""

    tier: TierName = Field("default", description=TIER_HELP)
    data: MathDataParams = Field(default_factory=MathDataParams, description="problems (stage llm_rl_data)")
    train: ReinforceTrainParams = Field(default_factory=ReinforceTrainParams, description="both variants (stage "
                                        "llm_rl_train)")
    eval: MathEvalParams = Field(default_factory=MathEvalParams, description="evaluation (stage llm_rl_eval)")


#: Every top-level section of a parameter set and its model.
SECTIONS: dict[str, type[Section]] = {
    "base_llm": BaseLLMParams, "demos": DemosParams, "eval_baselines": EvalBaselinesParams,
    "llm_rl": LLMRLParams, "glam": GlamParams, "llm4teach": LLM4TeachParams, "kalm": KalmParams,
    "props": PropsParams, "report": ReportParams,
}
#: A parameter set's note to its reader (conf/config.yaml), not a section: params.yaml is composed by DVC at
#: ``dvc exp run``, which drops YAML comments, so the note saying the file is generated is a key.
GENERATED_KEY = "_generated"


def validate_params(params: dict[str, Any]) -> dict[str, Section]:
    """Every section validated; ``ParamsError`` names every missing, unknown or invalid section and key."""
    errors, out = [], {}
    for name in sorted(set(SECTIONS) | set(params) - {GENERATED_KEY}):
        if name not in SECTIONS:
            errors.append(f"{name}: unknown section")
            continue
        try:
            out[name] = load_section(params, name, SECTIONS[name])
        except ParamsError as err:
            errors.append(str(err))
    if errors:
        raise ParamsError("\n".join(errors))
    return out


def compose(conf_dir: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The parameter set Hydra composes from ``conf_dir`` (its ``config.yaml``) with ``overrides`` such as
    ``["kalm=study", "kalm.eval.seed=20100"]``, as plain data (what ``dvc exp run -S ...`` writes to params.yaml)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(os.path.abspath(conf_dir)), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def listed(model: BaseModel) -> dict[str, Any]:
    """``model`` as a profile lists it, as plain data in field declaration order: a model built with keyword
    arguments (a section's default such as ``PPOParams(total_frames=20_480, ...)``) lists the keys it was given,
    any other every field but those marked ``UNLISTED``."""
    given = model.model_fields_set
    out = {}
    for name, field in type(model).model_fields.items():
        extra = field.json_schema_extra
        if (name not in given) if given else (isinstance(extra, dict) and extra.get("unlisted") is True):
            continue
        out[field.alias or name] = _plain(getattr(model, name))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return listed(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return to_jsonable_python(value)


def default_profile(name: str) -> dict[str, Any]:
    """Section ``name`` of the default tier: its model's defaults as ``listed`` gives them."""
    return listed(SECTIONS[name]())
