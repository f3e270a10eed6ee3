"""ProPS GRPO: the four rewards on hand-made replies (with and without an answer prefix), the data set, prompt
truncation to the token budget, prompts opened with the answer prefix, a GRPO update on the tiny model that changes
every LoRA weight and nothing frozen (chat and opened prompts), and a byte-stable adapter."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from datasets import Dataset

from llmrl.agents.linear_policy import evaluate_params
from llmrl.algos.grpo import build_grpo_trainer, opens_answer, prompt_token_count, recording, save_adapter, train, \
    truncate_prompt
from llmrl.algos.props_grpo import RewardSettings, accepted_replies, build_records, format_hard, format_soft, \
    improvement_reward, make_reward_funcs, policy_reward, sample_scored_vectors, split_indices
from llmrl.algos.props_prompts import PromptSettings, parse_reply
from llmrl.config import ParamsError, load_section
from llmrl.config.grpo import GRPOTrainParams
from llmrl.config.props import PropsGRPOParams
from llmrl.envs.control import get_task
from llmrl.llm import LoraSettings, load_model
from llmrl.llm.load import render_chat

TASK = get_task("mountaincar_continuous")
S = RewardSettings(task=TASK, n_params=3, low=-6.0, high=6.0, return_floor=-200.0, return_span=300.0)
OLD = [1.0, -2.0, 0.5]
GOOD = [0.0, 6.0, 0.0]  # pushes along the velocity: reaches the flag (return ~99)
SEED = 7


def reply(params_line: str, think: str = "The car must swing.\nPush with the velocity.\nLarger weight.") -> str:
    return f"<think>{think}</think>\n{params_line}"


def rollout(params, seed=SEED) -> float:
    return float(evaluate_params(TASK, np.asarray(params, dtype=float), [seed])[0, 0])


# ------------------------------------------------------------------------------------------------ rewards


def test_format_soft_accepts_multiline_think_and_needs_closed_tags():
    texts = [reply("params[0]: 0; params[1]: 6; params[2]: 0"),  # multi-line think (the original's regex: 0)
             "<think>\n\n</think>answer",
             "params[0]: 0; params[1]: 6; params[2]: 0",  # no tags
             "<think>never closed\nparams[0]: 0; params[1]: 6; params[2]: 0",
             "<think>all reasoning, no answer</think>   \n",
             [{"role": "assistant", "content": reply("x")}]]  # TRL's conversational completion
    assert format_soft(completions=texts) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_format_hard_needs_tags_and_exactly_the_parser_format():
    texts = [reply("params[0]: 0; params[1]: 6; params[2]: 0"),  # the format the prompt asks for
             reply("<policy>params[0]: -1.5; params[1]: 5; params[2]: 0.3</policy>"),
             reply("params[0]: 0; params[1]: 6"),  # too few
             reply("params[0]: 0; params[1]: 6; params[2]: 0; params[3]: 1"),  # too many
             reply("0, 6, 0"),  # the right count, not the format
             reply("params[0]: 0; params[1]: 60; params[2]: 0"),  # out of range
             reply("params[0]: 1; params[1]: -2; params[2]: 0.5"),  # the shown point again
             "params[0]: 0; params[1]: 6; params[2]: 0"]  # no think block
    got = format_hard(completions=texts, old_params=[OLD] * len(texts), settings=S)
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # exactly the search's acceptance: the same parser says the same
    assert parse_reply(texts[0], 3, -6, 6, current=OLD).ok and not parse_reply(texts[2], 3, -6, 6).ok


def test_policy_reward_is_one_seeded_rollout_mapped_to_unit_interval():
    texts = [reply("params[0]: 0; params[1]: 6; params[2]: 0"), reply("params[0]: 1; params[1]: 6; params[2]: 0"),
             reply("junk"), reply("params[0]: 0; params[1]: 6")]
    got = policy_reward(completions=texts, old_params=[OLD] * 4, rollout_seed=[SEED] * 4, settings=S)
    expected_good = np.clip((rollout(GOOD) + 200) / 300, 0, 1)
    assert got[0] == pytest.approx(expected_good) and got[0] > 0.95
    assert got[1] == pytest.approx(np.clip((rollout([1, 6, 0]) + 200) / 300, 0, 1)) and got[1] < got[0]
    assert got[2:] == [0.0, 0.0]  # rejected replies earn nothing
    again = policy_reward(completions=texts[:1], old_params=[OLD], rollout_seed=[SEED], settings=S)
    assert again == got[:1]  # same example (seed) -> same reward


def test_improvement_uses_each_examples_own_r_old_and_keeps_the_sign():
    text = reply("params[0]: 0; params[1]: 6; params[2]: 0")
    r_new = rollout(GOOD)
    r_olds = [-99.9, -50.0, r_new + 10.0, 0.0]
    got = improvement_reward(completions=[text] * 4, old_params=[OLD] * 4, rollout_seed=[SEED] * 4, r_old=r_olds,
                             settings=S)
    assert got == pytest.approx([min(1.0, (r_new + 99.9) / 300), (r_new + 50) / 300, 0.0, r_new / 300])
    # the original's (R_new - R_old) * R_new / R_old is negative here (R_old < 0 < R_new): ours rewards it
    assert (r_new - (-50.0)) * r_new / -50.0 < 0 < got[1]
    # no hidden state: the same call alone, without the policy reward before it, gives the same values
    assert improvement_reward(completions=[text], old_params=[OLD], rollout_seed=[SEED], r_old=[-50.0],
                              settings=S) == pytest.approx([got[1]])
    assert improvement_reward(completions=[reply("junk")], old_params=[OLD], rollout_seed=[SEED], r_old=[-99.9],
                              settings=S) == [0.0]


def test_rewards_read_the_answer_prefix_with_the_completion():
    whole = "params[0]: 0; params[1]: 6; params[2]: 0"
    rest = whole.removeprefix("params[0]:")
    kw = dict(old_params=[OLD], rollout_seed=[SEED])
    assert policy_reward(completions=[rest], answer_prefix=["params[0]:"], settings=S, **kw) == \
        policy_reward(completions=[whole], settings=S, **kw) != [0.0]
    assert policy_reward(completions=[rest], settings=S, **kw) == [0.0]  # the completion alone is no whole reply
    assert improvement_reward(completions=[rest], answer_prefix=["params[0]:"], r_old=[-50.0], settings=S, **kw) == \
        improvement_reward(completions=[whole], r_old=[-50.0], settings=S, **kw)
    think = reply(whole)
    assert format_soft(completions=[think[7:]], answer_prefix=[think[:7]]) == [1.0]
    assert format_soft(completions=[think[7:]]) == [0.0]
    assert format_hard(completions=[think[7:]], answer_prefix=[think[:7]], old_params=[OLD], settings=S) == [1.0]
    # an answer prefix that opens the answer leaves no room for a think block before it
    assert format_hard(completions=[rest], answer_prefix=["params[0]:"], old_params=[OLD], settings=S) == [0.0]
    # the search's acceptance: the whole reply as the search parses it, think block or not; junk and the shown point
    # are rejected
    replies = [rest, whole, think, "junk", "params[0]: 1; params[1]: -2; params[2]: 0.5"]
    assert accepted_replies(replies, [OLD] * 5, ["params[0]:", "", "", "", ""], settings=S) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert accepted_replies([rest], [OLD], settings=S) == [0.0]


def test_bound_reward_funcs_are_named_for_trl():
    assert [f.__name__ for f in make_reward_funcs(S)] == ["format_soft", "format_hard", "policy", "improvement"]


# ------------------------------------------------------------------------------------------------ data


def test_vectors_come_from_the_one_range_and_split_is_disjoint():
    data = sample_scored_vectors(TASK, 10, 2, low=-2.0, high=3.0, decimals=1, seed=3)
    assert data.params.shape == (10, 3) and data.returns.shape == (10, 2)
    assert data.params.min() >= -2.0 and data.params.max() <= 3.0
    assert np.allclose(data.params, np.round(data.params, 1))
    assert np.array_equal(data.returns, sample_scored_vectors(TASK, 10, 2, low=-2.0, high=3.0, decimals=1,
                                                              seed=3).returns)
    train_idx, test_idx = split_indices(10, 0.2, 3)
    assert len(test_idx) == 2 and not set(train_idx) & set(test_idx) and len(train_idx) + len(test_idx) == 10
    settings = PromptSettings(low=-2.0, high=3.0, decimals=1, step_size=0.5, optimum=100.0, episodes=2)
    rec = build_records(TASK, data, train_idx[:1], settings, iteration=1, total_iterations=30, rollout_seed_base=50)
    r = rec[0]
    assert r["r_old"] == pytest.approx(data.returns[train_idx[0]].mean())
    assert r["rollout_seed"] == 50 + train_idx[0] and r["old_params"] == data.params[train_idx[0]].tolist()
    system, user = r["prompt"]
    assert "<think>" in system["content"]
    assert parse_reply(system["content"].split("format: ")[-1], 3, -6, 6).ok  # the example is in the parser's format
    assert "[-2, 3]" in user["content"] and user["content"].count("f(params):") == 1


# ------------------------------------------------------------------------------------------------ GRPO


def test_prompt_truncated_to_the_token_budget_keeps_template_and_the_end(tiny_llm):
    tok = tiny_llm.tokenizer
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": " ".join(f"w{i}" for i in range(200)) + " Now answer."}]
    n = prompt_token_count(tok, chat)
    cut, was_cut = truncate_prompt(tok, chat, n - 100)
    assert was_cut and prompt_token_count(tok, cut) <= n - 100
    assert cut[0] == chat[0] and cut[1]["content"].endswith("Now answer.") and "w0 " not in cut[1]["content"]
    assert truncate_prompt(tok, chat, n) == (chat, False)
    with pytest.raises(ValueError, match="max_prompt_tokens=3"):
        truncate_prompt(tok, chat, 3)
    ds = Dataset.from_list([{"prompt": chat}, {"prompt": chat[:1] + [{"role": "user", "content": "short"}]}])
    cfg = GRPOTrainParams(max_prompt_tokens=n - 100, max_steps=1, max_completion_length=4,
                          lora=LoraSettings(r=2, alpha=4, dropout=0.0))
    run = build_grpo_trainer(tiny_llm, ds, [format_soft], cfg, "unused-output-dir")
    assert run.truncated_prompts == 1 and run.prompts == 2
    assert max(prompt_token_count(tok, p) for p in run.trainer.train_dataset["prompt"]) <= n - 100


def test_a_chat_that_opens_the_answer_is_continued_and_cut_before_the_opening(tiny_llm):
    tok = tiny_llm.tokenizer
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": " ".join(f"w{i}" for i in range(200)) + " Now answer."}]
    opened = chat + [{"role": "assistant", "content": "params[0]:"}]
    assert opens_answer(opened) and not opens_answer(chat) and not opens_answer("params[0]:")
    text = render_chat(tok, opened)
    assert text == render_chat(tok, chat) + "params[0]:"  # the search's rendering of its prefix
    n = prompt_token_count(tok, opened)
    assert n == prompt_token_count(tok, text)
    cut_chat, cut = truncate_prompt(tok, opened, n - 100)
    short = render_chat(tok, cut_chat)
    assert cut and prompt_token_count(tok, short) <= n - 100 and short.endswith("params[0]:")
    assert cut_chat[0] == chat[0] and cut_chat[-1] == opened[-1]  # the system turn and the opening stay
    assert short.endswith(text[text.index("Now answer."):])  # the end of the user turn and the opened answer stay
    assert "w0 " not in short
    with pytest.raises(ValueError, match="max_prompt_tokens=5"):
        truncate_prompt(tok, opened, 5)
    # TRL would close the opened turn: the trainer gets the rendered text, cut to the budget
    cfg = GRPOTrainParams(max_prompt_tokens=n - 100, max_steps=1, max_completion_length=4,
                          lora=LoraSettings(r=2, alpha=4, dropout=0.0))
    brief = [{"role": "user", "content": "short"}, opened[-1]]
    run = build_grpo_trainer(tiny_llm, Dataset.from_list([{"prompt": opened}, {"prompt": brief}]), [format_soft],
                             cfg, "unused-output-dir")
    assert run.truncated_prompts == 1 and run.trainer.train_dataset["prompt"] == [short, render_chat(tok, brief)]
    with pytest.raises(ValueError, match="prompt: either every chat opens the answer"):
        build_grpo_trainer(tiny_llm, Dataset.from_list([{"prompt": opened}, {"prompt": [chat[1]]}]), [format_soft],
                           cfg, "unused-output-dir")


def _length_reward(completions, **_):
    """Varies within a group even for the random tiny model, so advantages are non-zero."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]


