"""The gym wrapper: any BabyAI level observed in text, and ``make_text_env``, the entry point of every
``BabyAI-Text-*`` id.

Observations are dicts: ``image`` (the 7x7x3 encoding), ``direction``, ``mission`` (the goal, transformed by the
variant) and ``text`` (the sentences joined by ", "). Actions are the first six MiniGrid actions; their strings
are ``env.get_wrapper_attr("action_texts")``. What the text says, and in which order, is ``description.py``'s;
how it is worded (the ``variant``) is ``languages.py``'s.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium import spaces

from llmrl.envs.babyai_text.description import ORDERS, describe_image
from llmrl.envs.babyai_text.languages import ACTIONS_EN, CHARSET, VARIANTS
from llmrl.envs.babyai_text.levels import MixedLocal
from llmrl.envs.babyai_text.missions import parse_mission

__all__ = ["BabyAIText", "make_text_env"]


class BabyAIText(gym.Wrapper):
    """Text observations for any BabyAI level (see module doc); six actions (MiniGrid's "done" is dropped)."""

    def __init__(self, env: gym.Env, variant: str = "none", order: str = "glam"):
        super().__init__(env)
        if variant not in VARIANTS:
            raise ValueError(f"BabyAIText: unknown variant {variant!r}; known: {sorted(VARIANTS)}")
        if order not in ORDERS:
            raise ValueError(f"BabyAIText: order must be one of {ORDERS}, got {order!r}")
        self.variant, self.order = variant, order
        self.language = VARIANTS[variant]
        self.action_texts: tuple[str, ...] = self.language.actions
        self.labels: dict[str, str] = self.language.labels
        self.action_space = spaces.Discrete(len(ACTIONS_EN))
        text = spaces.Text(max_length=4096, charset=CHARSET)
        self.observation_space = spaces.Dict({
            "image": env.observation_space["image"],
            "direction": env.observation_space["direction"],
            "mission": text,
            "text": text,
        })

    def observation(self, obs: dict) -> dict[str, Any]:
        facts = describe_image(obs["image"], self.order)
        sentences = [self.language.sentence(f) for f in facts] or [self.labels["none"]]
        return {"image": obs["image"], "direction": obs["direction"],
                "mission": self.language.mission(parse_mission(obs["mission"])), "text": ", ".join(sentences)}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self.observation(obs), info

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"BabyAIText.step: action must be in 0..5, got {action!r}")
        obs, reward, terminated, truncated, info = self.env.step(int(action))
        return self.observation(obs), reward, terminated, truncated, info


def make_text_env(level: str, variant: str = "none", order: str = "glam", **kwargs) -> BabyAIText:
    """Entry point of every ``BabyAI-Text-*`` id: the level (a BabyAI id or a mixed split) in the text wrapper."""
    if level in ("train", "test"):
        base = MixedLocal(split=level, **kwargs)
    else:
        import minigrid  # noqa: F401  (registers the BabyAI ids)

        base = gym.make(level, disable_env_checker=True, **kwargs).unwrapped
    return BabyAIText(base, variant=variant, order=order)
