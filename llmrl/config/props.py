"""ProPS params (``props:`` in params.yaml): one parameter space, the LLM, the search, baselines, transfer, eval.

Sections are read with ``stage_params("props.search", PropsSearchParams)`` and friends; the algorithm functions
take these models directly. ``props.space`` is the one parameter range every ProPS piece uses (the search's
prompt and parser, the random fallback, the baselines, the GRPO data); the original sampled its GRPO data from
[-10, 10] while its prompt allowed [-6, 6].

``PropsParams`` is the whole ``props:`` section (every profile: params.yaml, conf/props/*.yaml), with the
cross-section checks: equal episode budgets for every method of one table (CEM's generations fill the search's
budget exactly), and the quadratic check's budget likewise.

``props.grpo`` fine-tunes the optimizer with GRPO (function episodes on the CPU tiers, the original's control
recipe in the paper profile); ``props.heldout`` tests it on functions it never saw.

The defaults are the CPU default tier; the study and paper scale are conf/props/study.yaml and paper.yaml.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmrl.config import DTYPE_HELP, TIER_HELP, ComputeDType, Section, TierName
from llmrl.config.grpo import GRPOTrainParams
from llmrl.config.llm_faults import LLMFaultParams
from llmrl.config.lora import LoraSettings

__all__ = ["PropsMethod", "BaselineMethod", "PropsSpaceParams", "PropsLLMParams", "PropsSearchParams",
           "PPOBaselineParams", "CEMParams", "PropsBaselinesParams", "PropsTransferParams", "PropsEvalParams",
           "PropsQuadraticParams", "PropsFunctionDataParams", "PropsGRPOParams", "PropsHeldoutParams",
           "PropsParams"]

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
    dtype: ComputeDType = Field("auto", description="local backend: " + DTYPE_HELP)
    model: str | None = Field(None, description="backend openai: the endpoint's model name")
    base_url: str | None = Field(None, description="backend openai: e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key (never "
                                                           "the key itself)")
    faults: LLMFaultParams = Field(
        default_factory=lambda: LLMFaultParams(timeout_s=120.0, max_retries=2, deadline_s=3600.0, max_fault_share=0.1),
        description="the fault policy of every stage asking this LLM (props_search, props_transfer): request "
                    "timeout, retries, deadline (a stage's LLM requests take ~6 min at the CPU default), share of "
                    "failed requests past which the stage fails writing nothing")
    api: Literal["completions", "chat"] = Field(
        "completions", description="openai: 'completions' sends the prompt rendered here with spec's chat "
        "template (the text the local backend feeds the model, answer prefix continued; vLLM, llama.cpp, "
        "llmrl.llm.serve); 'chat' lets the server render it (hosted chat APIs; not every server continues an "
        "answer prefix)")
    batch_size: int = Field(16, gt=0, description="local backend: prompts per generate() batch")
    offline: bool = Field(False, description="serve replies only from the reply cache; a miss is an error")
    max_new_tokens: int | None = Field(None, gt=0, description="reply length cap in tokens; None: the longest "
                                                                "answer line of the task's parameter count in the "
                                                                "model's tokens (props_prompts.reply_token_cap); a "
                                                                "value below that is an error (room to reason above)")
    stop_at_newline: bool = Field(True, description="stop each reply at its first line break (the answer is "
                                                    "line 1; saves generation time; off for reasoning models)")
    answer_prefix: str = Field("params[0]:", description="start of the assistant turn written for the model (the "
                               "model continues it; local backend or endpoints that accept a final assistant "
                               "message; SmolLM2-135M rarely starts with the format unaided); '' = none, for "
                               "endpoint models")
    temperature: float = Field(0.7, ge=0, description="sampling temperature (0: greedy; sampled, so the seeds' "
                                                      "searches differ: greedy makes them identical)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")

    @model_validator(mode="after")
    def _endpoint(self) -> PropsLLMParams:
        if self.backend == "openai" and not (self.model and self.base_url):
            raise ValueError("backend openai needs model and base_url")
        return self


class PropsSearchParams(Section):
    tasks: list[str] = Field(["mountaincar_continuous"], min_length=1,
                             description="control task keys (llmrl.envs.control.TASKS), one DVC stage item each "
                                         "(CartPole, ~190 s of search, runs in the paper profile)")
    methods: list[PropsMethod] = Field(["props", "props_plus"], min_length=1,
                                       description="props: numeric template; props_plus: semantic template")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="independent searches, run in lockstep (one "
                                                                   "batched LLM call per iteration)")
    iterations: int = Field(4, gt=0, description="search iterations (one proposal evaluated per iteration)")
    episodes_per_eval: int = Field(10, gt=0, description="episodes behind each f(params) (the original: 20)")
    # MountainCarContinuous runs its own 999 steps: at 200 its flag is mostly out of reach and no stated maximum
    # would be true (docs/methods/props.md, "Protocol details")
    max_episode_steps: dict[str, int] = Field(default_factory=lambda: {"cartpole": 200, "inverted_pendulum": 200},
                                              description="per-task horizon below the "
                                                                                "task's own limit (missing: own "
                                                                                "limit); every figure the prompts "
                                                                                "state follows it (ControlTask."
                                                                                "at_horizon; MountainCarContinuous "
                                                                                "and FrozenLake: own limit only)")
    optimum_hint: bool = Field(True, description="tell the LLM the best return possible at the task's horizon "
                                                 "(privileged information no RL baseline has; ablate with false)")
    step_size: dict[str, float] = Field(default_factory=dict, description="per-task suggested step overriding "
                                                                          "the original's value")
    max_reasks: int = Field(1, ge=0, description="correction re-asks after an unusable reply (the original: 3)")
    prompt_token_budget: int = Field(768, gt=0, description="prompt tokens (model's tokenizer, chat template "
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
    cem: CEMParams = Field(
        default_factory=lambda: CEMParams(population=10, elite_frac=0.2, episodes_per_candidate=1, init_std=3.0,
                                          min_std=0.1),
        description="cross-entropy method settings")
    ppo: PPOBaselineParams = Field(default_factory=PPOBaselineParams, description="SB3 PPO settings")


class PropsTransferParams(Section):
    """``props.transfer``: the GRPO-tuned optimizer in the ProPS search on control tasks (``props_transfer``), at
    the search's budget, beside the same base model run the same way and the repeat control
    (``props_repeat_control``), tabled with the base model's ProPS runs and the baselines of the same task."""

    tasks: list[str] = Field(["mountaincar_continuous"], min_length=1,
                             description="control tasks, each among props.search.tasks (the base model's runs and "
                                         "the baselines come from there); one DVC stage item each")
    method: PropsMethod = Field("props", description="template the tuned optimizer is asked with (its base runs: "
                                                     "props_search's runs of the same method)")
    seeds: list[int] = Field([0, 1, 2], min_length=2,
                             description="search seeds of the transfer and of its repeat control, one stage item "
                                         "each; seed i (by position) is run by the adapter of training seed "
                                         "props.grpo.seeds[i mod n]; props_eval pairs the tuned, untuned and "
                                         "control runs by these seeds (the baselines, on props.search.seeds, are "
                                         "tabled beside them, not paired)")

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"props.transfer.seeds must be distinct, got {v}")
        return v


