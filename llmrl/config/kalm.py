"""Params of the KALM stages (``kalm`` section of params.yaml).

``kalm.env`` (shared horizon and BabyAI room), ``kalm.data``, ``kalm.offline``, ``kalm.eval`` are defined first;
the grounding and imagination sections (``kalm.ground``, ``kalm.imagine``) are appended at the end of the file.
d3rlpy algorithms keep d3rlpy's own config classes: ``OfflineAlgo.config`` holds keyword arguments validated by
constructing ``d3rlpy.algos.<Algo>Config(**config)`` (no mirror of d3rlpy's fields here).

The defaults are the CPU default tier; the study's and KALM's own scale are conf/kalm/study.yaml and paper.yaml.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from llmrl.config import UNLISTED, ComputeDType, Section
from llmrl.config.lora import LoraSettings

__all__ = ["BenchmarkName", "LevelName", "D3rlpyAlgoName", "DataKind", "DATA_KINDS", "KalmEnvParams",
           "KalmDataParams", "OfflineAlgo", "KalmOfflineParams", "KalmEvalParams", "KalmGroundParams", "KalmImagineParams"]

BenchmarkName = Literal["metaworld", "babyai"]
LevelName = Literal["rephrase", "easy", "hard"]
D3rlpyAlgoName = Literal["BC", "CQL", "IQL", "TD3PlusBC", "AWAC", "DiscreteBC", "DiscreteCQL"]
DataKind = Literal["real", "imagine"]  # imagine = real + imagined rollouts (data/kalm/imagine/)
# Every offline algorithm runs on both: the pipeline's shape (stages kalm_offline_real and kalm_offline_imagine),
# not a parameter.
DATA_KINDS: tuple[DataKind, ...] = ("real", "imagine")
_DISCRETE = {"DiscreteBC", "DiscreteCQL"}



def _distinct_seeds(cls, v: list[int]) -> list[int]:
    """The ``seeds`` validator of every KALM section that has seeds."""
    if len(set(v)) != len(v):
        raise ValueError("seeds must be distinct")
    return v

class KalmEnvParams(Section):
    metaworld_max_steps: int = Field(100, gt=0, description="Meta-World step cap for data, imagination and "
                                     "evaluation alike (metaworld's own is 500; scripted experts finish the "
                                     "training tasks in 30-120 steps)")
    babyai_max_steps: int = Field(64, gt=0, description="BabyAI step cap (BabyAI's own: room_size² per navigation)")
    babyai_room_size: int = Field(8, ge=5, le=16, description="BabyAI room side in cells, walls included (at most "
                                  "kalm_babyai.MAX_ROOM_SIZE: the compact state's position classes)")
    babyai_num_distractors: int = Field(4, ge=0, le=16, description="BabyAI objects besides the goal object(s), "
                                        "every object of its own (type, colour): 18 slots of the compact state "
                                        "less at most two goal objects")
    babyai_egocentric_input: bool = Field(True, description="BabyAI's policies (offline RL, gate 0's BC) and "
                                          "grounded model read each object slot's offset from the agent in its own "
                                          "frame beside the compact state (llmrl.envs.kalm_egocentric; in a probe "
                                          "with one-hot tasks DiscreteBC agreed with the expert 0.69 with them, 0.54 "
                                          "without, the majority action 0.55); the state stored and predicted stays the compact one. False: the "
                                          "compact state alone")

    def egocentric_input(self, benchmark: str) -> bool:
        """Whether ``benchmark``'s policy and grounded-model inputs carry the egocentric features (BabyAI only)."""
        return benchmark == "babyai" and self.babyai_egocentric_input


