"""llmrl: large language models and reinforcement learning in one reproducible pipeline."""

__all__: list[str] = []

__version__ = "0.1.0"
