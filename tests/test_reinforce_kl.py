"""Stepwise REINFORCE with KL (LLM_RL) on the tiny model: loss terms, tokenisation, LoRA, one real iteration."""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch

from llmrl.agents.math_solver import build_messages, render_state, solve
from llmrl.algos.reinforce_kl import (
    MathEpisode,
    ReinforceKL,
    advantages,
    collect_episodes,
    optimizer_steps,
    reinforce_kl_loss,
    token_logprobs,
    tokenize_episodes,
    train,
)
from llmrl.config.llm_rl import CommonTrainParams, ReinforceTrainParams
from llmrl.config.lora import LoraSettings
from llmrl.llm.generate import SamplingConfig
from llmrl.llm.load import load_model

PROBLEMS = [{"id": f"p{i}", "problem": f"Tom has {i} apples and gets 2 more. How many apples?",
             "solution": f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\nThe answer is: {i + 2}", "answer": str(i + 2)}
            for i in range(1, 9)]
SHOTS = PROBLEMS[:1]


def _episode(llm, problem, lines, reward, group=0):
    head = render_state(llm, build_messages(problem["problem"], SHOTS), "")
    return MathEpisode(problem_id=problem["id"], group=group, head=head, lines=lines, reward=reward,
                       success=reward > 0)


def _line_logprob(llm, ep):
    with torch.no_grad():
        logp, line_of = token_logprobs(llm.model, tokenize_episodes(llm.tokenizer, [ep], llm.device))
    return float(logp[line_of >= 0].sum())


def test_joint_tokenisation_keeps_the_first_line_token():
    llm = load_model("tiny")
    # GPT-2 merges digit runs: "4" + "2 apples" tokenises as "42" + " apples". Tokenised apart, the line would
    # start with "2"; jointly, the straddling "42" token belongs to the line, so nothing of it is lost.
    ep = MathEpisode(problem_id="x", group=0, head="Count: 4", lines=["2 apples\n", "The answer is: 42\n"])
    ids, line_of = tokenize_episodes(llm.tokenizer, [ep], "cpu").row(0)
    first = line_of.index(0)
    assert llm.tokenizer.decode(ids[first]) == " 42"
    assert llm.tokenizer.decode([i for i, s in zip(ids, line_of) if s >= 0]).endswith("".join(ep.lines))
    assert llm.tokenizer.decode([i for i, s in zip(ids, line_of) if s == 1]) == "The answer is: 42\n"
    # In a batch the shared prompt prefix is split off once; every row keeps all of its own tokens.
    other = MathEpisode(problem_id="y", group=0, head="Count: 5", lines=["A\n"])
    batch = tokenize_episodes(llm.tokenizer, [ep, other], "cpu")
    assert batch.tokens.P > 0 and batch.row(0) == (ids, line_of)
    assert llm.tokenizer.decode(batch.row(1)[0]) == "Count: 5A\n"
    # Two episodes of one problem with the same first line: the shared prefix stops before any line token.
    twin = MathEpisode(problem_id="x", group=0, head="Count: 4", lines=["2 apples\n", "The answer is: 7\n"])
    batch = tokenize_episodes(llm.tokenizer, [ep, twin], "cpu")
    assert batch.row(0) == (ids, line_of) and batch.row(1)[1].count(0) == line_of.count(0)


def test_token_logprobs_match_a_full_forward():
    llm = load_model("tiny")
    eps = [_episode(llm, PROBLEMS[1], ["3 + 2 = 5\n", "The answer is: 5\n"], 1.0),
           _episode(llm, PROBLEMS[2], ["The answer is: 5\n"], 0.0)]
    batch = tokenize_episodes(llm.tokenizer, eps, "cpu")
    with torch.no_grad():
        logp, line_of = token_logprobs(llm.model, batch)
        for row, ep in enumerate(eps):
            ids = llm.tokenizer(ep.head + "".join(ep.lines), add_special_tokens=False)["input_ids"]
            assert batch.row(row)[0] == ids
            full = torch.log_softmax(llm.model(input_ids=torch.tensor([ids])).logits[0], -1)
            ref = full[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
            n = int((line_of[row] >= 0).sum())
            torch.testing.assert_close(logp[row][line_of[row] >= 0], ref[-n:], atol=1e-4, rtol=1e-4)


def test_loss_terms_and_their_gradients():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -2.0]])
    line_of = torch.tensor([[0, 0, 0]])
    T = 3
    # Policy-gradient term alone (β = 0): dL/dℓ_t = −A/T.
    loss, _ = reinforce_kl_loss(lp, ref, line_of, [np.array([2.0])], beta=0.0)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.full((1, 3), -2.0 / T))
    # KL term alone (A = 0): L = Σ β ℓ_t (ℓ_t − ℓ^ref_t)/T², not detached, so dL/dℓ_t = β(2ℓ_t − ℓ^ref_t)/T².
    lp.grad = None
    beta = 0.5
    loss, stats = reinforce_kl_loss(lp, ref, line_of, [np.array([0.0])], beta=beta)
    loss.backward()
    torch.testing.assert_close(lp.grad, beta * (2 * lp.detach() - ref) / T**2)
    torch.testing.assert_close(loss.detach(), (beta * lp * (lp - ref) / T**2).sum().detach())
    assert stats["kl_sum"] == pytest.approx(float((lp.detach() - ref).sum()))


