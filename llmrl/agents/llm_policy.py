"""GLAM's LLM policy: the action strings scored by the LLM, a value head on the prompt's last hidden state.

pi(a | prompt) = softmax_a(score(a | prompt) / T), score = summed log-softmax log-probs of the action string's
tokens (``llmrl.llm.score_tensors``; the original summed raw logits), or optionally their per-token mean. The
value head is the original's MLP hidden -> 1024 -> Sigmoid -> 1024 -> Sigmoid -> 1 on the hidden state of the
prompt's last token. The NPAE variant replaces scoring with an MLP action head over the same hidden state (the
original's ablation).

With LoRA on the top layers only (``lora_layers``), the scoring head captures what the frozen layers below compute
for each (prompt, candidates) row when it acts (``trunk_start``), and PPO's epochs run the top layers alone on
those states (``llmrl.llm.score``'s frozen trunk).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from llmrl.files import save_torch
from llmrl.llm.heads import mlp_head
from llmrl.llm.load import LLM
from llmrl.llm.score import Trunk, score_tensors, tokenize_left_padded

__all__ = ["build_prompt", "render", "candidates_for", "History", "ActorOutput", "LLMActorCritic", "infer",
           "LLMBatchPolicy", "LLMPolicy", "build_agent", "save_agent", "load_agent"]

SYSTEM = "You are an agent in a grid world. Reply with the next action."
_PREFIXES = "prompt prefixes"  # infer's memo entry for the kept prefix passes (its other keys are tuples)


def build_prompt(labels: dict[str, str], actions: tuple[str, ...] | list[str], goal: str,
                 observations: list[str], past_actions: list[str]) -> str:
    """GLAM's prompt: possible actions, goal, then observations interleaved with actions, last slot empty."""
    if len(past_actions) != len(observations) - 1:
        raise ValueError("build_prompt: need exactly one action between consecutive observations")
    lines = [f"{labels['actions']}: {', '.join(actions)}", f"{labels['goal']}: {goal}"]
    for i, obs in enumerate(observations):
        lines.append(f"{labels['obs']} {i}: {obs}")
        lines.append(f"{labels['action']} {i}: {past_actions[i]}" if i < len(past_actions)
                     else f"{labels['action']} {i}:")
    return "\n".join(lines)


def render(llm: LLM, prompt: str) -> str:
    """The exact model input: the chat template (short system turn) for chat models, else the raw prompt."""
    if llm.is_chat:
        return llm.render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}])
    return prompt


def candidates_for(rendered: str, actions: tuple[str, ...] | list[str]) -> list[str]:
    """Action strings as continuations: a leading space after a raw prompt, as-is after a chat template."""
    return [a if rendered.endswith(("\n", " ")) else " " + a for a in actions]


class History:
    """The last ``history`` observations and the actions between them, for one environment."""

    def __init__(self, history: int):
        self.obs: deque[str] = deque(maxlen=history)
        self.actions: deque[str] = deque(maxlen=max(history - 1, 1))
        self.history = history

    def reset(self, text: str) -> None:
        self.obs.clear()
        self.actions.clear()
        self.obs.append(text)

    def push(self, action: str, text: str) -> None:
        self.actions.append(action)
        self.obs.append(text)

    def prompt(self, labels: dict[str, str], actions, goal: str) -> str:
        past = list(self.actions)[-(len(self.obs) - 1):] if len(self.obs) > 1 else []
        return build_prompt(labels, actions, goal, list(self.obs), past)


@dataclass
class ActorOutput:
    logits: torch.Tensor  # [B, A] (log-probs / T for the scoring head)
    values: torch.Tensor  # [B]
    trunks: list[Trunk] | None = None  # with capture: the frozen layers' states per row


