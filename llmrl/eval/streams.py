"""Sampling streams: repeated runs of a policy that has no training seed (random actions, the zero-shot LLM) from
the same starts, so it is compared with trained agents over as many runs as they have seeds.

Policies seed their sampling from the episode's seed (``reset(..., seed)``); a stream re-seeds that sampling alone,
leaving the start (``env.reset(seed=...)``, done by the harness) the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SamplingStream", "episode_stream_seed"]


def episode_stream_seed(seed: int, stream: int) -> int:
    """The sampling seed of the episode of reset seed ``seed`` in stream ``stream``; stream 0 is ``seed`` itself, so a
    single-stream evaluation samples as it would without streams."""
    if stream < 0:
        raise ValueError(f"episode_stream_seed: stream must be >= 0, got {stream}")
    return int(seed) if stream == 0 else int(np.random.SeedSequence([int(seed), int(stream)]).generate_state(1)[0])


class SamplingStream:
    """``policy`` (a harness policy or a batched one) with its per-episode sampling seeds moved to ``stream``."""

    def __init__(self, policy: Any, stream: int):
        self.policy, self.stream = policy, stream
        self.name = f"{policy.name}-{stream}"

    def reset(self, *args) -> None:  # (env, seed) for a harness policy, (slot, env, seed) for a batched one
        *rest, seed = args
        self.policy.reset(*rest, episode_stream_seed(seed, self.stream))

    def act(self, obs: Any, *, greedy: bool) -> Any:
        return self.policy.act(obs, greedy=greedy)

    def act_batch(self, slots: list[int], observations: list, *, greedy: bool) -> list:
        return self.policy.act_batch(slots, observations, greedy=greedy)
