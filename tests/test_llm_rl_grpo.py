"""The TRL GRPO variant of LLM_RL's training stage runs on the tiny model with the same prompts and reward."""

from __future__ import annotations

import pytest
import torch

from llmrl.agents.math_solver import build_messages
from llmrl.algos.grpo import train
from llmrl.algos.llm_rl_grpo import build_dataset, build_trainer, correctness_reward, trainer_params
from llmrl.config.llm_rl import CommonTrainParams, GRPOParams, ReinforceKLParams, ReinforceTrainParams
from llmrl.config.lora import LoraSettings
from llmrl.llm.load import load_model

PROBLEMS = [{"id": f"p{i}", "problem": f"What is {i} + 1?", "solution": f"The answer is: {i + 1}",
             "answer": str(i + 1)} for i in range(6)]


def test_reward_and_dataset():
    assert correctness_reward(None, ["x\nThe answer is: 3.", [{"role": "assistant", "content": "The answer is: 4"}],
                                     "no answer"], ["3", "5", "1"]) == [1.0, 0.0, 0.0]
    ds = build_dataset(PROBLEMS[1:], PROBLEMS[:1])
    assert ds[0]["prompt"] == build_messages(PROBLEMS[1]["problem"], PROBLEMS[:1]) and ds[0]["answer"] == "2"


