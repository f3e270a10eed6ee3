"""KALM's grounded LLM: a causal LM that reads and writes environment states and actions as vectors.

Layout as in KALM (arXiv 2404.09248, its code's ``modeling_llama`` wrapper):
- placeholder tokens stand for vectors in the token sequence: state ``" #"``, action ``" @"``, target state ``" ^"``
  (a predicted next/final state outside a step sequence). They are single tokens in SmolLM2's and GPT-2's
  tokenizers, and sequences are built from token ids (``SequenceBuilder``), so they never merge with neighbours;
- their input embeddings are replaced by ``LayerNorm(state_proj(encoded obs))`` / ``LayerNorm(action_proj(a))``
  (Linear for continuous actions, Embedding for discrete ones);
- an observation head and an action head read the last hidden state beside the LM head and predict the vector
  of the *next* position (shifted by one, as the LM head predicts the next token).

Observations pass through an ``ObsCodec``: continuous dims are normalised by the training data's mean and a
floored scale (``observation_scale``: a dim that never varies in training must not be multiplied by 1/1e-3 when it
varies later), and regressed with MSE; categorical fields (``GroundingSpec.obs_fields``, e.g. BabyAI's compact state)
enter as one-hot vectors, are predicted as logits with cross-entropy, and are decoded by argmax, so an imagined
state holds exact codes that a success rule can test.
Generation is step-wise with the KV cache: each imagined action or state is one appended embedding; the prefix is
never re-encoded (``reuse_cache=False`` re-encodes it each step, only to measure the difference in bench/).
This module knows no training loop (``llmrl.algos.kalm_grounding``) and no environment (``llmrl.algos.kalm_imagine``)
beyond the egocentric input features of BabyAI's compact state (``GroundingSpec.obs_egocentric``): the llm layer may
import envs (tests/test_layers.py), and the function lives with the state it reads, so a saved spec's flag alone
rebuilds the same input on load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from llmrl.config.lora import LoraSettings
from llmrl.envs.kalm_babyai import OBS_DIM as BABYAI_OBS_DIM
from llmrl.envs.kalm_egocentric import EGOCENTRIC_CLASSES, EGOCENTRIC_ONEHOT_DIM, egocentric_classes
from llmrl.files import atomic_path, save_torch, verify_checksums, write_checksums
from llmrl.llm.heads import NumericIO
from llmrl.llm.load import LLM, load_model, stable_adapter_names

__all__ = ["CONFIG_FILE", "TEXT", "STATE", "ACTION", "PlaceholderError", "GroundingSpec", "ObsCodec",
           "observation_scale", "TokenSequence", "collate", "GroundedLM", "trajectory_prompt", "reverse_prompt",
           "build_grounded"]

PLACEHOLDERS = {"state": " #", "action": " @", "target": " ^"}
TEXT, STATE, ACTION = 0, 1, 2  # position kinds
CONFIG_FILE, HEADS_FILE, ADAPTER_DIR, FULL_DIR = "grounding.json", "grounding.pt", "adapter", "model"


class PlaceholderError(ValueError):
    """A placeholder string that is not exactly one token of the model's tokenizer."""


@dataclass
class GroundingSpec:
    """What the projections and heads are built for; saved beside the weights."""

    obs_dim: int
    action_dim: int  # continuous: action size; discrete: number of actions
    discrete: bool
    action_low: float = -1.0
    action_high: float = 1.0
    base_model: str = "tiny"
    finetune: str = "lora"  # "lora" | "full"
    obs_mean: list[float] = field(default_factory=list)
    obs_std: list[float] = field(default_factory=list)  # the scale continuous dims are divided by (floored)
    obs_fields: list[list] = field(default_factory=list)  # categorical fields [first dim, classes, kind]
    obs_delta: bool = False  # continuous dims predicted as (next - current) / scale, not absolute
    obs_copy: list[list[int]] = field(default_factory=list)  # [dim of s', dim of s]: copied, never predicted
    # added to the logit of each categorical field's current class: a step changes few fields (BabyAI: ~3 %), and
    # a head that must rebuild every field from one hidden state got ~38 % of them wrong; with the prior it learns
    # the changes, as obs_delta does for continuous dims (0: fields predicted outright)
    field_copy_logit: float = 0.0
    # BabyAI: the input also carries each object slot's egocentric offsets (llmrl.envs.kalm_egocentric) as one-hot
    # blocks; heads, loss and decoding stay on the compact state's fields
    obs_egocentric: bool = False


def observation_scale(observations: np.ndarray, floor: float) -> tuple[list[float], list[float]]:
    """(mean, scale) per dim for normalising continuous observations: scale = sqrt(std^2 + floor^2).

    A dim that is constant in the training data gets scale ``floor`` instead of ~0, so a later state in which it
    varies by d enters as d / floor (bounded) and the observation head can reach it with outputs of that size."""
    if floor <= 0:
        raise ValueError(f"observation_scale: floor must be > 0, got {floor}")
    obs = np.asarray(observations, np.float64)
    return obs.mean(0).tolist(), np.sqrt(obs.std(0) ** 2 + floor ** 2).tolist()


