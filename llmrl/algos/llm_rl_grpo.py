"""TRL's GRPO on the same math problems, prompts and reward as ``reinforce_kl``: the comparison variant.

Whole solutions are sampled (``num_generations`` per prompt) instead of line by line; the prompt is the same
chat (system prompt, few-shot pairs, problem) that TRL renders with the model's own chat template, identical to
``LLM.render``; the reward is 1 for a correct final answer. The trainer is the project's one GRPO set-up
(``llmrl.algos.grpo``, also ProPS's); ``trainer_params`` turns the budget both variants share
(``llm_rl.train.common``) into its settings: ``iterations`` generation rounds of ``problems_per_iteration ×
group_size`` completions, each split into optimiser steps of ``micro_batch``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import torch

from llmrl.agents.math_solver import build_messages
from llmrl.algos.grpo import build_grpo_trainer, completion_text, gather_records, GRPORun, train as train_grpo
from llmrl.config.grpo import GRPOTrainParams
from llmrl.config.llm_rl import CommonTrainParams, GRPOParams, ReinforceTrainParams
from llmrl.envs.word_problems.answers import answers_match, extract_answer, through_first_answer
from llmrl.llm.load import LLM

__all__ = ["trainer_params", "correctness_reward", "build_dataset", "build_trainer", "train"]


def trainer_params(common: CommonTrainParams, grpo: GRPOParams, *, bf16: bool = False) -> GRPOTrainParams:
    """GRPO settings for the budget ``reinforce_kl`` also trains with: the same samples, optimiser steps, lr and
    schedule, gradient clip and tokens per answer; ``bf16`` where the LLM computes in bf16."""
    steps_per_generation = common.problems_per_iteration * common.group_size // common.micro_batch
    return GRPOTrainParams(
        learning_rate=grpo.learning_rate or common.lr, loss_type=grpo.loss_type, beta=grpo.beta,
        num_iterations=grpo.num_iterations, epsilon=grpo.epsilon, scale_rewards=grpo.scale_rewards,
        num_generations=common.group_size, per_device_train_batch_size=common.micro_batch,
        gradient_accumulation_steps=1, steps_per_generation=steps_per_generation,  # one round feeds this many steps
        max_steps=common.iterations * steps_per_generation, max_prompt_tokens=None,  # few-shot prompts stay whole
        max_completion_length=common.answer_tokens, temperature=common.temperature, top_p=common.top_p,
        lr_scheduler_type=common.lr_schedule, max_grad_norm=common.grad_clip, seed=common.seed, bf16=bf16,
        # The few-shot prefix shared by a micro-batch's prompts runs once, without checkpointing (whole prompts
        # under checkpointing took 5.2 GiB; without either, 8.3 GiB).
        share_prompt_prefix=True, gradient_checkpointing=False,
        lora=common.lora)


def stated_answer(completion) -> str | None:
    """The answer a completion states first (what ends a ``reinforce_kl`` episode and what ``llm_rl_eval`` scores)."""
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


def build_trainer(llm: LLM, problems: Sequence[dict], shots: Sequence[dict], cfg: GRPOTrainParams,
                  output_dir: str | os.PathLike, record: list[dict] | None = None) -> GRPORun:
    """The GRPO trainer over ``problems`` (``llm.model`` plain: TRL attaches the adapter). With ``record`` every
    sampled completion is appended to it (LLM outputs are data)."""
    reward = correctness_reward if record is None else recording_reward(record)
    return build_grpo_trainer(llm, build_dataset(problems, shots), [reward], cfg, output_dir)


def train(llm: LLM, problems: Sequence[dict], cfg: ReinforceTrainParams, *, shots: Sequence[dict],
          output_dir: str | os.PathLike, record: list[dict] | None = None) -> Iterator[dict]:
    """GRPO at the budget REINFORCE-KL trains with (``cfg.common``, ``cfg.grpo``), the shape LLM_RL's variants share
    (``llmrl.algos.reinforce_kl.train``): one stats row per optimiser step (``step`` from 0, ``optimizer_steps`` 1;
    the reward and completion length on the steps that start a generation round), ``llm.model`` the trained model
    at the end. TRL writes its run under ``output_dir``. With ``record`` every sampled completion of every process
    is appended to it once training ends (LLM outputs are data); every process must run to the end, for the gather.
    """
    completions: list[dict] = []
    run = build_trainer(llm, problems, shots, trainer_params(cfg.common, cfg.grpo, bf16=llm.dtype == torch.bfloat16),
                        output_dir=output_dir, record=completions)
    for row in train_grpo(run):
        stats = {"step": row["step"] - 1, "loss": row["loss"], "grad_norm": row["grad_norm"], "lr": row["lr"],
                 "step_time": row.get("step_time"), "optimizer_steps": 1}
        if "reward_mean" in row:
            stats.update(average_reward=row["reward_mean"], mean_length=row.get("completion_length"))
        yield stats
    llm.model = run.trainer.model
    gathered = gather_records(completions)  # a collective: every process takes part
    if record is not None:
        record += gathered
