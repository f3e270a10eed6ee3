"""The pipeline's stages run for tests: in a scratch workspace (``pipelines.workspace``) with the tiny model and minimal
budgets, each method's stages one after the other in one process (its ``main(argv)``, as ``python -m
stages.<name>`` calls it), the stage items DVC resolves from the scratch copy's dvc.yaml and params.yaml.

``TINY`` holds the minimal budgets as Hydra overrides of the composed parameters (``pipelines.tiers.compose``),
so they apply to any profile of a method: the default (the stage smoke tests) and the paper profile
(``tests/test_paper_profiles.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pipelines.tiers import overrides
from pipelines.workspace import copy_workspace, stage_outputs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ("data", "models", "metrics", "plots", "reports")  # where stages write (stages/paths.py)
METHODS = ("llm_rl", "glam", "llm4teach", "kalm", "props")
SHARED = ("base_llm", "demos", "eval_baselines")

# Per section, the keys set for a smoke run: the tiny model (base_llm's output is every method's model folder) and
# the smallest budgets each stage accepts. Lists and mappings replace the profile's.
TINY: dict[str, dict] = {
    "base_llm": {"spec": "tiny"},
    "demos": {"envs": ["BabyAI-GoToLocal-v0", "BabyAI-Text-GoToObjS4-v0"], "episodes": 2, "max_steps": 8},
    "eval_baselines": {"episodes": 2},
    "llm_rl": {
        "data": {"n_train": 5, "n_test": 2},
        "train": {"seeds": [0], "common": {"model": "models/base_llm", "few_shot": 1, "iterations": 1,
                                           "problems_per_iteration": 2, "group_size": 2, "micro_batch": 4,
                                           "answer_tokens": 6, "line_tokens": 6, "gen_batch_size": 4},
                  "reinforce_kl": {"max_steps": 2}},
        "eval": {"n_problems": 2, "batch_size": 2},
    },
    "glam": {
        "model": "models/base_llm",
        "train": {"n_envs": 2, "frames_per_env": 2, "updates": 1, "epochs": 1, "minibatch_size": 4, "micro_batch": 4,
                  "seeds": [0], "max_steps": 4},
        "bc": {"episodes": 1, "validation_episodes": 1, "epochs": 2, "batch_size": 2},
        "symbolic": {"ppo": {"total_frames": 8, "num_envs": 2, "num_steps": 4, "epochs": 1, "minibatch_size": 4},
                     "seeds": [0]},
        "eval": {"episodes": 100, "max_steps": 1, "batch": 50},  # 100: the least an evaluation takes
        "generalisation": {"episodes": 100, "max_steps": 1, "batch": 50, "tests": ["none", "french"]},
    },
    "llm4teach": {
        "teacher": {"spec": "models/base_llm", "n_ask": 1, "max_new_tokens": 4, "batch_size": 8},
        # the oracle teaches the grid students (the tiny model's plans wander to the step limit, which 100
        # evaluation episodes per teacher and mode take long; the LLM teaches on MPE); 160 steps per environment:
        # past DoorKey's 150-step limit, so an episode ends and its curves exist
        "train": {"teachers": ["oracle", "none"], "seeds": [0],
                  "ppo": {"total_frames": 320, "num_envs": 2, "num_steps": 80, "epochs": 1, "minibatch_size": 80},
                  "distill": {"until_iteration": 1}, "curve_points": 1, "curve_episodes": 2},
        "mpe": {"seeds": [0], "max_cycles": 5,
                "ppo": {"total_frames": 10, "num_envs": 2, "num_steps": 5, "epochs": 1, "minibatch_size": 10},
                "distill": {"until_iteration": 1}},
        "eval": {"episodes": 100},
    },
    "kalm": {
        "env": {"metaworld_max_steps": 12, "babyai_max_steps": 8},
        "data": {"metaworld_episodes_per_task": 1, "babyai_episodes_per_task": 1, "validation_episodes_per_task": 1,
                 "agreement_test_episodes": 0, "embed_model": "models/base_llm", "embed_batch_size": 64},
        "ground": {"model": "models/base_llm", "trajectory_samples": 4, "dynamics_samples": 4, "goal_samples": 2,
                   "reverse_samples": 2, "window": 4, "reverse_states": 2, "batch_size": 4, "epochs": 1.0,
                   "warmup": 0, "log_every": 1},
        "imagine": {"levels": ["train", "easy"], "rollouts": 1, "metaworld_horizon": 3, "babyai_horizon": 3,
                    "batch_size": 64, "consistency_candidates": 2, "examples": 1},
        "offline": {"seeds": [0], "imagined_levels": ["easy"], "log_every": 1},
        "eval": {"levels": ["easy"], "babyai_episodes": 1, "metaworld_episodes": 1, "random_seeds": 1,
                 "grounded_episodes": 1},
    },
    "props": {
        "llm": {"spec": "models/base_llm", "batch_size": 8},
        "search": {"seeds": [0], "iterations": 2, "episodes_per_eval": 1, "eval_episodes": 1, "video": False,
                   "max_episode_steps": {"cartpole": 10, "inverted_pendulum": 10, "swimmer": 10, "pendulum": 10}},
        "baselines": {"cem": {"population": 2, "episodes_per_candidate": 1},
                      "ppo": {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "net_arch": [8]}},
        "eval": {"reps": 50},
        "transfer": {"seeds": [0, 1]},  # the fewest the paired difference takes
        "quadratic": {"iterations": 2, "seeds": [0, 1], "cem": {"population": 2}},
        "grpo": {"model": "models/base_llm", "vectors": 3, "episodes": 1, "validation_samples": 1,
                 "functions": {"train_examples": 4, "validation_examples": 2, "dims": [2]},
                 "trainer": {"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 4,
                             "gradient_accumulation_steps": 1,
                             "max_completion_length": 6, "max_prompt_tokens": 1024}},
        "heldout": {"dims": [2], "functions_per_dim": 2, "validation_functions_per_dim": 1, "iterations": 3,
                    "base_reps": 1, "reps": 1, "hill_steps": [1.0], "reps_bootstrap": 50,
                    "cem": {"population": 3, "elite_frac": 0.34}},
    },
}


def compose_params(profiles: list[str] | tuple[str, ...] = (), extra: dict | None = None) -> dict:
    """The parameters ``conf/`` composes for ``profiles`` (``["kalm=paper"]``) with ``TINY`` and ``extra`` on top,
    and what depends on the profile: two updates for every offline RL algorithm it lists, and the demonstrations
    of GLAM's training level (glam_bc's data)."""
    from pipelines.tiers import compose

    base = [*profiles, *overrides(TINY), *overrides(extra or {})]
    first = compose(base)
    algos = {name: {"steps": 2} for name in first["kalm"]["offline"]["algos"]}
    levels = list(dict.fromkeys([*TINY["demos"]["envs"], first["glam"]["train"]["env_id"]]))
    return compose([*base, *overrides({"kalm": {"offline": {"algos": algos}}, "demos": {"envs": levels}})])


def scratch_workspace(dst: Path, params: dict) -> Path:
    """A copy of this workspace at ``dst`` without its results (every file a stage writes is the run's), whose
    params.yaml is ``params``."""
    root = copy_workspace(dst, commit=True, skip=RESULTS)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def stage_commands(root: Path, prefixes: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """(stage, argv after ``python -m``) of every stage item of ``root``'s dvc.yaml whose name starts with one of
    ``prefixes``, in dvc.yaml's order, as DVC resolves them from ``root``'s params.yaml."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:
        stages = [s for s in repo.index.stages if Path(s.dvcfile.path) == root / "dvc.yaml"]
        found = [(s.addressing, s.cmd.split()[2:]) for s in stages if s.addressing.split("@")[0].startswith(prefixes)]
    order = list(yaml.safe_load((root / "dvc.yaml").read_text())["stages"])
    return sorted(found, key=lambda item: order.index(item[0].split("@")[0]))


RUNNER = """\
import importlib, json, sys, time
from stages.common import prepare_stage_process
prepare_stage_process()
for argv in json.loads(sys.argv[1]):
    start = time.perf_counter()
    importlib.import_module(argv[0]).main(argv[1:])
    print(f"stage {' '.join(argv)}: {time.perf_counter() - start:.1f} s", flush=True)
"""


def run_stages(root: Path, commands: list[tuple[str, list[str]]], timeout: float = 600) -> str:
    """Every command's ``main`` in turn, in one process with ``root`` as its repository (its stages package, its
    params.yaml); its output, or an AssertionError with its tail (or, past ``timeout``, with what finished)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(root))
    env.pop("LLMRL_TIER", None)
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps([argv for _, argv in commands])], cwd=root,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:  # named as the stages' failure, not a dead lane's missing outputs
        done = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        raise AssertionError(f"stages {[name for name, _ in commands]} ran past {timeout:.0f} s; "
                             f"finished:\n{done[-3000:]}") from None
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"stages {[name for name, _ in commands]} failed ({proc.returncode}):\n{out[-6000:]}")
    print(f"\n[stages] {', '.join(name for name, _ in commands)}: {time.perf_counter() - start:.1f} s")
    return out


def result_files(root: Path) -> set[Path]:
    return {p for top in RESULTS if (root / top).is_dir() for p in (root / top).rglob("*") if p.is_file()}


def check_outputs(root: Path, commands: list[tuple[str, list[str]]], before: set[Path]) -> None:
    """Each stage item wrote every output stages/paths.py names for it (dvc.yaml declares the same:
    tests/test_stage_paths.py), and no file outside them."""
    declared = {name: stage_outputs(root, name, argv) for name, argv in commands}
    for name, outputs in declared.items():
        missing = [str(p.relative_to(root)) for p in outputs if not p.exists()]
        assert not missing, f"{name} did not write {missing}"
    everything = [p for outputs in declared.values() for p in outputs]
    stray = sorted(str(f.relative_to(root)) for f in result_files(root) - before
                   if not any(f == p or p in f.parents for p in everything))
    assert not stray, f"{[n for n, _ in commands]} wrote files no declared output holds: {stray[:20]}"