class PropsQuadraticParams(Section):
    """The direct check of in-context optimisation (``props_quadratic``): f(params) = 100 - 10 ||params - c||^2
    with an unknown centre c per seed, no environment; ProPS against random search (and CEM) at equal evaluations.
    The search's other settings (re-asks, prompt budget, hint) come from ``props.search``."""

    n_params: int = Field(2, ge=1, le=10, description="dimension of the quadratic (the issue: 2-3)")
    iterations: int = Field(15, gt=0, description="proposals per search (one evaluation each; the issue: 15-20)")
    seeds: list[int] = Field([0, 1], min_length=2, description="searches per method, each with its own centre c "
                                                               "(drawn from the seed; 2 seeds x 15 proposals ~60 s "
                                                               "of CPU, the study: 5 seeds x 30)")
    baselines: list[Literal["random_search", "cem"]] = Field(["random_search"], min_length=1,
                                                             description="gradient-free baselines at the same "
                                                                         "number of evaluations")
    cem: CEMParams = Field(
        default_factory=lambda: CEMParams(population=5, elite_frac=0.2, episodes_per_candidate=1, init_std=3.0,
                                          min_std=0.1),
        description="CEM on the quadratic (one evaluation per candidate)")

    @model_validator(mode="after")
    def _cem_budget(self) -> PropsQuadraticParams:
        if "cem" in self.baselines and self.iterations % (self.cem.population * self.cem.episodes_per_candidate):
            raise ValueError(f"cem: population x episodes_per_candidate ({self.cem.population} x "
                             f"{self.cem.episodes_per_candidate}) must divide iterations ({self.iterations}): every "
                             "method spends the same evaluations")
        return self


