"""Math word problems (LLM_RL's task): the stepwise environment, its answer rules (the reward), the embedded
GSM-style generator, GSM8K / MATH records converted to one format, and the safe calculator."""

from llmrl.envs.word_problems.answers import ANSWER_PHRASE, answers_match, extract_answer, is_correct
from llmrl.envs.word_problems.calculator import CalculatorError, apply_calculator, safe_eval
from llmrl.envs.word_problems.datasets import MathDataError, read_jsonl, write_jsonl
from llmrl.envs.word_problems.env import MathEnv
from llmrl.envs.word_problems.generator import Problem, generate_problems, generated_splits

__all__ = [
    "ANSWER_PHRASE", "CalculatorError", "MathDataError", "MathEnv", "Problem", "answers_match", "apply_calculator",
    "extract_answer", "generate_problems", "generated_splits", "is_correct", "read_jsonl", "safe_eval", "write_jsonl",
]