class KalmDataParams(Section):
    benchmarks: list[BenchmarkName] = Field(default_factory=lambda: ["metaworld", "babyai"], min_length=1,
                                            description="benchmarks to record offline data for")
    metaworld_episodes_per_task: int = Field(8, gt=0, description="scripted episodes per Meta-World training task "
                                             "(10 tasks)")
    babyai_episodes_per_task: int = Field(24, gt=0, description="bot episodes per BabyAI training task (26 tasks; "
                                          "bot episodes are ~5-10 steps)")
    action_noise: float = Field(0.1, ge=0, description="std of Gaussian noise added to Meta-World scripted actions "
                                "(clipped to [-1, 1])")
    seed: int = Field(0, ge=0, description="first training episode seed; episode i of a task uses seed + i (must "
                      "lie in the train initial-state range, llmrl.envs.kalm_levels.START_SPLITS)")
    validation_episodes_per_task: int = Field(2, ge=1, description="expert episodes per training task with the "
                                              "validation phrasings, from validation initial states: the grounding's "
                                              "held-out losses (never trained on)")
    validation_seed: int = Field(10_000, ge=0, description="first validation episode seed (validation range)")
    agreement_test_episodes: int = Field(1, ge=0, description="expert episodes per test-level task run only to "
                                         "measure the observation rule against the env's success (never stored)")
    embed_model: str = Field("models/base_llm", description="model spec of the frozen instruction embedding "
                             "(mean-pooled last hidden state)")
    embed_batch_size: int = Field(32, gt=0, description="instructions per forward pass of the embedding model")
    threads: int = Field(1, gt=0, description="torch threads of the embedding pass (2 threads on a shared 2-core "
                                              "box is slower)")


class OfflineAlgo(Section):
    benchmark: BenchmarkName = Field(description="benchmark the algorithm trains on")
    algo: D3rlpyAlgoName = Field(description="d3rlpy algorithm (d3rlpy.algos.<algo>Config)")
    steps: int = Field(gt=0, description="gradient updates per run")
    config: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of "
                                   "d3rlpy.algos.<algo>Config (batch_size, learning rates, alpha, ...)")
    instruction_components: int = Field(8, ge=0, description="principal components of the instruction embedding "
                                        "in the policy's input (llmrl.data.embeddings.InstructionProjection, fitted "
                                        "on the training data's instructions); 0: the raw embedding")
    standardise: bool = Field(True, description="standardise the input (observation and instruction columns) with "
                              "d3rlpy's StandardObservationScaler, fitted on the training data")

    @model_validator(mode="after")
    def _check(self) -> OfflineAlgo:
        discrete = self.algo in _DISCRETE
        if discrete != (self.benchmark == "babyai"):
            raise ValueError(f"algo {self.algo} does not fit benchmark {self.benchmark} "
                             f"({'discrete' if self.benchmark == 'babyai' else 'continuous'} actions)")
        self.d3rlpy_config()
        return self

    def d3rlpy_config(self):
        """d3rlpy's own config object; invalid kwargs raise here, at params validation."""
        import d3rlpy

        cls = getattr(d3rlpy.algos, f"{self.algo}Config")
        if self.standardise and "observation_scaler" in self.config:
            raise ValueError("config: observation_scaler is set by standardise (true: d3rlpy's "
                             "StandardObservationScaler); set standardise: false to give another")
        scaler = {"observation_scaler": d3rlpy.preprocessing.StandardObservationScaler()} if self.standardise else {}
        try:
            return cls(**scaler, **self.config)
        except TypeError as err:
            raise ValueError(f"config: not valid for d3rlpy.algos.{self.algo}Config ({err})") from None


