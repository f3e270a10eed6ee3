"""Params of the results page (``report:`` in params.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmrl.config import Section

__all__ = ["ReportSection", "REPORT_SECTIONS", "ReportParams"]

# Page sections in page order: the BabyAI bot/random baselines (eval_baselines), then the five methods.
ReportSection = Literal["baselines", "glam", "llm_rl", "llm4teach", "kalm", "props"]
REPORT_SECTIONS: tuple[ReportSection, ...] = ("baselines", "glam", "llm_rl", "llm4teach", "kalm", "props")


class ReportParams(Section):
    methods: list[ReportSection] = Field(
        default_factory=lambda: list(REPORT_SECTIONS),
        description="sections whose stages this pipeline runs (baselines = eval_baselines, glam, llm_rl = LLM_RL, "
                    "llm4teach = LLM4Teach, kalm, props); one left out is shown as 'not run' and none of its files is "
                    "read, while every file of a listed one must exist")

    @field_validator("methods")
    @classmethod
    def _unique(cls, methods: list[str]) -> list[str]:
        if len(set(methods)) != len(methods):
            raise ValueError(f"lists a section twice: {methods}")
        return methods
