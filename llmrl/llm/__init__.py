"""The LLM layer: load any model spec, score candidate strings, generate, and call remote endpoints."""

from llmrl.llm.backends import (
    Backend,
    CachedBackend,
    CacheMissError,
    LocalBackend,
    OpenAIChatBackend,
    ReplyCache,
)
from llmrl.llm.generate import Generation, SamplingConfig, generate
from llmrl.llm.load import LLM, LoraSettings, ModelSpecError, load_model, save_model
from llmrl.llm.score import CandidateScores, ScoreOutput, score, score_naive, score_tensors

__all__ = [
    "LLM", "Backend", "CachedBackend", "CacheMissError", "CandidateScores", "Generation", "LocalBackend",
    "LoraSettings", "ModelSpecError", "OpenAIChatBackend", "ReplyCache", "SamplingConfig", "ScoreOutput",
    "generate", "load_model", "save_model", "score", "score_naive", "score_tensors",
]