class ObsCodec(nn.Module):
    """Observation vectors <-> the model's observation features (module docstring).

    Features: the continuous dims (every dim no categorical field covers), normalised, then each categorical field
    as a one-hot block, then with ``spec.obs_egocentric`` the egocentric one-hot blocks of BabyAI's compact state
    (``kalm_egocentric.egocentric_onehot``: inputs only, never predicted). ``encode`` builds inputs, ``loss`` scores
    head outputs against observations (MSE on the normalised continuous dims + mean cross-entropy over fields),
    ``decode`` turns head outputs into observations.

    Head outputs cover the *predicted* features: continuous dims not in ``spec.obs_copy`` (those are the current
    state's, e.g. Meta-World's previous-frame block and goal), then the categorical blocks. With ``spec.obs_delta``
    a continuous output is (next - current) / scale: a Meta-World hand moves ~0.01 a step, far below what an
    absolute regression resolves. ``loss`` and ``decode`` then need the current state (the last state before the
    predicted one).
    """

    def __init__(self, spec: GroundingSpec):
        super().__init__()
        d = spec.obs_dim
        covered: set[int] = set()
        groups: dict[tuple[int, str], list[int]] = {}
        for start, classes, kind in spec.obs_fields:
            if kind != "index":  # one dim holding the class id: BabyAI's compact state
                raise ValueError(f"obs_fields: kind {kind!r}, expected 'index'")
            dims = {int(start)}
            if dims & covered or max(dims) >= d:
                raise ValueError(f"obs_fields: field at {start} overlaps another or leaves the {d} dims")
            covered |= dims
            groups.setdefault((int(classes), kind), []).append(int(start))
        cont = [i for i in range(d) if i not in covered]
        self.register_buffer("cont", torch.tensor(cont, dtype=torch.long), persistent=False)
        copies = [(int(t), int(src)) for t, src in spec.obs_copy]
        if any(t not in cont or not 0 <= src < d for t, src in copies) or len({t for t, _ in copies}) != len(copies):
            raise ValueError(f"obs_copy: {spec.obs_copy} must map distinct continuous dims of s' to dims of s "
                             f"(< {d})")
        copied = {t for t, _ in copies}
        pred = [i for i in cont if i not in copied]
        self.register_buffer("pred", torch.tensor(pred, dtype=torch.long), persistent=False)
        self.register_buffer("copy_to", torch.tensor([t for t, _ in copies], dtype=torch.long), persistent=False)
        self.register_buffer("copy_from", torch.tensor([src for _, src in copies], dtype=torch.long),
                             persistent=False)
        self.delta = bool(spec.obs_delta)
        self.field_copy_logit = float(spec.field_copy_logit)
        if self.field_copy_logit < 0:
            raise ValueError(f"field_copy_logit must be >= 0, got {spec.field_copy_logit}")
        mean = torch.tensor(spec.obs_mean, dtype=torch.float32) if spec.obs_mean else torch.zeros(d)
        scale = torch.tensor(spec.obs_std, dtype=torch.float32) if spec.obs_std else torch.ones(d)
        self.register_buffer("mean", mean)
        self.register_buffer("scale", scale.clamp_min(1e-6))
        offset, out = len(cont), len(pred)
        self.groups: list[tuple[int, str]] = []
        for i, ((classes, kind), starts) in enumerate(sorted(groups.items())):
            n = len(starts)
            block = torch.arange(n * classes).reshape(n, classes)
            self.register_buffer(f"starts_{i}", torch.tensor(starts, dtype=torch.long), persistent=False)
            self.register_buffer(f"feat_{i}", offset + block, persistent=False)
            self.register_buffer(f"out_{i}", out + block, persistent=False)
            self.groups.append((classes, kind))
            offset += n * classes
            out += n * classes
        self.egocentric = bool(spec.obs_egocentric)
        if self.egocentric and d != BABYAI_OBS_DIM:
            raise ValueError(f"obs_egocentric: the egocentric features read BabyAI's compact state "
                             f"({BABYAI_OBS_DIM} dims), the spec has obs_dim {d}")
        self.egocentric_start = offset
        offset += EGOCENTRIC_ONEHOT_DIM if self.egocentric else 0
        self.features = offset  # input width
        self.out_features = out  # head width

    @property
    def categorical(self) -> bool:
        return bool(self.groups)

    @property
    def needs_current(self) -> bool:
        return self.delta or len(self.copy_to) > 0 or (self.categorical and self.field_copy_logit > 0)

    def _group(self, i: int, output: bool = False) -> tuple[int, str, torch.Tensor, torch.Tensor]:
        classes, kind = self.groups[i]
        return classes, kind, getattr(self, f"starts_{i}"), getattr(self, f"{'out' if output else 'feat'}_{i}")

    def _current(self, current: torch.Tensor | None) -> torch.Tensor | None:
        if self.needs_current and current is None:
            raise ValueError("ObsCodec: this codec predicts changes or copies dims, so it needs the current state")
        return current

    def _classes(self, obs: torch.Tensor, i: int) -> torch.Tensor:
        """Class index of every field of group i: [..., n_fields]."""
        classes, _kind, starts, _ = self._group(i)
        return obs[..., starts].round().long().clamp(0, classes - 1)

    def _field_logits(self, pred: torch.Tensor, i: int, current: torch.Tensor | None) -> torch.Tensor:
        """Group i's logits [..., n_fields, classes]: the head's, plus ``field_copy_logit`` on the current class."""
        classes, _kind, _starts, idx = self._group(i, output=True)
        logits = pred[..., idx]
        if self.field_copy_logit > 0:
            logits = logits + self.field_copy_logit * nn.functional.one_hot(self._classes(current, i),
                                                                            classes).to(logits.dtype)
        return logits

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        feats = obs.new_zeros((*obs.shape[:-1], self.features))
        if len(self.cont):
            feats[..., : len(self.cont)] = (obs[..., self.cont] - self.mean[self.cont]) / self.scale[self.cont]
        for i in range(len(self.groups)):
            classes, _kind, _starts, idx = self._group(i)
            feats[..., idx] = nn.functional.one_hot(self._classes(obs, i), classes).to(feats.dtype)
        if self.egocentric:
            blocks = [nn.functional.one_hot(c.round().long().clamp(0, n - 1), n)
                      for c, n in zip(egocentric_classes(obs), EGOCENTRIC_CLASSES, strict=True)]
            feats[..., self.egocentric_start:] = torch.cat(blocks, -1).flatten(-2).to(feats.dtype)
        return feats

    def _pred_targets(self, target_obs: torch.Tensor, current: torch.Tensor | None) -> torch.Tensor:
        """What the head's continuous outputs should be for ``target_obs``."""
        dims = self.pred
        if self.delta:
            return (target_obs[..., dims] - current[..., dims]) / self.scale[dims]
        return (target_obs[..., dims] - self.mean[dims]) / self.scale[dims]

    def loss(self, pred: torch.Tensor, target_obs: torch.Tensor, current: torch.Tensor | None = None) -> torch.Tensor:
        """MSE on the predicted continuous features plus the mean cross-entropy over categorical fields."""
        current = self._current(current)
        total = pred.new_zeros(())
        if len(self.pred):
            total = total + nn.functional.mse_loss(pred[..., : len(self.pred)], self._pred_targets(target_obs, current))
        if self.groups:
            ce, fields = pred.new_zeros(()), 0
            for i in range(len(self.groups)):
                classes = self.groups[i][0]
                logits = self._field_logits(pred, i, current)  # [N, n_fields, classes]
                ce = ce + nn.functional.cross_entropy(logits.reshape(-1, classes),
                                                      self._classes(target_obs, i).reshape(-1), reduction="sum")
                fields += logits.shape[:-1].numel()
            total = total + ce / fields
        return total

    def accuracy(self, pred: torch.Tensor, target_obs: torch.Tensor, current: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """Share of categorical fields whose argmax is the target class (nan without fields)."""
        if not self.groups:
            return pred.new_tensor(float("nan"))
        current = self._current(current)
        hits, n = 0.0, 0
        for i in range(len(self.groups)):
            ok = self._field_logits(pred, i, current).argmax(-1) == self._classes(target_obs, i)
            hits, n = hits + float(ok.sum()), n + ok.numel()
        return pred.new_tensor(hits / n)

    def decode(self, pred: torch.Tensor, current: torch.Tensor | None = None) -> torch.Tensor:
        """Head outputs -> observations (the current state supplies copied dims and the base of changes)."""
        current = self._current(current)
        obs = pred.new_zeros((*pred.shape[:-1], self.mean.shape[0]))
        dims = self.pred
        if len(dims):
            z = pred[..., : len(dims)] * self.scale[dims]
            obs[..., dims] = current[..., dims] + z if self.delta else z + self.mean[dims]
        if len(self.copy_to):
            obs[..., self.copy_to] = current[..., self.copy_from].to(obs.dtype)
        for i in range(len(self.groups)):
            starts = self._group(i)[2]
            obs[..., starts] = self._field_logits(pred, i, current).argmax(-1).to(obs.dtype)
        return obs

    def target_features(self, target_obs: torch.Tensor, current: torch.Tensor | None = None) -> torch.Tensor:
        """The head output that decodes exactly to ``target_obs`` (categorical blocks: logits that, with the copy
        prior added, are one-hot of 1 + ``field_copy_logit``)."""
        current = self._current(current)
        out = target_obs.new_zeros((*target_obs.shape[:-1], self.out_features))
        if len(self.pred):
            out[..., : len(self.pred)] = self._pred_targets(target_obs, current)
        for i in range(len(self.groups)):
            classes, _kind, _starts, idx = self._group(i, output=True)
            block = (1 + self.field_copy_logit) * nn.functional.one_hot(self._classes(target_obs, i), classes)
            if self.field_copy_logit > 0:
                block = block - self.field_copy_logit * nn.functional.one_hot(self._classes(current, i), classes)
            out[..., idx] = block.to(out.dtype)
        return out


@dataclass
class TokenSequence:
    """One token sequence with vector slots: ids [L], kind [L], vectors and targets per position."""

    ids: list[int]
    kind: list[int]
    obs: np.ndarray  # [L, obs_dim] raw observation at STATE positions (zeros elsewhere)
    act: np.ndarray  # [L, action_dim] continuous or [L] int discrete, at ACTION positions
    obs_target: np.ndarray  # [L] bool: the vector at this STATE position is predicted (from position - 1)
    act_target: np.ndarray  # [L] bool: the action at this ACTION position is predicted (from position - 1)
    labels: list[int]  # token targets (-100 where none), the LM's own next-token convention

    def __len__(self) -> int:
        return len(self.ids)


class SequenceBuilder:
    """Builds ``TokenSequence`` objects from text pieces, states and actions (token ids, never re-tokenised text)."""

    def __init__(self, tokenizer, spec: GroundingSpec):
        self.tok = tokenizer
        self.spec = spec
        self.placeholder_ids = {}
        for name, text in PLACEHOLDERS.items():
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise PlaceholderError(f"placeholder {name}={text!r} is {len(ids)} tokens in this tokenizer; "
                                       "it must be exactly one")
            self.placeholder_ids[name] = ids[0]
        self._parts: list = []

    def text(self, s: str, *, target: bool = False) -> SequenceBuilder:
        self._parts.append(("text", self.tok(s, add_special_tokens=False)["input_ids"], target))
        return self

    def eos(self, *, target: bool = False) -> SequenceBuilder:
        self._parts.append(("text", [self.tok.eos_token_id], target))
        return self

    def state(self, obs, *, target: bool = False, marker: str = "state") -> SequenceBuilder:
        self._parts.append((marker, np.asarray(obs, np.float32), target))
        return self

    def action(self, a, *, target: bool = False) -> SequenceBuilder:
        self._parts.append(("action", a, target))
        return self

    def build(self) -> TokenSequence:
        d, ad, disc = self.spec.obs_dim, self.spec.action_dim, self.spec.discrete
        ids, kind, labels, obs_rows, act_rows, o_t, a_t = [], [], [], {}, {}, [], []
        for part, value, target in self._parts:
            if part == "text":
                for i in value:
                    ids.append(i); kind.append(TEXT); labels.append(i if target else -100)
                    o_t.append(False); a_t.append(False)
            elif part in ("state", "target"):
                obs_rows[len(ids)] = value
                ids.append(self.placeholder_ids[part]); kind.append(STATE); labels.append(-100)
                o_t.append(target); a_t.append(False)
            else:
                act_rows[len(ids)] = value
                ids.append(self.placeholder_ids["action"]); kind.append(ACTION); labels.append(-100)
                o_t.append(False); a_t.append(target)
        L = len(ids)
        obs = np.zeros((L, d), np.float32)
        for p, v in obs_rows.items():
            obs[p] = v
        act = np.zeros(L, np.int64) if disc else np.zeros((L, ad), np.float32)
        for p, v in act_rows.items():
            act[p] = v
        self._parts = []
        return TokenSequence(ids, kind, obs, act, np.asarray(o_t), np.asarray(a_t), labels)


def collate(seqs: Sequence[TokenSequence], pad_id: int, *, left: bool = False) -> dict[str, torch.Tensor]:
    """Pad sequences into a batch (right padding for training, left for generation)."""
    L = max(len(s) for s in seqs)
    B = len(seqs)
    d = seqs[0].obs.shape[1]
    disc = seqs[0].act.ndim == 1
    out = {
        "ids": torch.full((B, L), pad_id, dtype=torch.long),
        "kind": torch.zeros((B, L), dtype=torch.long),
        "mask": torch.zeros((B, L), dtype=torch.long),
        "obs": torch.zeros((B, L, d)),
        "act": torch.zeros((B, L), dtype=torch.long) if disc else torch.zeros((B, L, seqs[0].act.shape[1])),
        "obs_target": torch.zeros((B, L), dtype=torch.bool),
        "act_target": torch.zeros((B, L), dtype=torch.bool),
        "labels": torch.full((B, L), -100, dtype=torch.long),
    }
    for b, s in enumerate(seqs):
        n = len(s)
        sl = slice(L - n, L) if left else slice(0, n)
        out["ids"][b, sl] = torch.tensor(s.ids)
        out["kind"][b, sl] = torch.tensor(s.kind)
        out["mask"][b, sl] = 1
        out["obs"][b, sl] = torch.from_numpy(s.obs)
        out["act"][b, sl] = torch.from_numpy(s.act)
        out["obs_target"][b, sl] = torch.from_numpy(s.obs_target)
        out["act_target"][b, sl] = torch.from_numpy(s.act_target)
        out["labels"][b, sl] = torch.tensor(s.labels)
    return out


class GroundedLM(nn.Module):
    """Base causal LM (LoRA adapter or full fine-tune) + state/action projections + observation/action heads."""

    def __init__(self, llm: LLM, spec: GroundingSpec):
        super().__init__()
        self.llm = llm
        self.lm = llm.model
        self.spec = spec
        self.builder = SequenceBuilder(llm.tokenizer, spec)
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        self.backbone = base.model  # the decoder stack without the LM head (LoRA layers are injected in place)
        self.lm_head = base.get_output_embeddings()
        self.token_embed = base.get_input_embeddings()
        H = base.config.hidden_size
        self.codec = ObsCodec(spec).to(llm.device)
        self.io = NumericIO(self.codec.features, spec.action_dim, spec.discrete, H, obs_out=self.codec.out_features)
        self.grounding_modules().to(device=llm.device, dtype=torch.float32)

    # ---- parts ---------------------------------------------------------------------------------------------
    def grounding_modules(self) -> nn.ModuleDict:
        return nn.ModuleDict(dict(self.io.named_children()))

    def grounding_state(self) -> dict[str, torch.Tensor]:
        state = {k: v.detach().cpu() for k, v in self.grounding_modules().state_dict().items()}
        state["obs_mean"], state["obs_std"] = self.codec.mean.cpu(), self.codec.scale.cpu()
        return state

    def embed(self, ids, kind, obs, act) -> torch.Tensor:
        """Token embeddings with every STATE/ACTION placeholder replaced by its projected vector."""
        e = self.token_embed(ids)
        s = self.io.embed_ln(self.io.state_proj(self.codec.encode(obs)))
        a = self.io.embed_ln(self.io.action_proj(act.clamp(0, self.spec.action_dim - 1) if self.spec.discrete
                                           else act))
        k = kind.unsqueeze(-1)
        return torch.where(k == STATE, s.to(e.dtype), torch.where(k == ACTION, a.to(e.dtype), e))

    def step_embeds(self, batch: int, *, action: torch.Tensor | None = None,
                    state: torch.Tensor | None = None) -> torch.Tensor:
        """The placeholders one step appends to every row of a batch: the action a_t (``batch`` discrete ids or
        ``[batch, A]`` continuous values), then the state s_{t+1} (``[batch, d]``), either alone or both in one
        block (imagination appends them one forward pass apart, acting in a real environment together)."""
        dev = self.llm.device
        slots = [(name, kind) for name, kind, value in (("action", ACTION, action), ("state", STATE, state))
                 if value is not None]
        n = len(slots)
        ids = torch.tensor([[self.builder.placeholder_ids[name] for name, _ in slots]], device=dev).expand(batch, n)
        kind = torch.tensor([[k for _, k in slots]], device=dev).expand(batch, n)
        acts = torch.zeros((batch, n), dtype=torch.long, device=dev) if self.spec.discrete else \
            torch.zeros((batch, n, self.spec.action_dim), device=dev)
        obs = torch.zeros((batch, n, self.spec.obs_dim), device=dev)
        if action is not None:
            acts[:, 0] = action.long().reshape(batch) if self.spec.discrete else action.float().reshape(batch, -1)
        if state is not None:
            obs[:, n - 1] = state.float().reshape(batch, -1)
        return self.embed(ids, kind, obs, acts)

    def hidden(self, embeds, mask, *, past=None, position_ids=None):
        if position_ids is None:
            position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
            if past is not None:
                position_ids = position_ids[:, -embeds.shape[1]:]
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                            past_key_values=past, use_cache=past is not None)
        return out.last_hidden_state, (out.past_key_values if past is not None else None)

    @staticmethod
    def _current_states(b: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, L - 1, d]: for each position 1 .. L - 1, the observation at the last STATE placeholder before it
        (the state a predicted state follows: s_t for s_{t+1}, s for s', s_0 for the final state)."""
        L = b["kind"].shape[1]
        pos = torch.arange(L, device=b["kind"].device).expand_as(b["kind"])
        last = torch.where(b["kind"] == STATE, pos, torch.zeros_like(pos)).cummax(1).values[:, :-1]
        return b["obs"].gather(1, last.unsqueeze(-1).expand(-1, -1, b["obs"].shape[-1]))

    # ---- training --------------------------------------------------------------------------------------------
    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """obs_loss (``ObsCodec.loss``), act_loss (MSE or CE), token_loss (CE); zero where a batch has none;
        obs_accuracy (share of categorical fields predicted exactly, detached) when the codec has fields."""
        dev = self.llm.device
        b = {k: v.to(dev) for k, v in batch.items()}
        h = self.hidden(self.embed(b["ids"], b["kind"], b["obs"], b["act"]), b["mask"])[0]
        h_prev, zero = h[:, :-1], h.new_zeros(()).float()
        o_mask, a_mask = b["obs_target"][:, 1:], b["act_target"][:, 1:]
        losses = {}
        if o_mask.any():
            pred = self.io.obs_head(h_prev[o_mask].float())
            target = b["obs"][:, 1:][o_mask]
            losses["obs_loss"] = self.codec.loss(pred, target, self._current_states(b)[o_mask])
            if self.codec.categorical:
                losses["obs_accuracy"] = self.codec.accuracy(pred.detach(), target, self._current_states(b)[o_mask])
        else:
            losses["obs_loss"] = zero
        if a_mask.any():
            pred = self.io.act_head(h_prev[a_mask].float())
            tgt = b["act"][:, 1:][a_mask]
            losses["act_loss"] = (nn.functional.cross_entropy(pred, tgt) if self.spec.discrete
                                  else nn.functional.mse_loss(pred, tgt))
        else:
            losses["act_loss"] = zero
        t_mask = b["labels"][:, 1:] != -100
        if t_mask.any():
            logits = self.lm_head(h_prev[t_mask])  # only where a token is a target: no [B, L, vocab] tensor
            losses["token_loss"] = nn.functional.cross_entropy(logits.float(), b["labels"][:, 1:][t_mask])
        else:
            losses["token_loss"] = zero
        return losses

    # ---- generation ------------------------------------------------------------------------------------------
    def _action_out(self, h: torch.Tensor, greedy: bool, temperature: float, generator) -> torch.Tensor:
        out = self.io.act_head(h.float())
        if self.spec.discrete:
            if greedy:
                return out.argmax(-1)
            probs = torch.softmax(out / temperature, -1)
            return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        if not greedy:
            out = out + temperature * torch.randn(out.shape, generator=generator, device=out.device)
        return out.clamp(self.spec.action_low, self.spec.action_high)

    def prompt_sequence(self, instruction: str, obs0) -> TokenSequence:
        """The instruction -> trajectory prompt up to the first state (the format of ``kalm_grounding``)."""
        return self.builder.text(trajectory_prompt(instruction)).state(obs0).build()

    @torch.no_grad()
    def imagine(self, instructions: Sequence[str], obs0: np.ndarray, steps: int, *, greedy: bool = True,
                temperature: float = 1.0, generator: torch.Generator | None = None, stop=None,
                reuse_cache: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Roll out ``steps`` imagined (a_t, s_{t+1}) from each (instruction, s_0).

        ``stop(t, next_obs[B, d]) -> bool[B]`` marks rows done (they keep being computed in the batch but their
        later steps are not returned as valid). Returns actions [B, T(, A)], next_obs [B, T, d] and
        lengths [B] (steps up to and including the stop step). The batch ends when every row is done.
        """
        self.eval()
        dev = self.llm.device
        seqs = [self.prompt_sequence(i, o) for i, o in zip(instructions, obs0, strict=True)]
        b = {k: v.to(dev) for k, v in collate(seqs, self.llm.tokenizer.pad_token_id, left=True).items()}
        B = len(seqs)
        mask = b["mask"]
        embeds = self.embed(b["ids"], b["kind"], b["obs"], b["act"])
        past = _new_cache() if reuse_cache else None
        h, past = self._run(embeds, mask, past, reuse_cache)
        all_embeds = embeds
        ones = mask.new_ones((B, 1))
        acts, nexts = [], []
        lengths = np.full(B, steps, np.int64)
        done = np.zeros(B, bool)
        current = b["obs"][:, -1].float()  # s_0: every prompt ends with its state (left padding)
        for t in range(steps):
            a = self._action_out(h[:, -1], greedy, temperature, generator)
            e_a = self.step_embeds(B, action=a)
            mask = torch.cat([mask, ones], 1)
            all_embeds = torch.cat([all_embeds, e_a], 1)
            h, past = self._run(e_a if reuse_cache else all_embeds, mask, past, reuse_cache)
            s_next = current = self.codec.decode(self.io.obs_head(h[:, -1].float()), current)
            acts.append(a.cpu().numpy())
            nexts.append(s_next.cpu().numpy())
            if stop is not None:
                newly = np.asarray(stop(t, nexts[-1]), bool) & ~done
                lengths[newly] = t + 1
                done |= newly
                if done.all():
                    break
            if t + 1 == steps:
                break
            e_s = self.step_embeds(B, state=s_next)
            mask = torch.cat([mask, ones], 1)
            all_embeds = torch.cat([all_embeds, e_s], 1)
            h, past = self._run(e_s if reuse_cache else all_embeds, mask, past, reuse_cache)
        return np.stack(acts, 1), np.stack(nexts, 1), lengths

    @torch.no_grad()
    def instruction_logprobs(self, obs: np.ndarray, actions: np.ndarray, final_obs: np.ndarray,
                             candidates: Sequence[str], states: int) -> np.ndarray:
        """Mean log-probability per token of each candidate instruction (its text and the end-of-sequence token)
        after the trajectory -> instruction prompt of one trajectory (``reverse_prompt``): [len(candidates)].

        The prompt runs once; its KV cache is repeated for the candidates, which run as one right-padded batch."""
        self.eval()
        dev = self.llm.device
        prompt = reverse_prompt(self.builder, obs, actions, final_obs, states).build()
        b = {k: v.to(dev) for k, v in collate([prompt], self.llm.tokenizer.pad_token_id).items()}
        past = _new_cache()
        h, past = self.hidden(self.embed(b["ids"], b["kind"], b["obs"], b["act"]), b["mask"], past=past)
        tok = self.llm.tokenizer
        conts = [tok(" " + c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in candidates]
        K, Lc = len(conts), max(len(c) for c in conts)
        ids = torch.full((K, Lc), tok.pad_token_id, dtype=torch.long, device=dev)
        cmask = torch.zeros((K, Lc), dtype=torch.long, device=dev)
        for i, c in enumerate(conts):
            ids[i, : len(c)] = torch.tensor(c, device=dev)
            cmask[i, : len(c)] = 1
        past.batch_repeat_interleave(K)
        mask = torch.cat([b["mask"].expand(K, -1), cmask], 1)
        hc, _ = self.hidden(self.token_embed(ids), mask, past=past)
        inputs = torch.cat([h[:, -1:].expand(K, 1, -1), hc[:, :-1]], 1)  # position i predicts continuation token i
        logp = torch.log_softmax(self.lm_head(inputs).float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return ((logp * cmask).sum(1) / cmask.sum(1)).cpu().numpy()

    @torch.no_grad()
    def predict_next(self, obs: np.ndarray, actions: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """The dynamics pattern's one-step prediction of s' for each (s, a) (``Predict the next state: # s @ a ^``),
        teacher-forced from real states: [N, d]."""
        self.eval()
        dev = self.llm.device
        out = []
        for lo in range(0, len(obs), batch_size):
            seqs = [self.builder.text("Predict the next state:").state(o).action(a)
                    .state(np.zeros_like(o), marker="target").build()
                    for o, a in zip(obs[lo:lo + batch_size], actions[lo:lo + batch_size], strict=True)]
            b = {k: v.to(dev) for k, v in collate(seqs, self.llm.tokenizer.pad_token_id, left=True).items()}
            h = self.hidden(self.embed(b["ids"], b["kind"], b["obs"], b["act"]), b["mask"])[0]
            # the target placeholder is last: its state is predicted at the action before it
            out.append(self.codec.decode(self.io.obs_head(h[:, -2].float()), b["obs"][:, -3].float()).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.spec.obs_dim), np.float32)

    def _run(self, embeds, mask, past, reuse_cache):
        if reuse_cache:
            return self.hidden(embeds, mask, past=past)
        return self.hidden(embeds, mask)[0], None

    # ---- acting in a real environment --------------------------------------------------------------------------
    # Episodes are rows of one batch: prompts left-padded into one KV cache, then (a_t, s_{t+1}) appended to every
    # row in lockstep; rows of finished episodes leave the cache (``select_rows``). One episode is a batch of one.
    @torch.no_grad()
    def start_episodes(self, instructions: Sequence[str], obs0) -> tuple:
        """Encode each episode's prompt and s_0 (``obs0`` [B, d]); returns (state, last hidden [B, H])."""
        self.eval()
        dev = self.llm.device
        seqs = [self.prompt_sequence(i, o) for i, o in zip(instructions, obs0, strict=True)]
        b = {k: v.to(dev) for k, v in collate(seqs, self.llm.tokenizer.pad_token_id, left=True).items()}
        past = _new_cache()
        h, past = self.hidden(self.embed(b["ids"], b["kind"], b["obs"], b["act"]), b["mask"], past=past)
        return (past, b["mask"]), h[:, -1]

    def start_episode(self, instruction: str, obs0) -> tuple:
        return self.start_episodes([instruction], np.asarray(obs0, np.float32)[None])

    @torch.no_grad()
    def feed(self, state: tuple, actions, obs) -> tuple:
        """Append a_t (taken in the real env; [B] discrete, [B, A] continuous) and the real s_{t+1} ([B, d]) to
        every row; returns the new state and the last hidden [B, H]."""
        past, mask = state
        dev = self.llm.device
        B = mask.shape[0]
        e = self.step_embeds(B, action=torch.as_tensor(np.asarray(actions), device=dev),
                             state=torch.as_tensor(np.asarray(obs, np.float32), device=dev))
        mask = torch.cat([mask, mask.new_ones((B, 2))], 1)
        h, past = self.hidden(e, mask, past=past)
        return (past, mask), h[:, -1]

    @staticmethod
    def select_rows(state: tuple, rows: Sequence[int]) -> tuple:
        """The state of the episodes ``rows`` only (the others have ended)."""
        past, mask = state
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=mask.device)
        past.batch_select_indices(idx)
        return past, mask[idx]

    def actions_from_hidden(self, h: torch.Tensor, *, greedy: bool = True, temperature: float = 1.0,
                            generator=None) -> np.ndarray:
        """One action per row of ``h`` ([B] discrete, [B, A] continuous)."""
        with torch.no_grad():
            return self._action_out(h, greedy, temperature, generator).cpu().numpy()

    # ---- persistence -----------------------------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> None:
        """Adapter (or full weights) + projections/heads + spec, and their checksums (``SHA256SUMS``, checked by
        ``load``), written atomically into ``out_dir``."""
        with atomic_path(out_dir, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            if self.spec.finetune == "lora":
                stable_adapter_names(self.lm, self.spec.base_model)
                self.lm.save_pretrained(tmp / ADAPTER_DIR)
            else:
                self.lm.save_pretrained(tmp / FULL_DIR)
                self.llm.tokenizer.save_pretrained(tmp / FULL_DIR)
            save_torch(self.grounding_state(), tmp / HEADS_FILE)
            (tmp / CONFIG_FILE).write_text(json.dumps(asdict(self.spec), indent=1), encoding="utf-8")
            write_checksums(tmp)

    @classmethod
    def load(cls, model_dir: str | Path, *, base_model: str | None = None, device: str | None = None,
             dtype: str | None = "float32") -> GroundedLM:
        """The model saved by ``save``; ``base_model`` overrides the saved base model spec (LoRA only). ``device``
        None: CUDA where there is one."""
        model_dir = Path(model_dir)
        cfg_path = model_dir / CONFIG_FILE
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{model_dir}: no {CONFIG_FILE} (not a grounded model folder)")
        verify_checksums(model_dir)  # a damaged file is a DamagedFileError naming it, before anything is parsed
        spec = GroundingSpec(**json.loads(cfg_path.read_text(encoding="utf-8")))
        if spec.finetune == "lora":
            from peft import PeftModel

            llm = load_model(base_model or spec.base_model, device=device, dtype=dtype)
            llm.model = PeftModel.from_pretrained(llm.model, model_dir / ADAPTER_DIR)
        else:
            llm = load_model(str(model_dir / FULL_DIR), device=device, dtype=dtype)
        llm.model.eval()
        llm.model.requires_grad_(False)
        model = cls(llm, spec)
        state = torch.load(model_dir / HEADS_FILE, map_location=llm.device, weights_only=True)
        model.codec.mean.copy_(state.pop("obs_mean"))
        model.codec.scale.copy_(state.pop("obs_std"))
        model.grounding_modules().load_state_dict(state)
        model.eval()
        return model


def reverse_prompt(builder: SequenceBuilder, obs: np.ndarray, actions: np.ndarray, final_obs: np.ndarray,
                   states: int) -> SequenceBuilder:
    """The trajectory -> instruction prompt (grounding pattern 4) up to the instruction text: ``Trajectory:``, then
    ``states`` evenly spaced (s_t, a_t) pairs (first and last included), the final state and ``\nInstruction:``."""
    T = len(obs)
    keep = np.unique(np.linspace(0, T - 1, min(T, states)).round().astype(int))
    builder.text("Trajectory:")
    for t in keep:
        builder.state(obs[t]).action(actions[t])
    return builder.state(final_obs).text("\nInstruction:")


def _new_cache():
    from transformers import DynamicCache

    return DynamicCache()


def trajectory_prompt(instruction: str) -> str:
    return f"Instruction: {instruction}\nTrajectory:"


def build_grounded(spec: GroundingSpec, *, lora: LoraSettings | None = None, device: str | None = None,
                   dtype: str | None = "float32") -> GroundedLM:
    """A fresh grounded model on ``spec.base_model``: LoRA adapter when ``spec.finetune == "lora"``, else all
    weights trainable. Projections and heads are always trainable. ``device`` None: CUDA where there is one."""
    if spec.finetune not in ("lora", "full"):
        raise ValueError(f"finetune: {spec.finetune!r}, expected 'lora' or 'full'")
    llm = load_model(spec.base_model, device=device, dtype=dtype,
                     lora=(lora or LoraSettings()) if spec.finetune == "lora" else None,
                     trainable=spec.finetune == "full")
    return GroundedLM(llm, spec)
