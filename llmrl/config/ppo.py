"""The project's CleanRL-style PPO (``llmrl.algos.distilled_ppo``: LLM4Teach's students, MAPPO, GLAM's Symbolic-PPO) and
LLM4Teach's distillation schedule: the only definition of their settings and defaults. The classes' defaults are the
original LLM4Teach values where it has them; each section's own values are the default of the field holding it
(``GlamSymbolic.ppo``, ``LLM4TeachTrainParams.ppo`` and ``.distill``, ``LLM4TeachMPEParams.ppo`` and ``.distill``),
the default tier. The algorithms take these models themselves."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmrl.config import Section

__all__ = ["PPOParams", "DistillParams"]


class PPOParams(Section):
    total_frames: int = Field(100_000, gt=0, description="environment steps per run (all envs together; MPE: "
                              "joint steps x agents)")
    num_envs: int = Field(8, gt=0, description="parallel environments")
    num_steps: int = Field(64, gt=0, description="rollout length per env per iteration")
    epochs: int = Field(3, gt=0, description="passes over each rollout (original: 3)")
    minibatch_size: int = Field(128, gt=0, description="minibatch size (original: 128)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate (original: 1e-3)")
    adam_eps: float = Field(1e-8, gt=0, description="Adam epsilon")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    advantage: Literal["gae", "mc"] = Field("gae", description="gae, or mc (the original's Monte-Carlo returns)")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range (policy, and value when clip_value)")
    clip_value: bool = Field(True, description="clip each value update to ±clip_eps around the rollout's value; "
                             "with returns of tens (MPE) it caps the critic at 0.2 per iteration")
    value_coef: float = Field(0.5, ge=0, description="value loss weight")
    entropy_coef: float = Field(0.001, ge=0, description="entropy bonus weight (original: 0.001)")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient norm clip (actor and critic together)")
    norm_adv: bool = Field(True, description="normalise advantages per minibatch")
    reward_scale: float = Field(1.0, gt=0, description="rewards are multiplied by this for learning only "
                                "(returns of tens make the critic's gradient swamp the joint norm clip); "
                                "reported returns stay raw")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def iterations(self) -> int:
        return max(1, self.total_frames // self.batch_size)


class DistillParams(Section):
    """The schedule of λ, LLM4Teach's weight of the teacher cross-entropy (``llmrl.algos.distilled_ppo.distill_coef``:
    λ_k = min(λ₀, max(λ_min, λ₀ − δ·k)) for iterations k < ``until_iteration``, then 0); defaults are the
    original's."""

    initial: float = Field(10.0, ge=0, description="λ_0 of the teacher cross-entropy (0 = pure PPO)")
    decrement: float = Field(0.005, ge=0, description="λ decrease per iteration")
    minimum: float = Field(0.1, ge=0, description="λ floor")
    until_iteration: int = Field(3000, ge=0, description="iteration from which the teacher term is dropped")
