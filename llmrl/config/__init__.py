"""Typed parameters: one pydantic model per params.yaml section. The only package that knows param names.

Foundation sections live here; each method keeps its sections in a module of its own
(``llmrl.config.glam``, ``llmrl.config.llm_rl``, ``llmrl.config.llm4teach``) built on ``Section``.

Stage scripts call ``load_section(params, "demos", DemosParams)``; an unknown key, a wrong type or an
out-of-range value raises ``ParamsError`` naming the key path (``demos.episodes: must be > 0, got -3``)
before the stage writes anything.

Every model's defaults are the default tier (``conf/<method>/default.yaml`` and ``conf/shared.yaml`` are generated
from them: docs/tiers.md). CPU defaults aim at the whole pipeline within 45 minutes on 2 cores (measured cold,
``make repro``: 24 min on an AVX-512 EPYC, 51.5 min on an AVX2-only one; two one-thread stages at a time; README);
``threads`` is a stage's torch CPU threads (dvc.yaml's ``meta.cpus`` follows them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ComputeDType", "DTYPE_HELP", "TierName", "TIER_HELP", "UNLISTED", "ParamsError", "Section", "read_params", "load_section", "BaseLLMParams",
           "DemosParams", "EvalBaselinesParams"]

T = TypeVar("T", bound=BaseModel)


# An LLM's compute dtype: auto = bf16 where the device computes it natively, else fp32 (llmrl.llm.load.resolve_dtype).
ComputeDType = Literal["auto", "float32", "bfloat16"]
DTYPE_HELP = ("LLM compute dtype: auto = bf16 where the device computes it natively (CUDA with bf16; a CPU with "
              "AVX-512-BF16/AMX when LLMRL_PIN_KERNELS=0), else fp32; recorded in the metrics")


# The profile a method's section comes from (conf/<method>/<tier>.yaml; pipelines/tiers.py).
TierName = Literal["default", "study", "paper"]
TIER_HELP = ("the profile this section comes from: default (params.yaml), study or paper (conf/<method>/<tier>.yaml, "
             "selected with `dvc exp run -S <method>=<tier>`)")


# A field's marker (``Field(..., json_schema_extra=UNLISTED)``): the default tier leaves the key out of
# conf/<method>/default.yaml and params.yaml, so its stages run with the model's default without naming it (a
# key named in params.yaml is part of its stages' DVC params: naming one re-runs them); a profile may still set it.
UNLISTED = {"unlisted": True}


class ParamsError(ValueError):
    """Invalid parameters; the message names every offending key path."""


class Section(BaseModel):
    """Base of every params section: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


def _format_error(section: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join([section, *[str(p) for p in e["loc"]]])
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key")
        elif e["type"] == "missing":
            lines.append(f"{path}: required key missing")
        else:
            msg = e["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
            if e["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
                msg = "must be " + msg.replace("greater than or equal to", ">=").replace(
                    "greater than", ">").replace("less than or equal to", "<=").replace("less than", "<")
            lines.append(f"{path}: {msg}, got {e.get('input')!r}")
    return "\n".join(lines)


def read_params(path: str | os.PathLike = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: top level must be a mapping of sections")
    return data


def load_section(params: dict[str, Any], section: str, model: type[T]) -> T:
    """Validate ``params[section]`` (a dotted path like ``glam.train`` is allowed) against ``model``."""
    node: Any = params
    for part in section.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ParamsError(f"{section}: section missing from params")
        node = node[part]
    if not isinstance(node, dict):
        raise ParamsError(f"{section}: must be a mapping, got {node!r}")
    try:
        return model.model_validate(node)
    except ValidationError as err:
        raise ParamsError(_format_error(section, err)) from None


# ---------------------------------------------------------------------------------------------- foundation


class BaseLLMParams(Section):
    spec: str = Field("embedded:smollm2-135m-instruct",
                      description="model spec: embedded:<name>, a local folder, a hub name "
                                  "(Qwen/Qwen2.5-0.5B-Instruct), or tiny")
    threads: int = Field(1, gt=0, description="torch CPU threads of the conversion")


class DemosParams(Section):
    envs: list[str] = Field(default_factory=lambda: ["BabyAI-GoToLocal-v0", "BabyAI-PickupLoc-v0",
                                                     "BabyAI-Text-GoToObjS4-v0"], min_length=1,
                            description="BabyAI level ids to record bot demonstrations on (the last: GLAM's BC data)")
    episodes: int = Field(200, gt=0, description="episodes per level")
    seed: int = Field(0, ge=0, description="first level seed; episode i uses seed + i")
    max_steps: int | None = Field(None, gt=0, description="cut episodes after this many steps (None: env limit)")


class EvalBaselinesParams(Section):
    episodes: int = Field(200, gt=0, description="evaluation episodes per policy, level and mode")
    seed: int = Field(100_000, ge=0, description="first evaluation seed; far from the demos' seeds")
    policies: list[Literal["bot", "random"]] = Field(default_factory=lambda: ["bot", "random"], min_length=1,
                                                     description="baseline policies evaluated")
