"""Batched, seeded text generation with stop strings, for local models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from llmrl.llm.load import LLM

__all__ = ["Prompt", "SamplingConfig", "Generation", "eos_token_ids", "truncate_at_stop", "generate"]

Prompt = str | list[dict]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample a reply. Part of every reply-cache key."""

    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"sampling.max_new_tokens: must be > 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    """One reply with the exact text the model saw."""

    prompt: str  # rendered prompt (chat template applied)
    text: str  # reply, cut before the first stop string
    finish_reason: str  # "stop" (stop string or end-of-turn) or "length"
    n_tokens: int
    # OpenAI-compatible endpoints: the server answered an answer prefix in a new turn and wrote it again (cut)
    prefix_repeated: bool = False


def eos_token_ids(llm: LLM) -> list[int]:
    """Every token id that ends a reply: the tokenizer's end-of-sequence id and the generation config's (one id
    or a list, as Llama 3's end-of-turn ids are). The one place both decoding loops take them from."""
    ids = [llm.tokenizer.eos_token_id]
    configured = getattr(llm.model.generation_config, "eos_token_id", None)
    ids += configured if isinstance(configured, list) else [configured]
    return sorted({i for i in ids if i is not None})


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest stop string."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def generate(
    llm: LLM,
    prompts: Sequence[Prompt],
    sampling: SamplingConfig = SamplingConfig(),
    *,
    batch_size: int = 8,
    raw: bool = False,
) -> list[Generation]:
    """Generate one reply per prompt. Same prompts, sampling and batch size give the same replies.

    Chat models get their chat template unless ``raw``. The torch RNG is seeded from ``sampling.seed`` for
    each batch (and restored afterwards), so a call does not disturb the caller's random stream.
    """
    tok, model = llm.tokenizer, llm.model
    rendered = [llm.render(p, raw=raw) for p in prompts]
    eos_ids = eos_token_ids(llm)
    outputs: list[Generation] = []
    was_training = model.training
    model.eval()
    old_side = tok.padding_side
    tok.padding_side = "left"
    try:
        for start in range(0, len(rendered), batch_size):
            chunk = rendered[start : start + batch_size]
            enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(llm.device)
            kwargs = dict(
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=eos_ids,
            )
            if sampling.greedy:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            else:
                kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k or None)
            if sampling.stop:
                kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
            with torch.random.fork_rng(devices=[llm.device] if llm.device.type == "cuda" else []):
                torch.manual_seed(sampling.seed + start)
                with torch.no_grad():
                    out = model.generate(**enc, **kwargs)
            new = out[:, enc["input_ids"].shape[1]:]
            for prompt, row in zip(chunk, new):
                ids = row.tolist()
                n = len(ids)
                hit_eos = False
                for j, t in enumerate(ids):
                    if t in eos_ids:
                        n, hit_eos = j, True
                        break
                text = tok.decode(ids[:n], skip_special_tokens=True)
                text, hit_stop = truncate_at_stop(text, sampling.stop)
                outputs.append(Generation(prompt=prompt, text=text, n_tokens=n,
                                          finish_reason="stop" if (hit_eos or hit_stop) else "length"))
    finally:
        tok.padding_side = old_side
        model.train(was_training)
    return outputs
