"""Every stage, end to end: each stage's ``main`` runs in a scratch copy of this
workspace on the tiny model with minimal budgets (``tests/stage_runs.py``), the stage items DVC resolves from its
params, and writes exactly the outputs stages/paths.py names for it (which dvc.yaml declares:
tests/test_stage_paths.py).

Two runs: every method at its default profile, and every method at its paper profile through the same switch
(``pipelines.tiers.compose(["<method>=paper", ...])``) with the same minimal budgets on top, so the paths only a paper
run takes execute on this CPU: full fine-tunes (LLM_RL, GLAM's ``full`` variant, KALM's grounding), continuous CQL,
IQL and AWAC, more environments (LLM4Teach's DoorKey family, ProPS's MuJoCo tasks, GLAM's mixed levels), local
GSM8K files through the real-data path, and the tiny model's folder standing in for every hub model.

The methods run in two processes side by side (two cores), each method's stages one after the other in one process.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipelines.workspace import stage_outputs

from .stage_runs import (METHODS, SHARED, check_outputs, compose_params, result_files, run_stages,
                         scratch_workspace, stage_commands)

# every stage of every method twice, in two processes: ~9 min on 2 cores, `make test-integration` (CI runs it)
pytestmark = pytest.mark.integration

# What a paper profile needs on this CPU: one thread, no CUDA device asked for, fp32 where it asks for bf16, and
# local files in GSM8K's format for the hub's GSM8K (the tiny model's folder stands in for every hub model: TINY).
# Of its longer lists, the entries whose code the default profile does not run: a full fine-tune beside LoRA and
# NPAE (GLAM), the mixed test level, continuous CQL, IQL and AWAC (on real and on real + imagined data), the colour-renamed and two-door
# DoorKey tasks, a MuJoCo task in search.
PAPER_ON_CPU = {
    "glam": {"threads": 1, "policy": {"history": 1},  # the paper's 3 past steps: 10x the tiny model's scoring time
             "eval": {"env_ids": ["BabyAI-Text-MixedTestLocal-v0"]}},
    "llm_rl": {"data": {"train_path": "gsm8k/train.jsonl", "test_path": "gsm8k/test.jsonl"},
               "train": {"common": {"device": None, "dtype": "auto", "threads": 1}}},
    "llm4teach": {"teacher": {"threads": 1}, "train": {"envs": ["coloreddoorkey", "twodoor"]}},
    "kalm": {"data": {"threads": 1}, "offline": {"threads": 1, "workers": 1},
             "eval": {"threads": 1}, "ground": {"threads": 1}, "imagine": {"threads": 1}},
    "props": {"llm": {"threads": 1}, "search": {"tasks": ["mountaincar_continuous", "swimmer"]},
              "transfer": {"tasks": ["mountaincar_continuous"]},
              "grpo": {"device": None, "dtype": "auto", "threads": 1, "trainer": {"bf16": False}}},
}
# The default profile's teachers on MPE, the scoring teacher with its controls (the paper profile has no scoring
# teacher: its planner answers unopened).
DEFAULT_TEACHERS = {"llm4teach": {"mpe": {"teachers": ["llm", "llm_score", "uniform", "random_score", "none"]}}}
SCENARIOS = {"default": ([], DEFAULT_TEACHERS), "paper": ([f"{m}=paper" for m in METHODS], PAPER_ON_CPU)}
LANES = (("llm_rl", "glam", "llm4teach"), ("kalm", "props"))  # one process each, side by side


def gsm8k_files(root: Path) -> None:
    """A few problems in GSM8K's own format (question, rationale and ``#### answer``), train and test apart."""
    for split, first, n in (("train", 1, 6), ("test", 50, 3)):
        rows = [{"question": f"Tom has {a} apples and buys {a + 1} more. How many apples does he have?",
                 "answer": f"He has {a} + {a + 1} = <<{a}+{a + 1}={2 * a + 1}>>{2 * a + 1} apples.\n#### {2 * a + 1}"}
                for a in range(first, first + n)]
        (root / "gsm8k").mkdir(exist_ok=True)
        (root / "gsm8k" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@dataclass
class Part:
    commands: list[tuple[str, list[str]]]
    error: str | None = None
    seconds: float = 0.0


@dataclass
class Run:
    root: Path
    before: set[Path]
    parts: dict[str, Part] = field(default_factory=dict)


def run_part(run: Run, name: str) -> None:
    part = run.parts[name]
    start = time.perf_counter()
    try:
        run_stages(run.root, part.commands)
    except AssertionError as err:
        part.error = str(err)
    part.seconds = time.perf_counter() - start


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def pipeline_run(request, tmp_path_factory) -> Run:
    profiles, extra = SCENARIOS[request.param]
    root = scratch_workspace(tmp_path_factory.mktemp(f"smoke-{request.param}"), compose_params(profiles, extra))
    gsm8k_files(root)
    run = Run(root, result_files(root))
    for name, prefixes in (("shared", SHARED), *((m, (f"{m}_",)) for m in METHODS), ("report", ("report",))):
        run.parts[name] = Part(stage_commands(root, prefixes))
    run_part(run, "shared")
    if run.parts["shared"].error is None:
        lanes = [threading.Thread(target=lambda lane=lane: [run_part(run, m) for m in lane]) for lane in LANES]
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join()
        run_part(run, "report")
    else:
        for name, part in run.parts.items():
            part.error = part.error or f"not run: the shared stages failed:\n{run.parts['shared'].error}"
    print(f"\n[smoke {request.param}] " + ", ".join(f"{n} {p.seconds:.0f} s" for n, p in run.parts.items()))
    return run


@pytest.mark.parametrize("part", ["shared", *METHODS, "report"])
def test_every_stage_writes_the_outputs_it_declares(pipeline_run, part):
    result = pipeline_run.parts[part]
    assert result.error is None, result.error
    assert result.commands, f"no stage of {part} in dvc.yaml"
    for name, argv in result.commands:
        missing = [str(p.relative_to(pipeline_run.root)) for p in stage_outputs(pipeline_run.root, name, argv)
                   if not p.exists()]
        assert not missing, f"{name} did not write {missing}"


def test_metrics_files_hold_numbers_only(pipeline_run):
    """What the stages write as ``metrics:`` in dvc.yaml is headline numbers only (tests/test_metrics_shape.py checks
    the committed files the same way)."""
    from dvc.repo import Repo

    from .test_metrics_shape import non_numeric

    with Repo(str(pipeline_run.root)) as repo:
        declared = [Path(o.fs_path) for s in repo.index.stages for o in s.outs
                    if o.is_metric and Path(s.dvcfile.path) == pipeline_run.root / "dvc.yaml"]
    files = [f for d in declared for f in ([d] if d.is_file() else sorted(d.rglob("*.json")))]
    assert files
    found = non_numeric(files)
    assert not found, "\n".join(found[:20])


def test_no_stage_writes_outside_its_outputs(pipeline_run):
    commands = [c for part in pipeline_run.parts.values() for c in part.commands]
    check_outputs(pipeline_run.root, commands, pipeline_run.before)