class PropsEvalParams(Section):
    statistic: Literal["mean", "iqm"] = Field("mean", description="statistic over seeds")
    confidence: float = Field(0.95, gt=0, lt=1, description="bootstrap interval level")
    reps: int = Field(2000, gt=0, description="bootstrap resamples")


class PropsFunctionDataParams(Section):
    """``props.grpo.functions``: optimisation episodes on cheap objective functions (``llmrl.envs.functions``;
    ``llmrl.algos.props_grpo_functions``), the CPU tiers' GRPO data."""

    train_examples: int = Field(64, ge=1, description="training examples, each on its own function of the train "
                                                       "split")
    validation_examples: int = Field(8, ge=1, description="validation examples (checkpoint selection), functions "
                                                           "of the validation split")
    dims: list[int] = Field([2, 3, 4], min_length=1, description="dimensions the functions are drawn in")
    history_min: int = Field(0, ge=0, description="fewest evaluated points in a prompt's history (0: the search's "
                                                  "first turn)")
    history_max: int = Field(12, ge=1, description="most evaluated points in a prompt's history")
    random_share: float = Field(0.5, ge=0, le=1, description="share of histories made by random search (the rest: "
                                                             "partial hill-climbing runs)")
    hill_step: list[float] = Field([0.3, 2.0], min_length=2, max_length=2, description="range of the hill-climbing "
                                                                                        "histories' step sigma "
                                                                                        "(log-uniform)")
    centre_range: float = Field(4.5, gt=0, description="function centres uniform in [-centre_range, centre_range]")
    curvature: list[float] = Field([0.5, 10.0], min_length=2, max_length=2, description="range of the bowls' "
                                                                                         "curvatures (log-uniform)")
    step_size: float = Field(1.0, gt=0, description="exploration step the prompt suggests (the quadratic check's)")
    seed: int = Field(0, ge=0, description="seed of the dimensions, history lengths, producers and histories")
    loop_functions: int = Field(0, ge=0, description="train functions per dimension the base model searches before "
                                                     "training (the ProPS search at props.heldout's dimensions and "
                                                     "settings), every exchange of those searches an example; 0: "
                                                     "made-up histories only")
    loop_validation_functions: int = Field(0, ge=0, description="validation functions per dimension searched the same "
                                                                "way for the validation examples")
    loop_share: float = Field(0.5, ge=0, le=1, description="share of the training (and validation) examples taken "
                                                           "from those searches, where there are any")

    @model_validator(mode="after")
    def _ranges(self) -> PropsFunctionDataParams:
        if self.history_min > self.history_max:
            raise ValueError(f"history_min ({self.history_min}) must be <= history_max ({self.history_max})")
        if any(d < 1 or d > 10 for d in self.dims):
            raise ValueError(f"dims: every dimension must be in [1, 10], got {self.dims}")
        for name in ("hill_step", "curvature"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name}: expected 0 < low <= high, got {[lo, hi]}")
        return self


def _cpu_trainer() -> GRPOTrainParams:
    """TRL GRPO of the CPU default: LoRA at a few steps (the original: lr 1e-5 over 5 epochs)."""
    return GRPOTrainParams(
        learning_rate=1e-4, loss_type="dapo", beta=0.0, num_iterations=1, epsilon=0.2, scale_rewards="group",
        reward_weights=None, num_generations=4,
        per_device_train_batch_size=4,  # one prompt's group per step
        gradient_accumulation_steps=1, steps_per_generation=None,
        max_steps=4,  # one step in each of dvc.yaml's 4 props_grpo_part parts
        num_train_epochs=1.0,
        max_prompt_tokens=1024,  # the longest function prompts (4-d, 12 points) fit whole
        max_completion_length=32,
        temperature=0.7,  # SmolLM2-135M at 1.0 rambles off-task
        top_p=1.0, lr_scheduler_type="linear", max_grad_norm=1.0, seed=0,
        stop_at_newline=True,  # the answer is line 1, as the search stops its replies
        bf16=True, gradient_checkpointing=False,
        lora=LoraSettings(r=8, alpha=32, dropout=0.1,
                          target_modules=("q_proj", "k_proj", "o_proj", "up_proj", "down_proj")))


