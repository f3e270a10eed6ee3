"""Text-generation backends behind one interface, and a content-addressed reply cache.

``Backend.generate(prompts, sampling) -> list[Generation]`` is all a method needs (teachers, optimisers,
planners). ``LocalBackend`` runs a loaded model in-process; ``OpenAICompletionsBackend`` and
``OpenAIChatBackend`` call OpenAI-compatible endpoints through the official ``openai`` client;
``CachedBackend`` wraps any of them and stores each reply on disk under the hash of (model, messages,
sampling settings, seed), so a stage re-runs offline with identical output. ``SharedPromptBackend`` answers
many copies of one prompt from a single prefill (LLM4Teach's planner); ``LazyBackend`` builds any backend on
first use.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from llmrl.config.llm_faults import LLMFaultParams
from llmrl.files import DamagedFileError, read_json, write_json
from llmrl.llm.faults import FaultGuard, MalformedReplyError, llm_fault_types
from llmrl.llm.generate import Generation, Prompt, SamplingConfig, generate, truncate_at_stop
from llmrl.llm.load import LLM, render_chat, reply_tag
from llmrl.llm.prefix import generate_shared_prefix

__all__ = ["Backend", "LocalBackend", "MalformedReplyError", "llm_fault_types", "OpenAIChatBackend",
           "OpenAICompletionsBackend", "openai_backend", "CacheMissError", "ReplyCache", "CachedBackend",
           "LazyBackend", "SharedPromptBackend"]

log = logging.getLogger(__name__)


class Backend(Protocol):
    model_id: str

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]: ...


def as_messages(prompt: Prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


class LocalBackend:
    """A model loaded in this process (chat template applied). With ``shared_prefix`` a batch's common prompt
    prefix is computed once (``llmrl.llm.prefix``): the same distribution, another random stream, so another
    ``model_id`` (and reply-cache keys)."""

    def __init__(self, llm: LLM, batch_size: int = 8, *, shared_prefix: bool = False):
        self.llm = llm
        self.batch_size = batch_size
        self.shared_prefix = shared_prefix
        self.model_id = f"{'local-shared-prefix' if shared_prefix else 'local'}:{llm.spec}{reply_tag(llm.dtype)}"

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        if self.shared_prefix:
            return generate_shared_prefix(self.llm, [self.llm.render(p) for p in prompts], sampling,
                                          batch_size=self.batch_size)
        return generate(self.llm, list(prompts), sampling, batch_size=self.batch_size)


class _OpenAIClient:
    """The official ``openai`` client for one endpoint. The key is read from the environment variable
    ``api_key_env`` only and never logged. Each request goes through ``guard.request`` (``llmrl.llm.faults``): its
    attempts' timeouts, retries with backoff on transient failures and the deadline are the stage's fault policy,
    so the client's own retries are off. Without a ``guard`` (a direct caller), one is made from ``timeout_s`` and
    ``max_retries`` with no deadline. The endpoint is not part of ``model_id`` (nor of reply-cache keys): the same
    model served elsewhere replays the same cache."""

    def __init__(self, model: str, base_url: str, *, api_key_env: str = "OPENAI_API_KEY",
                 guard: FaultGuard | None = None, timeout_s: float | None = None, max_retries: int | None = None):
        import openai

        if guard is not None and (timeout_s is not None or max_retries is not None):
            raise ValueError("timeout_s / max_retries come from the guard's policy when a guard is given")
        if guard is None:
            given = {k: v for k, v in (("timeout_s", timeout_s), ("max_retries", max_retries)) if v is not None}
            guard = FaultGuard(LLMFaultParams(**given, deadline_s=None), f"openai backend {base_url}")
        self.model = model
        self.base_url = base_url
        self.guard = guard
        key = os.environ.get(api_key_env) or "no-key"  # local servers need no key; the client wants a string
        self.client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=guard.policy.timeout_s)

    def _request(self, sampling: SamplingConfig, i: int) -> dict:
        kwargs = dict(model=self.model, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                      top_p=sampling.top_p, seed=sampling.seed + i)
        if sampling.stop:
            kwargs["stop"] = list(sampling.stop)
        return kwargs

    def _create(self, endpoint, **kwargs):
        """One completion request under the guard's policy; a body that is no completion is a fault."""
        resp = self.guard.request(lambda timeout: endpoint.create(timeout=timeout, **kwargs))
        if not getattr(resp, "choices", None):
            raise MalformedReplyError(f"{self.base_url}: not a completion: {str(resp)[:120]!r}")
        usage = getattr(resp, "usage", None)
        return resp.choices[0], getattr(usage, "completion_tokens", 0) or 0


