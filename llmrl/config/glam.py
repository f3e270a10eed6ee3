"""Params of the GLAM stages (section ``glam`` of params.yaml); paper scale in conf/glam/paper.yaml."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.config import DTYPE_HELP, TIER_HELP, ComputeDType, Section, TierName
from llmrl.config.lora import LoraSettings
from llmrl.config.ppo import PPOParams

__all__ = ["GlamPolicy", "GlamPPO", "GlamTrain", "GlamBC", "GlamSymbolic", "GlamEval", "GlamGeneralisation",
           "GlamParams"]


class GlamPolicy(Section):
    history: int = Field(3, ge=1, description="observations in the prompt (with history-1 previous actions)")
    temperature: float = Field(1.0, gt=0, description="softmax temperature over the candidates' log-probs")
    length_norm: bool = Field(False, description="score candidates by mean (not summed) token log-prob")


class GlamPPO(Section):
    """GLAM's PPO (``llmrl.algos.ppo_llm.train`` takes this model itself); defaults are the original's."""

    n_envs: int = Field(32, gt=0, description="environments stepped as one batch")
    frames_per_env: int = Field(40, gt=0, description="frames per environment per PPO update (original: 40)")
    updates: int = Field(10, gt=0, description="PPO updates")
    epochs: int = Field(4, gt=0, description="PPO epochs per update")
    minibatch_size: int = Field(64, gt=0, description="samples per optimiser step")
    micro_batch: int = Field(4, gt=0, description="samples per forward/backward (gradient accumulation); divides "
                                                  "minibatch_size")
    lr: float = Field(1e-6, gt=0, description="Adam learning rate (original: 1e-6, full fine-tuning)")
    adam_eps: float = Field(1e-5, gt=0, description="Adam epsilon")
    clip: float = Field(0.2, gt=0, description="PPO ratio and value clip")
    ent_coef: float = Field(0.01, ge=0, description="entropy bonus coefficient")
    vf_coef: float = Field(0.5, ge=0, description="value loss coefficient")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    lam: float = Field(0.99, ge=0, le=1, description="GAE lambda")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient clipping norm")
    reward_scale: float = Field(20.0, gt=0, description="reward = reward_scale x BabyAI reward")
    max_steps: int | None = Field(None, gt=0, description="cut training episodes after this many steps (a "
                                                          "truncation: its reward gets gamma x V(s_cut))")

    @model_validator(mode="after")
    def _micro_batch_divides_minibatch(self) -> GlamPPO:
        if self.minibatch_size % self.micro_batch:
            raise ValueError(f"minibatch_size {self.minibatch_size} is not a multiple of micro_batch "
                             f"{self.micro_batch}")
        return self


class GlamTrain(GlamPPO):
    env_id: str = Field(description="BabyAI-Text level to train on")
    seeds: list[int] = Field(min_length=1, description="training seeds (one glam_train item per seed x variant)")
    variants: list[Literal["lora", "full", "npae"]] = Field(
        min_length=1, description="agent variants: LoRA scoring policy, full fine-tuning, NPAE action head")

    def ppo(self) -> GlamPPO:
        """The algorithm's settings alone (what identifies a training run, without the item lists)."""
        return GlamPPO(**self.model_dump(include=set(GlamPPO.model_fields)))


class GlamBC(Section):
    episodes: int = Field(gt=0, description="the first N bot demonstrations of the training level from the demos "
                                            "stage (data/demos/<glam.train.env_id>.h5)")
    seed: int = Field(ge=0, description="seed of the adapter's initialisation and the minibatch order")
    epochs: int = Field(gt=0, description="passes over the demonstrations")
    batch_size: int = Field(gt=0, description="samples per optimiser step")
    lr: float = Field(gt=0, description="Adam learning rate")


class GlamSymbolic(Section):
    ppo: PPOParams = Field(description="the Symbolic-PPO baseline's PPO (llmrl.algos.distilled_ppo, no teacher)")
    seeds: list[int] = Field(min_length=1, description="training seeds: one model per seed, pooled as seeds in "
                                                       "glam_eval")


class GlamEval(Section):
    env_ids: list[str] = Field(min_length=1, description="BabyAI-Text levels to evaluate on")
    episodes: int = Field(ge=100, description="episodes per agent, level and mode (>= 100)")
    seed: int = Field(ge=0, description="first evaluation seed (disjoint from training and BC seeds)")
    max_steps: int | None = Field(None, gt=0, description="cut evaluation episodes after this many steps")
    modes: list[Literal["greedy", "sampled"]] = Field(["greedy", "sampled"], min_length=1,
                                                      description="action choice: argmax, or sampled from the policy")
    batch: int = Field(16, gt=0, description="episodes stepped in lockstep, their prompts scored in one forward")


class GlamGeneralisation(Section):
    env_id: str = Field(description="level the text variants are applied to")
    episodes: int = Field(ge=100, description="episodes per agent variant and test (>= 100), split evenly over "
                                             "its training seeds: each runs ceil(episodes / seeds)")
    seed: int = Field(ge=0, description="first seed (disjoint from training seeds)")
    max_steps: int | None = Field(None, gt=0, description="cut episodes after this many steps")
    mode: Literal["greedy", "sampled"] = Field("greedy", description="action selection")
    tests: list[str] = Field(min_length=1, description="text variants (llmrl.envs.babyai_text.languages.VARIANTS)")
    batch: int = Field(16, gt=0, description="episodes stepped in lockstep, their prompts scored in one forward")
    include_bc: bool = Field(False, description="also test the BC agent (the original tested GLAM agents only)")


class GlamParams(Section):
    tier: TierName = Field("default", description=TIER_HELP)
    model: str = Field(description="base model spec (models/base_llm, embedded:..., tiny, a hub name)")
    threads: int = Field(2, gt=0, description="torch CPU threads")
    dtype: ComputeDType = Field("auto", description=DTYPE_HELP)
    lora: LoraSettings = Field(LoraSettings(dropout=0.0), description="LoRA adapter of the lora variant "
                                                                         "(dropout 0 keeps PPO's ratios exact)")
    policy: GlamPolicy = Field(GlamPolicy(), description="how the LLM acts: prompt window, temperature, scoring")
    train: GlamTrain = Field(description="PPO of the LLM agents (stage glam_train)")
    bc: GlamBC = Field(description="behaviour cloning of the BabyAI bot (stage glam_bc)")
    symbolic: GlamSymbolic = Field(description="the Symbolic-PPO baseline (stage glam_symbolic)")
    eval: GlamEval = Field(description="evaluation of every agent on the test levels (stage glam_eval)")
    generalisation: GlamGeneralisation = Field(description="the generalisation tests (stage glam_generalisation)")
