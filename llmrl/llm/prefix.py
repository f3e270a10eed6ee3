"""Batched forward passes and sampling that compute a prompt prefix shared by the whole batch only once.

Few-shot prompts repeat the same system prompt and solved examples in every row: often three quarters of the
tokens. The longest common token prefix of the batch is run once ([1, P]), its KV cache is repeated over the
rows, and only each row's own suffix is computed (the same idea as ``score_tensors``). ``transformers``'
``generate`` cannot share one prefix cache across a left-padded batch, hence the small sampling loop here.
Rows are tokenised whole (jointly), so the shared prefix is exact token for token.

Layout of a batch: ``[prefix | suffix]``. For scoring, suffixes are right-padded; for sampling, they are
left-padded inside the suffix region (``[prefix | pad | suffix]``) so every row's next token is at the end.
Padding is masked out and position ids count real tokens only, so results equal per-row full forward passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from llmrl.llm.generate import Generation, SamplingConfig, eos_token_ids, truncate_at_stop
from llmrl.llm.load import LLM

__all__ = ["common_prefix_length", "PrefixBatch", "split_prefix", "split_prefix_left_padded", "suffix_token_logprobs",
           "completion_logprobs", "generate_shared_prefix"]


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of token-id rows, leaving every row at least one token of its own."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for i in range(max(n, 0)):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return max(n, 0)


@dataclass
class PrefixBatch:
    """Token ids split into the shared prefix and right-padded suffixes."""

    prefix: torch.Tensor  # [1, P]
    suffix: torch.Tensor  # [B, S]
    suffix_mask: torch.Tensor  # [B, S]

    @property
    def P(self) -> int:
        return self.prefix.shape[1]


def split_prefix(rows: Sequence[Sequence[int]], pad_id: int, device, max_prefix: int | None = None) -> PrefixBatch:
    """Shared prefix (at most ``max_prefix`` tokens) and right-padded suffixes of token-id ``rows``."""
    p = common_prefix_length(rows)
    if max_prefix is not None:
        p = min(p, max_prefix)
    width = max(len(r) for r in rows) - p
    suffix = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        suffix[i, : len(r) - p] = torch.tensor(r[p:])
        mask[i, : len(r) - p] = 1
    return PrefixBatch(torch.tensor([list(rows[0][:p])], dtype=torch.long).to(device), suffix.to(device),
                       mask.to(device))


def split_prefix_left_padded(rows: Sequence[Sequence[int]], pad_id: int, device, *, share: bool = True,
                             length: int | None = None) -> PrefixBatch:
    """Shared prefix and suffixes padded on the left, ``[prefix | pad | suffix]``, so that every row's last token
    is the batch's last position; ``share=False`` keeps no prefix (plain left padding), ``length`` a prefix of
    that many tokens (at most the rows' common prefix)."""
    p = common_prefix_length(rows) if share else 0
    if length is not None:
        if length > p:
            raise ValueError(f"split_prefix_left_padded: a prefix of {length} tokens, the rows share {p}")
        p = length
    width = max(len(r) for r in rows) - p
    suffix = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        suffix[i, width - (len(r) - p):] = torch.tensor(r[p:])
        mask[i, width - (len(r) - p):] = 1
    return PrefixBatch(torch.tensor([list(rows[0][:p])], dtype=torch.long).to(device), suffix.to(device),
                       mask.to(device))


def _prefix_cache(model, prefix: torch.Tensor, batch: int):
    """The prefix's KV cache repeated over ``batch`` rows, and its last-position logits."""
    if prefix.shape[1] == 0:
        return DynamicCache(), None
    out = model(input_ids=prefix, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(batch)
    return cache, out.logits[:, -1]


def suffix_token_logprobs(model, batch: PrefixBatch) -> torch.Tensor:
    """Log-prob of every suffix token given all tokens before it: [B, S] (padding positions hold junk).

    Differentiable: gradients flow through the shared prefix's cache too.
    """
    B, S = batch.suffix.shape
    P = batch.P
    cache, prefix_last = _prefix_cache(model, batch.prefix, B)
    mask = torch.cat([torch.ones((B, P), dtype=torch.long, device=batch.suffix.device), batch.suffix_mask], dim=1)
    pos = P + torch.arange(S, device=batch.suffix.device)[None].expand(B, S)
    logits = model(input_ids=batch.suffix, attention_mask=mask, position_ids=pos, past_key_values=cache,
                   use_cache=P > 0).logits
    logp_rest = F.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch.suffix[:, 1:, None]).squeeze(-1)
    if prefix_last is None:  # no prefix: the first token has no prediction; give it log-prob 0
        first = torch.zeros((B, 1), device=logits.device)
    else:
        first = F.log_softmax(prefix_last.float(), dim=-1).expand(B, -1).gather(-1, batch.suffix[:, :1])
    return torch.cat([first, logp_rest], dim=1)


def completion_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int, *, pad_id: int,
                        temperature: float = 1.0, entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, k] (and entropies) of the last ``k`` tokens of every row, at ``temperature``, with the
    rows' common prompt prefix computed once. The layout is TRL's: ``[left-padded prompt | completion]``, the
    prompt's padding marked 0 in ``attention_mask``; the ``k`` completion columns are all scored (positions
    after an end of sequence are the caller's to mask). Equal to a per-row full forward (tested against TRL's).
    Differentiable through the shared prefix."""
    B, L = input_ids.shape
    keep = attention_mask[:, : L - k].bool()
    prompt_len = keep.sum(1)
    rows = [torch.cat([ids[: L - k][m], ids[L - k:]]).tolist() for ids, m in zip(input_ids, keep)]
    # Every row keeps at least its last prompt token in the suffix: that position predicts the completion.
    batch = split_prefix(rows, pad_id, input_ids.device, max_prefix=int(prompt_len.min()) - 1)
    S, P = batch.suffix.shape[1], batch.P
    cache, _ = _prefix_cache(model, batch.prefix, B)
    mask = torch.cat([torch.ones((B, P), dtype=torch.long, device=input_ids.device), batch.suffix_mask], dim=1)
    pos = P + torch.arange(S, device=input_ids.device)[None].expand(B, S)
    logits = model(input_ids=batch.suffix, attention_mask=mask, position_ids=pos, past_key_values=cache,
                   use_cache=P > 0).logits
    # Row i's completion token j is predicted at suffix position (prompt_len_i - P - 1 + j).
    at = (prompt_len - P - 1)[:, None] + torch.arange(k, device=input_ids.device)[None]
    picked = logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1])).float() / temperature
    logp_all = F.log_softmax(picked, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, L - k:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return logp, ent


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    remove = probs.cumsum(-1) - probs > top_p  # keep the smallest set whose mass reaches top_p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)


@torch.no_grad()
def generate_shared_prefix(llm: LLM, texts: Sequence[str], sampling: SamplingConfig, *,
                           batch_size: int = 32, done: Callable[[str], bool] | None = None) -> list[Generation]:
    """Replies to rendered ``texts`` (chat template already applied), computing their common prefix once.

    Same semantics as ``llmrl.llm.generate``: temperature 0 is greedy, otherwise temperature and top-p
    (top-k if set) sampling from a generator seeded with ``sampling.seed + batch start``; a reply ends at an
    end-of-sequence token or a stop string (cut before it) or after ``max_new_tokens``. ``done(text)`` ends a
    reply too, keeping its text whole (finish reason "stop"): a caller that reads only part of a reply (the
    first answer line) need not pay for the tokens after it.
    """
    tok, model, dev = llm.tokenizer, llm.model, llm.device
    eos_ids = set(eos_token_ids(llm))
    was_training = model.training
    model.eval()
    out: list[Generation] = []
    try:
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            rows = [tok(t, add_special_tokens=False)["input_ids"] for t in chunk]
            batch = split_prefix_left_padded(rows, tok.pad_token_id, dev)
            B, S, P = batch.suffix.shape[0], batch.suffix.shape[1], batch.P
            suffix, smask = batch.suffix, batch.suffix_mask
            lens = smask.sum(-1)
            cache, _ = _prefix_cache(model, batch.prefix, B)
            mask = torch.cat([torch.ones((B, P), dtype=torch.long, device=dev), smask], dim=1)
            pos = P + (smask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=suffix, attention_mask=mask, position_ids=pos, past_key_values=cache,
                           use_cache=True, logits_to_keep=1).logits[:, -1]
            gen = torch.Generator(device=dev).manual_seed(sampling.seed + start)
            tokens: list[list[int]] = [[] for _ in range(B)]
            ended = [False] * B  # end-of-sequence token or stop string
            alive = torch.arange(B, device=dev)  # rows still generating; finished rows leave the batch
            next_pos = P + lens
            for step in range(sampling.max_new_tokens):
                logits = logits.float()
                if sampling.greedy:
                    nxt = logits.argmax(-1)
                else:
                    logits = logits / sampling.temperature
                    if sampling.top_k:
                        kth = logits.topk(min(sampling.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    logits = _top_p_filter(logits, sampling.top_p)
                    nxt = torch.multinomial(logits.softmax(-1), 1, generator=gen).squeeze(-1)
                keep = []
                for j, (row, t) in enumerate(zip(alive.tolist(), nxt.tolist())):
                    if t in eos_ids:
                        ended[row] = True
                        continue
                    tokens[row].append(t)
                    if sampling.stop or done is not None:
                        text = tok.decode(tokens[row], skip_special_tokens=True)
                        if (sampling.stop and truncate_at_stop(text, sampling.stop)[1]) or (done and done(text)):
                            ended[row] = True
                            continue
                    keep.append(j)
                if not keep or step == sampling.max_new_tokens - 1:
                    break
                if len(keep) < len(alive):  # drop finished rows: their compute would be wasted
                    sel = torch.tensor(keep, device=dev)
                    cache.batch_select_indices(sel)
                    alive, nxt, mask, next_pos = alive[sel], nxt[sel], mask[sel], next_pos[sel]
                mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long, device=dev)], dim=1)
                logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                               past_key_values=cache, use_cache=True).logits[:, -1]
                next_pos = next_pos + 1
            for i, prompt in enumerate(chunk):
                text, stopped = truncate_at_stop(tok.decode(tokens[i], skip_special_tokens=True), sampling.stop)
                out.append(Generation(prompt=prompt, text=text, n_tokens=len(tokens[i]),
                                      finish_reason="stop" if (ended[i] or stopped) else "length"))
    finally:
        model.train(was_training)
    return out