def _common(**kw) -> CommonTrainParams:
    base = dict(iterations=1, problems_per_iteration=2, group_size=2, micro_batch=2, answer_tokens=6, line_tokens=6,
                lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    return CommonTrainParams(**{**base, **kw})


def test_grpo_runs_two_steps_on_tiny_model(tmp_path):
    llm = load_model("tiny")
    common = _common()
    cfg = trainer_params(common, GRPOParams())
    record: list[dict] = []
    run = build_trainer(llm, PROBLEMS[1:], PROBLEMS[:1], cfg, output_dir=tmp_path, record=record)
    args = run.trainer.args
    assert (args.learning_rate, args.loss_type, args.beta) == (common.lr, "dapo", 0.0)
    # the budget reinforce_kl shares: its lr schedule, gradient clip and per-answer token budget
    assert (args.lr_scheduler_type, args.max_grad_norm, args.max_completion_length) == ("constant", 1.0, 6)
    assert run.truncated_prompts == 0  # few-shot prompts are never cut
    trainable = [n for n, p in run.trainer.model.named_parameters() if p.requires_grad]
    steps = list(train(run))
    assert len(steps) == 2  # one generation round of 4 completions, two optimiser steps of 2
    assert [("reward_mean" in row) for row in steps] == [True, False]  # rewards are logged per generation round
    assert len(record) == 4 and all(r["reward"] in (0.0, 1.0) for r in record)
    assert all(1 <= r["tokens"] <= 6 for r in record)
    assert {r["problem_id"] for r in record} <= {p["id"] for p in PROBLEMS[1:]}
    assert trainable and all("lora_" in n for n in trainable)  # TRL attached the adapter; the base stays frozen


def test_grpo_rejects_split_groups():
    with pytest.raises(ValueError, match="multiple of group_size"):
        ReinforceTrainParams(common=_common(problems_per_iteration=2, group_size=4, micro_batch=2),
                             reinforce_kl=ReinforceKLParams(), grpo=GRPOParams())


def test_shared_prefix_log_probs_equal_trls_own(tmp_path):
    """The trainer's per-token log-probs and entropies with the shared prompt prefix computed once equal TRL's
    whole-prompt ones on a left-padded batch of prompts that share a few-shot prefix, gradients included."""
    import torch

    from trl import GRPOTrainer

    llm = load_model("tiny")
    cfg = trainer_params(_common(temperature=0.7), GRPOParams())
    assert cfg.share_prompt_prefix and not cfg.gradient_checkpointing
    run = build_trainer(llm, PROBLEMS[1:], PROBLEMS[:1], cfg, output_dir=tmp_path, record=[])
    trainer, tok = run.trainer, llm.tokenizer
    assert type(trainer).__name__ == "LLMRLGRPOTrainer"
    prompts = [tok.apply_chat_template(build_messages(p["problem"] + " Think." * i, PROBLEMS[:1]), tokenize=False,
                                       add_generation_prompt=True) for i, p in enumerate(PROBLEMS[1:4])]
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (enc["attention_mask"] == 0).any()  # rows of different lengths: real left padding
    completion = torch.randint(5, 200, (3, 5))
    ids = torch.cat([enc["input_ids"], completion], dim=1)
    mask = torch.cat([enc["attention_mask"], torch.ones_like(completion)], dim=1)
    model = trainer.model

    def run_both(fn):
        model.zero_grad()
        lp, ent, _ = fn(trainer, model, ids, mask, 5, compute_entropy=True)
        lp.sum().backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    ours = run_both(type(trainer)._get_per_token_logps_and_entropies)
    trls = run_both(GRPOTrainer._get_per_token_logps_and_entropies)
    torch.testing.assert_close(ours[0], trls[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[1], trls[1], atol=1e-4, rtol=1e-4)
    for a, b in zip(ours[2], trls[2]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_shared_prefix_and_checkpointing_exclude_each_other():
    from llmrl.config.grpo import GRPOTrainParams

    with pytest.raises(ValueError, match="share_prompt_prefix and gradient_checkpointing"):
        GRPOTrainParams(share_prompt_prefix=True, gradient_checkpointing=True)


def test_seeded_row_sampler_draws_softmax_and_ignores_its_batch_companions():
    from llmrl.algos.grpo import SeededRowSampler, completion_seed

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    rows = 4000
    sampler = SeededRowSampler([torch.Generator().manual_seed(completion_seed(0, 0, i)) for i in range(rows)])
    picks = sampler(None, logits.expand(rows, -1)).argmax(-1)
    freq = torch.bincount(picks, minlength=5).float() / rows
    assert freq[4] == 0  # a filtered token is never drawn
    assert torch.allclose(freq, torch.softmax(logits, -1), atol=0.025)  # 4 sigma of the largest share's binomial
    # row 7's draws depend on its seed alone, not on the rows beside it or their logits
    alone = SeededRowSampler([torch.Generator().manual_seed(completion_seed(0, 0, 7))])
    mixed = SeededRowSampler([torch.Generator().manual_seed(s) for s in (123, completion_seed(0, 0, 7), 5)])
    other = torch.tensor([0.0, 5.0, 0.0, 0.0, 0.0])
    for _ in range(5):
        a = alone(None, logits[None])
        b = mixed(None, torch.stack([other, logits, other]))
        assert torch.equal(a[0], b[1])
    assert completion_seed(0, 0, 7) != completion_seed(0, 1, 7) != completion_seed(1, 0, 7)


def test_training_seed_reaches_grpo_sampling(tmp_path):
    """llm_rl_train's item seed (``ReinforceTrainParams.for_seed``) is TRL's seed and each completion's sampling
    seed: two seeds sample other completions, one seed twice the same."""
    from llmrl.seeding import seed_everything

    section = ReinforceTrainParams(seeds=[0, 1], common=_common(temperature=1.0).model_dump(exclude={"seed"}))

    def completions(seed: int, run_dir: str) -> list[str]:
        seed_everything(0)
        cfg = trainer_params(section.for_seed(seed).common, GRPOParams())
        assert cfg.seed == seed
        record: list[dict] = []
        list(train(build_trainer(load_model("tiny"), PROBLEMS[1:], PROBLEMS[:1], cfg, output_dir=tmp_path / run_dir,
                                 record=record)))
        return [r["completion"] for r in record]

    zero = completions(0, "a")
    assert completions(0, "b") == zero
    assert completions(1, "c") != zero
