"""Params of the LLM4Teach stages (``llm4teach`` section of params.yaml): teacher, training, MPE, evaluation. The
defaults are the CPU default tier; the original's scale is conf/llm4teach/paper.yaml."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from llmrl.config import DTYPE_HELP, TIER_HELP, ComputeDType, Section, TierName
from llmrl.config.llm_faults import LLMFaultParams
from llmrl.config.ppo import DistillParams, PPOParams

__all__ = ["EnvKey", "TeacherKind", "SCORE_CONTROLS", "LLM4TeachTeacherParams", "LLM4TeachStudentParams",
           "LLM4TeachTrainParams", "LLM4TeachMPEParams", "LLM4TeachValidationParams", "LLM4TeachEvalParams", "LLM4TeachParams"]

EnvKey = Literal["simpledoorkey", "lavadoorkey", "coloreddoorkey", "twodoor"]
TeacherKind = Literal["llm", "llm_score", "uniform", "random_score", "oracle", "none"]
# The scoring teacher's controls: its candidate plans with equal or random scores, so a student's gain from the
# candidate set is told apart from the gain the LLM's scores add (llmrl.eval.llm4teach.scores_help).
SCORE_CONTROLS = ("uniform", "random_score")
TEACHERS = list(get_args(TeacherKind))  # every kind, in the order the default tier trains them
TEACHERS_HELP = ("llm (sampled replies), llm_score (the LLM's log-probs of every admissible plan, softmax), uniform "
                 "and random_score (llm_score's controls: the same plans with equal or random scores; required "
                 "beside llm_score), oracle, none (pure PPO)")


def _controls_beside_scoring(teachers: list[str], where: str) -> None:
    missing = [c for c in SCORE_CONTROLS if c not in teachers]
    if "llm_score" in teachers and missing:
        raise ValueError(f"{where}: llm_score needs its controls {missing} in the same list (without them no claim "
                         "about the LLM's scores can be made)")


class LLM4TeachTeacherParams(Section):
    backend: Literal["local", "openai"] = Field("local", description="local: load_model(spec) in-process; "
                                                "openai: an OpenAI-compatible endpoint (openai_api)")
    spec: str = Field("models/base_llm", description="model spec for the local backend (folder, embedded:..., hub "
                      "name, tiny); with backend openai and openai_api completions, the served model's tokenizer")
    dtype: ComputeDType = Field("auto", description="local backend: " + DTYPE_HELP)
    openai_model: str = Field("", description="model name for the openai backend")
    openai_base_url: str = Field("", description="base URL for the openai backend")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key")
    openai_api: Literal["completions", "chat"] = Field(
        "completions", description="openai: 'completions' sends the prompt rendered here with spec's chat "
        "template (the text the local backend feeds the model, answer prefix continued; vLLM, llama.cpp, "
        "llmrl.llm.serve); 'chat' lets the server render it (hosted chat APIs; not every server continues an "
        "answer prefix)")
    faults: LLMFaultParams = Field(LLMFaultParams(), description="llm4teach_plans' fault policy (request timeout, "
                                   "retries, deadline of the planning pass, share of failed replies past which the "
                                   "stage fails writing nothing): an outage is never cached as the teacher")
    n_ask: int = Field(10, ge=1, description="replies sampled per observation text (original: 10)")
    max_new_tokens: int = Field(24, gt=0, description="reply length budget in tokens")
    temperature: float = Field(0.9, ge=0, description="sampling temperature (0 = greedy; 0.9: the fork's "
                                                      "llama.cpp setting)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    seed: int = Field(0, ge=0, description="sampling seed of the planner (part of every reply-cache key)")
    answer_prefix: str = Field("Action: {", description="start of the assistant turn (a 135M model cannot follow "
                               "the three-part answer); '' lets the model write the full three-part answer "
                               "(original prompt protocol, the paper profile)")
    stop: list[str] = Field(default_factory=lambda: ["\n"], description="stop strings of a reply")
    fallback_plan: str = Field("explore", min_length=1, description="plan used when no reply for a text is valid")
    random_score_seed: int = Field(0, ge=0, description="seed of the random_score control teacher's scores (drawn "
                                   "once per observation text)")
    batch_size: int = Field(10, gt=0, description="replies decoded together from one shared prompt prefill (local)")
    threads: int = Field(1, gt=0, description="torch CPU threads (1: LLM decoding gains little from a second "
                                              "thread, and `make repro` runs two one-thread stages side by side)")


class LLM4TeachStudentParams(Section):
    channels: list[int] = Field(default_factory=lambda: [16, 32, 64], min_length=1,
                                description="3x3 convolution channels (original: 16, 32, 64)")
    hidden: int = Field(64, gt=0, description="width of the actor and critic heads")
    embed_dim: int = Field(8, gt=0, description="embedding width of each cell's (object, colour, state, direction)")


class LLM4TeachTrainParams(Section):
    envs: list[EnvKey] = Field(["simpledoorkey"], min_length=1, description="DoorKey-family environments to train "
                                                                            "on")
    teachers: list[TeacherKind] = Field(default_factory=lambda: list(TEACHERS), min_length=1,
                                        description=TEACHERS_HELP)
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="training seeds (env and torch)")
    # Budget, lr and λ schedule picked on validation levels only (llm4teach.validation; scripts/llm4teach_select.py
    # doorkey, record in metrics/llm4teach/selection.json): {30720, 40960 frames} x {lr 1e-3, 2e-3}, oracle teacher,
    # tuning seeds 100/101; none reached 0.9 on every seed, best mean 0.69 = 30720 frames at lr 1e-3. 30720 frames
    # = 60 iterations: λ at its floor from iteration 30, the teacher term off from 45.
    ppo: PPOParams = Field(
        default_factory=lambda: PPOParams(total_frames=30_720, num_envs=8, num_steps=64, epochs=3, minibatch_size=128,
                                          lr=1e-3, gamma=0.99, gae_lambda=0.95, advantage="gae", clip_eps=0.2,
                                          value_coef=0.5, entropy_coef=0.001, max_grad_norm=0.5),
        description="the students' PPO (and pure PPO's but for pure_ppo_lr)")
    pure_ppo_lr: float | None = Field(2e-3, gt=0, description="pure PPO's (teacher none) learning rate, picked "
                                      "for it alone on the validation levels at the students' frame budget "
                                      "(scripts/llm4teach_select.py ppo; selection.json 'ppo': lr {5e-4, 1e-3, 2e-3, "
                                      "4e-3} x tuning seeds 100/101; greedy success 0 for every candidate, the "
                                      "tie-break, sampled success, gave 2e-3 0.03, 1e-3 0.01: within noise, so PPO's "
                                      "failure at this budget is not down to the students' learning rate); null: "
                                      "ppo.lr, the students' pick")
    # the original's form λ_k = max(0.1, 10 − δ·k), off from k = K; constants so λ anneals within the budget
    distill: DistillParams = Field(
        default_factory=lambda: DistillParams(initial=10.0, decrement=0.33, minimum=0.1, until_iteration=45),
        description="the teacher's weight in the student's loss")
    student: LLM4TeachStudentParams = Field(default_factory=LLM4TeachStudentParams, description="the student network")
    curve_points: int = Field(3, gt=0, description="greedy evaluations along training (learning curve, AULC)")
    curve_episodes: int = Field(20, gt=0, description="episodes per learning-curve evaluation")
    curve_seed: int = Field(500000, ge=0, description="first learning-curve level seed (apart from eval seeds)")

    @model_validator(mode="after")
    def _controls(self) -> LLM4TeachTrainParams:
        _controls_beside_scoring(self.teachers, "llm4teach.train.teachers")
        return self

    def for_teacher(self, teacher: str) -> LLM4TeachTrainParams:
        """The settings a run with ``teacher`` trains with: pure PPO takes its own learning rate."""
        if teacher == "none" and self.pure_ppo_lr is not None:
            return self.model_copy(update={"ppo": self.ppo.model_copy(update={"lr": self.pure_ppo_lr})})
        return self


class LLM4TeachMPEParams(Section):
    teachers: list[TeacherKind] = Field(default_factory=lambda: list(TEACHERS), min_length=1,
                                        description="as for the DoorKey family; none: pure MAPPO")
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="training seeds")
    n_agents: int = Field(3, ge=2, le=3, description="agents = landmarks (the teacher's text assumes 3)")
    max_cycles: int = Field(25, gt=0, description="episode length")
    local_ratio: float = Field(0.5, ge=0, le=1, description="weight of the local (collision) reward")
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1, description="actor/critic MLP widths")
    # MAPPO picked on validation episodes only (scripts/llm4teach_select.py mpe; record in
    # metrics/llm4teach/selection.json): 5 candidates x tuning seeds 100-104, critic with the episode clock; every
    # candidate beat random (-25.4) on validation; best mean -21.3 (every seed -21.1..-21.6) = value clip, rewards
    # x0.1. 60000 frames = 100 iterations (CPU budget: the 45-min pipeline; the selection ran at this budget).
    ppo: PPOParams = Field(
        default_factory=lambda: PPOParams(total_frames=60_000, num_envs=8, num_steps=25, epochs=4, minibatch_size=200,
                                          lr=1e-3, gamma=0.99, gae_lambda=0.95, advantage="gae", clip_eps=0.2,
                                          clip_value=True, value_coef=0.5, entropy_coef=0.01, max_grad_norm=0.5,
                                          reward_scale=0.1),
        description="MAPPO's PPO")
    # 100 iterations; DoorKey's pick's schedule fractions (floor at 3/8 of the run, off from 9/16), not tuned
    distill: DistillParams = Field(
        default_factory=lambda: DistillParams(initial=10.0, decrement=0.264, minimum=0.1, until_iteration=56),
        description="the teacher's weight in the students' loss")

    @model_validator(mode="after")
    def _controls(self) -> LLM4TeachMPEParams:
        _controls_beside_scoring(self.teachers, "llm4teach.mpe.teachers")
        return self


class LLM4TeachValidationParams(Section):
    seed: int = Field(300000, ge=0, description="first validation level seed (DoorKey levels; MPE: the episode "
                      "stream's seed); disjoint from the test levels (eval.seed..), the learning-curve levels "
                      "(train.curve_seed..) and the training seeds. Every selection of settings scores on these "
                      "only (scripts/llm4teach_select.py), never on the test levels")
    episodes: int = Field(50, gt=0, description="validation episodes per candidate and tuning seed")
    selection: str = Field("metrics/llm4teach/selection.json", description="the record of the last selection "
                           "(candidates, validation scores per tuning seed, the pick); a plain file, not a metric")


class LLM4TeachEvalParams(Section):
    episodes: int = Field(100, ge=100, description="evaluation episodes per policy, seed and mode (>= 100)")
    seed: int = Field(200000, ge=0, description="first evaluation (test) level seed; disjoint from training, "
                      "learning-curve and validation seeds; never used to select settings")
    success_target: float = Field(0.9, gt=0, le=1, description="student-with-teacher success the result asks for")
    ppo_ceiling: float = Field(0.5, gt=0, le=1, description="pure PPO must stay below this at the same budget")


class LLM4TeachParams(Section):
    tier: TierName = Field("default", description=TIER_HELP)
    workers: int = Field(1, ge=1, description="seeds trained side by side, each alone in a single-threaded "
                                              "process (results do not depend on it; 1: `make repro` runs two "
                                              "items side by side, dvc.yaml's meta.cpus)")
    teacher: LLM4TeachTeacherParams = Field(LLM4TeachTeacherParams(), description="the LLM teacher (stage "
                                            "llm4teach_plans)")
    train: LLM4TeachTrainParams = Field(default_factory=LLM4TeachTrainParams, description="the DoorKey-family "
                                        "students (stage llm4teach_train)")
    mpe: LLM4TeachMPEParams = Field(default_factory=LLM4TeachMPEParams, description="the MPE simple_spread students "
                                    "(stage llm4teach_train_mpe)")
    validation: LLM4TeachValidationParams = Field(LLM4TeachValidationParams(), description="the validation "
                                                  "levels every selection of settings scores on")
    eval: LLM4TeachEvalParams = Field(LLM4TeachEvalParams(), description="the test evaluation (stage "
                                      "llm4teach_eval)")

    @model_validator(mode="after")
    def _levels_disjoint(self) -> LLM4TeachParams:
        """Validation, test and learning-curve level ranges must not overlap (test data never feeds selection)."""
        ranges = {"validation": (self.validation.seed, self.validation.episodes),
                  "eval": (self.eval.seed, self.eval.episodes),
                  "train.curve": (self.train.curve_seed, self.train.curve_episodes)}
        items = sorted(ranges.items(), key=lambda kv: kv[1][0])
        for (a, (sa, na)), (b, (sb, _)) in zip(items, items[1:]):
            if sa + na > sb:
                raise ValueError(f"llm4teach.{a} levels {sa}..{sa + na - 1} overlap llm4teach.{b} levels from {sb}")
        return self