def test_kl_term_is_zero_when_policy_equals_reference():
    lp = torch.randn(2, 5)
    line_of = torch.tensor([[0, 0, 1, 1, 1], [-1, 0, 0, 0, 0]])
    adv = [np.array([0.7, 1.0]), np.array([-0.3])]
    with_kl, stats = reinforce_kl_loss(lp, lp.clone(), line_of, adv, beta=0.25)
    without, _ = reinforce_kl_loss(lp, lp.clone(), line_of, adv, beta=0.0)
    assert float(with_kl) == pytest.approx(float(without))
    assert stats["kl_sum"] == 0.0


def test_advantages_baselines():
    eps = [MathEpisode("a", 0, "", ["x\n", "y\n"], reward=1.0), MathEpisode("a", 0, "", ["x\n"], reward=0.0),
           MathEpisode("b", 1, "", ["x\n"], reward=1.0), MathEpisode("b", 1, "", ["x\n"], reward=1.0)]
    none = advantages(eps, 0.99, "none")
    np.testing.assert_allclose(none[0], [0.99, 1.0])
    batch = advantages(eps, 0.99, "batch")
    np.testing.assert_allclose(batch[1], [-0.75])
    group = advantages(eps, 0.99, "group")  # leave-one-out within each problem
    np.testing.assert_allclose(group[0], [0.99 * 1.0, 1.0])
    np.testing.assert_allclose(group[1], [-1.0])
    np.testing.assert_allclose(group[2], [0.0])


def _params(**kw) -> ReinforceTrainParams:
    """The params sections from flat keys: common's fields go to ``common``, the rest to ``reinforce_kl``."""
    kw = {"temperature": 1.0, **kw}
    return ReinforceTrainParams(common={k: v for k, v in kw.items() if k in CommonTrainParams.model_fields},
                                reinforce_kl={k: v for k, v in kw.items() if k not in CommonTrainParams.model_fields})


def _trainer(llm, **kw):
    cfg = _params(**{"problems_per_iteration": 2, "group_size": 2, "max_steps": 2, "line_tokens": 6,
                     "answer_tokens": 12, "micro_batch": 4, "lr": 1e-2, "baseline": "none", "beta": 0.0, **kw})
    return ReinforceKL(llm, cfg, PROBLEMS[1:], SHOTS)


def test_update_raises_logprob_of_rewarded_line():
    llm = load_model("tiny:1", lora=LoraSettings(r=8, alpha=16, dropout=0.0))
    good = _episode(llm, PROBLEMS[1], ["The answer is: 3\n"], 1.0)
    bad = _episode(llm, PROBLEMS[1], ["The answer is: 9\n"], 0.0, group=0)
    algo = _trainer(llm, baseline="batch")
    before_good, before_bad = _line_logprob(llm, good), _line_logprob(llm, bad)
    for _ in range(3):
        algo.update([good, bad])
    assert _line_logprob(llm, good) > before_good + 0.05
    assert _line_logprob(llm, good) - before_good > _line_logprob(llm, bad) - before_bad


