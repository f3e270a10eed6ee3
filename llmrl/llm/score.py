"""Log-probability of candidate continuations, computing each prompt once and reusing its KV cache.

score(a | c) = sum_t log softmax(logits)[a_t] over the candidate's tokens, given the prompt's tokens. Padding
contributes exactly 0 (GLAM's original filled padding with 1.0 and summed raw logits; both are fixed here).
The candidate's tokens are those of the candidate string tokenised on its own and appended to the prompt's
tokens, as Lamorel and GLAM do; the naive reference below uses the very same token ids.

Frozen trunk: when only the layers from ``trunk_start`` up train (LoRA on the top layers), what the layers below
compute for a (prompt, candidates) row never changes. ``score_tensors(..., trunk_start=k)`` returns those hidden
states (one ``Trunk`` per row, captured from the same forward passes), and ``score_tensors(..., trunks=...)``
runs only layers k.. on them, so PPO's epochs and minibatches cost the top layers alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import contextlib
import copy
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from llmrl.llm.load import LLM
from llmrl.llm.prefix import common_prefix_length, split_prefix_left_padded

__all__ = ["CandidateScores", "ScoreOutput", "Trunk", "tokenize_left_padded", "score_tensors", "score", "score_naive"]


@dataclass
class CandidateScores:
    """Scores of one prompt's candidates."""

    logprob: np.ndarray  # [C] summed log-probability of each candidate
    n_tokens: np.ndarray  # [C] candidate lengths in tokens

    @property
    def logprob_mean(self) -> np.ndarray:
        """Length-normalised log-probability (per token)."""
        return self.logprob / np.maximum(self.n_tokens, 1)


@dataclass
class ScoreOutput:
    """Tensor form, kept on the graph so policies can train through it."""

    logprob: torch.Tensor  # [B, C] summed log-probs
    n_tokens: torch.Tensor  # [B, C]
    prompt_hidden: torch.Tensor | None  # [B, H] last-layer hidden state at the prompt's last token
    trunks: list[Trunk] | None = None  # with trunk_start: what the frozen layers computed, one per prompt


@dataclass
class Trunk:
    """The hidden states entering decoder layer ``start`` for one prompt and its candidates (no padding, no grad):
    the frozen layers' whole contribution to that row's scores."""

    start: int
    prompt: torch.Tensor  # [P, H] at the prompt's tokens
    candidates: list[torch.Tensor]  # C x [L_c, H] at each candidate's tokens, given the prompt


