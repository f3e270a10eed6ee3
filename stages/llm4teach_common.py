"""What the LLM4Teach stages share: output paths and the planner built from the ``llm4teach.teacher`` params.

The planner's replies live in the reply cache ``data/llm4teach/replies`` (an out of ``llm4teach_plans``); training
and evaluation open it offline, so they never load a model, and a missing reply fails the stage with a
``CacheMissError`` naming the text (a broken pipeline, not an LLM fault).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from llmrl.agents.student import save_student
from llmrl.agents.teacher import (
    ENV_KIND,
    LLMPlanner,
    OraclePlanner,
    PlanDistribution,
    Planner,
    RandomScorePlanner,
    ScoringPlanner,
    TablePlanner,
    TaskKind,
    TeacherPolicy,
    UniformPlanner,
)
from llmrl.config.llm4teach import LLM4TeachTeacherParams
from llmrl.envs.doorkey import ENV_IDS
from llmrl.envs.mpe import ENV_ID as MPE_ID
from llmrl.files import read_json, write_json
from llmrl.parallel import run_seeds_into
from llmrl.llm.backends import CachedBackend, LazyBackend, ReplyCache, SharedPromptBackend
from llmrl.llm.faults import FaultGuard, GuardedBackend
from llmrl.llm.generate import SamplingConfig
from stages import paths
from stages.common import model_spec

MPE_KEY = "simple_spread"
# Torch's intra-op threads of the training and evaluation stages: these small networks and the 135M planner gain
# nothing from a second thread, and on a busy 2-core machine the threads' spin-waiting made the planner ~3x slower
# (measured).
THREADS = 1


def env_id(key: str) -> str:
    return MPE_ID if key == MPE_KEY else ENV_IDS[key]


def task_kind(key: str) -> TaskKind:
    return ENV_KIND[env_id(key)]


def _backend_factory(p: LLM4TeachTeacherParams, guard: FaultGuard):
    if p.backend == "openai":
        from llmrl.llm.backends import openai_backend
        from llmrl.llm.load import load_tokenizer

        def remote():
            tokenizer = load_tokenizer(model_spec(p.spec)) if p.openai_api == "completions" else None
            return openai_backend(p.openai_api, p.openai_model, p.openai_base_url, tokenizer=tokenizer,
                                  api_key_env=p.api_key_env, guard=guard)

        # The endpoint's URL is not part of the identity (nor of the reply-cache keys): the same model behind
        # another spelling of the URL replays the same cache.
        return f"openai-{p.openai_api}:{p.openai_model}", remote

    def local():
        from llmrl.llm.load import load_model

        return SharedPromptBackend(load_model(model_spec(p.spec), dtype=p.dtype), batch_size=p.batch_size)

    from llmrl.llm.load import default_device_dtype, reply_tag

    # The local backend's model_id, known before the model is loaded (a cache hit never loads it).
    return f"local-shared-prompt:{p.spec}{reply_tag(default_device_dtype(None, p.dtype)[1])}", local


def scores_file(key: str) -> Path:
    """The scoring teacher's plan distributions for a task, written by llm4teach_plans."""
    return paths.llm4teach_plans().plans / f"{key}-score.json"


