"""The one LoRA settings type, importable without torch or transformers (config modules and the LLM layer use it)."""

from __future__ import annotations

from pydantic import Field

from llmrl.config import Section

__all__ = ["LoraSettings"]


class LoraSettings(Section):
    """LoRA adapter settings passed to peft (``peft.LoraConfig``: r, lora_alpha, lora_dropout, target_modules)."""

    r: int = Field(8, gt=0, description="LoRA rank")
    alpha: int = Field(16, gt=0, description="LoRA alpha (the update is scaled by alpha / r)")
    dropout: float = Field(0.05, ge=0, lt=1, description="LoRA dropout (0 keeps on-policy log-prob ratios exact)")
    target_modules: tuple[str, ...] | str = Field(
        "all-linear", description="modules that get an adapter: peft's 'all-linear' or a list of module names")
    layers: int | None = Field(
        None, gt=0, description="adapters on the top N decoder layers only (peft's layers_to_transform); null: on "
        "every layer. The layers below stay frozen, so GLAM's PPO computes their outputs once per prompt and "
        "reuses them in every epoch (llmrl.llm.score's frozen trunk)")
