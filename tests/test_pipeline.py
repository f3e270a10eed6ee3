"""DVC round trip on the project's own stages, and the Prefect flow over a DVC DAG."""

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

VENV_BIN = str(Path(sys.executable).parent)


def _env(root: Path) -> dict:
    # Stage commands say `python`: the venv's; and they import llmrl from the clone itself.
    return dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(root))


def _run(args, cwd: Path, check=True) -> str:
    proc = subprocess.run(args, cwd=cwd, env=_env(cwd), capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def _dvc(*args, cwd: Path, check=True) -> str:
    return _run([sys.executable, "-m", "dvc", *args], cwd, check)


def _git(*args, cwd: Path) -> str:
    return _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd)


@pytest.fixture
def clone(tmp_path) -> Path:
    """The project's tracked and untracked-not-ignored files, as a fresh git repository."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    dst = tmp_path / "a"
    for f in files:
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)
    # the same small budgets in params.yaml and in conf/, which `dvc exp run` composes params.yaml from (Hydra)
    params = yaml.safe_load((dst / "params.yaml").read_text())
    shared = yaml.safe_load((dst / "conf" / "shared.yaml").read_text())
    for sections in (params, shared):
        sections["demos"]["episodes"] = 3
        sections["eval_baselines"]["episodes"] = 3
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (dst / "conf" / "shared.yaml").write_text("# @package _global_\n" + yaml.safe_dump(shared, sort_keys=False))
    _git("init", "-q", cwd=dst)
    _dvc("remote", "add", "-f", "-d", "local", str(tmp_path / "remote"), cwd=dst)
    _git("add", "-A", cwd=dst)
    _git("commit", "-qm", "init", cwd=dst)
    return dst


@pytest.mark.integration  # the project's own stages through dvc repro, push and pull: ~2 min
def test_dvc_round_trip(clone, tmp_path):
    targets = ["demos", "eval_baselines"]
    out = _dvc("repro", *targets, cwd=clone)
    assert "Running stage 'demos'" in out and "Running stage 'eval_baselines'" in out
    out = _dvc("repro", *targets, cwd=clone)
    assert "Running stage" not in out  # no-op

    # Changing one key re-runs what reads it, nothing else.
    out = _dvc("exp", "run", "-S", "demos.episodes=4", *targets, cwd=clone)
    assert "Running stage 'demos'" in out and "Running stage 'eval_baselines'" not in out
    summary = yaml.safe_load((clone / "data/demos/summary.json").read_text())
    assert summary["BabyAI-GoToLocal-v0"]["episodes"] == 4
    # An experiment in a scratch copy (what `dvc queue` workers do) finds the same caches.
    out = _dvc("exp", "run", "--temp", "-S", "demos.episodes=5", "demos", cwd=clone)
    assert "Running stage 'demos'" in out
    assert yaml.safe_load((clone / "params.yaml").read_text())["demos"]["episodes"] == 4  # workspace untouched

    _dvc("push", *targets, cwd=clone)
    _git("add", "-A", cwd=clone)
    _git("commit", "-qm", "results", cwd=clone)
    second = tmp_path / "b"
    _git("clone", "-q", str(clone), str(second), cwd=tmp_path)
    assert not (second / "data/demos").exists()
    _dvc("pull", *targets, cwd=second)
    cmp = filecmp.dircmp(clone / "data/demos", second / "data/demos")
    assert sorted(cmp.same_files if hasattr(cmp, "same_files") else cmp.common_files)
    for f in (clone / "data/demos").iterdir():
        assert (second / "data/demos" / f.name).read_bytes() == f.read_bytes()
    headline = "metrics/baselines/eval/BabyAI-GoToLocal-v0/bot.json"
    assert (second / headline).read_bytes() == (clone / headline).read_bytes()
    out = _dvc("status", *targets, cwd=second)
    assert "up to date" in out


@pytest.mark.integration  # glam_train through dvc repro, push and pull: ~1 min
def test_round_trip_of_a_checkpointed_stage(clone, tmp_path):
    """glam_train keeps a resume point while it runs: after push and pull, a second clone is clean and up to date,
    and `dvc repro` there is a no-op (the checkpoint is scratch, not an out that a clone lacks)."""
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["base_llm"]["spec"] = "tiny"
    params["glam"]["train"].update(n_envs=2, frames_per_env=2, updates=2, epochs=1, minibatch_size=4, micro_batch=4,
                                   seeds=[0], variants=["lora"])
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _git("commit", "-qam", "tiny glam", cwd=clone)
    out = _dvc("repro", "glam_train", cwd=clone)
    assert "Running stage 'glam_train@lora-0'" in out
    assert not list((clone / ".cache" / "resume").rglob("*.pt"))  # the resume point served and is gone
    _dvc("push", "--with-deps", "glam_train", cwd=clone)
    _git("add", "-A", cwd=clone)
    _git("commit", "-qm", "results", cwd=clone)
    second = tmp_path / "b"
    _git("clone", "-q", str(clone), str(second), cwd=tmp_path)
    _dvc("pull", "--with-deps", "glam_train", cwd=second)
    out = _dvc("status", "glam_train", cwd=second)
    assert "up to date" in out, out
    out = _dvc("repro", "glam_train", cwd=second)
    assert "Running stage" not in out, out
    for f in (clone / "models/glam/lora-0").rglob("*"):
        if f.is_file():
            assert (second / f.relative_to(clone)).read_bytes() == f.read_bytes(), f


TOY_DVC = """
stages:
  prepare:
    cmd: python -c "open('a.txt','w').write('a')"
    outs: [a.txt]
  train:
    cmd: python -c "import os; open('b.txt','w').write(open('a.txt').read() + '|' + os.environ.get('CUDA_VISIBLE_DEVICES','unset'))"
    deps: [a.txt]
    outs: [b.txt]
    meta:
      gpu: true
  report:
    cmd: python -c "open('c.txt','w').write(open('b.txt').read() + '|done')"
    deps: [b.txt]
    outs: [c.txt]