class PropsGRPOParams(Section):
    """``props.grpo``: the data (function episodes, or the original's scored control vectors), the prompt, the
    training seeds, checkpoint selection and TRL's GRPO settings."""

    model: str = Field("models/base_llm", description="base model spec fine-tuned (folder, hub name, embedded:..., "
                                                      "tiny); the adapter is trained on top of it")
    data: Literal["functions", "control"] = Field("functions", description="functions: optimisation episodes on "
                                                  "objective functions (props.grpo.functions; rewards pay for "
                                                  "improvement); control: the original's recipe, scored vectors of "
                                                  "props.grpo.task (policy and improvement rewards from rollouts)")
    functions: PropsFunctionDataParams = Field(default_factory=PropsFunctionDataParams,
                                               description="data functions: the episodes")
    seeds: list[int] = Field([0], min_length=1, description="training seeds, one DVC stage item and one adapter "
                                                            "each (the seed of TRL's sampler, the adapter's "
                                                            "initialisation and sampling; the data stay the same)")
    eval_every: int = Field(0, ge=0, description="validate (mean reward of replies to the validation examples) every "
                                                 "this many steps and keep the best adapter; 0: validate at the "
                                                 "start and the end only")
    validation_samples: int = Field(1, ge=1, description="replies sampled per validation example (fixed seeds: the "
                                                         "same draws for every checkpoint)")
    task: str = Field("mountaincar_continuous", description="data control: the task the vectors are scored on (the "
                                                            "original: MountainCarContinuous-v0)")
    vectors: int = Field(40, ge=2, description="data control: parameter vectors drawn uniformly from props.space "
                                               "(the original: 4,000)")
    episodes: int = Field(2, gt=0, description="data control: episodes scoring each vector; their mean is the "
                                               "f(params) shown in the prompt and the improvement reward's R_old "
                                               "(original: 20)")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="data control: share of vectors held out (never "
                                                              "trained on)")
    seed: int = Field(0, ge=0, description="data control: seed of the vectors, the split, the scoring and rollout "
                                           "seeds")
    optimum_hint: bool = Field(True, description="show the optimum hint in the prompt (the original did; the "
                                                 "search's props.search.optimum_hint)")
    step_size: float | None = Field(None, gt=0, description="data control: exploration step the prompt suggests "
                                                            "(None: the task's, as the search; the original's GRPO "
                                                            "prompt: 1.0)")
    iteration: int = Field(1, gt=0, description="data control: iteration number the prompt states (the original: 1)")
    total_iterations: int = Field(15, gt=0, description="iteration count the prompt states (the original: 400; "
                                                        "data functions: the held-out search's, heldout.iterations)")
    # as props.llm's; 32 sampled SmolLM2 replies: 72 % parsed so opened, 3 % unopened
    answer_prefix: str = Field("params[0]:", description="text that opens the assistant turn the completions continue, as "
                                               "props.llm.answer_prefix opens the search's ('': the model writes "
                                               "the whole reply, the original's <think> format); the rewards read "
                                               "it with the completion")
    return_floor: float = Field(-200.0, description="data control: return mapped to 0 by the normalisation both "
                                                    "return rewards use (original: -200 on MountainCarContinuous)")
    return_span: float = Field(300.0, gt=0, description="data control: returns >= return_floor + return_span "
                                                        "normalise to 1 (original: 300)")
    device: str | None = Field(None, description="cpu/cuda; None: cuda if present")
    dtype: ComputeDType = Field("auto", description=DTYPE_HELP)
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")
    trainer: GRPOTrainParams = Field(default_factory=_cpu_trainer, description="TRL GRPO and LoRA settings "
                                                                                  "(its seed is each item's "
                                                                                  "training seed)")

    @model_validator(mode="after")
    def _distinct_seeds(self) -> PropsGRPOParams:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: must be distinct, got {self.seeds}")
        return self


class PropsHeldoutParams(Section):
    """``props.heldout``: the tuned optimizer in the ProPS search on test functions it never saw
    (``props_heldout``), against the base model, random search, hill climbing and CEM at equal evaluations. The
    search's other settings (re-asks, prompt budget, hint) come from ``props.search``, the sampling from
    ``props.llm``."""

    dims: list[int] = Field([2], min_length=1, description="dimensions of the test functions (one search task "
                                                           "each)")
    functions_per_dim: int = Field(4, ge=1, description="test functions per dimension (the families alternate)")
    validation_functions_per_dim: int = Field(2, ge=1, description="validation functions per dimension on which "
                                                                   "hill climbing's step is tuned")
    iterations: int = Field(15, gt=0, description="evaluations per search, every method")
    base_reps: int = Field(1, ge=1, description="runs per function of the base model (sampling streams); the tuned "
                                                "optimizer runs once per training seed")
    reps: int = Field(2, ge=1, description="runs per function of each baseline (random streams)")
    hill_steps: list[float] = Field([0.5, 1.0], min_length=1, description="hill-climbing steps tried on "
                                                                                     "the validation functions")
    prompt_token_budget: int = Field(640, gt=0, description="prompt tokens of each search (oldest history dropped "
                                                            "to fit), about the longest training prompts")
    cem: CEMParams = Field(
        default_factory=lambda: CEMParams(population=3, elite_frac=0.34, episodes_per_candidate=1, init_std=3.0,
                                          min_std=0.1),
        description="CEM (one evaluation per candidate)")
    confidence: float = Field(0.95, gt=0, lt=1, description="bootstrap interval level")
    reps_bootstrap: int = Field(2000, gt=0, description="bootstrap resamples")

    @model_validator(mode="after")
    def _cem_budget(self) -> PropsHeldoutParams:
        if self.iterations % (self.cem.population * self.cem.episodes_per_candidate):
            raise ValueError(f"cem: population x episodes_per_candidate must divide iterations ({self.iterations})")
        if any(h <= 0 for h in self.hill_steps):
            raise ValueError(f"hill_steps: every step must be > 0, got {self.hill_steps}")
        return self


