"""Shared-prefix scoring and sampling (llmrl.llm.prefix) agree with per-row full computation."""

from __future__ import annotations

import torch

from llmrl.llm.generate import SamplingConfig, generate
from llmrl.llm.load import load_model
from llmrl.llm.prefix import common_prefix_length, generate_shared_prefix, split_prefix, suffix_token_logprobs


def _texts(llm):
    return [llm.render([{"role": "system", "content": "You solve problems. " * 10},
                        {"role": "user", "content": f"What is {i} plus {i * 3}? " * (1 + i % 3)}]) for i in range(5)]


def test_common_prefix_length_leaves_a_token_per_row():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 1
    assert common_prefix_length([[5], [6]]) == 0


def test_greedy_and_stops_match_transformers_generate():
    llm = load_model("tiny:7")
    texts = _texts(llm)
    for sampling in (SamplingConfig(max_new_tokens=10, temperature=0),
                     SamplingConfig(max_new_tokens=10, temperature=0, stop=(" the", "\n"))):
        ours = generate_shared_prefix(llm, texts, sampling, batch_size=5)
        ref = generate(llm, texts, sampling, batch_size=5, raw=True)
        assert [(g.text, g.n_tokens, g.finish_reason) for g in ours] == \
               [(g.text, g.n_tokens, g.finish_reason) for g in ref]


def test_done_ends_replies_early_and_keeps_their_text_whole():
    llm = load_model("tiny:7")
    texts = _texts(llm)
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)
    full = generate_shared_prefix(llm, texts, greedy, batch_size=5)
    short = generate_shared_prefix(llm, texts, greedy, batch_size=5, done=lambda t: len(t) >= 6)
    for f, s in zip(full, short):  # greedy: the same reply, ended at the first token that reaches 6 characters
        assert f.text.startswith(s.text) and s.n_tokens <= f.n_tokens
        if len(f.text) > len(s.text):
            assert len(s.text) >= 6 and s.finish_reason == "stop"
    assert sum(s.n_tokens for s in short) < sum(f.n_tokens for f in full)


def test_sampling_is_seeded():
    llm = load_model("tiny:7")
    texts = _texts(llm)
    a = generate_shared_prefix(llm, texts, SamplingConfig(max_new_tokens=8, top_p=0.9, seed=3))
    b = generate_shared_prefix(llm, texts, SamplingConfig(max_new_tokens=8, top_p=0.9, seed=3))
    c = generate_shared_prefix(llm, texts, SamplingConfig(max_new_tokens=8, top_p=0.9, seed=4))
    assert [g.text for g in a] == [g.text for g in b] != [g.text for g in c]


def test_suffix_logprobs_match_full_forward_and_carry_gradients():
    llm = load_model("tiny:7", trainable=True)
    rows = [llm.tokenizer(t)["input_ids"] for t in _texts(llm)]
    batch = split_prefix(rows, llm.tokenizer.pad_token_id, "cpu")
    assert batch.P > 20
    lp = suffix_token_logprobs(llm.model, batch)
    for i, r in enumerate(rows):
        with torch.no_grad():
            full = torch.log_softmax(llm.model(input_ids=torch.tensor([r])).logits[0], -1)
        ref = full[:-1].gather(-1, torch.tensor(r[1:])[:, None]).squeeze(-1)[batch.P - 1:]
        torch.testing.assert_close(lp[i, : len(r) - batch.P].detach(), ref, atol=1e-5, rtol=1e-5)
    (lp * batch.suffix_mask).sum().backward()
    assert llm.model.model.layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0


def test_local_backend_with_a_shared_prefix_replies_as_the_plain_one():
    from llmrl.llm.backends import LocalBackend

    llm = load_model("tiny:7")
    chats = [[{"role": "system", "content": "You tune parameters. " * 10},
              {"role": "user", "content": f"History: {i}, {i * 3}."}, {"role": "assistant", "content": "params[0]:"}]
             for i in range(4)]
    sampling = SamplingConfig(max_new_tokens=8, temperature=0, stop=("\n",))
    shared, plain = LocalBackend(llm, 4, shared_prefix=True), LocalBackend(llm, 4)
    ours, ref = shared.generate(chats, sampling), plain.generate(chats, sampling)
    assert [(g.prompt, g.text, g.finish_reason) for g in ours] == [(g.prompt, g.text, g.finish_reason) for g in ref]
    assert shared.model_id != plain.model_id  # sampled replies differ in their random stream: other cache keys