def _cpu_algos() -> dict[str, OfflineAlgo]:
    """The CPU default's offline runs. KALM runs 500k updates per run (conf/kalm/paper.yaml); here 1-2k, sized from
    the measured one-thread rates (BC ~480, DiscreteCQL ~124, TD3+BC ~105 updates/s) to fit KALM's ~8 min budget.
    Continuous CQL (~11 updates/s: 1k updates = 90 s per run) and IQL (~80/s) run in the study and paper profiles
    only; 10-20k updates per run would take 24 runs x 80-190 s here."""
    return {
        "babyai-dbc": OfflineAlgo(benchmark="babyai", algo="DiscreteBC", steps=2000,
                                  config={"batch_size": 64, "learning_rate": 0.001}),
        "babyai-dcql": OfflineAlgo(benchmark="babyai", algo="DiscreteCQL", steps=1000,  # alpha 10 as KALM
                                   config={"batch_size": 64, "learning_rate": 0.0003, "alpha": 10.0}),
        "metaworld-bc": OfflineAlgo(benchmark="metaworld", algo="BC", steps=2000,
                                    config={"batch_size": 64, "learning_rate": 0.001}),
        "metaworld-td3bc": OfflineAlgo(benchmark="metaworld", algo="TD3PlusBC", steps=1000,
                                       config={"batch_size": 64, "alpha": 2.5}),
    }


class KalmOfflineParams(Section):
    algos: dict[str, OfflineAlgo] = Field(default_factory=_cpu_algos, min_length=1,
                                          description="runs by name (the key of dvc.yaml's foreach over them: "
                                          "kalm_offline_real@<name>, kalm_offline_imagine@<name>)")
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1, description="training seeds (CPU "
                                                                                        "budget; the study runs 3)")
    mix_ratio: float = Field(0.5, gt=0, lt=1, description="share of imagined transitions in the real + imagined dataset "
                             "at most (imagined episodes drawn in a seeded order, each at most once: with too few "
                             "rollouts the share falls short, recorded by kalm_offline)")
    imagined_levels: list[LevelName] = Field(default_factory=lambda: ["rephrase", "easy", "hard"], min_length=1,
                                             description="levels whose imagined rollouts feed the mixed dataset")
    threads: int = Field(1, gt=0, description="torch threads per run")
    workers: int = Field(1, ge=1, description="seeds trained side by side, each alone in a single-threaded process "
                                              "(results do not depend on it; 1: `make repro` runs two items side "
                                              "by side, dvc.yaml's meta.cpus)")
    log_every: int = Field(100, gt=0, description="updates between metric rows")

    _distinct = field_validator("seeds")(_distinct_seeds)


class KalmEvalParams(Section):
    babyai_episodes: int = Field(1, gt=0, description="BabyAI episodes per level and training seed, at least: every "
                                 "goal gets ceil(this / goals) episodes (rephrase 52, easy 20, hard 24 goals)")
    metaworld_episodes: int = Field(1, gt=0, description="Meta-World episodes per level and training seed, at "
                                    "least: every goal gets ceil(this / goals) episodes (rephrase 20, easy 16, "
                                    "hard 8 goals; each costs up to metaworld_max_steps MuJoCo steps)")
    seed: int = Field(20_000, ge=0, description="first evaluation episode seed (must lie in the test initial-state "
                      "range, llmrl.envs.kalm_levels.START_SPLITS)")
    levels: list[LevelName] = Field(default_factory=lambda: ["rephrase", "easy", "hard"], min_length=1,
                                    description="test levels evaluated")
    random_seeds: int = Field(3, gt=0, description="seeds of the random-policy row")
    grounded_episodes: int = Field(0, ge=0, description="episodes per level for the LLM-as-policy row, at least "
                                   "(every goal equally; never more than the other rows'; 0: skip the row, the CPU "
                                   "default: one LLM forward per step costs ~100 s; the study plays 50)")
    confidence: float = Field(0.95, gt=0, lt=1, description="interval level over seeds")
    threads: int = Field(1, gt=0, description="torch threads for policy inference (stage kalm_eval@<benchmark>: "
                                              "one benchmark per stage)")


# ---- KALM-B: grounding (kalm.ground) and imaginary rollouts (kalm.imagine) ------------------------------------------