@pytest.mark.parametrize("answer_prefix", ["", "params[0]:"])
def test_grpo_update_changes_every_lora_weight_and_nothing_frozen(tmp_path, answer_prefix):
    llm = load_model("tiny")
    data = sample_scored_vectors(TASK, 4, 1, low=-6, high=6, decimals=1, seed=0)
    settings = PromptSettings(low=-6, high=6, decimals=1, step_size=0.5, optimum=100.0, episodes=1)
    records = build_records(TASK, data, range(4), settings, iteration=1, total_iterations=30, rollout_seed_base=9,
                            answer_prefix=answer_prefix)
    assert all(opens_answer(r["prompt"]) == bool(answer_prefix) for r in records)
    record: list[dict] = []
    funcs = recording([*make_reward_funcs(S), _length_reward], record, keys=("id",))
    # Two optimiser steps: LoRA's B starts at zero, so A gets no gradient before B has moved once.
    cfg = GRPOTrainParams(learning_rate=1e-2, max_steps=2, max_completion_length=8,
                          lora=LoraSettings(r=4, alpha=8, dropout=0.0), bf16=True)
    run = build_grpo_trainer(llm, Dataset.from_list(records), funcs, cfg, tmp_path / "trl")
    assert all(isinstance(p, str) == bool(answer_prefix) for p in run.trainer.train_dataset["prompt"])
    args = run.trainer.args
    assert (args.learning_rate, args.loss_type, args.beta) == (1e-2, "dapo", 0.0)
    assert not args.bf16 and not args.gradient_checkpointing and args.report_to == []  # CPU: both off
    model = run.trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = list(train(run))
    assert [r["step"] for r in rows] == [1, 2]
    assert {"loss", "lr", "reward_mean", "reward_format_soft", "reward_format_hard", "reward_policy",
            "reward_improvement"} <= rows[0].keys()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    for n, p in model.named_parameters():
        changed = not torch.equal(before[n], p.detach())
        assert changed == p.requires_grad, f"{n}: changed={changed}, trainable={p.requires_grad}"
    assert len(record) == 8 and {r["id"] for r in record} <= set(range(4))
    assert {"reward_format_soft", "reward_policy", "reward_improvement", "reward__length_reward"} <= record[0].keys()
    assert not any(tmp_path.glob("trl/*"))  # TRL wrote no checkpoints or logs


