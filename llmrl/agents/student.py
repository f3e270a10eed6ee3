"""Student networks: actor-critic modules mapping an observation batch to (action logits, value).

``GridStudent`` follows the original LLM4Teach ``MLPBase``: three 3×3 convolutions (16, 32, 64 channels, ReLU),
then separate actor and critic heads (flatten → 64 → out). Changes, for sample efficiency and CPU cost:
the memory grid is first re-centred on the agent and rotated to its heading (an egocentric canvas, so "the
key is ahead on the left" looks the same everywhere); each cell's integer codes (object, colour, state,
direction) are embedded (a learned one-hot projection; raw codes would make "key" (5) look like 5/4 of a
"door" (4)); and a 2×2 max-pool follows each convolution but the last.

``MLPStudent`` flattens any observation into a two-hidden-layer actor-critic (benchmark and MPE).

Both are rebuilt from ``config()`` + ``state_dict()`` (``save_student`` / ``load_student``); no pickled modules.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX
from torch import nn

from llmrl.files import save_torch, verify_checksums, write_checksums

__all__ = ["GridStudent", "MLPStudent", "save_student", "load_student", "StudentPolicy"]

# Channel vocabularies of the memory grid: object, colour, state, direction (0-3 facing, 4 = no agent here).
GRID_VOCAB = (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX), 5)


class GridStudent(nn.Module):
    def __init__(self, width: int, height: int, n_actions: int, channels: tuple[int, ...] = (16, 32, 64),
                 hidden: int = 64, embed_dim: int = 8):
        super().__init__()
        self._config = {"kind": "grid", "width": width, "height": height, "n_actions": n_actions,
                        "channels": list(channels), "hidden": hidden, "embed_dim": embed_dim}
        self.register_buffer("offsets", torch.tensor([0, *GRID_VOCAB[:-1]]).cumsum(0), persistent=False)
        # Canvas offsets (right a, forward b) in [-S, S]; S = size - 2 covers a walled room from any inside cell.
        s = max(width, height) - 2
        a, b = torch.meshgrid(torch.arange(-s, s + 1), torch.arange(-s, s + 1), indexing="ij")
        fwd = torch.tensor([[1, 0], [0, 1], [-1, 0], [0, -1]])
        right = torch.stack([-fwd[:, 1], fwd[:, 0]], dim=1)
        # rel[d] = a * right_d + b * forward_d: [4, 2S+1, 2S+1, 2]
        rel = a[None, ..., None] * right[:, None, None, :] + b[None, ..., None] * fwd[:, None, None, :]
        self.register_buffer("rel", rel, persistent=False)
        size = 2 * s + 1
        # One embedding table for the four codes of a cell (summed): a one-hot 1x1 convolution, without the one-hot.
        self.embed = nn.Embedding(sum(GRID_VOCAB), embed_dim)
        layers, c_in = [], embed_dim
        for i, c in enumerate(channels):
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU()]
            if i < len(channels) - 1:  # halve the canvas between convolutions: CPU cost, receptive field
                layers.append(nn.MaxPool2d(2))
                size //= 2
            c_in = c
        self.conv = nn.Sequential(*layers, nn.Flatten())
        flat = c_in * size * size
        self.actor = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))
        self.critic = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def config(self) -> dict:
        return dict(self._config)

    def to_egocentric(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, W, H, 4] → [B, 2S+1, 2S+1, 4] centred on the agent, rotated so it faces +forward; unseen outside."""
        B, W, H, _ = obs.shape
        agent = (obs[..., 3] != 4).flatten(1).float().argmax(1)
        ax, ay = agent // H, agent % H
        d = obs.flatten(1, 2)[torch.arange(B), agent, 3].long()
        rel = self.rel[d]  # [B, 2S+1, 2S+1, 2]
        sx, sy = ax[:, None, None] + rel[..., 0], ay[:, None, None] + rel[..., 1]
        inside = (sx >= 0) & (sx < W) & (sy >= 0) & (sy < H)
        flat = (sx.clamp(0, W - 1) * H + sy.clamp(0, H - 1)).flatten(1)  # [B, K]
        out = obs.flatten(1, 2).gather(1, flat[..., None].expand(-1, -1, 4)).view(*sx.shape, 4)
        fill = torch.tensor([0, 0, 0, 4], dtype=obs.dtype, device=obs.device)
        return torch.where(inside[..., None], out, fill)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, W, H, 4] integer codes → [B, embed_dim, 2S+1, 2S+1] egocentric feature planes."""
        ego = self.to_egocentric(obs).long() + self.offsets
        return self.embed(ego).sum(dim=-2).permute(0, 3, 1, 2)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.conv(self.encode(obs))
        return self.actor(z), self.critic(z).squeeze(-1)


class MLPStudent(nn.Module):
    """Flatten → (hidden → tanh) × len(hidden), separately for the actor and the critic.

    With ``critic_dim`` the critic is centralised (MAPPO): the input row is [actor input (``obs_dim``) |
    critic input (``critic_dim``)], so one tensor still carries everything and PPO's loss stays generic.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...] = (64, 64), critic_dim: int | None = None):
        super().__init__()
        self._config = {"kind": "mlp", "obs_dim": obs_dim, "n_actions": n_actions, "hidden": list(hidden),
                        "critic_dim": critic_dim}
        self.obs_dim, self.critic_dim = obs_dim, critic_dim
        self.actor = self._mlp(obs_dim, hidden, n_actions)
        self.critic = self._mlp(critic_dim or obs_dim, hidden, 1)
        # Plain lists (not registered twice): forward calls F.linear on them directly.
        self._linears = tuple([m for m in seq if isinstance(m, nn.Linear)] for seq in (self.actor, self.critic))

    @staticmethod
    def _mlp(n_in: int, hidden: tuple[int, ...], n_out: int) -> nn.Sequential:
        layers = []
        for h in hidden:
            layers += [nn.Linear(n_in, h), nn.Tanh()]
            n_in = h
        return nn.Sequential(*layers, nn.Linear(n_in, n_out))

    def config(self) -> dict:
        return dict(self._config)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1).float()
        xa, xc = (x, x) if self.critic_dim is None else (x[:, :self.obs_dim], x[:, self.obs_dim:])
        return _tanh_mlp(self._linears[0], xa), _tanh_mlp(self._linears[1], xc).squeeze(-1)