"""


def test_prefect_flow_runs_dag_in_order(tmp_path):
    from pipelines.dag import read_dag

    root = tmp_path / "toy"
    root.mkdir()
    (root / "dvc.yaml").write_text(TOY_DVC)
    _git("init", "-q", cwd=root)
    _dvc("init", "-q", cwd=root)
    nodes = read_dag(root)
    assert [n.name for n in nodes] == ["prepare", "train", "report"]
    assert [n.gpu for n in nodes] == [False, True, False]
    assert [n.chain for n in nodes] == [3, 2, 1]  # the stages waiting on each, itself included: its priority
    (root / "dvc.yaml").write_text(TOY_DVC.replace("gpu: true", "gpu: true\n      minutes: 13"))
    assert [n.chain for n in read_dag(root)] == [15, 14, 1]  # minutes on the critical path, not stage counts
    assert [n.name for n in read_dag(root, ["train"])] == ["prepare", "train"]
    with pytest.raises(ValueError, match="unknown stage"):
        read_dag(root, ["nope"])

    # The flow's command line, in its own process (ephemeral Prefect server started and stopped there).
    flow = [sys.executable, str(ROOT / "pipelines" / "reproduce.py"), "--gpus", "1", "--root", str(root)]
    first = _run(flow, root)
    assert "prepare: ran\ntrain: ran\nreport: ran" in first
    # The GPU stage held the one GPU slot and saw its index.
    assert (root / "c.txt").read_text() == "a|0|done"
    second = _run(flow, root)
    assert "prepare: cached\ntrain: cached\nreport: cached" in second


# A diamond with a cached out, a git-tracked metric, a two-core stage and one-core stages that may overlap.
# Every command appends "<stage> start|end <time>" to $TOY_LOG so the test can see what ran side by side.
_TOY_STEP = ("import json, os, sys, time; name, out, *ins = sys.argv[1:]; "
             "log = lambda w: open(os.environ['TOY_LOG'], 'a').write(f'{name} {w} {time.time()}\\n'); "
             "log('start'); meet = os.environ.get('TOY_MEET', '').split(','); "
             "other = [m for m in meet if m != name] if name in meet else []; deadline = time.time() + 60; "
             "while other and time.time() < deadline and not any(l.startswith(other[0] + ' start') for l in open(os.environ['TOY_LOG'])): time.sleep(0.1); "
             "time.sleep(4); text = name + ''.join(open(i).read() for i in ins); "
             "os.makedirs(os.path.dirname(out), exist_ok=True); "
             "open(out, 'w').write(json.dumps({'len': len(text)}) if out.endswith('.json') else text); log('end')")
TOY_PARALLEL_DVC = f"""
stages:
  source:
    cmd: python step.py source out/source.txt params.yaml
    deps: [step.py]
    params: [size]
    outs: [out/source.txt]
  left:
    cmd: python step.py left out/left.txt out/source.txt
    deps: [step.py, out/source.txt]
    outs: [out/left.txt]
  right:
    cmd:
      - python step.py right metrics/right.json out/source.txt
      - python step.py right_data out/right.txt out/source.txt
    deps: [step.py, out/source.txt]
    outs: [out/right.txt]
    metrics:
      - metrics/right.json: {{cache: false}}
  wide:
    cmd: python step.py wide out/wide.txt out/source.txt
    deps: [step.py, out/source.txt]
    outs: [out/wide.txt]
    meta: {{cpus: 2}}
  join:
    cmd: python step.py join out/join.txt out/left.txt metrics/right.json out/wide.txt
    deps: [step.py, out/left.txt, metrics/right.json, out/wide.txt]
    outs: [out/join.txt]
  clock:
    cmd: python -c "import time; open('out/clock.txt', 'w').write(repr(time.time()))"
    deps: [out/source.txt]
    outs: [out/clock.txt]
  memo:
    cmd:
      - python step.py memo out/memo/notes.txt out/source.txt
      - python step.py memo_summary summary/memo.txt out/source.txt
    deps: [step.py, out/source.txt]
    outs:
      - out/memo:
          persist: true
      - summary/memo.txt: {{cache: false}}
