"""Params of the GLAM stages (section ``glam`` of params.yaml). The defaults are the CPU default tier: SmolLM2 from
models/base_llm on the small GoToObjS4 text level with short rollouts and capped evaluation episodes, sized for the
default pipeline's 45 minutes on 2 cores (the stages' measured times: docs/measurements.md); the original's scale
(mixed levels, 32 envs, 1.5M steps) is conf/glam/paper.yaml."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.config import DTYPE_HELP, TIER_HELP, UNLISTED, ComputeDType, Section, TierName
from llmrl.config.lora import LoraSettings
from llmrl.config.ppo import PPOParams

__all__ = ["GlamPolicy", "GlamPPO", "GlamTrain", "GlamBC", "GlamSymbolic", "GlamEval", "GlamGeneralisation",
           "GlamParams"]


class GlamPolicy(Section):
    history: int = Field(1, ge=1, description="observations in the prompt (with history-1 previous actions; paper "
                                              "profile: 3)")
    temperature: float = Field(3.0, gt=0, description="softmax temperature over the candidates' log-probs (paper "
                               "profile: 1). 3 because SmolLM2 gives 'go forward' ~0.1 % of the mass at temperature "
                               "1 and PPO never saw a success in 1,024 frames; at 3 it explores")
    length_norm: bool = Field(False, description="score candidates by mean (not summed) token log-prob")


class GlamPPO(Section):
    """GLAM's PPO (``llmrl.algos.ppo_llm.train`` takes this model itself); defaults are the CPU default tier's
    (the original's: conf/glam/paper.yaml)."""

    n_envs: int = Field(16, gt=0, description="environments stepped as one batch (original: 32)")
    frames_per_env: int = Field(8, gt=0, description="frames per environment per PPO update (original: 40)")
    updates: int = Field(16, gt=0, description="PPO updates (16 x 16 x 8 = 2,048 frames per seed). Measured on "
                         "validation levels (400000..400047, apart from eval's and generalisation's): every seed at "
                         "greedy success 1.00 from 16 updates on (seeds 1, 2 at 15 and 20; seed 0 0.79 at 14, 1.00 "
                         "at 16 and 18); 16 is the first budget from which every measured point is 1.00 (18 took "
                         "the fresh-clone pipeline to 45.8 min; README, GLAM)")
    epochs: int = Field(2, gt=0, description="PPO epochs per update (original: 4)")
    minibatch_size: int = Field(32, gt=0, description="samples per optimiser step (original: 64)")
    micro_batch: int = Field(16, gt=0, description="samples per forward/backward (gradient accumulation); divides "
                                                   "minibatch_size")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate (LoRA; original: 1e-6, full fine-tuning)")
    adam_eps: float = Field(1e-5, gt=0, json_schema_extra=UNLISTED, description="Adam epsilon")
    clip: float = Field(0.2, gt=0, description="PPO ratio and value clip")
    ent_coef: float = Field(0.01, ge=0, description="entropy bonus coefficient")
    vf_coef: float = Field(0.5, ge=0, description="value loss coefficient")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    lam: float = Field(0.99, ge=0, le=1, description="GAE lambda")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient clipping norm")
    reward_scale: float = Field(20.0, gt=0, description="reward = reward_scale x BabyAI reward")
    max_steps: int | None = Field(None, gt=0, description="cut training episodes after this many steps (a "
                                                          "truncation: its reward gets gamma x V(s_cut)); None: the "
                                                          "level's own step limit (16 on GoToObjS4)")

    @model_validator(mode="after")
    def _micro_batch_divides_minibatch(self) -> GlamPPO:
        if self.minibatch_size % self.micro_batch:
            raise ValueError(f"minibatch_size {self.minibatch_size} is not a multiple of micro_batch "
                             f"{self.micro_batch}")
        return self


class _TrainLevel(Section):
    env_id: str = Field("BabyAI-Text-GoToObjS4-v0", description="BabyAI-Text level to train on")


class GlamTrain(GlamPPO, _TrainLevel):  # _TrainLevel last: env_id is the first key of glam.train
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="training seeds (one glam_train item per seed x "
                                                                  "variant)")
    variants: list[Literal["lora", "full", "npae"]] = Field(
        ["lora"], min_length=1, description="agent variants: LoRA scoring policy, full fine-tuning, NPAE action "
                                            "head; one glam_train item and models/glam/<variant>-<seed> each")

    def ppo(self) -> GlamPPO:
        """The algorithm's settings alone (what identifies a training run, without the item lists)."""
        return GlamPPO(**self.model_dump(include=set(GlamPPO.model_fields)))


