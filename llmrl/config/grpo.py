"""The generic GRPO settings (``GRPOTrainParams``), nested by every method that fine-tunes an LLM with TRL's GRPO.

Field names are ``trl.GRPOConfig``'s own, so a value reads the same here, in TRL's docs and in the trainer's
``args``; only what TRL 1.16 lacks or decides badly for this project is ours: ``max_prompt_tokens`` (TRL 1.16
dropped ``max_prompt_length``; prompts are truncated by ``llmrl.algos.grpo``), ``bf16`` as a wish that is honoured
only where the device supports it, ``gradient_checkpointing`` off (TRL turns it on), and the LoRA adapter as the
one LoRA settings type, ``llmrl.config.lora.LoraSettings``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.config import Section
from llmrl.config.lora import LoraSettings

__all__ = ["GRPOTrainParams"]


class GRPOTrainParams(Section):
    learning_rate: float = Field(1e-6, gt=0, description="AdamW learning rate (TRL's default 1e-6 suits full "
                                                         "fine-tunes; LoRA adapters usually want 1e-5 to 1e-4)")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field("dapo", description="TRL GRPO loss variant")
    beta: float = Field(0.0, ge=0, description="KL coefficient to the reference model (0: no reference model; "
                                               "TRL's default since 0.19, 0.04 before)")
    num_iterations: int = Field(1, gt=0, description="policy updates per generation batch (mu)")
    epsilon: float = Field(0.2, gt=0, description="PPO-style clip range of the importance ratio")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="advantage scaling by the std "
                                                                                   "of the group, the batch, or none")
    reward_weights: list[float] | None = Field(None, description="weight of each reward function in the sum "
                                                                  "(None: all 1.0)")
    num_generations: int = Field(4, ge=2, description="completions sampled per prompt (the group size G)")
    per_device_train_batch_size: int = Field(4, gt=0, description="completions per micro-batch; a multiple of "
                                                                   "num_generations keeps groups whole")
    gradient_accumulation_steps: int = Field(1, gt=0, description="micro-batches per optimiser step")
    steps_per_generation: int | None = Field(None, gt=0, description="micro-batches fed by one generation round "
                                                                      "(None: gradient_accumulation_steps)")
    max_steps: int | None = Field(None, gt=0, description="optimiser steps; None: num_train_epochs over the data")
    num_train_epochs: float = Field(1.0, gt=0, description="passes over the prompts when max_steps is None")
    max_prompt_tokens: int | None = Field(512, gt=0, description="prompt budget in the model's own tokens after "
                                                                 "the chat template; longer prompts lose the start "
                                                                 "of their last message (None: no limit)")
    max_completion_length: int = Field(256, gt=0, description="tokens per sampled completion")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the completions")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of the completions")
    lr_scheduler_type: Literal["linear", "constant", "cosine"] = Field("linear", description="learning-rate schedule")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient-norm clip")
    seed: int = Field(0, ge=0, description="seed of TRL's sampler, the adapter's initialisation and sampling")
    stop_at_newline: bool = Field(False, description="end each completion after its first line break (needs "
                                                     "per_completion_seeds; ProPS: the answer is line 1, as the "
                                                     "search stops its replies)")
    bf16: bool = Field(True, description="bf16 mixed precision where the LLM's resolved dtype is bf16 (the "
                                         "stage's dtype: auto gives it on CUDA with bf16 and on CPUs that run bf16 "
                                         "natively when unpinned)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass (saves "
                                                            "memory, costs time; TRL's default is on)")
    share_prompt_prefix: bool = Field(True, description="score completions with the micro-batch's common "
                                                        "prompt prefix computed once (same log-probs as TRL's; "
                                                        "incompatible with gradient_checkpointing)")
    per_completion_seeds: bool = Field(True, description="sample each completion from its own stream, seeded by "
                                                         "(seed, generation round, its index in the round), so "
                                                         "N processes sample one process's completions "
                                                         "(False: transformers' sampling, one stream per process)")
    lora: LoraSettings | None = Field(default_factory=LoraSettings, description="LoRA adapter attached by TRL "
                                                                                "(None: full fine-tune)")

    @model_validator(mode="after")
    def _prefix_cache_without_recomputation(self):
        # A checkpointed layer re-runs its forward in the backward pass and would append to the prefix KV cache again.
        if self.share_prompt_prefix and self.gradient_checkpointing:
            raise ValueError("share_prompt_prefix and gradient_checkpointing cannot both be on (the recomputed "
                             "forward would extend the shared prefix's KV cache twice)")
        return self

    @model_validator(mode="after")
    def _groups_stay_whole(self):
        batch = self.per_device_train_batch_size * (self.steps_per_generation or self.gradient_accumulation_steps)
        if batch % self.num_generations:
            raise ValueError(f"per_device_train_batch_size x steps_per_generation = {batch} must be a multiple of "
                             f"num_generations={self.num_generations} (GRPO groups stay whole)")
        return self
