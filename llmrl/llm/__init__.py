"""The LLM layer: load any model spec, score candidate strings, generate, and call remote endpoints."""

from llmrl.config.lora import LoraSettings
from llmrl.llm.backends import (
    Backend,
    CachedBackend,
    CacheMissError,
    LocalBackend,
    OpenAIChatBackend,
    OpenAICompletionsBackend,
    ReplyCache,
    openai_backend,
)
from llmrl.llm.generate import Generation, SamplingConfig, generate
from llmrl.llm.load import LLM, ModelSpecError, load_model, save_model
from llmrl.llm.score import CandidateScores, ScoreOutput, score, score_naive, score_tensors

__all__ = [
    "LLM", "Backend", "CachedBackend", "CacheMissError", "CandidateScores", "Generation", "LocalBackend",
    "LoraSettings", "ModelSpecError", "OpenAIChatBackend", "OpenAICompletionsBackend", "ReplyCache",
    "SamplingConfig", "ScoreOutput", "generate", "load_model", "openai_backend", "save_model", "score",
    "score_naive", "score_tensors",
]