def _tanh_mlp(linears: list[nn.Linear], x: torch.Tensor) -> torch.Tensor:
    """``nn.Sequential(Linear, Tanh, ..., Linear)`` with the same maths, minus the per-module call overhead
    (about a third of this small network's CPU forward time)."""
    for layer in linears[:-1]:
        x = torch.tanh(F.linear(x, layer.weight, layer.bias))
    return F.linear(x, linears[-1].weight, linears[-1].bias)


def build_student(config: dict) -> nn.Module:
    cfg = dict(config)
    kind = cfg.pop("kind")
    if kind == "grid":
        return GridStudent(cfg["width"], cfg["height"], cfg["n_actions"], tuple(cfg["channels"]), cfg["hidden"],
                           cfg["embed_dim"])
    if kind == "mlp":
        return MLPStudent(cfg["obs_dim"], cfg["n_actions"], tuple(cfg["hidden"]), cfg["critic_dim"])
    raise ValueError(f"student config: unknown kind {kind!r} (expected 'grid' or 'mlp')")


def save_student(path: str | os.PathLike, model: nn.Module, extra: dict | None = None) -> None:
    """``{"config", "state_dict", **extra}`` written atomically, the same bytes for the same contents, and the
    checksums of its folder (``SHA256SUMS``, checked by ``load_student``; give each student a folder of its own)."""
    save_torch({"config": model.config(), "state_dict": model.state_dict(), **(extra or {})}, path)
    write_checksums(Path(path).parent)


def load_student(path: str | os.PathLike) -> tuple[nn.Module, dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"student checkpoint {path} not found")
    verify_checksums(path.parent, [path.name])  # a damaged file is a DamagedFileError naming it
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = build_student(ckpt["config"])
    model.load_state_dict(ckpt["state_dict"])
    return model, ckpt


class StudentPolicy:
    """A trained student for ``llmrl.eval.evaluate_batched``: one forward for all running episodes; argmax when
    greedy, else a sample from a generator seeded per episode (so an episode does not depend on its slot)."""

    def __init__(self, model: nn.Module, name: str = "student"):
        self.model = model.eval()
        self.name = name
        self.gens: dict[int, torch.Generator] = {}

    def reset(self, slot: int, env, seed: int) -> None:
        self.gens.setdefault(slot, torch.Generator()).manual_seed(seed)

    def act_batch(self, slots: list[int], observations: list, *, greedy: bool) -> list[int]:
        with torch.inference_mode():
            logits, _ = self.model(torch.as_tensor(np.stack(observations)))
        if greedy:
            return logits.argmax(-1).tolist()
        probs = logits.softmax(-1)
        return [int(torch.multinomial(probs[i], 1, generator=self.gens[s])) for i, s in enumerate(slots)]
