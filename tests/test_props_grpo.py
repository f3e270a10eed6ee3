"""ProPS GRPO: the four rewards on hand-made replies (each earned by a good reply under the search's answer prefix,
one rollout per proposal shared by the two return rewards), the data set and its chats (the search's own, system
message included), prompt truncation to the token budget, prompts opened with the answer prefix, a GRPO update on the
tiny model that changes every LoRA weight and nothing frozen (chat and opened prompts), and a byte-stable adapter."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from datasets import Dataset

from llmrl.agents.linear_policy import evaluate_params, policy_for
from llmrl.algos.grpo import build_grpo_trainer, opens_answer, prompt_token_count, recording, save_adapter, train, \
    truncate_prompt
from llmrl.algos.props_grpo import RewardSettings, RolloutMemo, accepted_replies, build_records, fine_tune_data, \
    format_hard, format_soft, improvement_reward, make_reward_funcs, normalised_return, policy_reward, \
    sample_scored_vectors, split_indices, training_summary
from llmrl.algos.props_prompts import PromptSettings, parse_reply, search_messages
from llmrl.config import ParamsError, load_section
from llmrl.config.grpo import GRPOTrainParams
from llmrl.config.props import PropsGRPOParams, PropsSpaceParams
from llmrl.envs.control import get_task
from llmrl.config.lora import LoraSettings
from llmrl.llm.load import load_model, render_chat

TASK = get_task("mountaincar_continuous")  # its own 999 steps, as the search runs it
S = RewardSettings(task=TASK, n_params=3, low=-6.0, high=6.0, return_floor=-200.0, return_span=300.0)
OLD = [1.0, -2.0, 0.5]
GOOD = [0.0, 5.0, 0.0]  # pushes along the velocity: reaches the flag (return ~99)
PREFIX = "params[0]:"  # the search's answer prefix at the CPU default
SEED = 7


def reply(params_line: str, think: str = "The car must swing.\nPush with the velocity.\nLarger weight.") -> str:
    return f"<think>{think}</think>\n{params_line}"


def rollout(params, seed=SEED) -> float:
    return float(evaluate_params(TASK, np.asarray(params, dtype=float), [seed])[0, 0])


# ------------------------------------------------------------------------------------------------ rewards


def test_every_reward_is_earned_by_a_good_reply_under_the_answer_prefix():
    """The completion after the search's prefix: both format rewards 1, the policy reward the good point's
    normalised return, the improvement over a poor shown point positive."""
    rest = " 0; params[1]: 5; params[2]: 0"
    funcs = dict((f.__name__, f) for f in make_reward_funcs(S))
    kw = dict(completions=[rest], answer_prefix=[PREFIX], old_params=[OLD], rollout_seed=[SEED], r_old=[-60.0])
    got = {name: f(**kw)[0] for name, f in funcs.items()}
    assert got["format_soft"] == 1.0 and got["format_hard"] == 1.0
    assert got["policy"] == pytest.approx(normalised_return(rollout(GOOD), S)) and got["policy"] > 0.95
    n, o = got["policy"], (-60.0 + 200) / 300
    assert got["improvement"] == pytest.approx(min(1.0, (n - o) * n / o)) and got["improvement"] > 0


def test_format_soft_asks_a_well_formed_answer_line_and_hard_the_parsers_acceptance():
    texts = ["params[0]: 0; params[1]: 5; params[2]: 0",  # accepted
             reply("params[0]: 0; params[1]: 5; params[2]: 0"),  # a closed think block first: the same answer
             "params[0]: 0; params[1]: 5; params[2]: 0; f(par",  # cut in the trailing echo: complete
             "params[0]: 0; params[1]: 5",  # well formed, too few
             "params[0]: 0; params[1]: 60; params[2]: 0",  # well formed, out of range
             "params[0]: 1; params[1]: -2; params[2]: 0.5",  # well formed, the shown point again
             "params[0]: <value>; params[1]: <value>; params[2]: <value>",  # the placeholder copied
             "0, 5, 0",  # the right count, not the format
             "params[0]: 0; params[1]: five; params[2]: 0",  # junk item
             "<think>never closed\nparams[0]: 0; params[1]: 5; params[2]: 0",  # the parser reads the answer line
             [{"role": "assistant", "content": "params[0]: 0; params[1]: 5; params[2]: 0"}]]  # TRL's conversational
    old = [OLD] * len(texts)
    assert format_soft(completions=texts, settings=S) == [1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1]
    assert format_hard(completions=texts, old_params=old, settings=S) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    # exactly the search's acceptance
    assert format_hard(completions=texts, old_params=old, settings=S) == accepted_replies(texts, old, settings=S)
    assert parse_reply(texts[0], 3, -6, 6, current=OLD).ok and not parse_reply(texts[3], 3, -6, 6).ok


def test_policy_reward_is_one_seeded_rollout_normalised():
    texts = ["params[0]: 0; params[1]: 5; params[2]: 0", "params[0]: 1; params[1]: 6; params[2]: 0", "junk",
             "params[0]: 0; params[1]: 5"]
    got = policy_reward(completions=texts, old_params=[OLD] * 4, rollout_seed=[SEED] * 4, settings=S)
    assert got[0] == pytest.approx(np.clip((rollout(GOOD) + 200) / 300, 0, 1)) and got[0] > 0.95
    assert got[1] == pytest.approx(np.clip((rollout([1, 6, 0]) + 200) / 300, 0, 1))
    assert got[2:] == [0.0, 0.0]  # rejected replies earn nothing
    again = policy_reward(completions=texts[:1], old_params=[OLD], rollout_seed=[SEED], settings=S)
    assert again == got[:1]  # same example (seed) -> same reward


def test_improvement_is_the_originals_formula_on_normalised_returns_with_r_old_zero_guarded():
    text = "params[0]: 0; params[1]: 5; params[2]: 0"
    n = normalised_return(rollout(GOOD), S)
    r_olds = [-50.0, -170.0, rollout(GOOD) + 10.0, -200.0, -400.0]  # the last two normalise to 0
    got = improvement_reward(completions=[text] * 5, old_params=[OLD] * 5, rollout_seed=[SEED] * 5, r_old=r_olds,
                             settings=S)
    o = [(r + 200) / 300 for r in r_olds[:2]]
    assert got[:2] == pytest.approx([min(1.0, (n - o[0]) * n / o[0]), min(1.0, (n - o[1]) * n / o[1])])
    assert got[2] == 0.0  # no improvement over a better shown point
    assert got[3:] == pytest.approx([n, n])  # o = 0: the original's guard rewards n itself
    assert improvement_reward(completions=["junk"], old_params=[OLD], rollout_seed=[SEED], r_old=[-99.9],
                              settings=S) == [0.0]


def test_policy_and_improvement_share_one_rollout_per_proposal():
    memo = RolloutMemo()
    funcs = dict((f.__name__, f) for f in make_reward_funcs(S, memo))
    texts = ["params[0]: 0; params[1]: 5; params[2]: 0", "params[0]: 1; params[1]: 6; params[2]: 0",
             "params[0]: 0; params[1]: 5; params[2]: 0", "junk"]
    kw = dict(completions=texts, old_params=[OLD] * 4, rollout_seed=[SEED, SEED, SEED, SEED], r_old=[-50.0] * 4)
    policy = funcs["policy"](**kw)
    assert memo.rollouts == 2  # two distinct accepted points, one seed: two episodes
    improvement = funcs["improvement"](**kw)
    assert memo.rollouts == 2 and policy[0] == policy[2]  # the improvement reward reused them
    # without the memo each call rolls out afresh, to the same values: the memo changes cost, not results
    assert improvement == improvement_reward(settings=S, **kw)


def test_rewards_read_the_answer_prefix_with_the_completion():
    whole = "params[0]: 0; params[1]: 5; params[2]: 0"
    rest = whole.removeprefix(PREFIX)
    kw = dict(old_params=[OLD], rollout_seed=[SEED])
    assert policy_reward(completions=[rest], answer_prefix=[PREFIX], settings=S, **kw) == \
        policy_reward(completions=[whole], settings=S, **kw) != [0.0]
    assert policy_reward(completions=[rest], settings=S, **kw) == [0.0]  # the completion alone is no whole reply
    assert format_soft(completions=[rest], answer_prefix=[PREFIX], settings=S) == [1.0]
    assert format_soft(completions=[rest], settings=S) == [0.0]
    assert accepted_replies([rest, whole, "junk"], [OLD] * 3, [PREFIX, "", ""], settings=S) == [1.0, 1.0, 0.0]


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
    # the search's own chat: the same system message and user prompt the search sends for this history
    assert r["prompt"] == search_messages("numeric", task=TASK, policy=policy_for(TASK),
                                          history=[(r["old_params"], r["r_old"])], iteration=1, total_iterations=30,
                                          settings=settings)
    system, user = r["prompt"]
    assert system["role"] == "system" and "<think>" not in system["content"]
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
    run = build_grpo_trainer(tiny_llm, ds, make_reward_funcs(S)[:1], cfg, "unused-output-dir")
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
    run = build_grpo_trainer(tiny_llm, Dataset.from_list([{"prompt": opened}, {"prompt": brief}]),
                             make_reward_funcs(S)[:1], cfg, "unused-output-dir")
    assert run.truncated_prompts == 1 and run.trainer.train_dataset["prompt"] == [short, render_chat(tok, brief)]
    with pytest.raises(ValueError, match="prompt: either every chat opens the answer"):
        build_grpo_trainer(tiny_llm, Dataset.from_list([{"prompt": opened}, {"prompt": [chat[1]]}]),
                           make_reward_funcs(S)[:1], cfg, "unused-output-dir")


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
    from llmrl.llm.load import save_model

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


def test_fine_tune_data_is_the_scored_vectors_split_and_shown_in_the_searchs_prompt():
    p = PropsGRPOParams(vectors=6, episodes=1, test_fraction=0.34, seed=2, answer_prefix=PREFIX)
    space = PropsSpaceParams(low=-2.0, high=3.0, decimals=1)
    data = fine_tune_data(TASK, p, space)
    assert len(data.train) + len(data.test) == 6 and not set(data.train) & set(data.test)
    assert [r["id"] for r in data.records["train"]] == data.train.tolist()
    assert [r["id"] for r in data.records["test"]] == data.test.tolist()
    first = data.records["train"][0]
    assert first["prompt"][-1] == {"role": "assistant", "content": PREFIX}  # the opened answer the search sends
    assert first["rollout_seed"] == 3_000_000_000 + first["id"]  # never a scoring episode's seed (2_000_000..)
    rows = data.vector_rows()
    assert [r["split"] for r in rows].count("test") == len(data.test)
    assert rows[data.test[0]]["params"] == data.vectors.params[data.test[0]].tolist()
    again = fine_tune_data(TASK, p, space)  # seeded: the same data
    assert np.array_equal(again.vectors.returns, data.vectors.returns) and again.records == data.records


def test_training_summary_rates_the_replies_the_search_would_accept_per_step():
    vectors = sample_scored_vectors(TASK, 2, 1, low=-6.0, high=6.0, decimals=1, seed=0)
    good = f" {GOOD[0]}, params[1]: {GOOD[1]}, params[2]: {GOOD[2]}"  # completes the prefix
    completions = [{"step": 0, "id": 0, "answer_prefix": PREFIX, "completion": good, "reward_format_hard": 1.0},
                   {"step": 0, "id": 1, "answer_prefix": PREFIX, "completion": " nonsense", "reward_format_hard": 0.0},
                   {"step": 1, "id": 0, "answer_prefix": PREFIX, "completion": good, "reward_format_hard": 1.0}]
    rows = [{"step": 1, "loss": 0.1, "reward_mean": 0.2, "reward_format_hard": 0.5},
            {"step": 2, "loss": 0.05}, {"step": 3, "loss": 0.0, "reward_mean": 0.4, "reward_format_hard": 1.0}]
    summary = training_summary(rows, completions, vectors, S)
    assert summary["steps"] == 3 and summary["completions"] == 3
    assert summary["accepted_rate_first_last"] == [0.5, 1.0] and summary["accepted_rate_all"] == round(2 / 3, 4)
    assert summary["reward_mean_first_last"] == [0.2, 0.4] and summary["format_hard_rate_first_last"] == [0.5, 1.0]
    assert summary["format_hard_rate_all"] == pytest.approx(2 / 3)
    empty = training_summary([{"step": 1, "loss": 0.0}], [], vectors, S)
    assert empty["accepted_rate_first_last"] == [None, None] and empty["reward_mean_first_last"] == [None, None]
