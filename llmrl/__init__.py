"""llmrl: large language models and reinforcement learning in one reproducible pipeline."""

__version__ = "0.1.0"
