"""The small trainable layers put on top of (or in front of) a causal LM, for every method that needs them.

GLAM's value and action heads read the LM's last hidden state; KALM's projections write numeric states and
actions into the LM's hidden space and its heads read them back. Built in a fixed order, so a seed gives the same
initial weights wherever they are built.
"""

from __future__ import annotations

from torch import nn

__all__ = ["mlp_head", "NumericIO"]


def mlp_head(hidden: int, out: int, width: int = 1024) -> nn.Sequential:
    """GLAM's value / action head as the original: hidden -> 1024 -> Sigmoid -> 1024 -> Sigmoid -> out."""
    return nn.Sequential(nn.Linear(hidden, width), nn.Sigmoid(), nn.Linear(width, width), nn.Sigmoid(),
                         nn.Linear(width, out))


class NumericIO(nn.Module):
    """KALM's numeric input/output layers around an LM of width ``hidden``: a state projection (observation
    features -> hidden), an action projection (an embedding table for discrete actions, a linear map otherwise), a
    LayerNorm on the projected inputs, and observation / action heads (hidden -> observation features,
    hidden -> action_dim). ``obs_features`` is the width of the encoded observation (normalised continuous dims
    and one-hot categorical fields, ``llmrl.llm.grounded.ObsCodec``); ``obs_out`` the observation head's width
    (the predicted features: dims copied from the last state are not predicted), ``obs_features`` by default."""

    def __init__(self, obs_features: int, action_dim: int, discrete: bool, hidden: int, obs_out: int | None = None):
        super().__init__()
        self.state_proj = nn.Linear(obs_features, hidden)
        self.action_proj = nn.Embedding(action_dim, hidden) if discrete else nn.Linear(action_dim, hidden)
        self.embed_ln = nn.LayerNorm(hidden)
        self.obs_head = nn.Linear(hidden, obs_features if obs_out is None else obs_out)
        self.act_head = nn.Linear(hidden, action_dim)
