"""Frozen instruction embeddings: the mean-pooled last hidden state of a base LLM, computed once per text.

KALM conditions its offline-RL policies on the instruction through a fixed sentence vector from the base LLM
(the policy never fine-tunes it). ``embed_texts`` pools the last hidden layer over the non-padding tokens of
each text (no chat template: the raw instruction); ``EmbeddingTable`` is the cache, one row per distinct text,
saved as ``.npz`` (``instructions``, ``embeddings``) and looked up by exact text. The table lives in
``llmrl.data.embeddings`` so its readers (offline RL, evaluation) need not import the LLM stack.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from llmrl.data.embeddings import EmbeddingTable

__all__ = ["build_table"]


@torch.no_grad()
def embed_texts(llm, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """[len(texts), hidden] float32: mean over each text's tokens of the model's last hidden state."""
    model, tok = llm.model, llm.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.eval()
    out = []
    for i in range(0, len(texts), batch_size):
        batch = list(texts[i:i + batch_size])
        enc = tok(batch, return_tensors="pt", padding=True).to(llm.device)
        hidden = model(**enc, output_hidden_states=True).hidden_states[-1].float()
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        out.append(((hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)).cpu().numpy())
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)


def build_table(llm, texts: Sequence[str], batch_size: int = 32) -> EmbeddingTable:
    """An ``EmbeddingTable`` of the distinct ``texts`` (sorted)."""
    unique = sorted(set(texts))
    return EmbeddingTable(unique, embed_texts(llm, unique, batch_size))
