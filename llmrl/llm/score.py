"""Log-probability of candidate continuations, computing each prompt once and reusing its KV cache.

score(a | c) = sum_t log softmax(logits)[a_t] over the candidate's tokens, given the prompt's tokens. Padding
contributes exactly 0 (GLAM's original filled padding with 1.0 and summed raw logits; both are fixed here).
The candidate's tokens are those of the candidate string tokenised on its own and appended to the prompt's
tokens, as Lamorel and GLAM do; the naive reference below uses the very same token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from llmrl.llm.load import LLM


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


def score_tensors(
    llm: LLM,
    prompts: Sequence[str],
    candidates: Sequence[Sequence[str]],
    *,
    return_prompt_hidden: bool = False,
) -> ScoreOutput:
    """Summed log-probs of ``candidates[i][j]`` after rendered text ``prompts[i]``, one forward per prompt.

    All prompts must offer the same number of candidates (pad the list upstream otherwise). Gradients flow
    when the model has trainable parameters and grad is enabled.
    """
    n_prompts = len(prompts)
    if n_prompts == 0:
        raise ValueError("score: no prompts")
    if len(candidates) != n_prompts:
        raise ValueError(f"score: {n_prompts} prompts but {len(candidates)} candidate lists")
    n_cand = len(candidates[0])
    if n_cand == 0 or any(len(c) != n_cand for c in candidates):
        raise ValueError("score: every prompt needs the same, non-zero number of candidates")
    model, tok, dev = llm.model, llm.tokenizer, llm.device

    prompt_ids, prompt_mask = tokenize_left_padded(tok, prompts, dev)
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=prompt_pos,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=return_prompt_hidden,
        logits_to_keep=1,  # only the last position's logits are used; the vocab projection dominates small models
    )
    first_logp = F.log_softmax(out.logits[:, -1].float(), dim=-1)  # [B, V]: predicts each candidate's 1st token
    hidden = out.hidden_states[-1][:, -1] if return_prompt_hidden else None
    cache = out.past_key_values

    flat = [c for cands in candidates for c in cands]
    cand_ids, cand_mask = _tokenize_candidates(tok, flat, dev)  # [B*C, L]
    cache.batch_repeat_interleave(n_cand)
    lens = prompt_mask.sum(-1).repeat_interleave(n_cand)  # [B*C] true prompt lengths
    cand_pos = lens[:, None] + torch.arange(cand_ids.shape[1], device=dev)[None]
    full_mask = torch.cat([prompt_mask.repeat_interleave(n_cand, dim=0), cand_mask], dim=1)
    cand_out = model(
        input_ids=cand_ids,
        attention_mask=full_mask,
        position_ids=cand_pos,
        past_key_values=cache,
        use_cache=True,
    )
    # Token t of a candidate is predicted by the prompt's last logits (t = 0) or candidate position t-1.
    rest_logp = F.log_softmax(cand_out.logits[:, :-1].float(), dim=-1)
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
    )


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
