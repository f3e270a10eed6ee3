"""TRL's GRPO on the same math problems, prompts and reward as ``reinforce_kl``: the comparison variant.

Whole solutions are sampled (``num_generations`` per prompt) instead of line by line; the prompt is the same
chat (system prompt, few-shot pairs, problem) that TRL renders with the model's own chat template, identical to
``LLM.render``; the reward is 1 for a correct final answer. TRL's defaults that matter (lr, loss_type, beta)
are passed explicitly. The budget matches ``reinforce_kl``: ``iterations`` generation rounds of
``problems_per_iteration × group_size`` completions, each split into optimiser steps of ``micro_batch``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from llmrl.agents.math_solver import build_messages
from llmrl.data.math_answers import answers_match, extract_answer, through_first_answer
from llmrl.llm import LLM


@dataclass(frozen=True)
class GRPOMathConfig:
    iterations: int = 3
    problems_per_iteration: int = 8
    group_size: int = 4
    micro_batch: int = 8  # completions per optimiser step
    max_new_tokens: int = 40  # per completion: reinforce_kl's answer_tokens
    temperature: float = 1.0
    top_p: float = 0.9
    learning_rate: float = 1e-4
    lr_schedule: str = "constant"  # "constant" | "linear" (to 0), as reinforce_kl
    grad_clip: float = 1.0
    loss_type: str = "dapo"
    beta: float = 0.0
    num_iterations: int = 1
    epsilon: float = 0.2
    scale_rewards: str = "group"
    lora_r: int | None = 16  # None: full fine-tune
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    seed: int = 0
    bf16: bool = False


def completion_text(completion) -> str:
    """TRL passes conversational completions as a list of messages; plain ones as a string."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def stated_answer(completion) -> str | None:
    """The answer a completion states first (what ends a ``reinforce_kl`` episode and what ``math_eval`` scores)."""
    text = completion_text(completion)
    return extract_answer(through_first_answer(text) or text)


def correctness_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 where the completion's first stated answer equals the gold ``answer`` column, else 0.0."""
    return [float(answers_match(stated_answer(c), str(a))) for c, a in zip(completions, answer)]


def recording_reward(record: list[dict]):
    """``correctness_reward`` that also appends every completion, its token count, parsed answer and reward to
    ``record``."""
    def reward(prompts, completions, answer, id, completion_ids=None, trainer_state=None,  # noqa: A002
               **_) -> list[float]:
        out = correctness_reward(prompts, completions, answer)
        step = trainer_state.global_step if trainer_state is not None else None
        lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [None] * len(out)
        for c, a, i, r, n in zip(completions, answer, id, out, lengths):
            text = completion_text(c)
            record.append({"step": step, "problem_id": i, "completion": text, "parsed_answer": stated_answer(c),
                           "answer": a, "reward": r, "tokens": n})
        return out

    reward.__name__ = "correctness_reward"
    return reward


def build_dataset(problems: Sequence[dict], shots: Sequence[dict]):
    """A ``datasets.Dataset`` of conversational prompts with their ids and gold answers."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": build_messages(p["problem"], shots), "answer": str(p["answer"]),
                               "id": str(p["id"])} for p in problems])


def make_trainer(llm: LLM, problems: Sequence[dict], shots: Sequence[dict], cfg: GRPOMathConfig,
                 output_dir: str | os.PathLike | None = None, record: list[dict] | None = None):
    """A ``trl.GRPOTrainer`` over ``problems``; ``llm.model`` must be a plain (non-peft) model.

    With ``record`` every sampled completion is appended to it (LLM outputs are data).
    """
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    rollout = cfg.problems_per_iteration * cfg.group_size
    if rollout % cfg.micro_batch or cfg.micro_batch % cfg.group_size:
        raise ValueError(f"grpo: micro_batch={cfg.micro_batch} must divide {rollout} and be a multiple of "
                         f"group_size={cfg.group_size}")
    steps_per_generation = rollout // cfg.micro_batch
    args = GRPOConfig(
        output_dir=str(output_dir or tempfile.mkdtemp(prefix="grpo_math_")),
        learning_rate=cfg.learning_rate,
        loss_type=cfg.loss_type,
        beta=cfg.beta,
        num_iterations=cfg.num_iterations,
        epsilon=cfg.epsilon,
        scale_rewards=cfg.scale_rewards,
        num_generations=cfg.group_size,
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=1,
        steps_per_generation=steps_per_generation,  # one generation round feeds this many optimiser steps
        max_steps=cfg.iterations * steps_per_generation,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        lr_scheduler_type=cfg.lr_schedule,
        max_grad_norm=cfg.grad_clip,
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=cfg.bf16,
        # TRL's default, kept: measured on the CPU default, checkpointing costs 2.5 % of the time (204 vs 199 s)
        # and saves 3.1 GiB of peak memory (5.2 vs 8.3 GiB: fp32 activations under a 49k-vocabulary head)
        activation_checkpointing=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    peft_config = None
    if cfg.lora_r is not None:
        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    return GRPOTrainer(
        model=llm.model,
        reward_funcs=correctness_reward if record is None else recording_reward(record),
        args=args,
        train_dataset=build_dataset(problems, shots),
        processing_class=llm.tokenizer,
        peft_config=peft_config,
    )