def test_adapter_bytes_are_stable_and_name_no_local_path(tmp_path):
    from peft import get_peft_model

    from llmrl.llm.load import peft_lora_config
    from llmrl.llm import save_model

    tiny = load_model("tiny")
    save_model(tiny.model, tiny.tokenizer, tmp_path / "base")
    base = load_model(str(tmp_path / "base")).model
    model = get_peft_model(base, peft_lora_config(LoraSettings(r=2, alpha=4), base))
    digests = []
    for name in ("a", "b"):
        save_adapter(model, tmp_path / name, base_model="models/base_llm")
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in (tmp_path / name).iterdir()})
    assert digests[0] == digests[1] and "adapter_model.safetensors" in digests[0]
    assert '"base_model_name_or_path": "models/base_llm"' in (tmp_path / "a" / "adapter_config.json").read_text()
    for f in (tmp_path / "a").iterdir():  # the local path of the base model leaks nowhere (same bytes per clone)
        assert str(tmp_path) not in f.read_bytes().decode("utf-8", errors="replace"), f.name


def test_config_errors_name_the_field():
    with pytest.raises(ParamsError, match="props.grpo.trainer"):
        load_section({"props": {"grpo": {"trainer": {"num_generations": 4, "per_device_train_batch_size": 6}}}},
                     "props.grpo", PropsGRPOParams)
    with pytest.raises(ParamsError, match="lora"):
        load_section({"g": {"lora": {"r": 0}}}, "g", GRPOTrainParams)
    with pytest.raises(ParamsError, match="props.grpo.vectors"):
        load_section({"props": {"grpo": {"vectors": 1}}}, "props.grpo", PropsGRPOParams)