class LLMActorCritic(nn.Module):
    """LLM + value head (+ action head for NPAE). ``llm.model`` carries LoRA or is fully trainable."""

    def __init__(self, llm: LLM, *, head: str = "score", n_actions: int = 6, temperature: float = 1.0,
                 length_norm: bool = False, seed: int = 0, trunk_start: int | None = None):
        super().__init__()
        if head not in ("score", "npae"):
            raise ValueError(f"LLMActorCritic: head must be 'score' or 'npae', got {head!r}")
        if temperature <= 0:
            raise ValueError(f"LLMActorCritic: temperature must be > 0, got {temperature}")
        if trunk_start is not None and head != "score":
            raise ValueError("LLMActorCritic: a frozen trunk (trunk_start) needs the scoring head")
        self.llm, self.head, self.temperature, self.length_norm = llm, head, temperature, length_norm
        self.trunk_start = trunk_start  # layers below it are frozen: their outputs can be captured and reused
        self.model = llm.model  # registered so .parameters() covers the trainable LLM weights
        if llm.device.type == "cuda" and llm.dtype != torch.float32:
            # Measured on an H100 (bench/gpu.py, paper profile): with SDPA attention in bf16 the left-padded PPO
            # batches gave NaN logits within the first update (fp32 weights or not); eager attention ran clean.
            llm.model.set_attn_implementation("eager")
        hidden = llm.model.config.hidden_size
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.value_head = mlp_head(hidden, 1).to(llm.device)
            self.action_head = mlp_head(hidden, n_actions).to(llm.device) if head == "npae" else None

    def _prompt_hidden(self, rendered: list[str]) -> torch.Tensor:
        # left padding: the last position is every prompt's last token
        input_ids, mask = tokenize_left_padded(self.llm.tokenizer, rendered, self.llm.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        return out.hidden_states[-1][:, -1]

    def forward(self, rendered: list[str], candidates: list[list[str]], *, trunks: list[Trunk] | None = None,
                capture: bool = False, prefix_cache: dict | None = None) -> ActorOutput:
        """Logits and values; ``capture`` also returns each row's frozen-trunk states (needs ``trunk_start``),
        and ``trunks`` (captured for these rows) runs only the layers above them. ``prefix_cache``: prompt
        prefixes kept across calls while the weights stay fixed (``llmrl.llm.score_tensors``)."""
        if capture and self.trunk_start is None:
            raise ValueError("LLMActorCritic: capture needs a frozen trunk (build the agent with lora_layers)")
        # Identical (prompt, candidates) rows are computed once: small levels repeat observations a lot, and
        # indexing the shared row back keeps the gradient exact (it sums over the copies).
        keys = [(r, tuple(c)) for r, c in zip(rendered, candidates)]
        unique = list(dict.fromkeys(keys))
        if len(unique) == len(keys):
            return self._forward(rendered, candidates, trunks, capture, prefix_cache)
        where = {k: i for i, k in enumerate(unique)}
        first = {k: keys.index(k) for k in unique}
        out = self._forward([k[0] for k in unique], [list(k[1]) for k in unique],
                            [trunks[first[k]] for k in unique] if trunks is not None else None, capture, prefix_cache)
        rows = torch.tensor([where[k] for k in keys], device=out.logits.device)
        return ActorOutput(logits=out.logits[rows], values=out.values[rows],
                           trunks=[out.trunks[where[k]] for k in keys] if out.trunks is not None else None)

    def _forward(self, rendered: list[str], candidates: list[list[str]], trunks: list[Trunk] | None = None,
                 capture: bool = False, prefix_cache: dict | None = None) -> ActorOutput:
        if self.head == "npae":
            hidden = self._prompt_hidden(rendered).float()
            logits = self.action_head(hidden)
        else:
            # share_prefix: GLAM's prompts share their first half (system turn, actions, labels), computed once
            out = score_tensors(self.llm, rendered, candidates, return_prompt_hidden=True, trunks=trunks,
                                trunk_start=self.trunk_start if capture else None, share_prefix=True,
                                prefix_cache=prefix_cache)
            hidden = out.prompt_hidden.float()
            # length_norm: per-token mean log-prob, so one-token actions are not favoured by length alone
            score = out.logprob / out.n_tokens.clamp(min=1) if self.length_norm else out.logprob
            logits = score / self.temperature
        return ActorOutput(logits=logits, values=self.value_head(hidden).squeeze(-1),
                           trunks=out.trunks if self.head == "score" else None)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Every trainable tensor (LoRA adapter or full weights, and the heads) — what a checkpoint holds."""
        return {n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.named_parameters())
        missing = [n for n, p in params.items() if p.requires_grad and n not in state]
        unknown = [n for n in state if n not in params]
        if missing or unknown:
            raise ValueError(f"load_trainable_state: missing {missing[:3]}..., unknown {unknown[:3]}...")
        with torch.no_grad():
            for n, t in state.items():
                params[n].copy_(t)


@torch.no_grad()
def infer(agent: LLMActorCritic, rendered: list[str], candidates: list[list[str]],
          memo: dict | None = None, *, capture: bool = False):
    """No-grad logits [B, A] and values [B] on the CPU (and, with ``capture``, each row's frozen-trunk states).

    ``memo`` maps (prompt, candidates) to earlier results and is filled here, so each distinct prompt is
    computed once, and keeps the prompts' shared prefixes' passes; it is valid only while the agent's weights
    stay fixed (one rollout, one evaluation).
    """
    memo = {} if memo is None else memo
    keys = [(r, tuple(c)) for r, c in zip(rendered, candidates)]
    todo = list(dict.fromkeys(k for k in keys if k not in memo or (capture and memo[k][2] is None)))
    if todo:
        agent.eval()
        out = agent([k[0] for k in todo], [list(k[1]) for k in todo], capture=capture,
                    prefix_cache=memo.setdefault(_PREFIXES, {}))
        for i, k in enumerate(todo):
            memo[k] = (out.logits[i].float().cpu(), out.values[i].float().cpu(),
                       out.trunks[i] if capture else None)
    logits, values = torch.stack([memo[k][0] for k in keys]), torch.stack([memo[k][1] for k in keys])
    return (logits, values, [memo[k][2] for k in keys]) if capture else (logits, values)


class LLMBatchPolicy:
    """An ``LLMActorCritic`` acting in many environments at once (``llmrl.eval.evaluate_batched``).

    Each slot keeps its GLAM prompt history and a sampler seeded by its episode's seed, so an episode's
    actions depend on its seed only, not on which slot or batch it ran in. Distinct prompts are scored once
    per policy object (the weights are fixed during evaluation). ``records`` keeps (rendered prompt,
    candidates, probabilities, action) of the first ``record_steps`` steps, saved with the results.
    """

    def __init__(self, agent: LLMActorCritic, name: str, history: int = 3, record_steps: int = 0):
        self.agent, self.name, self.history = agent, name, history
        self.record_steps = record_steps
        self.records: list[dict] = []
        self.memo: dict = {}
        self.slots: dict[int, dict] = {}

    def reset(self, slot: int, env: gym.Env, seed: int) -> None:
        self.slots[slot] = {"actions": tuple(env.get_wrapper_attr("action_texts")),
                            "labels": dict(env.get_wrapper_attr("labels")), "history": History(self.history),
                            "gen": torch.Generator().manual_seed(int(seed)), "pending": None}

    def act_batch(self, slots: list[int], observations: list[dict[str, Any]], *, greedy: bool) -> list[int]:
        rendered, cands = [], []
        for slot, obs in zip(slots, observations):
            s = self.slots[slot]
            if s["pending"] is None:
                s["history"].reset(obs["text"])
            else:  # each new observation follows the slot's previous action
                s["history"].push(s["pending"], obs["text"])
            r = render(self.agent.llm, s["history"].prompt(s["labels"], s["actions"], obs["mission"]))
            rendered.append(r)
            cands.append(candidates_for(r, s["actions"]))
        logits, _ = infer(self.agent, rendered, cands, self.memo)
        probs = torch.softmax(logits, -1)
        actions = []
        for i, slot in enumerate(slots):
            s = self.slots[slot]
            a = int(probs[i].argmax()) if greedy else int(torch.multinomial(probs[i], 1, generator=s["gen"]))
            s["pending"] = s["actions"][a]
            actions.append(a)
            if len(self.records) < self.record_steps:
                self.records.append({"prompt": rendered[i], "candidates": cands[i], "probs": probs[i].tolist(),
                                     "action": a, "greedy": greedy})
        return actions


class LLMPolicy:
    """The harness ``Policy`` (one environment) over an ``LLMBatchPolicy`` with a single slot."""

    def __init__(self, agent: LLMActorCritic, name: str, history: int = 3, record_steps: int = 0):
        self.name = name
        self.batch = LLMBatchPolicy(agent, name, history=history, record_steps=record_steps)

    @property
    def records(self) -> list[dict]:
        return self.batch.records

    def reset(self, env: gym.Env, seed: int) -> None:
        self.batch.reset(0, env, seed)

    def act(self, obs: dict[str, Any], *, greedy: bool) -> int:
        return self.batch.act_batch([0], [obs], greedy=greedy)[0]


def build_agent(model: str, variant: str, *, lora_r: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.0,
                lora_layers: int | None = None, temperature: float = 1.0, length_norm: bool = False, seed: int = 0,
                frozen: bool = False, dtype: str | None = None, device: str | None = None) -> LLMActorCritic:
    """A fresh agent: ``lora`` (adapter on a frozen LLM), ``full`` (all weights trainable) or ``npae``
    (LoRA + MLP action head); ``frozen`` loads the LLM untrained and without adapter (zero-shot);
    ``length_norm`` scores candidates by their mean instead of summed token log-prob; ``lora_layers`` puts the
    adapters on the top layers only, and the ``lora`` variant then reuses the frozen layers' outputs in PPO;
    ``dtype`` is the compute dtype (``llmrl.llm.load.resolve_dtype``); ``device`` defaults to the machine's."""
    from llmrl.config.lora import LoraSettings
    from llmrl.llm.load import load_model

    if variant not in ("lora", "full", "npae"):
        raise ValueError(f"build_agent: variant must be lora, full or npae, got {variant!r}")
    torch.manual_seed(seed)  # LoRA's random A matrices
    if frozen:
        llm = load_model(model, device=device, dtype=dtype)
    elif variant == "full":
        llm = load_model(model, device=device, dtype=dtype, trainable=True)
    else:
        llm = load_model(model, device=device, dtype=dtype, lora=LoraSettings(r=lora_r, alpha=lora_alpha, dropout=lora_dropout,
                                                  layers=lora_layers))
    n_layers = llm.model.config.num_hidden_layers
    trunk = (n_layers - lora_layers if variant == "lora" and not frozen and lora_layers is not None
             and lora_layers < n_layers else None)
    return LLMActorCritic(llm, head="npae" if variant == "npae" else "score", temperature=temperature,
                          length_norm=length_norm, seed=seed, trunk_start=trunk)


def save_agent(agent: LLMActorCritic, out_dir, meta: dict) -> None:
    """``agent.pt`` (trainable tensors), ``meta.json`` (the ``build_agent`` arguments) and their checksums
    (``SHA256SUMS``, checked by ``load_agent``), atomically."""
    import json
    from pathlib import Path

    from llmrl.files import atomic_path, write_checksums

    with atomic_path(out_dir, is_dir=True) as tmp:
        save_torch(agent.trainable_state(), Path(tmp) / "agent.pt")
        (Path(tmp) / "meta.json").write_text(json.dumps(meta, indent=2))
        write_checksums(tmp)


def load_agent(out_dir) -> tuple[LLMActorCritic, dict]:
    """Rebuild an agent saved by ``save_agent``; a damaged file is a ``DamagedFileError`` naming it."""
    import json
    from pathlib import Path

    from llmrl.files import verify_checksums

    meta_file = Path(out_dir) / "meta.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"load_agent: {meta_file} not found (run the training stage first)")
    verify_checksums(out_dir)
    meta = json.loads(meta_file.read_text())
    agent = build_agent(**meta["build"])
    agent.load_trainable_state(torch.load(Path(out_dir) / "agent.pt", weights_only=True))
    agent.eval()
    return agent, meta