class KalmGroundParams(Section):
    """Grounding fine-tune of the base LLM on KALM's four patterns (``llmrl.algos.kalm_grounding``). CPU default:
    SmolLM2 + LoRA, 400 short samples per benchmark; KALM trains a Llama-class model on full
    trajectories (conf/kalm/paper.yaml)."""

    model: str = Field("models/base_llm", description="base causal LM spec (llmrl.llm.load.load_model)")
    benchmarks: list[BenchmarkName] = Field(default_factory=lambda: ["metaworld", "babyai"], min_length=1,
                                            description="one grounded model per benchmark (observation sizes differ)")
    lora: LoraSettings | None = Field(
        default_factory=lambda: LoraSettings(r=8, alpha=16, dropout=0.05, target_modules="all-linear"),
        description="LoRA adapter (None: full fine-tune)")
    trajectory_samples: int = Field(160, ge=0, description="instruction -> trajectory samples per benchmark (drawn "
                                    "windows; ignored when all_transitions)")
    all_transitions: bool = Field(False, json_schema_extra=UNLISTED, description="the trajectory pattern tiles every real episode into "
                                  "consecutive windows of `window` steps, so every real transition is trained on "
                                  "once per epoch (the original trains on every trajectory); False: "
                                  "trajectory_samples windows drawn at random")
    dynamics_samples: int = Field(160, ge=0, description="(s, a) -> s' samples per benchmark")
    goal_samples: int = Field(40, ge=0, description="(s0, instruction) -> final state samples per benchmark")
    reverse_samples: int = Field(40, ge=0, description="trajectory -> instruction samples per benchmark")
    window: int = Field(40, gt=0, description="steps per trajectory sample (a window of the episode, starting at "
                        "its first step with probability start_prob, else at a random step); imagination runs at "
                        "most this many steps (kalm.imagine horizons), the length the model was trained on")
    start_prob: float = Field(0.5, ge=0, le=1, description="share of trajectory windows that start at s0")
    reverse_states: int = Field(6, gt=1, description="states kept (evenly spaced, first and last included) in a "
                                "trajectory -> instruction sample")
    obs_std_floor: float = Field(0.05, gt=0, description="continuous observation dims are divided by "
                                 "sqrt(std^2 + floor^2) of the training states: a dim constant in training stays "
                                 "bounded when it varies later (llmrl.llm.grounded.observation_scale)")
    epochs: float = Field(1.0, gt=0, description="passes over the patterns' samples (updates = epochs x samples / "
                          "batch_size, rounded up)")
    eval_every: int = Field(0, ge=0, json_schema_extra=UNLISTED, description="measure the held-out action and observation losses (validation "
                            "episodes relabelled with training phrasings) every this many updates and after the "
                            "last, and keep the weights where obs_weight x L_obs + act_weight x L_act was lowest "
                            "(the token loss on unseen phrasings is reported, never the selector); 0: keep the "
                            "last weights")
    batch_size: int = Field(8, gt=0, description="sequences per update")
    lr: float = Field(2e-3, gt=0, description="peak AdamW learning rate (LoRA, projections and heads)")
    warmup: int = Field(10, ge=0, description="linear warm-up updates, then linear decay to 0")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    obs_weight: float = Field(0.5, ge=0, description="weight of L_obs (KALM: 0.5)")
    act_weight: float = Field(0.5, ge=0, description="weight of L_act (KALM: 0.5)")
    token_weight: float = Field(1.0, ge=0, description="weight of L_token (KALM: 1.0)")
    dtype: ComputeDType = Field("auto", description="compute dtype of forward/backward (weights stay fp32; bf16 "
                                "runs under torch.autocast): auto = bf16 where the device computes it natively "
                                "(CUDA with bf16; a CPU with AVX-512-BF16/AMX when LLMRL_PIN_KERNELS=0), else fp32; "
                                "recorded in the metrics")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="grounding seeds (sampling, "
                             "initialisation, batch order), one kalm_ground item each; imagination and the "
                             "grounded-LLM row of kalm_eval read the first seed's model, gate 0 pools every seed")
    gate_episodes: int = Field(1, ge=0, description="gate 0: closed-loop episodes per grounding seed and row "
                               "(grounded model, random actions, BC), at least, on the training goals (one "
                               "phrasing per task, every task equally) from validation starts in the real "
                               "simulator (1: every training task once per row, BabyAI 50, Meta-World 10 "
                               "episodes); 0: no gate")
    gate_seed: int = Field(10_000, ge=0, description="first gate-0 episode seed (must lie in the validation "
                           "initial-state range, llmrl.envs.kalm_levels.START_SPLITS)")
    gate_bc_steps: int = Field(2000, gt=0, description="updates of gate 0's BC reference (d3rlpy BC / DiscreteBC, "
                               "batch 64, lr 1e-3) on the grounding's real data, one run per grounding seed")
    gate_swap_benchmarks: list[BenchmarkName] = Field(
        default_factory=lambda: ["babyai"], description="benchmarks whose gate 0 also runs the grounded model (and "
        "the sampled BC) under another task's instruction from the same starts: the control that says whether a "
        "pass comes from reading the goal (paired difference over starts and seeds). Meta-World is left out by "
        "default: its study item (grounding ~1,135 s + gate ~400 s) would pass the 30-minute stage limit")
    threads: int = Field(1, gt=0, description="torch threads (2 OpenMP threads on the shared 2-core box ran 40x "
                                              "slower under load)")
    log_every: int = Field(10, gt=0, description="updates between logged rows (every row goes to dvclive)")

    _distinct = field_validator("seeds")(_distinct_seeds)