def test_lora_weights_change_frozen_weights_do_not():
    llm = load_model("tiny:2", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    algo = _trainer(llm, beta=0.25)
    named = dict(llm.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {id(p) for g in algo.opt.param_groups for p in g["params"]} == {id(named[n]) for n in trainable}
    before = {n: p.detach().clone() for n, p in named.items()}
    eps = [_episode(llm, PROBLEMS[1], ["3 + 2 = 5\n", "The answer is: 5\n"], 1.0),
           _episode(llm, PROBLEMS[2], ["The answer is: 7\n"], 1.0)]
    for _ in range(2):  # LoRA's A gets a gradient only once B is non-zero
        algo.update(eps)
    for n, p in named.items():
        changed = not torch.equal(before[n], p.detach())
        assert changed == (n in trainable), n


def test_reference_snapshot_and_refresh():
    llm = load_model("tiny:3", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    algo = _trainer(llm, beta=0.25, ref_update_iterations=2, micro_batch=2)
    eps = [_episode(llm, PROBLEMS[1], ["The answer is: 3\n"], 1.0), _episode(llm, PROBLEMS[2], ["x\n"], 0.0)]
    stats = algo.update(eps)
    assert stats["divergence"] == 0.0  # one optimiser step, scored before it: policy == reference
    stats = algo.update(eps)
    assert stats["divergence"] != 0.0  # the policy moved away from the (unchanged) reference
    policy = [p.detach().clone() for p in algo.params]
    with algo.reference_weights():
        assert all(torch.equal(p, r) for p, r in zip(algo.params, algo.ref))
    assert all(torch.equal(p, q) for p, q in zip(algo.params, policy))  # swapped back exactly
    algo.iteration = 2
    policy_now = [p.detach().clone() for p in algo.params]
    algo.step()  # iteration 2: the reference is reset to the policy before collecting
    assert all(torch.equal(r, p) for r, p in zip(algo.ref, policy_now))


def test_collect_and_step_on_tiny_model_are_seeded():
    def run():
        llm = load_model("tiny:4", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
        algo = _trainer(llm, beta=0.25, baseline="group", calculator=True)
        stats, eps = algo.step()
        return stats, [ep.lines for ep in eps]

    (s1, l1), (s2, l2) = run(), run()
    assert l1 == l2 and s1["loss"] == s2["loss"]
    assert s1["episodes"] == 4 and all(1 <= len(lines) <= 2 for lines in l1)
    assert s1["samples"] == sum(len(lines) for lines in l1)
    assert s1["optimizer_steps"] == 1


def test_collect_episodes_state_is_chat_continuation():
    llm = load_model("tiny:5")
    cfg = _params(problems_per_iteration=1, group_size=2, micro_batch=2, max_steps=3, line_tokens=5, answer_tokens=15)
    eps = collect_episodes(llm, PROBLEMS[1:2], SHOTS, cfg, seed=0)
    msgs = build_messages(PROBLEMS[1]["problem"], SHOTS)
    for ep in eps:
        assert ep.head == llm.render(msgs) and ep.head.endswith("<|assistant|>\n")
        state = llm.render([*msgs, {"role": "assistant", "content": "".join(ep.lines)}])
        assert state == ep.head + "".join(ep.lines)
        assert len(ep.lines) <= 3 and all(line.endswith("\n") and line.count("\n") == 1 for line in ep.lines)


def test_solve_records_every_response():
    llm = load_model("tiny")
    recs = solve(llm, PROBLEMS[:3], SHOTS, SamplingConfig(max_new_tokens=4, temperature=0), batch_size=2,
                 progress=False)
    assert [r["id"] for r in recs] == ["p1", "p2", "p3"]
    assert all(set(r) >= {"prompt", "response", "parsed_answer", "correct", "finish_reason"} for r in recs)
    assert recs[0]["prompt"].startswith("<|system|>")


def test_saved_adapter_is_machine_independent_and_reloads(tmp_path):
    """The adapter folder names the base model as given (not this clone's absolute path), lists its modules in a
    fixed order, and ``load_policy`` merges it back into the same function."""
    from llmrl.agents.math_solver import load_policy, write_policy

    llm = load_model("tiny", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for name, param in llm.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # a non-zero adapter, as after training
    write_policy(llm, tmp_path / "a", base_model="models/base_llm")
    write_policy(llm, tmp_path / "b", base_model="models/base_llm")
    config = (tmp_path / "a" / "adapter_config.json").read_text()
    assert config == (tmp_path / "b" / "adapter_config.json").read_text()
    assert '"base_model_name_or_path": "models/base_llm"' in config and str(tmp_path) not in config
    modules = json.loads(config)["target_modules"]
    assert modules == sorted(modules)
    ids = llm.tokenizer("the cat sat", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = llm.model(ids).logits
        merged = load_policy("tiny", tmp_path / "a").model(ids).logits
    assert torch.allclose(merged, expected, atol=1e-5)


def test_episode_token_budget_caps_the_lines_together():
    """An episode's lines share ``answer_tokens`` (GRPO's completion budget): none spends more, and an episode
    whose budget runs out before an answer ends as ``answer_tokens``."""
    llm = load_model("tiny:6")
    cfg = _params(problems_per_iteration=2, group_size=3, micro_batch=6, max_steps=6, line_tokens=5, answer_tokens=12)
    eps = collect_episodes(llm, PROBLEMS[1:3], SHOTS, cfg, seed=0)
    assert all(0 < ep.tokens <= 12 for ep in eps)
    assert any(ep.end == "answer_tokens" for ep in eps)  # the tiny model never answers within 12 tokens
    assert all(len(ep.lines) <= 3 for ep in eps if ep.end == "answer_tokens")  # 5 + 5 + 2 tokens at most
    unbudgeted = collect_episodes(llm, PROBLEMS[1:3], SHOTS, _params(
        problems_per_iteration=2, group_size=3, micro_batch=6, max_steps=6, line_tokens=5, answer_tokens=30), seed=0)
    assert max(ep.tokens for ep in unbudgeted) > 12  # the cap above did bind


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_lr_schedule_matches_transformers(schedule):
    """The schedule steps per optimiser step as transformers' (TRL's) does: GRPO and REINFORCE share it."""
    from transformers import get_constant_schedule, get_linear_schedule_with_warmup

    llm = load_model("tiny:7", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    algo = _trainer(llm, lr_schedule=schedule, iterations=2, micro_batch=2)  # 2 x 2 optimiser steps
    reference_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=algo.cfg.common.lr)
    reference = (get_linear_schedule_with_warmup(reference_opt, 0, optimizer_steps(algo.cfg))
                 if schedule == "linear" else get_constant_schedule(reference_opt))
    eps = [_episode(llm, PROBLEMS[1], ["The answer is: 3\n"], 1.0), _episode(llm, PROBLEMS[2], ["x\n"], 0.0),
           _episode(llm, PROBLEMS[3], ["y\n"], 0.0), _episode(llm, PROBLEMS[4], ["The answer is: 6\n"], 1.0)]
    for _ in range(2):
        algo.update(eps)
        for _ in range(2):
            reference_opt.step()
            reference.step()
        assert algo.opt.param_groups[0]["lr"] == pytest.approx(reference_opt.param_groups[0]["lr"])
    assert algo.opt.param_groups[0]["lr"] == (0.0 if schedule == "linear" else algo.cfg.common.lr)


# ---- training seeds: llm_rl.train.seeds, one llm_rl_train item per variant and seed ------------------------------
def _seeded(seeds, **common) -> ReinforceTrainParams:
    return ReinforceTrainParams(seeds=seeds, common={"problems_per_iteration": 1, "group_size": 2, "line_tokens": 6,
                                                     "answer_tokens": 12, "micro_batch": 2, "lr": 1e-2,
                                                     "temperature": 1.0, **common},
                                reinforce_kl={"max_steps": 2, "baseline": "none", "beta": 0.0})


def test_training_seeds_are_validated_and_the_one_source_of_a_runs_seed():
    from llmrl.config import ParamsError, load_section

    assert ReinforceTrainParams().seeds == [0]  # the default pipeline: one training seed per variant
    assert _seeded([0, 3]).for_seed(3).common.seed == 3
    with pytest.raises(ParamsError, match="llm_rl.train.seeds: seeds must be distinct"):
        load_section({"llm_rl": {"train": {"seeds": [1, 1]}}}, "llm_rl.train", ReinforceTrainParams)
    with pytest.raises(ParamsError, match="llm_rl.train.seeds"):
        load_section({"llm_rl": {"train": {"seeds": []}}}, "llm_rl.train", ReinforceTrainParams)
    with pytest.raises(ValueError, match=r"llm_rl.train.seeds: 2 is not one of \[0, 1\]"):
        _seeded([0, 1]).for_seed(2)
    # a seed set in common as well would be silently overridden by the item's: an error instead
    with pytest.raises(ValueError, match="llm_rl.train.common.seed: the training seeds are llm_rl.train.seeds"):
        _seeded([0, 1], seed=1).for_seed(1)


def test_training_seed_reaches_the_sampling():
    """The item's seed decides the problems drawn and every sampled line: two seeds sample apart, one seed twice
    samples the same (same initial weights each time, so only the seed differs)."""
    from llmrl.seeding import seed_everything

    section = _seeded([0, 1])

    def first_iteration(seed: int):
        seed_everything(0)
        llm = load_model("tiny:4", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
        _, episodes = ReinforceKL(llm, section.for_seed(seed), PROBLEMS[1:], SHOTS).step()
        return [(ep.problem_id, ep.lines) for ep in episodes]

    zero = first_iteration(0)
    assert first_iteration(0) == zero
    assert first_iteration(1) != zero


def test_train_yields_a_row_per_iteration_and_records_every_episode():
    torch.manual_seed(0)
    llm = load_model("tiny:1", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    cfg = _params(problems_per_iteration=2, group_size=2, max_steps=2, line_tokens=6, answer_tokens=12, micro_batch=4,
                  iterations=2, baseline="none", beta=0.0)
    record: list[dict] = []
    rows = list(train(llm, PROBLEMS[1:], cfg, shots=SHOTS, record=record, progress=False))
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["episodes"] == 4 for r in rows)
    assert len(record) == 8 and [r["iteration"] for r in record] == [0] * 4 + [1] * 4
    assert set(record[0]) == {"iteration", "problem_id", "lines", "reward", "success", "end", "parsed_answer",
                              "tokens"}
    assert sum(r["optimizer_steps"] for r in rows) == optimizer_steps(cfg)