class OpenAIChatBackend(_OpenAIClient):
    """Any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI, vLLM, llama.cpp, ``llmrl.llm.serve``):
    the server renders the conversation with its chat template.

    A conversation that ends with a partial assistant turn (an answer prefix) must be continued, as the local
    backend does, or the model answers another prompt. The request then carries vLLM's fields for that
    (``continue_final_message``; ``llmrl.llm.serve`` honours them too), but not every server does:
    llama-cpp-python's starts a new turn (measured: SmolLM2's teacher replies 100 % invalid, against 37-40 %
    locally). A reply that begins with the prefix again is cut and ``prefix_repeated`` records it. Where the
    served model's tokenizer is at hand, ``OpenAICompletionsBackend`` sends the same text as the local backend.
    """

    def __init__(self, model: str, base_url: str, **client):
        super().__init__(model, base_url, **client)
        self.model_id = f"openai-chat:{model}"

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for i, prompt in enumerate(prompts):
            messages = as_messages(prompt)
            kwargs = self._request(sampling, i)
            prefix = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
            if prefix:
                kwargs["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
            choice, n_tokens = self._create(self.client.chat.completions, messages=messages, **kwargs)
            text, _ = truncate_at_stop(choice.message.content or "", sampling.stop)
            repeated = bool(prefix.strip()) and text.lstrip().startswith(prefix.strip())
            if repeated:  # a new turn that wrote the prefix again
                text = text.lstrip()[len(prefix.strip()):]
            out.append(Generation(prompt=json.dumps(messages), text=text, finish_reason=choice.finish_reason or "stop",
                                  n_tokens=n_tokens, prefix_repeated=repeated))
        return out


class OpenAICompletionsBackend(_OpenAIClient):
    """An OpenAI-compatible ``/v1/completions`` endpoint (vLLM, llama.cpp's llama-server, llama-cpp-python,
    ``llmrl.llm.serve``) sent the conversation rendered here with the served model's own ``tokenizer``:
    byte for byte the text ``LocalBackend`` feeds the model, answer prefix continued, whichever server runs it.
    Chat-only hosted APIs need ``OpenAIChatBackend``."""

    def __init__(self, model: str, base_url: str, tokenizer, **client):
        super().__init__(model, base_url, **client)
        self.tokenizer = tokenizer
        self.model_id = f"openai-completions:{model}"

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for i, prompt in enumerate(prompts):
            rendered = render_chat(self.tokenizer, prompt)
            choice, n_tokens = self._create(self.client.completions, prompt=rendered, **self._request(sampling, i))
            text, _ = truncate_at_stop(choice.text or "", sampling.stop)
            out.append(Generation(prompt=rendered, text=text, finish_reason=choice.finish_reason or "stop",
                                  n_tokens=n_tokens))
        return out


def openai_backend(api: str, model: str, base_url: str, *, tokenizer=None, **client):
    """``api="completions"`` (the prompt rendered here by ``tokenizer``) or ``"chat"`` (rendered by the server)."""
    if api == "completions":
        if tokenizer is None:
            raise ValueError("openai api 'completions' renders prompts here: it needs the served model's tokenizer")
        return OpenAICompletionsBackend(model, base_url, tokenizer, **client)
    if api == "chat":
        return OpenAIChatBackend(model, base_url, **client)
    raise ValueError(f"openai api must be 'completions' or 'chat', not {api!r}")


class CacheMissError(KeyError):
    """An offline cache was asked for a reply it does not hold."""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    damaged: list[str] = field(default_factory=list)  # entries that failed their checks, each also a miss


class ReplyCache:
    """Replies on disk, one JSON file per key under ``root/<k[:2]>/<k>.json``; written atomically.

    Each entry carries its checksum (``llmrl.files.write_json``) and the request it answers (model, messages,
    sampling settings, position), which must hash to its key: a damaged entry, or one that answers another
    request, is a miss recorded in ``damaged``, never a reply. Keep ``root`` as a DVC-tracked output so every
    reply travels with ``dvc push``/``dvc pull``.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.damaged: list[str] = []

    @staticmethod
    def key(model_id: str, prompt: Prompt, sampling: SamplingConfig, index: int) -> str:
        payload = {
            "model": model_id,
            "messages": as_messages(prompt),
            "sampling": sampling.as_dict(),
            "index": index,  # position in the call: the per-prompt seed offset
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Generation | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            record = read_json(path)
            request = {k: record[k] for k in ("model", "messages", "sampling", "index")}
            if hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest() != key:
                raise DamagedFileError(f"{path}: the request it records does not hash to its key")
            return Generation(**record["generation"])
        except (DamagedFileError, KeyError, TypeError) as err:
            self.damaged.append(str(path))
            log.warning("reply cache: %s is damaged, taken as a miss (%s)", path, err)
            return None

    def put(self, key: str, gen: Generation, *, model_id: str, prompt: Prompt, sampling: SamplingConfig,
            index: int) -> None:
        write_json(self._path(key), {"model": model_id, "messages": as_messages(prompt),
                                     "sampling": sampling.as_dict(), "index": index, "generation": gen.__dict__})


class CachedBackend:
    """Serve replies from a ``ReplyCache``; ask the wrapped backend only for misses (never when ``offline``).
    ``stats`` counts hits and misses, and names the damaged entries that were taken as misses."""

    def __init__(self, backend: Backend, cache: ReplyCache, *, offline: bool = False):
        self.backend = backend
        self.cache = cache
        self.offline = offline
        self.model_id = backend.model_id
        self.stats = CacheStats(damaged=cache.damaged)

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        keys = [ReplyCache.key(self.model_id, p, sampling, i) for i, p in enumerate(prompts)]
        results: list[Generation | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, r in enumerate(results) if r is None]
        self.stats.hits += len(prompts) - len(missing)
        self.stats.misses += len(missing)
        if missing and self.offline:
            damaged = f" (damaged entries taken as misses: {self.stats.damaged})" if self.stats.damaged else ""
            raise CacheMissError(f"offline reply cache {self.cache.root} has no reply for key "
                                 f"{keys[missing[0]]}{damaged}")
        if missing:
            # The index is part of the key and of the per-prompt seed, so misses are generated at their
            # original positions: generate the whole call once and keep the missing ones.
            fresh = self.backend.generate(list(prompts), sampling)
            for i in missing:
                self.cache.put(keys[i], fresh[i], model_id=self.model_id, prompt=prompts[i], sampling=sampling,
                               index=i)
                results[i] = fresh[i]
        return results  # type: ignore[return-value]


class LazyBackend:
    """A backend built on first use: a run whose replies are all cached never loads the model."""

    def __init__(self, model_id: str, factory: Callable[[], Backend]):
        self.model_id = model_id
        self._factory = factory
        self._backend: Backend | None = None

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        if self._backend is None:
            self._backend = self._factory()
        return self._backend.generate(prompts, sampling)


class SharedPromptBackend:
    """A local model that answers k copies of one prompt from a single prefill, its KV cache repeated k times.

    The planner sends the same prompt ``n_ask`` times; on a small CPU model the prompt's prefill costs about
    ten times the 24-token replies, so computing it once makes a planner query several times cheaper. Replies
    are seeded like ``llmrl.llm.generate`` (``sampling.seed`` per call) but are not the same samples, hence
    the distinct ``model_id`` (and reply-cache keys).
    """

    def __init__(self, llm, batch_size: int = 10):
        self.llm = llm
        self.batch_size = batch_size  # copies decoded together; bounds memory on large models
        self.model_id = f"local-shared-prompt:{llm.spec}{reply_tag(llm.dtype)}"

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        tok, model = self.llm.tokenizer, self.llm.model
        eos = {tok.eos_token_id, *np.atleast_1d(model.generation_config.eos_token_id or [])} - {None}
        out: list[Generation | None] = [None] * len(prompts)
        groups: dict[str, list[int]] = {}
        rendered = [self.llm.render(p) for p in prompts]
        for i, r in enumerate(rendered):
            groups.setdefault(r, []).append(i)
        model.eval()
        for text, idx in groups.items():
            ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(self.llm.device)
            kwargs = dict(max_new_tokens=sampling.max_new_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                          eos_token_id=[int(e) for e in eos])
            if sampling.greedy:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            else:
                kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k or None)
            # Stop strings are applied after decoding: transformers' stop-string matcher costs seconds to set
            # up per call, more than the few tokens it would save.
            rows: list[list[int]] = []
            with torch.no_grad(), torch.random.fork_rng():
                torch.manual_seed(sampling.seed)
                prefix = model(ids[:, :-1], use_cache=True).past_key_values  # prefill once, all but the last token
                for lo in range(0, len(idx), self.batch_size):
                    k = min(self.batch_size, len(idx) - lo)
                    cache = copy.deepcopy(prefix) if lo + k < len(idx) else prefix
                    cache.batch_repeat_interleave(k)
                    batch = ids.repeat(k, 1)
                    gen = model.generate(batch, attention_mask=torch.ones_like(batch), past_key_values=cache, **kwargs)
                    rows += gen[:, ids.shape[1]:].tolist()
            for i, row in zip(idx, rows):
                n = next((j for j, t in enumerate(row) if t in eos), len(row))
                reply, hit_stop = truncate_at_stop(tok.decode(row[:n], skip_special_tokens=True), sampling.stop)
                out[i] = Generation(prompt=text, text=reply, n_tokens=n,
                                    finish_reason="stop" if n < len(row) or hit_stop else "length")
        return out  # type: ignore[return-value]