"""
# `memo` has a persisted output (as ProPS's reply caches): DVC keeps no run-cache entry for it, and a git-tracked
# plain output (as the stages' summaries), which no cache holds: it comes back from the clone's files.
TOY_STAGES = {"source", "left", "right", "wide", "join", "memo"}  # and `clock`, whose output differs on every run
TOY_COMMANDS = TOY_STAGES | {"right_data", "memo_summary"}


def _toy_parallel_repo(path):
    path.mkdir()
    (path / "step.py").write_text(_TOY_STEP.replace("; ", "\n"))
    (path / "dvc.yaml").write_text(TOY_PARALLEL_DVC)
    (path / "params.yaml").write_text("size: 3\n")
    _git("init", "-q", cwd=path)
    _dvc("init", "-q", cwd=path)
    _git("add", "-A", cwd=path)
    _git("commit", "-qm", "toy", cwd=path)
    return path


def _intervals(log):
    spans = {}
    for line in log.read_text().splitlines():
        name, what, t = line.split()
        spans.setdefault(name, {})[what] = float(t)
    return {name: (s["start"], s["end"]) for name, s in spans.items()}


def _ran_serially_and_committed(serial):
    """The serial run's results committed, as a fresh clone of this project finds them: dvc.lock and metrics
    from git, outputs absent (a clone's cache is empty), so every stage runs again."""
    _dvc("repro", cwd=serial)
    _git("add", "-A", cwd=serial)
    _git("commit", "-qm", "results", cwd=serial)


def _check_clock_restored(root):
    # Its dvc.lock entry was committed with another output, which is in no cache: the workspace must still
    # take the clone's run from the run-cache rather than computing it a second time.
    import hashlib

    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["clock"]
    assert lock["outs"][0]["md5"] == hashlib.md5((root / "out/clock.txt").read_bytes()).hexdigest()


def _outputs(root):
    # dvc.lock as data: DVC appends a stage's first entry when it finishes, so the order of new entries
    # follows completion order, which parallel stages change.
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    lock["stages"].pop("clock", None)
    files = ["out/source.txt", "out/left.txt", "metrics/right.json", "out/right.txt", "out/wide.txt", "out/join.txt",
             "out/memo/notes.txt", "summary/memo.txt"]
    return lock, {f: (root / f).read_bytes() for f in files}


# several worker processes, with and without a DVC remote: ~2 min each, `make test-integration`
@pytest.mark.integration
@pytest.mark.parametrize("remote", [False, True])
def test_parallel_workers_end_as_a_serial_run(tmp_path, monkeypatch, remote):
    from pipelines.dag import read_dag

    serial = _toy_parallel_repo(tmp_path / "serial")
    assert {n.name: n.cpus for n in read_dag(serial)}["wide"] == 2
    monkeypatch.setenv("TOY_LOG", str(tmp_path / "serial.log"))
    _ran_serially_and_committed(serial)
    parallel = tmp_path / "parallel"
    _git("clone", "-q", str(serial), str(parallel), cwd=tmp_path)

    monkeypatch.setenv("TOY_LOG", str(tmp_path / "parallel.log"))
    monkeypatch.setenv("TOY_MEET", "left,right")  # each waits up to 60 s for the other: only true overlap passes
    flow = [sys.executable, str(ROOT / "pipelines" / "reproduce.py"), "--root", str(parallel), "--workers", "2",
            "--cpus", "2"]
    if remote:
        _dvc("remote", "add", "-d", "--local", "shared", str(tmp_path / "remote"), cwd=parallel)
        flow += ["--remote", "shared"]
    out = _run(flow, parallel)
    for stage in TOY_STAGES | {"clock"}:
        assert f"{stage}: ran" in out, out
    assert _outputs(parallel) == _outputs(serial)
    assert "up to date" in _dvc("status", cwd=parallel)
    spans = _intervals(tmp_path / "parallel.log")
    assert set(spans) == TOY_COMMANDS  # each stage computed once, in a clone
    assert "dvc repro --single-item memo in w" in out  # the persisted stage too: it never blocks the workspace
    _check_clock_restored(parallel)

    def overlap(a, b):
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    assert overlap("left", "right")  # two one-core stages side by side on two cores
    assert not any(overlap("wide", other) for other in ("left", "right"))  # the two-core stage ran alone

    again = _run(flow, parallel)
    assert "join: cached" in again


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration  # a Prefect server, a pool and a worker: ~2.5 min (`make test-integration`)
def test_pool_workers_end_as_a_serial_run(tmp_path, monkeypatch):
    """The multi-machine route on one machine: a Prefect server, a process work pool with the project's
    `stage` deployment (prefect.yaml), one worker, and the stages' data exchanged through a DVC remote."""
    import time
    import urllib.request

    serial = _toy_parallel_repo(tmp_path / "serial")
    monkeypatch.setenv("TOY_LOG", str(tmp_path / "serial.log"))
    _ran_serially_and_committed(serial)
    parallel = tmp_path / "parallel"
    _git("clone", "-q", str(serial), str(parallel), cwd=tmp_path)

    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_API_URL", api)
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "1")
    monkeypatch.setenv("TOY_LOG", str(tmp_path / "pool.log"))
    monkeypatch.setenv("LLMRL_WORKER_DIR", str(tmp_path / "worker"))
    bin_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    prefect = str(bin_dir / "prefect")
    logs = open(tmp_path / "services.log", "w")
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=logs, stderr=subprocess.STDOUT)
    worker = None
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        _run([prefect, "work-pool", "create", "toy-pool", "--type", "process"], ROOT)
        _run([prefect, "--no-prompt", "deploy", "--name", "stage", "--pool", "toy-pool"], ROOT)
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", "toy-pool", "--limit", "2"], cwd=ROOT,
                                  stdout=logs, stderr=subprocess.STDOUT)
        _dvc("remote", "add", "-d", "--local", "shared", str(tmp_path / "remote"), cwd=parallel)
        out = _run([sys.executable, str(ROOT / "pipelines" / "reproduce.py"), "--root", str(parallel),
                    "--deployment", "llmrl-stage/stage", "--remote", "shared"], parallel)
    finally:
        for proc in (worker, server):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:  # a Prefect worker once hung in its SIGTERM handling
                    proc.kill()
                    proc.wait(timeout=60)
        logs.close()
    for stage in TOY_STAGES | {"clock"}:
        assert f"{stage}: ran" in out, out
    assert _outputs(parallel) == _outputs(serial)
    assert "up to date" in _dvc("status", cwd=parallel)
    assert set(_intervals(tmp_path / "pool.log")) == TOY_COMMANDS
    _check_clock_restored(parallel)
    assert not (parallel / ".cache" / "workers").exists()  # nothing ran in local clones
    assert list((tmp_path / "worker").glob("*/clone-0/.dvc"))  # but in the worker's own clone


