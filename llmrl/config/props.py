"""ProPS params (``props:`` in params.yaml): one parameter space, the LLM, the search, baselines, transfer, eval.

Sections are read with ``stage_params("props.search", PropsSearchParams)`` and friends; the algorithm functions
take these models directly. ``props.space`` is the one parameter range every ProPS piece uses (the search's
prompt and parser, the random fallback, the baselines, the GRPO data); the original sampled its GRPO data from
[-10, 10] while its prompt allowed [-6, 6].

The GRPO fine-tuning section (``props.grpo``) is appended at the end of this file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.config import DTYPE_HELP, ComputeDType, Section
from llmrl.config.grpo import GRPOTrainParams

__all__ = ["PropsMethod", "BaselineMethod", "PropsSpaceParams", "PropsLLMParams", "PropsSearchParams",
           "PPOBaselineParams", "CEMParams", "PropsBaselinesParams", "PropsTransferParams", "PropsEvalParams",
           "PropsGRPOParams"]

PropsMethod = Literal["props", "props_plus"]
BaselineMethod = Literal["random_search", "cem", "ppo"]


class PropsSpaceParams(Section):
    low: float = Field(-6.0, description="lowest allowed parameter value (prompt, parser, fallback, baselines, "
                                         "GRPO data)")
    high: float = Field(6.0, description="highest allowed parameter value")
    decimals: int = Field(1, ge=0, le=6, description="decimal places the prompt asks for (replies with more "
                                                     "are still accepted)")

    @model_validator(mode="after")
    def _ordered(self) -> PropsSpaceParams:
        if not self.low < self.high:
            raise ValueError(f"low must be < high, got [{self.low}, {self.high}]")
        return self


class PropsLLMParams(Section):
    backend: Literal["local", "openai"] = Field("local", description="local: a model loaded in-process by "
                                                                     "llmrl.llm.load; openai: an OpenAI-compatible "
                                                                     "endpoint (api)")
    spec: str = Field("models/base_llm", description="local model spec (embedded:<name>, folder, hub name, tiny); "
                                                      "for backend openai, the served model's tokenizer (prompt "
                                                      "tokens; the text api 'completions' sends)")
    model: str | None = Field(None, description="backend openai: the endpoint's model name")
    base_url: str | None = Field(None, description="backend openai: e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key (never "
                                                           "the key itself)")
    timeout_s: float = Field(120.0, gt=0, description="backend openai: seconds per request")
    max_retries: int = Field(2, ge=0, description="backend openai: the openai client's retries on 429/5xx/timeouts")
    api: Literal["completions", "chat"] = Field(
        "completions", description="openai: 'completions' sends the prompt rendered here with spec's chat "
        "template (the text the local backend feeds the model, answer prefix continued; vLLM, llama.cpp, "
        "llmrl.llm.serve); 'chat' lets the server render it (hosted chat APIs; not every server continues an "
        "answer prefix)")
    dtype: ComputeDType = Field("auto", description="local backend: " + DTYPE_HELP)
    batch_size: int = Field(16, gt=0, description="local backend: prompts per generate() batch")
    offline: bool = Field(False, description="serve replies only from the reply cache; a miss is an error")
    max_new_tokens: int = Field(96, gt=0, description="reply length cap in tokens (the answer is one line)")
    stop_at_newline: bool = Field(True, description="stop each reply at its first line break (the answer is "
                                                    "line 1; saves generation time; off for reasoning models)")
    answer_prefix: str = Field("", description="start of the assistant turn written for the model (e.g. "
                                               "'params[0]:'; the model continues it; local backend or "
                                               "endpoints that accept a final assistant message); '' = none")
    temperature: float = Field(0.0, ge=0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")

    @model_validator(mode="after")
    def _endpoint(self) -> PropsLLMParams:
        if self.backend == "openai" and not (self.model and self.base_url):
            raise ValueError("backend openai needs model and base_url")
        return self


class PropsSearchParams(Section):
    tasks: list[str] = Field(min_length=1, description="control task keys (llmrl.envs.control.TASKS), one DVC "
                                                       "stage item each")
    methods: list[PropsMethod] = Field(["props", "props_plus"], min_length=1,
                                       description="props: numeric template; props_plus: semantic template")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="independent searches, run in lockstep (one "
                                                                   "batched LLM call per iteration)")
    iterations: int = Field(30, gt=0, description="search iterations (one proposal evaluated per iteration)")
    episodes_per_eval: int = Field(20, gt=0, description="episodes behind each f(params) (the original: 20)")
    max_episode_steps: dict[str, int] = Field(default_factory=dict, description="per-task episode cap below the "
                                                                                "task's own limit (missing: own "
                                                                                "limit)")
    optimum_hint: bool = Field(True, description="tell the LLM the approximate optimum (privileged information "
                                                 "no RL baseline has; ablate with false)")
    optimum: dict[str, float] = Field(default_factory=dict, description="per-task hinted optimum overriding the "
                                                                        "original's value (e.g. under an episode cap)")
    step_size: dict[str, float] = Field(default_factory=dict, description="per-task suggested step overriding "
                                                                          "the original's value")
    max_reasks: int = Field(3, ge=0, description="correction re-asks after an unusable reply (the original: 3)")
    prompt_token_budget: int = Field(2048, gt=0, description="prompt tokens (model's tokenizer, chat template "
                                                             "applied); oldest history entries are dropped to fit")
    eval_episodes: int = Field(20, gt=0, description="held-out evaluation episodes of each run's final policy")
    eval_seed: int = Field(10_000_000, ge=0, description="first held-out evaluation seed (search episodes use "
                                                         "seeds below 1,000,000 * (seed + 1))")
    video: bool = Field(True, description="write an MP4 of the best policy's evaluation episode per task")


class PPOBaselineParams(Section):
    learning_rate: float = Field(3e-4, gt=0, description="SB3 PPO learning rate")
    n_steps: int = Field(256, gt=0, description="SB3 PPO rollout length per update")
    batch_size: int = Field(64, gt=0, description="SB3 PPO minibatch size")
    n_epochs: int = Field(10, gt=0, description="SB3 PPO epochs per update")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    net_arch: list[int] = Field([64, 64], description="hidden sizes of SB3's MLP policy and value networks")


class CEMParams(Section):
    population: int = Field(10, ge=2, description="candidates per generation")
    elite_frac: float = Field(0.2, gt=0, le=1, description="fraction of candidates refitting the distribution")
    episodes_per_candidate: int = Field(4, gt=0, description="episodes scoring each candidate")
    init_std: float = Field(3.0, gt=0, description="initial standard deviation (mean starts at the range centre)")
    min_std: float = Field(0.1, gt=0, description="floor of the standard deviation (keeps exploring)")


class PropsBaselinesParams(Section):
    methods: list[BaselineMethod] = Field(["random_search", "cem", "ppo"], min_length=1,
                                          description="baselines run at the search's episode budget "
                                                      "(iterations × episodes_per_eval per seed)")
    cem: CEMParams = Field(default_factory=CEMParams, description="cross-entropy method settings")
    ppo: PPOBaselineParams = Field(default_factory=PPOBaselineParams, description="SB3 PPO settings")


class PropsTransferParams(Section):
    tasks: list[str] = Field(["mountaincar_continuous", "cartpole", "inverted_pendulum"], min_length=1,
                             description="the GRPO training task and transfer tasks")
    method: PropsMethod = Field("props", description="template used for base vs tuned optimizer")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="searches per task and optimizer")
    iterations: int = Field(10, gt=0, description="search iterations per run")
    require_adapter: bool = Field(False, description="fail when models/props/grpo is missing (false: run the base "
                                                     "model only and say so in the metrics)")


class PropsEvalParams(Section):
    statistic: Literal["mean", "iqm"] = Field("mean", description="statistic over seeds")
    confidence: float = Field(0.95, gt=0, lt=1, description="bootstrap interval level")
    reps: int = Field(2000, gt=0, description="bootstrap resamples")


# ------------------------------------------------------------------------------------------------------
# GRPO fine-tuning of the optimizer (props.grpo): appended below by the GRPO part.


class PropsGRPOParams(Section):
    """``props.grpo``: the data set of scored vectors, the prompt, the reward mapping and TRL's GRPO settings."""

    model: str = Field("models/base_llm", description="base model spec fine-tuned (folder, hub name, embedded:..., "
                                                      "tiny); the adapter is trained on top of it")
    task: str = Field("mountaincar_continuous", description="control task the vectors are scored on (the "
                                                            "original: MountainCarContinuous-v0)")
    vectors: int = Field(40, ge=2, description="parameter vectors drawn uniformly from props.space (the original: "
                                               "4,000)")
    episodes: int = Field(2, gt=0, description="episodes scoring each vector; their mean is the f(params) shown "
                                               "in the prompt and the improvement reward's R_old (original: 20)")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of vectors held out (never trained on)")
    seed: int = Field(0, ge=0, description="seed of the vectors, the split, the scoring and rollout seeds")
    max_episode_steps: int | None = Field(None, gt=0, description="episode cap for scoring and reward rollouts "
                                                                  "(None: the task's own limit)")
    optimum_hint: bool = Field(True, description="show the task's optimum hint in the prompt (the original did)")
    step_size: float | None = Field(None, gt=0, description="exploration step the prompt suggests (None: the task's, "
                                                            "as the search; the original's GRPO prompt: 1.0)")
    iteration: int = Field(1, gt=0, description="iteration number the prompt states (the original: 1)")
    total_iterations: int = Field(30, gt=0, description="iteration count the prompt states (the original: 400)")
    answer_prefix: str = Field("", description="text that opens the assistant turn the completions continue, as "
                                               "props.llm.answer_prefix opens the search's ('': the model writes "
                                               "the whole reply, the original's <think> format); the rewards read "
                                               "it with the completion")
    return_floor: float = Field(-200.0, description="return mapped to policy reward 0 (original: -200 on "
                                                    "MountainCarContinuous)")
    return_span: float = Field(300.0, gt=0, description="returns >= return_floor + return_span map to 1; also "
                                                        "the improvement reward's scale (original: 300)")
    device: str | None = Field(None, description="cpu/cuda; None: cuda if present")
    dtype: ComputeDType = Field("auto", description=DTYPE_HELP)
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")
    trainer: GRPOTrainParams = Field(default_factory=GRPOTrainParams, description="TRL GRPO and LoRA settings")