class PropsParams(Section):
    """The whole ``props:`` section of a profile (params.yaml, conf/props/<profile>.yaml)."""

    tier: TierName = Field("default", description=TIER_HELP)
    space: PropsSpaceParams = Field(default_factory=PropsSpaceParams, description="the one parameter range")
    llm: PropsLLMParams = Field(default_factory=PropsLLMParams, description="the optimizer LLM")
    search: PropsSearchParams = Field(default_factory=PropsSearchParams, description="ProPS / ProPS+ searches")
    baselines: PropsBaselinesParams = Field(default_factory=PropsBaselinesParams, description="random search, CEM, "
                                                                                             "PPO")
    transfer: PropsTransferParams = Field(default_factory=PropsTransferParams, description="base vs GRPO-tuned "
                                                                                          "optimizer")
    eval: PropsEvalParams = Field(default_factory=PropsEvalParams, description="statistics of the tables")
    quadratic: PropsQuadraticParams = Field(default_factory=PropsQuadraticParams,
                                            description="the environment-free check of in-context optimisation")
    grpo: PropsGRPOParams = Field(default_factory=PropsGRPOParams, description="GRPO fine-tuning of the optimizer")
    heldout: PropsHeldoutParams = Field(default_factory=PropsHeldoutParams, description="the tuned optimizer on "
                                                                                        "test functions")

    @model_validator(mode="after")
    def _equal_budgets(self) -> PropsParams:
        budget = self.search.iterations * self.search.episodes_per_eval
        cem = self.baselines.cem
        per_gen = cem.population * cem.episodes_per_candidate
        if "cem" in self.baselines.methods and budget % per_gen:
            raise ValueError(f"baselines.cem: population x episodes_per_candidate ({per_gen}) must divide the "
                             f"search budget iterations x episodes_per_eval ({budget}): every method of a table "
                             "spends the same episodes")
        outside = [t for t in self.transfer.tasks if t not in self.search.tasks]
        if outside:
            raise ValueError(f"transfer.tasks: {outside} not in search.tasks {self.search.tasks} (the tuned optimizer "
                             "is compared with the base model's runs there)")
        if self.transfer.method not in self.search.methods:
            raise ValueError(f"transfer.method: {self.transfer.method!r} not in search.methods {self.search.methods}")
        # the tuned optimizer is asked as the search asks: the same opening, hint and stated length
        g = self.grpo
        if g.answer_prefix != self.llm.answer_prefix:
            raise ValueError(f"grpo.answer_prefix: {g.answer_prefix!r} differs from llm.answer_prefix "
                             f"{self.llm.answer_prefix!r} (the search opens the tuned optimizer's replies with it)")
        if g.optimum_hint != self.search.optimum_hint:
            raise ValueError("grpo.optimum_hint must equal search.optimum_hint (the tuned optimizer is asked in search)")
        if g.data == "functions" and g.total_iterations != self.heldout.iterations:
            raise ValueError(f"grpo.total_iterations ({g.total_iterations}) must equal heldout.iterations "
                             f"({self.heldout.iterations}): the iteration count its training prompts state")
        if g.data == "functions" and g.functions.history_max >= g.total_iterations:
            raise ValueError(f"grpo.functions.history_max ({g.functions.history_max}) must be below "
                             f"grpo.total_iterations ({g.total_iterations}): a prompt states its iteration")
        if self.llm.backend == "local" and self.llm.spec != g.model:
            raise ValueError(f"llm.spec ({self.llm.spec!r}) must be grpo.model ({g.model!r}): the tuned optimizer is "
                             "compared with the base model's searches")
        return self