def test_core_slots_first_fit():
    import threading
    import time

    from pipelines.slots import CoreSlots

    cores = CoreSlots(2)
    events = []

    def stage(name, n, seconds):
        with cores.hold(n):
            events.append((name, "start"))
            time.sleep(seconds)
            events.append((name, "end"))

    first = threading.Thread(target=stage, args=("one-a", 1, 0.6))
    first.start()
    time.sleep(0.1)
    wide = threading.Thread(target=stage, args=("two", 2, 0.1))
    wide.start()
    time.sleep(0.1)
    second = threading.Thread(target=stage, args=("one-b", 1, 0.1))
    second.start()
    for t in (first, wide, second):
        t.join(timeout=10)
    order = [name for name, what in events if what == "start"]
    # one-b fits beside one-a although it came after `two`; `two` waits until both cores are free.
    assert order == ["one-a", "one-b", "two"]
    assert events.index(("two", "start")) > events.index(("one-a", "end"))
    with pytest.raises(ValueError, match="cpus"):
        CoreSlots(0)


def test_core_slots_serve_the_longer_chain_first():
    import threading
    import time

    from pipelines.slots import CoreSlots

    cores = CoreSlots(1)
    started = []

    def stage(name, priority, seconds):
        with cores.hold(1, priority=priority):
            started.append(name)
            time.sleep(seconds)

    threads = [threading.Thread(target=stage, args=a) for a in (("running", 0, 0.4), ("short-chain", 1, 0.05),
                                                                 ("long-chain", 5, 0.05), ("same-chain", 5, 0.05))]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=10)
    # Behind the running stage: the higher priority first, equal priorities in arrival order.
    assert started == ["running", "long-chain", "same-chain", "short-chain"]