def make_planner(key: str, teacher: str, p: LLM4TeachTeacherParams, *, offline: bool,
                 guard: FaultGuard | None = None) -> Planner:
    """The planner of a teacher kind. ``llm_score`` scores plans with the local model when planning (``offline``
    False) and replays the stored distributions otherwise; ``llm`` replays or fills the reply cache, its requests
    under ``guard`` (the planning stage's fault policy; by default one of ``p.faults``); ``oracle`` and the scoring
    teacher's controls ``uniform`` and ``random_score`` need no model."""
    kind = task_kind(key)
    if teacher == "oracle":
        return OraclePlanner(kind)
    if teacher == "uniform":
        return UniformPlanner(kind)
    if teacher == "random_score":
        return RandomScorePlanner(kind, p.random_score_seed)
    if teacher == "llm_score":
        if not offline:
            if p.backend != "local":
                raise SystemExit("llm4teach.teacher.backend: the scoring teacher (llm_score) needs the local model's "
                                 f"log-probs; backend {p.backend!r} only samples")
            from llmrl.llm.load import load_model

            return ScoringPlanner(kind, load_model(model_spec(p.spec), dtype=p.dtype), answer_prefix=p.answer_prefix)
        stored = read_json(scores_file(key))["records"]
        return TablePlanner(kind, {r["text"]: PlanDistribution.from_dict(r["distribution"]) for r in stored},
                            "llm_score")
    guard = guard or FaultGuard(p.faults, "llm4teach.teacher.faults")
    model_id, factory = _backend_factory(p, guard)
    backend = CachedBackend(GuardedBackend(LazyBackend(model_id, factory), guard),
                            ReplyCache(paths.llm4teach_plans().replies), offline=offline)
    sampling = SamplingConfig(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                              stop=tuple(p.stop), seed=p.seed)
    return LLMPlanner(kind, backend, n_ask=p.n_ask, sampling=sampling, answer_prefix=p.answer_prefix,
                      fallback_plan=p.fallback_plan)


def make_teacher(key: str, teacher: str, p: LLM4TeachTeacherParams, n_actions: int) -> TeacherPolicy:
    """The teacher of a run, replaying cached LLM replies offline."""
    return TeacherPolicy(task_kind(key), make_planner(key, teacher, p, offline=True), n_actions)


def log_iteration(live) -> Callable[[dict], None]:
    """The ``on_iteration`` callback of both student trainers: a stats row as dvclive metrics at its frame count."""
    def on_iteration(stats: dict) -> None:
        live.step = stats["frames"]
        for k, v in stats.items():
            if k not in ("iteration", "frames"):
                live.log_metric(k, v)
        live.next_step()

    return on_iteration


def teacher_record(teacher: TeacherPolicy | None) -> dict:
    """What a run's metrics keep of its teacher: the texts it was asked about and the LLM planner's reply statistics."""
    if teacher is None:
        return {}
    out = {"teacher_texts": dict(teacher.text_counts.most_common())}
    if hasattr(teacher.planner, "stats"):
        out["llm"] = teacher.planner.stats()
    return out


def item_outputs(key: str, teacher: str) -> paths.Outputs:
    """One stage item's folders: every seed of one task and teacher (``simpledoorkey-llm``, ``mpe-none``)."""
    return paths.llm4teach_train_mpe(teacher) if key == MPE_KEY else paths.llm4teach_train(key, teacher)


def student_file(models: Path, seed: int) -> Path:
    """A seed's student in a group's model folder (``models/llm4teach/<group>``)."""
    return models / f"seed-{seed}" / "student.pt"


def train_record_file(records: Path, seed: int) -> Path:
    """A seed's training record in a group's record folder (``metrics/llm4teach/train/<group>``)."""
    return records / f"seed-{seed}.json"


def save_run(seed: int, agent: nn.Module, metrics: dict, *, models: Path, records: Path, **extra) -> None:
    """The seed's student.pt (with the run's metrics minus wall-clock fields, so the same training gives the same
    bytes on any machine) and its training record, in the group's folders."""
    timeless = {k: v for k, v in metrics.items() if k not in ("seconds", "cpu_seconds", "fps")}
    save_student(student_file(models, seed), agent, {"run": timeless, **extra})
    write_json(train_record_file(records, seed), metrics)


def train_group(outputs: paths.Outputs, seeds: Sequence[int], workers: int, run_seed: Callable[..., None]) -> None:
    """Train every seed of one stage item, ``workers`` processes side by side, and publish the group's models,
    records and curves together: a killed or failed item leaves the previous group whole.

    ``run_seed(seed, models=, records=, plots=)`` trains one seed into the group's temporary folders. Each seed
    runs alone in a single-threaded process, as when every seed was its own stage, so the bytes do not depend
    on ``workers``.
    """
    run_seeds_into(dict(outputs), run_seed, seeds, workers)
