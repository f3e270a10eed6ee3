import numpy as np
import pytest
import torch

from llmrl.config.lora import LoraSettings
from llmrl.llm.generate import generate, SamplingConfig
from llmrl.llm.score import score, score_naive, score_tensors
from llmrl.llm.load import load_model, ModelSpecError, save_model

ACTIONS = [" turn left", " turn right", " go forward", " pick up", " drop", " toggle"]
PROMPTS = [
    "Possible actions: turn left, turn right, go forward.\nGoal: go to the red ball\nObservation: You see a wall "
    "2 steps forward\nAction:",
    "x",
    "A much longer prompt " * 12 + "Action:",
]


def _max_diff(a, b):
    return max(float(np.abs(x.logprob - y.logprob).max()) for x, y in zip(a, b))


def test_score_equals_naive_tiny(tiny_llm):
    fast = score(tiny_llm, PROMPTS, ACTIONS, batch_size=3)
    naive = score_naive(tiny_llm, PROMPTS, ACTIONS)
    assert _max_diff(fast, naive) <= 1e-4
    # Candidates of unequal token length: padding must contribute exactly nothing.
    assert len(set(fast[0].n_tokens.tolist())) > 1
    assert all(np.all(s.logprob < 0) for s in fast)


def test_score_batching_and_per_prompt_candidates(tiny_llm):
    one_by_one = [score(tiny_llm, [p], ACTIONS)[0] for p in PROMPTS]
    batched = score(tiny_llm, PROMPTS, ACTIONS, batch_size=8)
    assert _max_diff(one_by_one, batched) <= 1e-4
    per_prompt = score(tiny_llm, PROMPTS[:2], [ACTIONS[:2], [" a", " b c d"]])
    assert per_prompt[1].n_tokens.tolist() == [1, 3]
    ref = score_naive(tiny_llm, PROMPTS[1:2], [" a", " b c d"])[0]
    np.testing.assert_allclose(per_prompt[1].logprob, ref.logprob, atol=1e-4)
    np.testing.assert_allclose(per_prompt[1].logprob_mean, ref.logprob / np.array([1, 3]), atol=1e-4)


def test_score_is_sequence_log_likelihood(tiny_llm):
    """A candidate's score is the model's log-likelihood of those tokens (log-softmax, not raw logits)."""
    tok, model = tiny_llm.tokenizer, tiny_llm.model
    p_ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    c_ids = tok(ACTIONS[2], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([p_ids + c_ids])).logits[0]
    probs = torch.softmax(logits, -1)
    expected = sum(float(torch.log(probs[len(p_ids) - 1 + i, t])) for i, t in enumerate(c_ids))
    got = score(tiny_llm, PROMPTS[:1], ACTIONS)[0].logprob[2]
    assert abs(got - expected) < 1e-4


def test_score_errors(tiny_llm):
    with pytest.raises(ValueError, match="same, non-zero number of candidates"):
        score_tensors(tiny_llm, ["a", "b"], [[" x"], [" x", " y"]])
    with pytest.raises(ValueError, match="tokenise to nothing"):
        score(tiny_llm, ["a"], [""])


def test_score_gradients_flow_through_lora():
    llm = load_model("tiny:1", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    out = score_tensors(llm, PROMPTS[:2], [ACTIONS, ACTIONS], return_prompt_hidden=True)
    assert out.prompt_hidden.shape == (2, llm.model.config.hidden_size)
    out.logprob.sum().backward()
    trainable = [(n, p) for n, p in llm.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, _ in trainable)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for _, p in trainable)
    frozen = [p for _, p in llm.model.named_parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for p in frozen)


