"""Registers every ``BabyAI-Text-*`` id (``LEVELS``) with gymnasium; the package imports it, so importing
``llmrl.envs.babyai_text`` registers them."""

from __future__ import annotations

import gymnasium as gym

from llmrl.envs.babyai_text.levels import LEVELS

__all__: list[str] = []

# the entry point names the package (which re-exports make_text_env), not wrapper.py: the ids' specs stay as
# they were before the package was split into modules
for _id, _level in LEVELS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point="llmrl.envs.babyai_text:make_text_env", kwargs={"level": _level})
