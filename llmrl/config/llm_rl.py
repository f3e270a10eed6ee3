"""Params of the LLM_RL stages: ``llm_rl_data``, ``llm_rl_train`` (common + one block per variant), ``llm_rl_eval``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from llmrl.config import DTYPE_HELP, UNLISTED, ComputeDType, Section
from llmrl.config.lora import LoraSettings

__all__ = ["MathDataParams", "CommonTrainParams", "ReinforceKLParams", "GRPOParams", "ReinforceTrainParams",
           "MathEvalParams"]


class MathDataParams(Section):
    source: Literal["generated", "gsm_symbolic", "gsm8k", "math"] = Field(
        "generated", description="generated: the embedded GSM-style generator; gsm_symbolic: reasoning-gym's "
        "GSM8K-derived templates (offline); gsm8k / math: a real data set")
    train_path: str | None = Field(None, description="local .jsonl/.json/.parquet train file (gsm8k/math); "
                                                     "None reads the hub")
    test_path: str | None = Field(None, description="local test file (gsm8k/math); None reads the hub")
    hub_name: str | None = Field(None, description="hub data set; None: openai/gsm8k or EleutherAI/hendrycks_math")
    hub_configs: list[str] | None = Field(
        None, description="hub configs, concatenated; None: ['main'] for gsm8k, every MATH subject for math")
    n_train: int = Field(600, gt=0, description="train problems kept (generated: produced)")
    n_test: int = Field(100, gt=0, description="test problems kept, the first n_test of the test split")
    seed: int = Field(0, ge=0, description="seed of the generator and of the train-order shuffle")
    test_templates: float = Field(0.2, gt=0, lt=1, description="gsm_symbolic: seeded share of the templates "
                                  "that only the test split draws from")
    two_step_fraction: float = Field(0.2, ge=0, le=1, description="generated: share of two-operation problems")
    max_number: int = Field(20, ge=3, description="generated: largest operand")

    @model_validator(mode="after")
    def _paths_need_real_source(self):
        if self.source in ("generated", "gsm_symbolic") and (self.train_path or self.test_path):
            raise ValueError("train_path/test_path need source gsm8k or math")
        return self


class CommonTrainParams(Section):
    model: str = Field("models/base_llm", description="base model spec (folder, hub name, embedded:..., tiny)")
    seed: int = Field(0, ge=0, json_schema_extra=UNLISTED,
                      description="the seed of one training run, for Python, NumPy, torch and LLM sampling: "
                                  "llm_rl_train sets it from its item of llm_rl.train.seeds "
                                  "(ReinforceTrainParams.for_seed); params.yaml leaves it out")
    few_shot: int = Field(2, ge=0, description="solved train problems shown before each problem (the first k; CPU "
                                               "budget; the original: 4)")
    lora: LoraSettings | None = Field(LoraSettings(r=16, alpha=32, dropout=0.0),
                                      description="LoRA adapter (both variants); null: full fine-tune")
    lr: float = Field(2e-4, gt=0, description="learning rate (both variants; original: 1e-5, full "
                                                         "fine-tune)")
    lr_schedule: Literal["constant", "linear"] = Field(
        "constant", description="both variants: constant, or linear decay to 0 over the optimiser steps "
                                "(transformers' linear schedule, which TRL applies)")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip (both variants)")
    iterations: int = Field(2, gt=0, description="collect-then-update iterations (GRPO: generation rounds; "
                                                 "original: 20): the default shows both variants training, the "
                                                 "study settles the claim (20)")
    problems_per_iteration: int = Field(4, gt=0, description="train problems per iteration")
    group_size: int = Field(4, gt=0, description="episodes (completions) per problem")
    micro_batch: int = Field(8, gt=0, description="episodes (GRPO: completions) per optimizer step "
                                                      "(original: 32 (state, line) samples)")
    temperature: float = Field(0.7, gt=0, description="sampling temperature during training (original: 1.0; a "
                                                      "135M model samples too few right answers there)")
    top_p: float = Field(0.9, gt=0, le=1, description="nucleus sampling during training")
    answer_tokens: int = Field(
        96, gt=0, description="token budget of one answer, both variants: GRPO's completion length; REINFORCE's "
                              "lines of one episode together (each line also capped by line_tokens)")
    line_tokens: int = Field(40, gt=0, description="REINFORCE only: tokens per line (≤ answer_tokens; original: 64)")
    gen_batch_size: int = Field(24, gt=0, description="prompts generated together")
    device: str | None = Field(None, description="cpu/cuda; None: cuda if present")
    dtype: ComputeDType = Field("auto", description=DTYPE_HELP)
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")


class ReinforceKLParams(Section):
    beta: float = Field(0.25, ge=0, description="KL coefficient β to the reference policy")
    ref_update_iterations: int = Field(2, gt=0, description="reset the reference to the policy every k iterations")
    gamma: float = Field(0.99, gt=0, le=1, description="per-line discount of the final reward")
    baseline: Literal["none", "batch", "group"] = Field(
        "group", description="return baseline: none (the original), batch mean, or leave-one-out per problem")
    max_steps: int = Field(4, gt=0, description="lines per episode before truncation (original: 10)")
    calculator: bool = Field(False, description="rewrite <<expr=result>> annotations with the safe calculator "
                                                    "(the original's README command: on)")
    epochs: int = Field(1, gt=0, description="passes over an iteration's samples")


class GRPOParams(Section):
    learning_rate: float | None = Field(
        None, gt=0, description="None: the common lr (TRL's default 1e-6 suits full fine-tunes, not LoRA)")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field("dapo", description="TRL GRPO loss variant")
    beta: float = Field(0.0, ge=0, description="KL coefficient (TRL default 0: no reference model)")
    num_iterations: int = Field(1, gt=0, description="policy updates per generation batch (μ)")
    epsilon: float = Field(0.2, gt=0, description="clip range")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="advantage scaling")


class ReinforceTrainParams(Section):
    """The settings of both LLM_RL variants: REINFORCE-KL takes this model as it is; GRPO's TRL settings are
    derived from ``common`` and ``grpo`` by ``llmrl.algos.llm_rl_grpo.trainer_params``."""

    seeds: list[NonNegativeInt] = Field(
        [0], min_length=1, description="training seeds: one llm_rl_train item per variant and seed, each a "
                                       "model of its own; llm_rl_eval reports a variant over its seeds (the "
                                       "study: 3)")
    common: CommonTrainParams = Field(default_factory=CommonTrainParams, description="shared by both variants "
                                      "(same data, prompt, reward and sample budget)")
    reinforce_kl: ReinforceKLParams = Field(default_factory=ReinforceKLParams, description="REINFORCE-KL only")
    grpo: GRPOParams = Field(default_factory=GRPOParams, description="GRPO (TRL) only")

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    def for_seed(self, seed: int) -> ReinforceTrainParams:
        """The settings of the training run with ``seed``, one of ``seeds``: ``common.seed`` set to it, the one
        seed the trainers read (every RNG and the sampling). ``seeds`` is the only place a training seed is
        set, so a ``common.seed`` given here as well is an error rather than silently overridden."""
        if "seed" in self.common.model_fields_set:
            raise ValueError("llm_rl.train.common.seed: the training seeds are llm_rl.train.seeds (one "
                             "llm_rl_train item each); remove common.seed")
        if seed not in self.seeds:
            raise ValueError(f"llm_rl.train.seeds: {seed} is not one of {self.seeds}")
        return self.model_copy(update={"common": self.common.model_copy(update={"seed": seed})})

    @model_validator(mode="after")
    def _batches_fit(self):
        c = self.common
        n = c.problems_per_iteration * c.group_size
        if n % c.micro_batch or c.micro_batch % c.group_size:
            raise ValueError(f"common.micro_batch={c.micro_batch} must divide problems_per_iteration*group_size={n} "
                             f"and be a multiple of group_size={c.group_size} (GRPO groups stay whole)")
        if c.line_tokens > c.answer_tokens:
            raise ValueError(f"common.line_tokens={c.line_tokens} exceeds common.answer_tokens={c.answer_tokens}")
        if self.reinforce_kl.baseline == "group" and c.group_size < 2:
            raise ValueError("reinforce_kl.baseline: 'group' (leave-one-out) needs common.group_size >= 2")
        return self


class MathEvalParams(Section):
    n_problems: int | None = Field(20, gt=0, description="test problems evaluated, the first of the test split "
                                   "(20: the CPU budget of the 45-min pipeline; the study: all 100); None: the whole "
                                   "test split")
    max_new_tokens: int | None = Field(
        None, gt=0, description="tokens per solution; None: llm_rl.train.common.answer_tokens, the budget "
                                "both variants trained with")
    max_truncated: float = Field(0.05, ge=0, le=1, description="largest share of a model's answers the cap should "
                                                               "cut; above it the stage warns that the comparison "
                                                               "is unfair (raise the cap)")
    batch_size: int = Field(25, gt=0, description="prompts generated together")
    temperature: float = Field(0.6, gt=0, description="sampled mode temperature (the original's evaluation)")
    top_p: float = Field(0.9, gt=0, le=1, description="sampled mode nucleus")
    seed: int = Field(1234, ge=0, description="sampling seed")
    models: list[Literal["base", "reinforce_kl", "grpo"]] = Field(
        ["base", "reinforce_kl", "grpo"], min_length=1,
        description="base, or a llm_rl_train variant (scored as every one of its llm_rl.train.seeds models); each "
                    "variant is compared with base where base is listed")
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")

    @field_validator("models")
    @classmethod
    def _distinct_models(cls, models: list[str]) -> list[str]:
        if len(set(models)) != len(models):
            raise ValueError(f"models must be distinct, got {models}")
        return models
