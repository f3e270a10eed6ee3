"""KALM's grounded LLM acting directly in the real environment (the LLM-as-policy row of kalm_eval).

At each real step the observation is appended to the episode's sequence (``Instruction: ... Trajectory: # s0``,
then ``@ a_t # s_{t+1}`` per step) through the KV cache, and the action head's output on the last hidden state is
the action: argmax (greedy) or a softmax sample for discrete actions, the raw output clipped to the action bounds
(plus Gaussian noise of std ``temperature`` when sampled) for continuous ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmrl.envs import kalm_levels as kl
from llmrl.llm.grounded import CONFIG_FILE, GroundedLM

__all__ = ["GroundedPolicy", "GroundedAgent"]


class GroundedPolicy:
    """A harness ``Policy`` for one goal: ``reset(env, seed)``, ``act(obs, greedy=...)``."""

    def __init__(self, model: GroundedLM, goal: kl.Goal, temperature: float = 1.0):
        self.model = model
        self.goal = goal
        self.temperature = temperature
        self.name = "grounded-llm"
        self._state = None
        self._last_action = None
        self._gen = torch.Generator()

    def reset(self, env, seed: int) -> None:
        self._state, self._last_action = None, None
        self._gen.manual_seed(int(seed))

    def act(self, obs: Any, *, greedy: bool) -> Any:
        o = kl.check_obs(self.goal.benchmark, obs, "observation")
        if self._state is None:
            self._state, h = self.model.start_episode(self.goal.instruction, o)
        else:
            self._state, h = self.model.feed(self._state, np.asarray([self._last_action]), o[None])
        a = self.model.actions_from_hidden(h, greedy=greedy, temperature=self.temperature, generator=self._gen)[0]
        self._last_action = a
        return int(a) if self.model.spec.discrete else np.asarray(a, np.float32)


class GroundedAgent:
    """One grounded model per benchmark, loaded once."""

    def __init__(self, models: dict[str, GroundedLM]):
        self.models = models

    @classmethod
    def load(cls, folders: Mapping[str, str | Path], *, base_model: str | None = None) -> GroundedAgent:
        """The models saved in ``folders`` (benchmark -> a ``GroundedLM.save`` folder)."""
        unknown = sorted(set(folders) - set(kl.BENCHMARKS))
        if unknown:
            raise ValueError(f"GroundedAgent.load: unknown benchmarks {unknown} (known: {list(kl.BENCHMARKS)})")
        missing = {b: str(f) for b, f in folders.items() if not (Path(f) / CONFIG_FILE).is_file()}
        if not folders or missing:
            raise FileNotFoundError(f"GroundedAgent.load: no grounded model ({CONFIG_FILE}) in "
                                    f"{missing or 'any folder'}")
        return cls({b: GroundedLM.load(Path(f), base_model=base_model) for b, f in folders.items()})

    def policy(self, goal: kl.Goal, temperature: float = 1.0) -> GroundedPolicy:
        if goal.benchmark not in self.models:
            raise LookupError(f"no grounded model for benchmark {goal.benchmark!r} "
                              f"(have {sorted(self.models)})")
        return GroundedPolicy(self.models[goal.benchmark], goal, temperature)