class KalmImagineParams(Section):
    """Imaginary rollouts of the grounded model for each level's goals (``llmrl.algos.kalm_imagine``)."""

    levels: list[Literal["train", "rephrase", "easy", "hard"]] = Field(
        default_factory=lambda: ["train", "rephrase", "easy", "hard"], min_length=1,
        description="levels imagined (the kalm_imagine matrix); train = one phrasing per training task, a control "
                    "that says whether the model imagines at all (never fed to offline RL)")
    rollouts: int = Field(1, gt=0, description="imagined rollouts per level, at least: every goal gets ceil(this / "
                          "goals) (BabyAI rephrase 52, easy 20, hard 24 goals, Meta-World 20, 16, 8)")
    metaworld_horizon: int = Field(40, gt=0, description="imagined steps at most per Meta-World rollout")
    babyai_horizon: int = Field(16, gt=0, description="imagined steps at most per BabyAI rollout (BabyAI bot "
                                                      "episodes take ~7 steps, kalm_data)")
    greedy: bool = Field(True, description="greedy actions (argmax / raw); False samples (softmax at temperature, "
                         "Gaussian noise of std temperature)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature / action noise std (greedy=False)")
    batch_size: int = Field(50, gt=0, description="rollouts generated together (one KV cache per batch)")
    seed: int = Field(30_000, ge=0, description="seed of rollout i's real initial state = seed + i (must lie in "
                      "the imagine initial-state range, llmrl.envs.kalm_levels.START_SPLITS)")
    labels: Literal["consistent", "rule"] = Field("consistent", description="which imagined rollouts feed offline "
                                                  "RL: consistent = only those whose own task the grounded model "
                                                  "names first when asked for the instruction of the imagined "
                                                  "trajectory (its trajectory -> instruction pattern, among the "
                                                  "level's instructions and one per training task); rule = all. "
                                                  "Rewards come from the observation rule on imagined states")
    consistency_candidates: int = Field(8, ge=0, description="instructions a rollout's own competes with in the "
                                        "consistency check, drawn (seeded) from the other tasks' candidates; 0 = "
                                        "all of them (one per task: the level's and every training task)")
    threads: int = Field(1, gt=0, description="torch threads")
    examples: int = Field(5, ge=0, description="rollouts per level dumped as text (prompt, actions, states)")
