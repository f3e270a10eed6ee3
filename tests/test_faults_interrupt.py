"""Interruptions anywhere: each kind of training stage, run as the pipeline runs it (its script,
tiny params, in a scratch copy of the repository), is killed with SIGKILL at random moments, then run again; the
outputs must be the uninterrupted run's. Then, with the disk full, a run must end with a named error and leave
those outputs intact.

Kinds, every training stage: LLM PPO (glam_train, restart point per update), LLM behavioural cloning (glam_bc),
Symbolic-PPO (glam_symbolic, two seeds), distilled PPO (llm4teach_train, seeds published together), distilled MAPPO
on MPE (llm4teach_train_mpe), REINFORCE-KL (llm_rl_train reinforce_kl, restart point per iteration) and GRPO
(llm_rl_train grpo, TRL), d3rlpy offline RL (kalm_offline_real), KALM grounding (kalm_ground), ProPS's baselines (random
search, CEM and SB3 PPO: props_baselines) and ProPS's GRPO (props_grpo_part, TRL: the first of its parts, which
writes the checkpoint the next resumes); all but the two with restart points
restart from scratch.

Equal means: every model file (safetensors, peft adapter, ``.pt``, ``.d3``, ``SHA256SUMS``) byte for byte; JSON
and dvclive files value for value once wall-clock fields are set aside (seconds, rates, dvclive's timestamps),
which no two runs share, interrupted or not. The kill moments are drawn uniformly from 15-90 % of the
uninterrupted run's duration (the first seconds are the interpreter's imports); the seed is printed with any
failure (``LLMRL_KILL_SEED`` replays it).

The disk: a 64 MiB tmpfs mounted by the test (root), filled but for a few KiB before the last run. Without root
the same check runs under a file-size limit (RLIMIT_FSIZE: writes fail with EFBIG, reported the same way).
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .faults_support import ROOT, repo_params, stage_command, stage_env, stage_repo

pytestmark = pytest.mark.integration  # ~20-60 s per kind: make test-integration (CI runs it)

# wall-clock fields: never equal between two runs, interrupted or not
CLOCK_KEYS = {"seconds", "cpu_seconds", "fps", "updates_per_s", "wall_seconds", "train_seconds", "step_time",
              "collect_s", "update_s", "timestamp", "checksum"}
KILLS = 2


def _tiny_params() -> dict:
    p = repo_params()
    g = p["glam"]
    g.update(model="tiny")
    g["lora"]["layers"] = None
    g["train"].update(n_envs=2, frames_per_env=4, updates=5, epochs=1, minibatch_size=8, micro_batch=4, seeds=[0])
    # budgets of the kinds that train in well under a second otherwise: the first 3-5 s of a run are imports, so a
    # run of a few seconds' training puts most kill moments (15-90 % of the run) inside the training
    g["bc"].update(episodes=2, validation_episodes=1, batch_size=2, epochs=80, patience=80)
    g["symbolic"].update(seeds=[0, 1])
    g["symbolic"]["ppo"].update(total_frames=6144, num_envs=2, num_steps=32, epochs=1, minibatch_size=32)
    p["demos"].update(envs=[g["train"]["env_id"]], episodes=3, max_steps=8)
    t = p["llm4teach"]
    t["workers"] = 1
    t["train"].update(envs=["simpledoorkey"], teachers=["oracle"], seeds=[0], curve_points=2, curve_episodes=2)
    t["train"]["ppo"].update(total_frames=512, num_envs=4, num_steps=32)
    t["mpe"].update(seeds=[0, 1], max_cycles=5)
    t["mpe"]["ppo"].update(total_frames=4500, num_envs=2, num_steps=5, epochs=1, minibatch_size=10)
    p["llm_rl"]["train"]["common"].update(model="tiny", iterations=4, problems_per_iteration=2, group_size=2,
                                          micro_batch=4, answer_tokens=8, line_tokens=8, gen_batch_size=4, few_shot=1)
    k = p["kalm"]
    k["data"].update(benchmarks=["babyai"], babyai_episodes_per_task=1, validation_episodes_per_task=1,
                     agreement_test_episodes=0, embed_model="tiny")
    k["offline"].update(algos={"babyai-dbc": {"benchmark": "babyai", "algo": "DiscreteBC", "steps": 200,
                                              "config": {"batch_size": 16, "learning_rate": 1e-3}}},
                        seeds=[0], log_every=20)
    k["ground"].update(model="tiny", benchmarks=["babyai"], trajectory_samples=6, dynamics_samples=6, goal_samples=3,
                       reverse_samples=3, epochs=1.0, batch_size=3, window=8, log_every=1)
    pr = p["props"]
    pr["search"].update(tasks=["pendulum"], seeds=[0, 1], iterations=40, episodes_per_eval=2, eval_episodes=1,
                        video=False, max_episode_steps={"pendulum": 50})
    pr["baselines"]["cem"].update(population=2, episodes_per_candidate=1)
    pr["baselines"]["ppo"].update(n_steps=16, batch_size=16, n_epochs=1, net_arch=[8])
    pr["transfer"].update(tasks=["pendulum"])
    pr["grpo"].update(model="tiny", vectors=3, episodes=1)
    pr["grpo"]["trainer"].update(num_generations=2, per_device_train_batch_size=2, max_steps=40,
                                 max_completion_length=6)
    return p


def _math_problems(root: Path) -> None:
    folder = root / "data" / "llm_rl"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"p{i}", "problem": f"Tom has {i} apples and gets 2 more. How many apples does he have?",
             "solution": f"{i} + 2 = {i + 2}", "answer": str(i + 2)} for i in range(6)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _upstream_output(tmp_path_factory, script: str, output: str) -> Path:
    """``output`` of a tiny run of the upstream stage ``script``, in a workspace of its own."""
    root = stage_repo(tmp_path_factory.mktemp(Path(script).stem), _tiny_params())
    run = subprocess.run(stage_command(script), cwd=root, env=stage_env(), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return root / output


@pytest.fixture(scope="module")
def kalm_real(tmp_path_factory) -> Path:
    """data/kalm/real of a tiny kalm_data run, the input of kalm_offline_real/_imagine and kalm_ground."""
    return _upstream_output(tmp_path_factory, "kalm_data.py", "data/kalm/real")


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    """data/demos of a tiny demos run (the BabyAI bot on GLAM's training level), the input of glam_bc."""
    return _upstream_output(tmp_path_factory, "demos.py", "data/demos")


KINDS = {  # kind: the stage script and its arguments (dvc.yaml's cmd)
    "glam_ppo": ["glam_train.py", "lora-0"],
    "glam_bc": ["glam_bc.py"],
    "symbolic_ppo": ["glam_symbolic.py"],
    "distilled_ppo": ["llm4teach_train.py", "simpledoorkey", "oracle"],
    "distilled_mappo": ["llm4teach_train_mpe.py", "oracle"],
    "reinforce_kl": ["llm_rl_train.py", "reinforce_kl", "0"],
    "grpo": ["llm_rl_train.py", "grpo", "0"],
    "d3rlpy_offline": ["kalm_offline_real.py", "babyai", "babyai-dbc"],
    "kalm_grounding": ["kalm_ground.py", "babyai", "0"],
    "props_baselines": ["props_baselines.py"],
    "props_grpo": ["props_grpo_part.py", "1", "4", "0"],
}


def _stage_outputs(argv: list[str]) -> list[str]:
    """The stage's outputs as stages/paths.py names them (its function named like the stage, taking its argv)."""
    import importlib.util

    name = "stage_paths_of_this_checkout"
    spec = importlib.util.spec_from_file_location(name, ROOT / "stages" / "paths.py")
    paths = sys.modules[name] = importlib.util.module_from_spec(spec)  # its dataclasses look their module up
    spec.loader.exec_module(paths)
    outputs = getattr(paths, Path(argv[0]).stem)(*argv[1:])
    return [Path(p).relative_to(paths.ROOT).as_posix() for p in outputs.values()]


def _prepare(root: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """The stage's inputs in the scratch root (the fixtures that make them run only for the kinds that read them)."""
    if kind in ("reinforce_kl", "grpo"):
        _math_problems(root)
    if kind in ("d3rlpy_offline", "kalm_grounding"):
        shutil.copytree(request.getfixturevalue("kalm_real"), root / "data" / "kalm" / "real")
    if kind == "glam_bc":
        shutil.copytree(request.getfixturevalue("demos"), root / "data" / "demos")


def _strip_clock(node):
    if isinstance(node, dict):
        return {k: _strip_clock(v) for k, v in node.items() if k not in CLOCK_KEYS}
    if isinstance(node, list):
        return [_strip_clock(v) for v in node]
    return node


def _content(path: Path):
    """What must be equal between two runs: bytes, or for JSON and dvclive TSV the values without clock fields."""
    if path.stem in CLOCK_KEYS:  # a curve of a wall-clock figure (fps.tsv, updates_per_s.tsv)
        return "a wall-clock curve"
    if path.suffix == ".json":
        return _strip_clock(json.loads(path.read_text()))
    if path.suffix == ".tsv":
        rows = list(csv.DictReader(io.StringIO(path.read_text()), delimiter="\t"))
        return [_strip_clock(r) for r in rows]
    return path.read_bytes()


def _outputs(root: Path, outputs: list[str], *, published_only: bool = False) -> dict[str, object]:
    """Every file under the stage's outputs by path; with ``published_only`` what a reader would take for an
    output, i.e. without the hidden temporaries a killed writer leaves (the next run clears them)."""
    found = {}
    for rel in outputs:
        base = root / rel
        files = [base] if base.is_file() else sorted(f for f in base.rglob("*") if f.is_file()) if base.is_dir() else []
        for f in files:
            name = f.relative_to(root).as_posix()
            if published_only and any(part.startswith(".") for part in f.relative_to(root).parts):
                continue
            found[name] = _content(f)
    for rel in outputs:  # a killed writer's temporaries beside an output
        for sibling in (root / rel).parent.glob(f".{Path(rel).name}.*") if (root / rel).parent.is_dir() else []:
            if not published_only:
                found[sibling.relative_to(root).as_posix()] = "a temporary left behind"
    return found


def _run(root: Path, argv: list[str], *, limit: int | None = None, timeout: float = 600):
    def child():
        if limit is not None:  # no root for a tmpfs: the same failure through a file-size limit
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(stage_command(*argv), cwd=root, env=stage_env(), capture_output=True, text=True,
                          timeout=timeout, preexec_fn=child)


def _kill_at(root: Path, argv: list[str], after: float) -> bool:
    """Start the stage, SIGKILL it ``after`` seconds in; True if it was still running then."""
    proc = subprocess.Popen(stage_command(*argv), cwd=root, env=stage_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=after)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


class SmallDisk:
    """A 64 MiB tmpfs mounted at ``path`` where this process may mount one (root), else just the folder (then
    ``mounted`` is False and the caller limits file sizes instead); unmounted on exit."""

    def __init__(self, path: Path):
        self.path = path
        self.mounted = False

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True)
        if os.geteuid() == 0 and shutil.which("mount"):
            self.mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(self.path)],
                                          capture_output=True).returncode == 0
        return self

    def __exit__(self, *exc) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)

    def fill(self, leave: int = 16 << 10) -> Path:
        filler = self.path / "filler"
        free = shutil.disk_usage(self.path).free
        with open(filler, "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, max(0, free - leave))
        return filler


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kill_9_anywhere_then_a_rerun_gives_the_uninterrupted_outputs(kind, tmp_path, request):
    argv = KINDS[kind]
    outputs = _stage_outputs(argv)
    seed = int(os.environ.get("LLMRL_KILL_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    params = _tiny_params()

    straight = stage_repo(tmp_path / "straight", params)
    _prepare(straight, kind, request)
    t0 = time.perf_counter()
    run = _run(straight, argv)
    duration = time.perf_counter() - t0
    assert run.returncode == 0, run.stderr[-3000:]
    expected = _outputs(straight, outputs)
    assert expected and not any(isinstance(v, str) and "temporary" in v for v in expected.values())

    with SmallDisk(tmp_path / "disk") as disk:
        root = stage_repo(disk.path, params)
        _prepare(root, kind, request)
        moments = []
        for i in range(KILLS):
            after = rng.uniform(0.15, 0.9) * duration
            killed = _kill_at(root, argv, after)
            # the straight run paid for cold imports; a warm run can end before a late kill: then start clean and
            # kill earlier, so that the first kill always lands inside a run
            while i == 0 and not killed and after > 0.1 * duration:
                _remove(root, outputs)
                after /= 2
                killed = _kill_at(root, argv, after)
            moments.append((round(after, 2), killed))
            published = _outputs(root, outputs, published_only=True)
            # a killed run publishes nothing half-done: whatever is there is whole (and the same as uninterrupted)
            assert all(published[k] == expected[k] for k in published), f"seed {seed}, kills at {moments}"
        assert moments[0][1], f"seed {seed}: the first run ended before its kill at {moments[0][0]} s"
        rerun = _run(root, argv)
        assert rerun.returncode == 0, f"seed {seed}, kills at {moments}: {rerun.stderr[-3000:]}"
        got = _outputs(root, outputs)
        assert got.keys() == expected.keys(), f"seed {seed}, kills at {moments}: {sorted(got.keys() ^ expected.keys())}"
        differ = [k for k in got if got[k] != expected[k]]
        assert not differ, f"seed {seed}, kills at {moments}: {differ} differ from the uninterrupted run's"

        # a full disk: a named error, the outputs left as they were
        before = {f: f.read_bytes() for rel in outputs for f in _files(root / rel)}
        if disk.mounted:
            filler = disk.fill()
            full = _run(root, argv)
            filler.unlink()
        else:
            full = _run(root, argv, limit=4096)
        assert full.returncode != 0
        assert "DiskFullError" in full.stderr and "no space left on the device" in full.stderr, full.stderr[-3000:]
        assert {f: f.read_bytes() for rel in outputs for f in _files(root / rel)} == before
        assert not [s for rel in outputs for s in (root / rel).parent.glob(f".{Path(rel).name}.*")]


def _remove(root: Path, outputs: list[str]) -> None:
    for rel in outputs:
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _files(base: Path) -> list[Path]:
    return [base] if base.is_file() else sorted(f for f in base.rglob("*") if f.is_file())