def test_shared_prefix_gives_the_plain_scores_trunks_and_gradients():
    # GLAM computes its prompts' common token prefix once (share_prefix): the scores, prompt states, frozen-trunk
    # states, replays from those trunks and gradients of the plain left-padded pass, up to float rounding.
    from llmrl.llm.prefix import common_prefix_length

    llm = load_model("tiny:1", lora=LoraSettings(r=4, alpha=8, dropout=0.0, layers=1))
    stem = PROMPTS[0]
    prompts = [stem + " turn left", stem + " go forward, then turn right", stem]  # the last one is all prefix
    rows = [llm.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert common_prefix_length(rows) == len(rows[2]) - 1 > 20
    runs = {}
    for share in (False, True):
        llm.model.zero_grad()
        out = score_tensors(llm, prompts, [ACTIONS] * 3, return_prompt_hidden=True, trunk_start=1,
                            share_prefix=share)
        (out.logprob.sum() + out.prompt_hidden.sum()).backward()
        grads = {n: p.grad.clone() for n, p in llm.model.named_parameters() if p.grad is not None}
        replay = score_tensors(llm, prompts, [ACTIONS] * 3, return_prompt_hidden=True, trunks=out.trunks,
                               share_prefix=share)
        runs[share] = out, grads, replay
    (plain, plain_grads, _), (shared, shared_grads, shared_replay) = runs[False], runs[True]
    close = dict(rtol=0, atol=1e-4)
    torch.testing.assert_close(shared.logprob, plain.logprob, **close)
    torch.testing.assert_close(shared.prompt_hidden, plain.prompt_hidden, **close)
    torch.testing.assert_close(shared_replay.logprob, plain.logprob, **close)
    torch.testing.assert_close(shared_replay.prompt_hidden, plain.prompt_hidden, **close)
    for a, b, ids in zip(shared.trunks, plain.trunks, rows):
        assert a.prompt.shape == b.prompt.shape == (len(ids), llm.model.config.hidden_size)
        torch.testing.assert_close(a.prompt, b.prompt, **close)
        for x, y in zip(a.candidates, b.candidates):
            torch.testing.assert_close(x, y, **close)
    assert shared_grads.keys() == plain_grads.keys() and shared_grads
    for n, g in plain_grads.items():
        torch.testing.assert_close(shared_grads[n], g, rtol=1e-4, atol=1e-5)
    assert any(g.abs().sum() > 0 for g in plain_grads.values())


def test_kept_prefix_passes_serve_later_batches(tiny_llm):
    # GLAM's rollouts keep each batch's prefix pass (prefix_cache) while the weights stay fixed: a later batch
    # whose rows start with it reuses it, also a single row, and scores as the plain pass does.
    stem = PROMPTS[0]
    first, later = [stem + " a b", stem + " c"], [stem + " turn left, then go forward", stem + " d"]
    kept: dict = {}
    with torch.no_grad():
        score_tensors(tiny_llm, first, [ACTIONS] * 2, share_prefix=True, prefix_cache=kept)
        assert len(kept) == 1 and len(next(iter(kept))) > 20
        for rows in (later, later[:1]):
            got = score_tensors(tiny_llm, rows, [ACTIONS] * len(rows), return_prompt_hidden=True,
                                share_prefix=True, prefix_cache=kept)
            plain = score_tensors(tiny_llm, rows, [ACTIONS] * len(rows), return_prompt_hidden=True)
            torch.testing.assert_close(got.logprob, plain.logprob, rtol=0, atol=1e-4)
            torch.testing.assert_close(got.prompt_hidden, plain.prompt_hidden, rtol=0, atol=1e-4)
    assert len(kept) == 1  # reused, not recomputed


def test_generate_seeded_and_stop_strings(tiny_llm):
    s = SamplingConfig(max_new_tokens=12, temperature=1.0, seed=7)
    a = generate(tiny_llm, ["hello", "the cat"], s)
    b = generate(tiny_llm, ["hello", "the cat"], s)
    c = generate(tiny_llm, ["hello", "the cat"], SamplingConfig(max_new_tokens=12, temperature=1.0, seed=8))
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.text for g in a] != [g.text for g in c]
    # Chat template applied for chat models (the tiny model has one).
    assert a[0].prompt.startswith("<|user|>\nhello") and a[0].prompt.endswith("<|assistant|>\n")
    full = generate(tiny_llm, ["hello"], s)[0].text
    assert len(full.strip()) >= 8
    stop = full.strip()[5:8]
    cut = generate(tiny_llm, ["hello"], SamplingConfig(max_new_tokens=12, temperature=1.0, seed=7, stop=(stop,)))[0]
    assert cut.text == full[: full.find(stop)]
    assert cut.finish_reason == "stop"


def test_sampling_config_errors():
    with pytest.raises(ValueError, match="sampling.max_new_tokens"):
        SamplingConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="sampling.top_p"):
        SamplingConfig(top_p=1.5)


