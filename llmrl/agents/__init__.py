"""Policies: baselines (random, BabyAI bot) and, per method, LLM policies, teachers and students."""

from llmrl.agents.baselines import BabyAIBotPolicy, RandomPolicy

__all__ = ["BabyAIBotPolicy", "RandomPolicy"]