def test_core_slots_keep_large_stages_apart():
    import threading
    import time

    from pipelines.slots import CoreSlots

    slots = CoreSlots(2, mem_gib=7.5)
    running, peak = [], []
    lock = threading.Lock()

    def stage(mem):
        with slots.hold(1, mem):
            with lock:
                running.append(mem)
                peak.append(sum(running))
            time.sleep(0.2)
            with lock:
                running.remove(mem)

    threads = [threading.Thread(target=stage, args=(m,)) for m in (4.5, 4.5, 1.0)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=10)
    assert max(peak) <= 7.5  # the two 4.5 GiB stages never overlapped; the small one ran beside one of them
    assert 5.5 in peak
    with slots.hold(1, 20.0):  # larger than the whole budget: runs alone instead of never
        pass


def test_a_fresh_clone_runs_only_the_study_parts_still_to_do(tmp_path):
    """The study pipeline (study/dvc.yaml) in parts: a part done and committed elsewhere (its cached model absent
    here, its git-tracked result present) is not run again; a new part runs, with the default pipeline's upstream
    stage whose output it needs; the default pipeline's `dvc repro` never starts a study stage."""
    from pipelines.dag import read_dag

    repo = tmp_path / "done"
    (repo / "study").mkdir(parents=True)
    (repo / "params.yaml").write_text("n: 1\n")
    (repo / "study" / "params.yaml").write_text("n: 2\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "base": {"cmd": "echo base > base.txt", "outs": ["base.txt"]}}}))
    study = {
        "part1_model": {"wdir": "..", "cmd": "cat base.txt > study/m1.bin", "deps": ["base.txt"],
                        "outs": ["study/m1.bin"]},
        "part1_result": {"wdir": "..", "cmd": "cat study/m1.bin > study/r1.json", "deps": ["study/m1.bin"],
                         "metrics": [{"study/r1.json": {"cache": False}}]},
    }
    (repo / "study" / "dvc.yaml").write_text(yaml.safe_dump({"stages": study}))
    _git("init", "-q", cwd=repo)
    _dvc("init", "-q", cwd=repo)
    _dvc("repro", "-q", "study/dvc.yaml", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "part 1", cwd=repo)
    fresh = tmp_path / "fresh"
    _git("clone", "-q", str(repo), str(fresh), cwd=tmp_path)
    assert not (fresh / "study" / "m1.bin").exists() and (fresh / "study" / "r1.json").is_file()
    assert [n.name for n in read_dag(fresh, pipeline="study/dvc.yaml", allow_missing=True)] == []
    assert {n.name for n in read_dag(fresh, pipeline="study/dvc.yaml")} == {
        "base", "study/dvc.yaml:part1_model", "study/dvc.yaml:part1_result"}
    assert [n.name for n in read_dag(fresh)] == ["base"]  # the default pipeline: no study stage
    study["part2"] = {"wdir": "..", "cmd": "cat base.txt > study/r2.json", "deps": ["base.txt"],
                      "metrics": [{"study/r2.json": {"cache": False}}]}
    (fresh / "study" / "dvc.yaml").write_text(yaml.safe_dump({"stages": study}))
    assert [n.name for n in read_dag(fresh, pipeline="study/dvc.yaml", allow_missing=True)] == [
        "base", "study/dvc.yaml:part2"]
    with pytest.raises(ValueError, match="no stages"):
        read_dag(fresh, pipeline="other/dvc.yaml")


def test_a_fresh_clone_of_a_done_study_runs_nothing_and_a_new_part_only_its_chain(tmp_path):
    """Shapes the real pipelines have: stages that write items into one folder (DVC then commits a `.gitignore`
    into it, so a fresh clone has the folder, nearly empty) read by a later stage, and a default stage with a
    git-tracked result beside a cached one. A fresh clone of a finished study plans no stage; a new study part
    that reads only the git-tracked result runs alone; one that reads the cached output runs that stage's chain."""
    from pipelines.dag import read_dag

    repo = tmp_path / "done"
    (repo / "study").mkdir(parents=True)
    (repo / "params.yaml").write_text("n: 1\n")
    (repo / "study" / "params.yaml").write_text("n: 2\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "item": {"foreach": ["a", "b"], "do": {"cmd": "mkdir -p items && echo ${item} > items/${item}.txt",
                                                "outs": ["items/${item}.txt"]}},
        "summary": {"cmd": "mkdir -p cached && cat items/*.txt > cached/all.txt && echo 2 > result.json",
                    "deps": ["items"], "outs": ["cached"], "metrics": [{"result.json": {"cache": False}}]},
    }}))
    study = {"count": {"wdir": "..", "cmd": "ls items | wc -l > study/count.json", "deps": ["items"],
                       "metrics": [{"study/count.json": {"cache": False}}]}}
    (repo / "study" / "dvc.yaml").write_text(yaml.safe_dump({"stages": study}))
    _git("init", "-q", cwd=repo)
    _dvc("init", "-q", cwd=repo)
    _dvc("repro", "-q", "dvc.yaml", cwd=repo)
    _dvc("repro", "-q", "study/dvc.yaml", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "default and study", cwd=repo)
    fresh = tmp_path / "fresh"
    _git("clone", "-q", str(repo), str(fresh), cwd=tmp_path)
    assert sorted(p.name for p in (fresh / "items").iterdir()) == [".gitignore"]
    assert read_dag(fresh, pipeline="study/dvc.yaml", allow_missing=True) == []
    study["reads_result"] = {"wdir": "..", "cmd": "cat result.json > study/r.json", "deps": ["result.json"],
                             "metrics": [{"study/r.json": {"cache": False}}]}
    (fresh / "study" / "dvc.yaml").write_text(yaml.safe_dump({"stages": study}))
    assert [n.name for n in read_dag(fresh, pipeline="study/dvc.yaml", allow_missing=True)] == [
        "study/dvc.yaml:reads_result"]
    study["reads_cached"] = {"wdir": "..", "cmd": "cat cached/all.txt > study/c.json", "deps": ["cached"],
                             "metrics": [{"study/c.json": {"cache": False}}]}
    (fresh / "study" / "dvc.yaml").write_text(yaml.safe_dump({"stages": study}))
    assert {n.name for n in read_dag(fresh, pipeline="study/dvc.yaml", allow_missing=True)} == {
        "item@a", "item@b", "summary", "study/dvc.yaml:reads_result", "study/dvc.yaml:reads_cached"}