def test_local_folder_round_trip(tiny_llm, tmp_path):
    save_model(tiny_llm.model, tiny_llm.tokenizer, tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    a = score(tiny_llm, PROMPTS[:1], ACTIONS)[0].logprob
    b = score(again, PROMPTS[:1], ACTIONS)[0].logprob
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert again.is_chat


def test_bad_specs(tmp_path):
    with pytest.raises(ModelSpecError, match="no config.json"):
        load_model(str(tmp_path))
    with pytest.raises(ModelSpecError, match="unknown embedded model"):
        load_model("embedded:nope")
    with pytest.raises(ModelSpecError, match="not a model folder"):
        load_model(str(tmp_path / "missing-folder"))


def test_missing_relative_model_folder_is_no_hub_name(tmp_path, monkeypatch):
    """``models/x`` with a local ``models`` folder but no ``x`` is a missing folder, not a hub lookup."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for spec in ("models/x", "a/b/c", "~/nowhere/model"):
        with pytest.raises(ModelSpecError, match="not a model folder"):
            load_model(spec)


def test_embedded_model(embedded_llm):
    """The packaged SmolLM2: real answers, chat template, and scoring equal to the naive computation."""
    assert embedded_llm.is_chat and embedded_llm.model.config.num_hidden_layers == 30
    reply = generate(embedded_llm, ["What is the capital of France?"], SamplingConfig(max_new_tokens=12,
                                                                                      temperature=0))[0]
    assert "Paris" in reply.text
    prompts = [embedded_llm.render(PROMPTS[0]), embedded_llm.render("Goal: pick up the key. Action:")]
    fast = score(embedded_llm, prompts, ACTIONS, batch_size=2)
    naive = score_naive(embedded_llm, prompts, ACTIONS)
    assert _max_diff(fast, naive) <= 1e-4


def test_eos_token_ids_take_the_tokenizers_and_a_list_from_the_generation_config():
    from llmrl.llm.generate import eos_token_ids

    llm = load_model("tiny")
    llm.model.generation_config.eos_token_id = [5, 7]  # a list, as Llama 3's end-of-turn ids
    assert eos_token_ids(llm) == sorted({llm.tokenizer.eos_token_id, 5, 7})
    llm.model.generation_config.eos_token_id = None
    assert eos_token_ids(llm) == [llm.tokenizer.eos_token_id]


def test_full_fine_tuning_keeps_fp32_weights_and_computes_in_the_asked_dtype(tmp_path):
    """bf16 asked for a fully trained model: fp32 master weights, bf16 autocast forwards. An Adam step at the
    learning rates used here (1e-5) moves the fp32 weights; on bf16 weights most of the same step rounds away."""
    llm = load_model("tiny", device="cpu", dtype="bfloat16", trainable=True)
    assert llm.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and p.requires_grad for p in llm.model.parameters())
    ids = torch.tensor([[1, 2, 3, 4]])
    assert llm.model(input_ids=ids).logits.dtype == torch.bfloat16  # computed under autocast

    def moved_fraction(model) -> float:
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
        opt.step()
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
        return moved / sum(b.numel() for b in before)

    mixed = moved_fraction(llm.model)
    assert mixed > 0.9
    pure = load_model("tiny", device="cpu", dtype="bfloat16").model.requires_grad_(True)
    assert next(pure.parameters()).dtype == torch.bfloat16  # frozen models keep the asked dtype
    assert moved_fraction(pure) < 0.3  # measured 0.16: most updates are below bf16's resolution
    save_model(llm.model, llm.tokenizer, tmp_path / "m")  # the autocast wrapper does not get in the way
    assert (tmp_path / "m" / "config.json").is_file()


def test_resolve_dtype(monkeypatch):
    from llmrl.llm import load as load_module
    from llmrl.llm.load import resolve_dtype

    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) == torch.float32 and resolve_dtype("bfloat16", cpu) == torch.bfloat16
    monkeypatch.setattr(load_module, "cpu_runs_bf16", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    assert resolve_dtype(None, cpu) == torch.float32  # the library default: a test's numbers do not depend on the CPU
    assert load_model("tiny", device="cpu", dtype="auto").dtype_name == "bfloat16"
    monkeypatch.setattr(load_module, "cpu_runs_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, got 'fp16'"):
        resolve_dtype("fp16", cpu)


def test_bf16_scores_stay_close_to_fp32():
    # Scoring under bf16 against fp32 on the same weights: measured max |Δ log-prob| 0.002 on the tiny model
    # (bench/bf16.py: 0.30 max, 0.075 mean on SmolLM2-135M, the best candidate unchanged).
    fp32 = load_model("tiny", device="cpu", dtype="float32")
    bf16 = load_model("tiny", device="cpu", dtype="bfloat16")
    a, b = score(fp32, PROMPTS, ACTIONS), score(bf16, PROMPTS, ACTIONS)
    assert 0 < _max_diff(a, b) < 0.05


def test_bf16_replies_get_their_own_cache_identity():
    from llmrl.llm.backends import LocalBackend, SharedPromptBackend

    fp32 = load_model("tiny", device="cpu", dtype="float32")
    bf16 = load_model("tiny", device="cpu", dtype="bfloat16")
    assert LocalBackend(fp32).model_id == "local:tiny"  # fp32 keys as before
    assert LocalBackend(bf16).model_id == "local:tiny@bfloat16"
    assert SharedPromptBackend(bf16).model_id == "local-shared-prompt:tiny@bfloat16"