def decoder_layers_of(model) -> nn.Module:
    """The module holding a causal LM's decoder stack as ``.layers`` (through a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
        raise ValueError(f"frozen trunk: {type(base).__name__} has no decoder stack at .model.layers")
    return inner


@contextlib.contextmanager
def top_layers(model, start: int) -> Iterator[None]:
    """Run ``model`` on ``inputs_embeds`` = the hidden states entering layer ``start``: the stack is cut to layers
    ``start``.. for the block (their KV-cache slots renumbered from 0), embeddings skipped, the final norm and LM
    head kept. transformers has no entry point mid-stack, hence the temporary cut."""
    inner = decoder_layers_of(model)
    layers = inner.layers
    if not 0 < start < len(layers):
        raise ValueError(f"frozen trunk: start must be in 1..{len(layers) - 1}, got {start}")
    top = list(layers)[start:]
    indices = [layer.self_attn.layer_idx for layer in top]
    inner.layers = nn.ModuleList(top)
    for i, layer in enumerate(top):
        layer.self_attn.layer_idx = i
    try:
        yield
    finally:
        for layer, i in zip(top, indices):
            layer.self_attn.layer_idx = i
        inner.layers = layers


def tokenize_left_padded(tokenizer, texts: Sequence[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``texts`` padded on the left (every row's last position is its last token):
    the one left-padding routine of the project (scoring, GLAM's value and action heads)."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    if any(len(x) == 0 for x in ids):
        raise ValueError("score: every prompt must tokenise to at least one token")
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    return input_ids.to(device), mask.to(device)


def _tokenize_candidates(tokenizer, candidates: Sequence[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in candidates]
    if any(len(x) == 0 for x in ids):
        empty = [c for c, x in zip(candidates, ids) if not x]
        raise ValueError(f"score: candidates {empty!r} tokenise to nothing")
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return input_ids.to(device), mask.to(device)


@dataclass
class _PrefixState:
    """A prefix pass kept for later batches: its KV cache (one row) and hidden states."""

    cache: DynamicCache
    hidden_states: tuple[torch.Tensor, ...] | None


def _prompt_forward(model, prefix: dict | None, suffix: dict, suffix_mask: torch.Tensor, *, hidden: bool,
                    stored: _PrefixState | None = None, keep: bool = False):
    """The prompts' pass, ``[prefix | pad | suffix]``: the shared prefix (``input_ids`` or ``inputs_embeds`` of one
    row; None for none) once, or its ``stored`` pass, its KV cache repeated over the rows, then every row's
    left-padded suffix on it. Returns the prefix pass (a ``_PrefixState``, kept intact with ``keep``, or None),
    the suffix pass's output (last position's logits only) and the attention mask over both, [B, P + S]."""
    B = suffix_mask.shape[0]
    cache, pre = DynamicCache(), stored
    if stored is None and prefix is not None:
        out = model(**prefix, past_key_values=cache, use_cache=True, output_hidden_states=hidden or keep,
                    logits_to_keep=1)
        pre = _PrefixState(copy.deepcopy(out.past_key_values) if keep else out.past_key_values, out.hidden_states)
        cache = out.past_key_values
    elif stored is not None:
        cache = copy.deepcopy(stored.cache)  # the repeat below is in place
    if pre is not None:
        cache.batch_repeat_interleave(B)
    P = cache.get_seq_length()
    mask = torch.cat([torch.ones((B, P), dtype=suffix_mask.dtype, device=suffix_mask.device), suffix_mask], dim=1)
    pos = P + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(**suffix, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                output_hidden_states=hidden,
                logits_to_keep=1)  # only the last position's logits are used; the vocab projection dominates
    return pre, out, mask


def _candidate_forward(model, cand: dict, cand_mask: torch.Tensor, prompt_mask: torch.Tensor, cache, n_cand: int,
                       *, hidden: bool = False):
    """Every candidate on its prompt's KV cache ([B*C] rows): logits at the positions that predict a next
    candidate token only (a candidate's last position predicts nothing)."""
    cache.batch_repeat_interleave(n_cand)
    width = cand_mask.shape[1]
    dev = cand_mask.device
    lens = prompt_mask.sum(-1).repeat_interleave(n_cand)  # [B*C] true prompt lengths
    full_mask = torch.cat([prompt_mask.repeat_interleave(n_cand, dim=0), cand_mask], dim=1)
    return model(**cand, attention_mask=full_mask, position_ids=lens[:, None] + torch.arange(width, device=dev)[None],
                 past_key_values=cache, use_cache=True, output_hidden_states=hidden,
                 logits_to_keep=torch.arange(max(width - 1, 1), device=dev))


def score_tensors(
    llm: LLM,
    prompts: Sequence[str],
    candidates: Sequence[Sequence[str]],
    *,
    return_prompt_hidden: bool = False,
    trunk_start: int | None = None,
    trunks: Sequence[Trunk] | None = None,
    share_prefix: bool = False,
    prefix_cache: dict | None = None,
) -> ScoreOutput:
    """Summed log-probs of ``candidates[i][j]`` after rendered text ``prompts[i]``, one forward per prompt.

    All prompts must offer the same number of candidates (pad the list upstream otherwise). Gradients flow
    when the model has trainable parameters and grad is enabled. ``trunk_start`` also returns each row's
    ``Trunk`` (hidden states entering that layer); ``trunks`` (captured earlier for these very rows, with the
    layers below their ``start`` unchanged since) runs only the layers from there. ``share_prefix`` computes the
    prompts' longest common token prefix once (``llmrl.llm.prefix``): the same scores up to float rounding, for
    the cost of the rows' own suffixes (GLAM's prompts share their first half: system turn and action list).
    ``prefix_cache`` (a dict the caller keeps, valid while the weights stay fixed, no grad) keeps those prefix
    passes for later calls: a batch whose rows start with a kept prefix reuses it (the longest such).
    """
    if trunks is not None:
        return _score_from_trunks(llm, prompts, candidates, trunks, return_prompt_hidden, share_prefix)
    n_prompts = len(prompts)
    if n_prompts == 0:
        raise ValueError("score: no prompts")
    if len(candidates) != n_prompts:
        raise ValueError(f"score: {n_prompts} prompts but {len(candidates)} candidate lists")
    n_cand = len(candidates[0])
    if n_cand == 0 or any(len(c) != n_cand for c in candidates):
        raise ValueError("score: every prompt needs the same, non-zero number of candidates")
    model, tok, dev = llm.model, llm.tokenizer, llm.device

    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if any(len(x) == 0 for x in rows):
        raise ValueError("score: every prompt must tokenise to at least one token")
    capture = trunk_start is not None
    kept = None
    if share_prefix and prefix_cache is not None:
        common = common_prefix_length(rows)
        kept = next((key for key in sorted(prefix_cache, key=len, reverse=True)
                     if len(key) <= common and tuple(rows[0][:len(key)]) == key), None)
    batch = split_prefix_left_padded(rows, tok.pad_token_id, dev, share=share_prefix,
                                     length=len(kept) if kept is not None else None)
    keep = prefix_cache is not None and kept is None and batch.P > 0 and n_prompts > 1  # one row's is its own
    pre, out, prompt_mask = _prompt_forward(model, {"input_ids": batch.prefix} if batch.P else None,
                                            {"input_ids": batch.suffix}, batch.suffix_mask,
                                            hidden=return_prompt_hidden or capture,
                                            stored=prefix_cache[kept] if kept is not None else None, keep=keep)
    if keep:
        prefix_cache[tuple(rows[0][:batch.P])] = pre
    hidden = out.hidden_states[-1][:, -1] if return_prompt_hidden else None

    flat = [c for cands in candidates for c in cands]
    cand_ids, cand_mask = _tokenize_candidates(tok, flat, dev)  # [B*C, L]
    cand_out = _candidate_forward(model, {"input_ids": cand_ids}, cand_mask, prompt_mask, out.past_key_values,
                                  n_cand, hidden=capture)
    captured = None
    if capture:
        hs = out.hidden_states[trunk_start].detach()
        hp = hs if pre is None else torch.cat([pre.hidden_states[trunk_start].detach().expand(n_prompts, -1, -1),
                                               hs], dim=1)
        hc = cand_out.hidden_states[trunk_start].detach()
        c_len = cand_mask.sum(-1).tolist()
        captured = [Trunk(trunk_start, hp[i][prompt_mask[i].bool()].clone(),
                          [hc[j, : c_len[j]].clone() for j in range(i * n_cand, (i + 1) * n_cand)])
                    for i in range(n_prompts)]
    return _candidate_scores(out.logits, cand_out.logits, cand_ids, cand_mask, n_prompts, n_cand, hidden, captured)


def _candidate_scores(prompt_logits, cand_logits, cand_ids, cand_mask, n_prompts, n_cand, hidden,
                      trunks=None) -> ScoreOutput:
    first_logp = F.log_softmax(prompt_logits[:, -1].float(), dim=-1)  # [B, V]: predicts each candidate's 1st token
    # Token t of a candidate is predicted by the prompt's last logits (t = 0) or candidate position t-1.
    rest_logp = F.log_softmax(cand_logits[:, : cand_ids.shape[1] - 1].float(), dim=-1)
    token_logp = torch.cat(
        [
            first_logp.repeat_interleave(n_cand, dim=0).gather(-1, cand_ids[:, :1]),
            rest_logp.gather(-1, cand_ids[:, 1:, None]).squeeze(-1),
        ],
        dim=1,
    )
    token_logp = token_logp * cand_mask  # padding adds exactly zero
    return ScoreOutput(
        logprob=token_logp.sum(-1).view(n_prompts, n_cand),
        n_tokens=cand_mask.sum(-1).view(n_prompts, n_cand),
        prompt_hidden=hidden,
        trunks=trunks,
    )


def _score_from_trunks(llm: LLM, prompts, candidates, trunks: Sequence[Trunk], return_prompt_hidden: bool,
                       share_prefix: bool = False) -> ScoreOutput:
    """``score_tensors`` from captured trunks: the same two passes (prompts, then candidates on the prompts' KV
    cache) through layers ``start``.. only, on the stored hidden states laid out as the token ids would be. With
    ``share_prefix`` the prompts' common token prefix runs once, on the first row's states: rows captured in
    other batches hold the same states up to float rounding."""
    model, dev = llm.model, llm.device
    n_prompts, n_cand = len(prompts), len(candidates[0])
    if len(trunks) != n_prompts or any(len(t.candidates) != n_cand for t in trunks):
        raise ValueError("score: one trunk per prompt, with one hidden-state block per candidate")
    starts = {t.start for t in trunks}
    if len(starts) != 1:
        raise ValueError(f"score: trunks captured at different layers {sorted(starts)}")
    start = starts.pop()
    P = 0
    if share_prefix:
        rows = [llm.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if any(len(r) != t.prompt.shape[0] for r, t in zip(rows, trunks)):
            raise ValueError("score: a trunk's prompt states do not match its prompt's tokens: the trunks belong "
                             "to other rows")
        P = common_prefix_length(rows)
    width, dim = max(t.prompt.shape[0] for t in trunks) - P, trunks[0].prompt.shape[1]
    suffix_h = torch.zeros(n_prompts, width, dim, dtype=trunks[0].prompt.dtype, device=dev)
    suffix_mask = torch.zeros(n_prompts, width, dtype=torch.long, device=dev)
    for i, t in enumerate(trunks):  # left padding, as split_prefix_left_padded lays out the ids
        n = t.prompt.shape[0] - P
        suffix_h[i, width - n:] = t.prompt[P:]
        suffix_mask[i, width - n:] = 1
    flat = [c for cands in candidates for c in cands]
    cand_ids, cand_mask = _tokenize_candidates(llm.tokenizer, flat, dev)
    cand_h = torch.zeros(len(flat), cand_ids.shape[1], dim, dtype=suffix_h.dtype, device=dev)
    for j, h in enumerate(c for t in trunks for c in t.candidates):
        if h.shape[0] != int(cand_mask[j].sum()):
            raise ValueError(f"score: trunk of candidate {flat[j]!r} has {h.shape[0]} positions, its tokens "
                             f"{int(cand_mask[j].sum())}: the trunks belong to other rows")
        cand_h[j, : h.shape[0]] = h
    with top_layers(model, start):
        _, out, prompt_mask = _prompt_forward(model, {"inputs_embeds": trunks[0].prompt[None, :P]} if P else None,
                                              {"inputs_embeds": suffix_h}, suffix_mask,
                                              hidden=return_prompt_hidden)
        cand_out = _candidate_forward(model, {"inputs_embeds": cand_h}, cand_mask, prompt_mask,
                                      out.past_key_values, n_cand)
    hidden = out.hidden_states[-1][:, -1] if return_prompt_hidden else None
    return _candidate_scores(out.logits, cand_out.logits, cand_ids, cand_mask, n_prompts, n_cand, hidden)


def score(
    llm: LLM,
    prompts: Sequence[str],
    candidates: Sequence[str] | Sequence[Sequence[str]],
    *,
    batch_size: int = 8,
    progress: bool = False,
) -> list[CandidateScores]:
    """Score candidates for each rendered prompt (see ``LLM.render``); no gradients.

    ``candidates`` is one list shared by all prompts or one list per prompt (equal lengths within a batch).
    Prompts are processed in batches of ``batch_size``, grouped by length to limit padding.
    """
    if candidates and isinstance(candidates[0], str):
        per_prompt = [list(candidates)] * len(prompts)
    else:
        per_prompt = [list(c) for c in candidates]
    order = sorted(range(len(prompts)), key=lambda i: (len(per_prompt[i]), len(prompts[i])))
    results: list[CandidateScores | None] = [None] * len(prompts)
    from tqdm.auto import tqdm

    with torch.no_grad():
        batches = []
        for i in order:
            if batches and len(batches[-1]) < batch_size and len(per_prompt[batches[-1][0]]) == len(per_prompt[i]):
                batches[-1].append(i)
            else:
                batches.append([i])
        for batch in tqdm(batches, desc="score", disable=not progress):
            out = score_tensors(llm, [prompts[i] for i in batch], [per_prompt[i] for i in batch])
            lp = out.logprob.cpu().numpy().astype(np.float64)
            nt = out.n_tokens.cpu().numpy()
            for row, i in enumerate(batch):
                results[i] = CandidateScores(logprob=lp[row], n_tokens=nt[row])
    return results  # type: ignore[return-value]


def score_naive(llm: LLM, prompts: Sequence[str], candidates: Sequence[str]) -> list[CandidateScores]:
    """Reference: one full sequence per (prompt, candidate), no cache, no padding. For tests and benchmarks."""
    tok, model = llm.tokenizer, llm.model
    results = []
    with torch.no_grad():
        for p in prompts:
            p_ids = tok(p, add_special_tokens=False)["input_ids"]
            lps, nts = [], []
            for c in candidates:
                c_ids = tok(c, add_special_tokens=False)["input_ids"]
                ids = torch.tensor([p_ids + c_ids], device=llm.device)
                logp = F.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                positions = torch.arange(len(p_ids) - 1, len(p_ids) + len(c_ids) - 1, device=llm.device)
                lps.append(logp[positions, torch.tensor(c_ids, device=llm.device)].sum().item())
                nts.append(len(c_ids))
            results.append(CandidateScores(logprob=np.array(lps), n_tokens=np.array(nts)))
    return results
