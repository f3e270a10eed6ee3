"""The TRL GRPO variant of the math stage runs on the tiny model with the same prompts and reward."""

from __future__ import annotations

import pytest

from llmrl.agents.math_solver import build_messages
from llmrl.algos.grpo_math import GRPOMathConfig, build_dataset, correctness_reward, make_trainer
from llmrl.llm import load_model

PROBLEMS = [{"id": f"p{i}", "problem": f"What is {i} + 1?", "solution": f"The answer is: {i + 1}",
             "answer": str(i + 1)} for i in range(6)]


def test_reward_and_dataset():
    assert correctness_reward(None, ["x\nThe answer is: 3.", [{"role": "assistant", "content": "The answer is: 4"}],
                                     "no answer"], ["3", "5", "1"]) == [1.0, 0.0, 0.0]
    ds = build_dataset(PROBLEMS[1:], PROBLEMS[:1])
    assert ds[0]["prompt"] == build_messages(PROBLEMS[1]["problem"], PROBLEMS[:1]) and ds[0]["answer"] == "2"


def test_grpo_runs_two_steps_on_tiny_model(tmp_path):
    llm = load_model("tiny")
    cfg = GRPOMathConfig(iterations=1, problems_per_iteration=2, group_size=2, micro_batch=2, max_new_tokens=6,
                         lora_r=4, lora_alpha=8)
    record: list[dict] = []
    trainer = make_trainer(llm, PROBLEMS[1:], PROBLEMS[:1], cfg, output_dir=tmp_path, record=record)
    args = trainer.args
    assert (args.learning_rate, args.loss_type, args.beta) == (cfg.learning_rate, "dapo", 0.0)
    # the budget reinforce_kl shares: its lr schedule, gradient clip and per-answer token budget
    assert (args.lr_scheduler_type, args.max_grad_norm, args.max_completion_length) == ("constant", 1.0, 6)
    trainer.train()
    steps = [row for row in trainer.state.log_history if "loss" in row and "train_runtime" not in row]
    assert len(steps) == 2  # one generation round of 4 completions, two optimiser steps of 2
    assert [("reward" in row) for row in steps] == [True, False]  # rewards are logged per generation round
    assert len(record) == 4 and all(r["reward"] in (0.0, 1.0) for r in record)
    assert all(1 <= r["tokens"] <= 6 for r in record)
    assert {r["problem_id"] for r in record} <= {p["id"] for p in PROBLEMS[1:]}
    assert any("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)


def test_grpo_rejects_split_groups():
    with pytest.raises(ValueError, match="multiple of group_size"):
        make_trainer(load_model("tiny"), PROBLEMS, PROBLEMS[:1],
                     GRPOMathConfig(problems_per_iteration=2, group_size=4, micro_batch=2))
