"""The one LoRA settings type, importable without torch or transformers (config modules use it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings passed to peft."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: tuple[str, ...] | str = "all-linear"
