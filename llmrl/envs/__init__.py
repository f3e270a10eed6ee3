"""Environments: ``make_env`` over gymnasium ids (MiniGrid and BabyAI included), seeded and quiet."""

from llmrl.envs.make import QuietReset, make_env

__all__ = ["QuietReset", "make_env"]