class GlamBC(Section):
    episodes: int = Field(160, gt=0, description="training demonstrations: the first N bot episodes of the training "
                                                 "level from the demos stage (data/demos/<glam.train.env_id>.h5)")
    validation_episodes: int = Field(40, gt=0, description="validation demonstrations: the last N episodes of the "
                                                           "same file (disjoint from the training ones); the epoch "
                                                           "of lowest validation loss is kept")
    seed: int = Field(50_000, ge=0, description="BC of training seed s initialises its adapter and orders its "
                                                "minibatches from seed + s (one BC model per glam.train.seeds)")
    epochs: int = Field(12, gt=0, description="at most this many passes over the training demonstrations (12: at "
                        "24, every seed's validation accuracy reached 1.00 by epoch 8 and its loss fell below 0.01 "
                        "by epoch 9, the later epochs moving it in the fourth decimal: docs/measurements.md, "
                        "2026-11-29 (morning))")
    patience: int = Field(3, gt=0, description="stop after this many epochs without a lower validation loss")
    batch_size: int = Field(4, gt=0, description="distinct prompts per optimiser step (a prompt the bot met several "
                                                 "times is one row weighted by its count: llmrl.algos.bc_llm)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")


class GlamSymbolic(Section):
    ppo: PPOParams = Field(
        default_factory=lambda: PPOParams(total_frames=20_480, num_envs=8, num_steps=64, epochs=4, minibatch_size=128,
                                          lr=1e-3, gae_lambda=0.95, entropy_coef=0.01),
        description="the Symbolic-PPO baseline's PPO (llmrl.algos.distilled_ppo, no teacher)")
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="training seeds: one model per seed, "
                                                                        "pooled as seeds in glam_eval")


class GlamEval(Section):
    env_ids: list[str] = Field(["BabyAI-Text-GoToObjS4-v0"], min_length=1,
                               description="BabyAI-Text levels to evaluate on")
    episodes: int = Field(100, ge=100, description="episodes per agent, level and mode (>= 100)")
    seed: int = Field(200_000, ge=0, description="first evaluation seed (disjoint from training and BC seeds)")
    max_steps: int | None = Field(None, gt=0, description="cut evaluation episodes after this many steps; None: the "
                                                          "level's own step limit (16 on GoToObjS4)")
    modes: list[Literal["greedy", "sampled"]] = Field(["greedy", "sampled"], min_length=1,
                                                      description="action choice: argmax, or sampled from the policy")
    batch: int = Field(16, gt=0, description="episodes stepped in lockstep, their prompts scored in one forward")


class GlamGeneralisation(Section):
    env_id: str = Field("BabyAI-Text-GoToObjS4-v0", description="level the text variants are applied to")
    episodes: int = Field(102, ge=100, description="episodes per agent variant and test (>= 100), split evenly over "
                                                  "its training seeds: each runs ceil(episodes / seeds) (34 each "
                                                  "of 3)")
    seed: int = Field(300_000, ge=0, description="first seed (disjoint from training seeds)")
    max_steps: int | None = Field(None, gt=0, description="cut episodes after this many steps; None: the level's "
                                                          "own step limit")
    mode: Literal["greedy", "sampled"] = Field("greedy", description="action selection")
    batch: int = Field(20, gt=0, description="episodes stepped in lockstep, their prompts scored in one forward")
    include_bc: bool = Field(False, description="also test the BC agent (the original tested GLAM agents only)")
    tests: list[str] = Field(["none", "nouns_renamed", "french"], min_length=1,
                             description="text variants (llmrl.envs.babyai_text.languages.VARIANTS); the CPU "
                                         "default: the reference and two variants (the paper profile runs all "
                                         "nine)")


class GlamParams(Section):
    tier: TierName = Field("default", description=TIER_HELP)
    model: str = Field("models/base_llm", description="base model spec (models/base_llm, embedded:..., tiny, a hub "
                                                      "name)")
    threads: int = Field(1, gt=0, description="torch CPU threads (measured: 1 thread ~4x faster than 2 on a shared "
                                              "2-core machine under load)")
    dtype: ComputeDType = Field("auto", description=DTYPE_HELP)
    # LoRA on the top 2 of 30 layers: PPO's epochs run those layers only, on the frozen trunk's outputs captured
    # while acting (6x the env steps/s of LoRA everywhere, bench/glam.py).
    lora: LoraSettings = Field(default_factory=lambda: LoraSettings(r=8, alpha=16, dropout=0.0, layers=2),
                               description="LoRA adapter of the lora variant (dropout 0 keeps PPO's ratios exact)")
    policy: GlamPolicy = Field(default_factory=GlamPolicy, description="how the LLM acts: prompt window, "
                                                                       "temperature, scoring")
    train: GlamTrain = Field(default_factory=GlamTrain, description="PPO of the LLM agents (stage glam_train)")
    bc: GlamBC = Field(default_factory=GlamBC, description="behaviour cloning of the BabyAI bot (stage glam_bc)")
    symbolic: GlamSymbolic = Field(default_factory=GlamSymbolic, description="the Symbolic-PPO baseline (stage "
                                                                             "glam_symbolic)")
    eval: GlamEval = Field(default_factory=GlamEval, description="evaluation of every agent on the test levels "
                                                                 "(stage glam_eval)")
    generalisation: GlamGeneralisation = Field(default_factory=GlamGeneralisation, description="the generalisation "
                                               "tests (stage glam_generalisation)")
