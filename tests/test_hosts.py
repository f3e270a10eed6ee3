"""The pool route (pipelines/reproduce.py --deployment) across hosts: network namespaces on this machine (tests/hosts_lab.py).

Host A runs the Prefect servers, the coordinators and an SSH server holding the git repositories and the DVC remotes;
worker hosts (B, C, ...) run Prefect workers (pipelines/hosts.py) that reach A only through their veth pairs, over SSH
for git and DVC. Without root or network namespaces these tests skip (and fail under CI).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from pipelines import hosts

from .hosts_lab import HEARTBEAT_S, ROOT, STEADY_HEARTBEAT_S, Lab, Server, partial_objects, snapshot, state_env, temporary_files, \
    unavailable
from .test_pipeline import _TOY_STEP, TOY_COMMANDS, TOY_PARALLEL_DVC, TOY_STAGES, _check_clock_restored, _intervals, \
    _outputs

pytestmark = pytest.mark.integration  # 3-6 min of network namespaces: make test-integration (CI runs it)

# --- no hosts needed ---


def test_a_host_gives_each_gpu_stage_its_own_device(tmp_path):
    held, events = [], []
    lock = threading.Lock()

    def stage(seconds):
        with hosts.hold_device(tmp_path, ["0", "1"], poll_s=0.02) as device:
            with lock:
                held.append(device)
                events.append(sorted(held))
            time.sleep(seconds)
            with lock:
                held.remove(device)

    threads = [threading.Thread(target=stage, args=(0.3,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert max(len(e) for e in events) == 2  # two devices: the third stage waited for one
    assert all(len(set(e)) == len(e) for e in events)  # never one device twice
    assert len(events) == 3
    with pytest.raises(ValueError, match="LLMRL_WORKER_GPUS"):
        with hosts.hold_device(tmp_path, []):
            pass
    assert hosts.worker_devices({"LLMRL_WORKER_GPUS": "1, 3"}) == ["1", "3"]
    assert hosts.worker_devices({}) == []


def test_pool_errors_are_not_retried_by_the_task():
    from prefect.states import Failed

    assert not hosts.retry_unless_pool_error(None, None, Failed(data=hosts.WorkerLost("stage s: worker b lost")))
    assert not hosts.retry_unless_pool_error(None, None, Failed(data=hosts.NoWorkerOnline("stage s: no worker")))
    assert hosts.retry_unless_pool_error(None, None, Failed(data=RuntimeError("stage s: flow run ended Failed")))


# --- the lab ---


def _sh(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} in {cwd} failed ({proc.returncode}):\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout + proc.stderr


def _dvc(*args: str, cwd: Path, env: dict[str, str]) -> str:
    return _sh([sys.executable, "-m", "dvc", *args], cwd, env)


def _git(*args: str, cwd: Path) -> str:
    return _sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd, dict(os.environ))


def _repo(path: Path, files: dict[str, str], env: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    for rel, text in files.items():
        (path / rel).write_text(text)
    _git("init", "-q", cwd=path)
    _dvc("init", "-q", cwd=path, env=env)
    _git("add", "-A", cwd=path)
    _git("commit", "-qm", "init", cwd=path)
    return path


def _toy_serial(tmp: Path) -> Path:
    """tests/test_pipeline.py's toy DAG, its stages' pause cut to 0.2 s, run serially and committed."""
    env = dict(state_env(tmp / "home"), TOY_LOG=str(tmp / "serial.log"))
    files = {"step.py": _TOY_STEP.replace("time.sleep(4)", "time.sleep(0.2)").replace("; ", "\n"),
             "dvc.yaml": TOY_PARALLEL_DVC, "params.yaml": "size: 3\n"}
    serial = _repo(tmp / "serial", files, env)
    _dvc("repro", cwd=serial, env=env)
    _git("add", "-A", cwd=serial)
    _git("commit", "-qm", "results", cwd=serial)
    return serial


SLICE = ["base_llm", "glam_train@lora-0"]
SLICE_TIMED = "metrics/glam/train/lora-0.json"  # its "seconds" is the stage's wall time
TIMED_KEYS = {"seconds", "checksum"}  # the wall time, and the file's checksum that covers it


def _slice_base(base: Path) -> Path:
    """The project's files at tiny budgets, committed in a repository of their own."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    for rel in listed:
        if (ROOT / rel).is_file():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, base / rel)
    params = yaml.safe_load((base / "params.yaml").read_text())
    params["base_llm"]["spec"] = "tiny"
    params["glam"]["train"].update(n_envs=2, frames_per_env=2, updates=2, epochs=1, minibatch_size=4, micro_batch=4,
                                   seeds=[0], variants=["lora"])
    (base / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _git("init", "-q", cwd=base)
    _git("add", "-A", cwd=base)
    _git("commit", "-qm", "tiny budgets", cwd=base)
    return base


def _slice_serial(base: Path, tmp: Path) -> Path:
    """A clone of ``base`` where ``dvc repro glam_train`` ran."""
    serial = tmp / "serial"
    _git("clone", "-q", str(base), str(serial), cwd=tmp.parent)
    _dvc("repro", "glam_train", cwd=serial, env=state_env(tmp / "home"))
    return serial


def _require_lab() -> None:
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the two-host tests cannot run under CI: {reason}")
        pytest.skip(reason)


# Each test below checks one scenario. The scenarios run at the same time, each with its own coordinator, and a test
# waits for its own: on two cores they mostly wait on processes starting, on polls and on heartbeats.
SCENARIOS: dict = {}
# The worker hosts: B runs the toy DAG and the pipeline slice (one worker, one server for both); the fault and GPU
# scenarios have hosts and servers of their own.
HOSTS = ("b", "b-dies", "c-joins", "b-cut", "b-2gpus", "c-1gpu")


def _scenario(fn):
    SCENARIOS["test_" + fn.__name__.removeprefix("_")] = fn
    return fn


@pytest.fixture(scope="module")
def scenarios(request, tmp_path_factory):
    """The lab (host A and the worker hosts) with the scenarios of the selected tests started in the background, and
    the serial runs they compare with."""
    _require_lab()
    wanted = [item.name for item in request.session.items
              if item.module.__name__ == __name__ and item.name in SCENARIOS]
    tmp = tmp_path_factory.mktemp("hosts")
    lab = Lab(tmp)
    executor = ThreadPoolExecutor(max_workers=len(wanted) + 2)
    try:
        serial = {}
        if "test_toy_dag_runs_on_host_b" in wanted:
            serial["toy"] = executor.submit(_toy_serial, tmp / "serial-toy")
        if "test_pipeline_slice_runs_on_host_b" in wanted:
            serial["slice-base"] = _slice_base(tmp / "slice-base")
            serial["slice"] = executor.submit(_slice_serial, serial["slice-base"], tmp / "serial-slice")
        lab.start()
        for name in HOSTS:
            lab.add_host(name)
        yield {name: executor.submit(SCENARIOS[name], lab, serial) for name in wanted}
    finally:
        lab.close()  # first: a scenario still waiting on one of its processes sees it end
        executor.shutdown(wait=True)


def _wait(what: str, check, timeout: float, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def _online(server: Server, pool: str, names: set[str], timeout: float = 120) -> None:
    def ready():
        with server.client() as client:
            return names <= hosts.online_workers(client, pool)
    _wait(f"workers {sorted(names)} of pool {pool} online", ready, timeout)


def _stage_runs(server: Server, deployment: str) -> list:
    """The flow runs of ``deployment``, oldest first."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with server.client() as client:
        found = client.read_deployment_by_name(deployment)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id])))
    return sorted(runs, key=lambda r: r.created)


def _workspace(lab: Lab, name: str, source: Path) -> tuple[Path, Path, dict[str, str]]:
    """A clone of ``source`` on A for the coordinator, and its DVC remote (a folder on A, ``ssh://hosta/...`` to the
    workers)."""
    tmp = lab.tmp / name
    tmp.mkdir()
    workspace, remote = tmp / "workspace", tmp / "remote"
    _git("clone", "-q", str(source), str(workspace), cwd=tmp)
    remote.mkdir()
    env = state_env(tmp / "home")
    _dvc("remote", "add", "-d", "--local", "shared", str(remote), cwd=workspace, env=env)
    return workspace, remote, env


def _pool_args(lab: Lab, deployment: str, workspace: Path, remote: Path) -> list[str]:
    return ["--root", str(workspace), "--deployment", deployment, "--remote", "shared", "--remote-url", lab.ssh_url(remote),
            "--git-url", lab.ssh_url(workspace)]


# A bound on a coordinator's run, only so that a hang fails: the toy DAG took 172 s and the pipeline slice 235 s on a
# quiet 2-core host with the other scenarios beside them, and CI's runner is about 1.5x slower.
COORDINATOR_TIMEOUT_S = 900


def _coordinate(lab: Lab, server: Server, name: str, args: list[str], workspace: Path,
                timeout: float = COORDINATOR_TIMEOUT_S,
                **env: str) -> dict:
    """The coordinator on A to its end: its exit status, output and wall time."""
    started = time.monotonic()
    proc = lab.coordinator(server, args, workspace, f"{name}-coordinator", **env)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    return dict(rc=rc, out=lab.log(f"{name}-coordinator"), wall=time.monotonic() - started)


# --- the toy DAG and a slice of the pipeline on host B ---


_host_b_lock = threading.Lock()


def _host_b_pool(lab: Lab) -> tuple[Server, str]:
    """The Prefect server, pool and deployment that the toy DAG and the pipeline slice share, with host B's worker
    (four stages at once) on it: started by whichever scenario comes first."""
    with _host_b_lock:
        if "b" not in lab.shared:
            server = lab.server("b")
            deployment = lab.deploy(server, "b")
            lab.start_worker(server, lab.hosts["b"], "b", limit=4, TOY_LOG=str(lab.tmp / "toy-pool.log"),
                             PREFECT_WORKER_HEARTBEAT_SECONDS=str(STEADY_HEARTBEAT_S))  # no fault staged on B
            _online(server, "b", {"b"})
            lab.shared["b"] = server, deployment
        return lab.shared["b"]


def _run_states(run: dict) -> str:
    """Each flow run's stage, state and message, and the coordinator's last lines: why a stage ran twice."""
    rows = [f"{r.parameters['stage']}: {r.state.name} {r.state.message or ''}" for r in run["runs"]]
    return "\n".join(rows) + "\n" + run["out"][-3000:]


def _runs_for(server: Server, deployment: str, lab: Lab, workspace: Path) -> list:
    """The flow runs of one coordinator's stages (those that fetch its workspace)."""
    return [r for r in _stage_runs(server, deployment) if r.parameters["git_url"] == lab.ssh_url(workspace)]


@_scenario
def _toy_dag_runs_on_host_b(lab: Lab, serial: dict) -> dict:
    source = serial["toy"].result()
    workspace, remote, env = _workspace(lab, "toy", source)
    server, deployment = _host_b_pool(lab)
    pool_log = lab.tmp / "toy-pool.log"
    run = _coordinate(lab, server, "toy", _pool_args(lab, deployment, workspace, remote), workspace,
                      TOY_LOG=str(pool_log))
    return dict(run, serial=source, workspace=workspace, remote=remote, env=env, pool_log=pool_log,
                runs=_runs_for(server, deployment, lab, workspace))


def test_toy_dag_runs_on_host_b(scenarios):
    """tests/test_pipeline.py's toy DAG with its stages on host B: the coordinator on A ends as the serial run."""
    run = scenarios["test_toy_dag_runs_on_host_b"].result()
    assert run["rc"] == 0, run["out"][-6000:]
    for stage in TOY_STAGES | {"clock"}:
        assert f"{stage}: ran" in run["out"], run["out"][-6000:]
    workspace = run["workspace"]
    assert _outputs(workspace) == _outputs(run["serial"])
    assert "up to date" in _dvc("status", cwd=workspace, env=run["env"])
    assert set(_intervals(run["pool_log"])) == TOY_COMMANDS  # each computed once
    _check_clock_restored(workspace)
    # every stage that can leave the coordinator (all but the persisted `memo`) ran on B, once
    assert sorted(r.parameters["stage"] for r in run["runs"]) == sorted(TOY_STAGES - {"memo"} | {"clock"}), \
        _run_states(run)
    assert {r.labels.get(hosts.WORKER_LABEL) for r in run["runs"]} == {"b"}
    assert all(r.state.is_completed() for r in run["runs"])
    assert not partial_objects(run["remote"])
    print(f"\n[hosts] toy DAG, stages on host B: {run['wall']:.1f} s wall time")


def _lock_entries(root: Path) -> dict:
    """dvc.lock as data, the timed metrics file's hash left out (its "seconds" differ between any two runs)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    for out in lock["glam_train@lora-0"]["outs"]:
        if out["path"] == SLICE_TIMED:
            out.pop("md5"), out.pop("size")
    return lock


def _slice_files(root: Path) -> dict[str, bytes]:
    files = {}
    for folder in ("models/base_llm", "models/glam/lora-0", "plots/glam/train/lora-0/plots/metrics"):  # the outs
        for path in sorted((root / folder).rglob("*")):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


@_scenario
def _pipeline_slice_runs_on_host_b(lab: Lab, serial: dict) -> dict:
    workspace, remote, env = _workspace(lab, "slice", serial["slice-base"])
    server, deployment = _host_b_pool(lab)
    run = _coordinate(lab, server, "slice",
                      ["--stages", "glam_train", *_pool_args(lab, deployment, workspace, remote)], workspace)
    return dict(run, serial=serial["slice"].result(), workspace=workspace, remote=remote, env=env,
                runs=_runs_for(server, deployment, lab, workspace))


def test_pipeline_slice_runs_on_host_b(scenarios):
    """base_llm and a GLAM training seed downstream of it, at tiny budgets, with both stages on B: the coordinator ends
    with the serial run's dvc.lock, metrics and outputs, apart from the training's wall time."""
    run = scenarios["test_pipeline_slice_runs_on_host_b"].result()
    assert run["rc"] == 0, run["out"][-6000:]
    for stage in SLICE:
        assert f"{stage}: ran" in run["out"], run["out"][-6000:]
    workspace, serial = run["workspace"], run["serial"]
    assert _lock_entries(workspace) == _lock_entries(serial)
    timed = [json.loads((root / SLICE_TIMED).read_text()) for root in (workspace, serial)]
    assert [{k: v for k, v in t.items() if k not in TIMED_KEYS} for t in timed] == [
        {k: v for k, v in timed[1].items() if k not in TIMED_KEYS}] * 2
    assert _slice_files(workspace) == _slice_files(serial)
    assert "up to date" in _dvc("status", *SLICE, cwd=workspace, env=run["env"])
    assert sorted(r.parameters["stage"] for r in run["runs"]) == sorted(SLICE), _run_states(run)
    assert {r.labels.get(hosts.WORKER_LABEL) for r in run["runs"]} == {"b"}
    assert not partial_objects(run["remote"])
    print(f"\n[hosts] pipeline slice {SLICE}, stages on host B: {run['wall']:.1f} s wall time")


# --- faults between hosts ---

GATE_STEP = """import os, sys, time
name = sys.argv[1]
log = os.environ.get("GATE_LOG")
if log:
    open(log, "a").write(f"{name} start {os.environ.get('PREFECT__WORKER_NAME', 'here')} {time.time()}\\n")
gate, deadline = os.environ.get("GATE"), time.time() + 120
while gate and not os.path.exists(gate) and time.time() < deadline:
    time.sleep(0.1)
os.makedirs("out", exist_ok=True)
open(f"out/{name}.txt", "w").write(name * 1000)
"""
GATE_DVC = """
stages:
  p1:
    cmd: python gate.py p1
    deps: [gate.py]
    outs: [out/p1.txt]
  p2:
    cmd: python gate.py p2
    deps: [gate.py]
    outs: [out/p2.txt]
"""


def _starts(log: Path) -> dict[str, str]:
    """stage -> the worker its latest start was on."""
    starts = {}
    if log.is_file():
        for line in log.read_text().splitlines():
            name, _, worker, _ = line.split()
            starts[name] = worker
    return starts


def _outputs_of(root: Path) -> tuple[dict, dict[str, bytes]]:
    # dvc.lock as data (entries follow completion order) and the outputs (not the .gitignore DVC writes beside them)
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return lock, {p.name: p.read_bytes() for p in sorted((root / "out").glob("*.txt"))}


@_scenario
def _a_host_joins_mid_run_and_takes_over_from_a_killed_one(lab: Lab, serial: dict) -> dict:
    tmp = lab.tmp / "gate"
    env = state_env(tmp / "home")
    source = _repo(tmp / "source", {"gate.py": GATE_STEP, "dvc.yaml": GATE_DVC}, env)
    workspace, remote, _ = _workspace(lab, "gate-run", source)
    _dvc("repro", cwd=source, env=env)  # the serial run: ungated, the stages write their outputs at once
    gate, log = tmp / "open", tmp / "starts.log"
    server = lab.server("gate")
    deployment = lab.deploy(server, "gate")
    b, c = lab.hosts["b-dies"], lab.hosts["c-joins"]
    lab.start_worker(server, b, "gate", limit=1, GATE=str(gate), GATE_LOG=str(log))
    _online(server, "gate", {"b-dies"})
    started = time.monotonic()
    proc = lab.coordinator(server, [*_pool_args(lab, deployment, workspace, remote), "--no-worker-timeout", "60"],
                           workspace, "gate-coordinator")
    try:
        on_b = _wait("a stage started on B", lambda: [s for s, w in _starts(log).items() if w == b.name], 120)[0]
        lab.start_worker(server, c, "gate", limit=1, GATE=str(gate), GATE_LOG=str(log))  # C joins mid-run
        on_c = _wait("a stage started on C", lambda: [s for s, w in _starts(log).items() if w == c.name], 120)[0]
        killed, killed_at = time.monotonic(), datetime.datetime.now(datetime.timezone.utc)
        lab.kill_host(b)
        lost = _wait("B's flow run marked crashed",
                     lambda: [r for r in _stage_runs(server, deployment) if r.state.is_crashed()], 60)[0]
        detected = time.monotonic() - killed
    finally:
        gate.touch()
    rc = proc.wait(timeout=240)
    return dict(rc=rc, out=lab.log("gate-coordinator"), wall=time.monotonic() - started, on_b=on_b, on_c=on_c,
                lost=lost, detected=detected, killed_at=killed_at, starts=_starts(log),
                runs=_stage_runs(server, deployment),
                workspace=workspace, serial=source, remote=remote)


def test_a_host_joins_mid_run_and_takes_over_from_a_killed_one(scenarios):
    """B runs one of two gated stages; C joins mid-run and takes the other; B dies mid-stage: its flow run is marked
    crashed and runs again on C. The coordinator ends as a serial run; the remote holds only whole objects."""
    run = scenarios["test_a_host_joins_mid_run_and_takes_over_from_a_killed_one"].result()
    assert run["rc"] == 0, run["out"][-6000:]
    assert {run["on_b"], run["on_c"]} == {"p1", "p2"}  # C took a stage while B held the other
    assert "submitting it once more for another worker" in run["out"]
    lost = run["lost"]
    assert lost.parameters["stage"] == run["on_b"] and lost.labels.get(hosts.WORKER_LABEL) == "b-dies"
    assert "went offline" in lost.state.message and lost.state.timestamp > run["killed_at"]  # not a false alarm
    assert {(r.parameters["stage"], r.labels.get(hosts.WORKER_LABEL), r.state.type.value)
            for r in run["runs"] if r.id != lost.id} == {(run["on_b"], "c-joins", "COMPLETED"),
                                                          (run["on_c"], "c-joins", "COMPLETED")}
    assert run["starts"][run["on_b"]] == "c-joins"
    assert _outputs_of(run["workspace"]) == _outputs_of(run["serial"])
    assert not partial_objects(run["remote"])
    assert run["detected"] < 3 * HEARTBEAT_S + 20  # three missed heartbeats; slack for two busy cores
    print(f"\n[hosts] dead worker: its flow run marked crashed {run['detected']:.1f} s after its host was killed "
          f"(heartbeat every {HEARTBEAT_S} s, offline after 3 missed); whole run {run['wall']:.1f} s")


LINK_NO_WORKER_S = 10
BIG_DVC = """
stages:
  big:
    cmd: python -c "import random; open('big.bin', 'wb').write(random.Random(0).randbytes(6_000_000))"
    outs: [big.bin]
"""


@_scenario
def _a_dropped_link_fails_by_name_and_leaves_nothing_half_written(lab: Lab, serial: dict) -> dict:
    tmp = lab.tmp / "link"
    env = state_env(tmp / "home")
    source = _repo(tmp / "source", {"dvc.yaml": BIG_DVC}, env)
    workspace, remote, env = _workspace(lab, "link-run", source)
    server = lab.server("link")
    deployment = lab.deploy(server, "link")
    b = lab.hosts["b-cut"]
    lab.start_worker(server, b, "link", limit=1)
    _online(server, "link", {"b-cut"})
    lab.throttle(b, "8mbit")  # the 6 MB push takes about 6 s
    before = snapshot(workspace)
    proc = lab.coordinator(server, [*_pool_args(lab, deployment, workspace, remote), "--no-worker-timeout",
                                    str(LINK_NO_WORKER_S)], workspace, "link-coordinator")

    def pushing():
        files = remote / "files"
        return files.is_dir() and [p for p in files.rglob(".*.tmp") if p.stat().st_size > 0]
    try:
        _wait("B's push under way", pushing, 120, poll=0.05)
        dropped, dropped_at = time.monotonic(), datetime.datetime.now(datetime.timezone.utc)
        lab.set_link(b, False)
        ended = {}

        def both_ended():
            if "coordinator" not in ended and proc.poll() is not None:
                ended["coordinator"] = time.monotonic() - dropped
            # B's side: the push ends by itself (ServerAliveInterval 2 x ServerAliveCountMax 3), with DVC's error
            if "push" not in ended and "failed to push data to the cloud" in lab.log("b-cut-link"):
                ended["push"] = time.monotonic() - dropped
            return len(ended) == 2
        _wait("the coordinator and B's push to end", both_ended, 120)
        runs = _stage_runs(server, deployment)  # before B is back: its flow run would then report its own end
    finally:
        lab.set_link(b, True)
    return dict(rc=proc.wait(timeout=10), out=lab.log("link-coordinator"), failed=ended["coordinator"],
                push_ended=ended["push"], remote=remote, before=before, after=snapshot(workspace),
                dropped_at=dropped_at, runs=runs)


def test_a_dropped_link_fails_by_name_and_leaves_nothing_half_written(scenarios):
    """B's link to A goes down while B pushes a stage's output: B's push ends by the SSH keepalive, the coordinator
    fails with WorkerLost once B has missed its heartbeats, no object on the remote is partial, and the coordinator's
    workspace is as before."""
    run = scenarios["test_a_dropped_link_fails_by_name_and_leaves_nothing_half_written"].result()
    assert run["rc"] != 0
    assert "WorkerLost" in run["out"] and "went offline" in run["out"], run["out"][-6000:]
    crashed = [r for r in run["runs"] if r.state.is_crashed()]
    assert len(crashed) == 1 and crashed[0].state.timestamp > run["dropped_at"]  # lost through the drop, not before
    assert [r.state.type.value for r in run["runs"]] == ["CRASHED", "CANCELLED"]  # the second run: no worker took it
    assert not partial_objects(run["remote"])
    assert temporary_files(run["remote"])  # the cut upload, under DVC's temporary name only
    assert run["after"] == run["before"]
    # three missed heartbeats, then the second run finds no worker (no_worker_s); slack for two busy cores
    assert run["failed"] < 3 * HEARTBEAT_S + LINK_NO_WORKER_S + 30
    assert run["push_ended"] < 2 * 3 + 20  # the SSH keepalives of B's ~/.ssh/config; slack for two busy cores
    print(f"\n[hosts] link dropped mid-push: B's push failed {run['push_ended']:.1f} s later, the coordinator "
          f"(WorkerLost) {run['failed']:.1f} s later")


# --- GPU slots across hosts ---

GPU_STEP = """import os, sys, time
name, log = sys.argv[1], os.environ["GPU_LOG"]
def note(what):
    open(log, "a").write(f"{name} {what} {os.environ.get('PREFECT__WORKER_NAME')} "
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')} {time.time()}\\n")
note("start")
deadline = time.time() + 300  # the three starts can lag by minutes when the suite's scenarios share two cores
while time.time() < deadline and sum(line.split()[1] == "start" for line in open(log)) < 3:
    time.sleep(0.1)
time.sleep(0.5)
os.makedirs("out", exist_ok=True)
open(f"out/{name}.txt", "w").write(name)
note("end")
"""
GPU_DVC = "stages:\n" + "".join(
    f"  {g}:\n    cmd: python gpu_step.py {g}\n    deps: [gpu_step.py]\n    outs: [out/{g}.txt]\n"
    "    meta: {gpu: true}\n" for g in ("g1", "g2", "g3", "g4"))


@_scenario
def _gpu_slots_count_the_gpus_declared_across_hosts(lab: Lab, serial: dict) -> dict:
    tmp = lab.tmp / "gpus"
    env = state_env(tmp / "home")
    source = _repo(tmp / "source", {"gpu_step.py": GPU_STEP, "dvc.yaml": GPU_DVC}, env)
    workspace, remote, env = _workspace(lab, "gpus-run", source)
    log = tmp / "gpu.log"
    server = lab.server("gpus")
    deployment = lab.deploy(server, "gpus")
    b, c = lab.hosts["b-2gpus"], lab.hosts["c-1gpu"]
    steady = dict(GPU_LOG=str(log), PREFECT_WORKER_HEARTBEAT_SECONDS=str(STEADY_HEARTBEAT_S))  # no fault staged
    lab.start_worker(server, b, "gpus", limit=0, gpus=2, **steady)  # GPU stages only
    lab.start_worker(server, c, "gpus", limit=0, gpus=1, **steady)
    _online(server, "gpus", {f"{b.name}-gpu", f"{c.name}-gpu"})

    def limit():
        from prefect.exceptions import ObjectNotFound

        with server.client() as client:
            try:
                return client.read_global_concurrency_limit_by_name(hosts.GPU_LIMIT)
            except ObjectNotFound:  # no host has synced it yet
                return None
    _wait("the gpu limit at 3", lambda: limit() is not None and limit().limit == 3, 60)
    with server.client() as client:
        declared = hosts.online_gpus(client, "gpus")
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], limit().active_slots)
            time.sleep(0.2)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run = _coordinate(lab, server, "gpus", _pool_args(lab, deployment, workspace, remote), workspace)
    finally:
        done.set()
        watcher.join()
    status = _dvc("status", cwd=workspace, env=env)
    lab.stop_workers(c)  # C leaves: it withdraws its GPU
    with server.client() as client:
        after = dict(limit=limit().limit, declared=hosts.online_gpus(client, "gpus"))
    return dict(run, declared=declared, peak=peak[0], log=log, status=status, after=after)


def test_gpu_slots_count_the_gpus_declared_across_hosts(scenarios):
    """B declares two GPUs and C one: the `gpu` limit is 3 and three of its slots are held at once; four GPU stages
    never run more than three at once, each on a device of its own host; when C leaves, the limit drops to 2."""
    run = scenarios["test_gpu_slots_count_the_gpus_declared_across_hosts"].result()
    assert run["rc"] == 0, run["out"][-6000:]
    assert run["declared"] == {"b-2gpus-gpu": 2, "c-1gpu-gpu": 1}
    spans, lines = {}, run["log"].read_text().splitlines()
    for line in lines:
        name, what, worker, device, t = line.split()
        spans.setdefault(name, {"worker": worker, "device": device})[what] = float(t)
    assert set(spans) == {"g1", "g2", "g3", "g4"}
    # no fault is staged, so no stage runs twice (a live worker taken for lost would submit its stage again)
    assert len(lines) == 2 * len(spans), "\n".join(lines)
    devices = {"b-2gpus-gpu": {"0", "1"}, "c-1gpu-gpu": {"0"}}
    assert all(s["device"] in devices[s["worker"]] for s in spans.values())

    def running_at(t):
        return [s for s in spans.values() if s["start"] <= t < s["end"]]
    assert max(len(running_at(s["start"])) for s in spans.values()) == 3  # three GPUs: three at once, never four
    for s in spans.values():  # and on one host never one device twice
        for worker in devices:
            here = [r["device"] for r in running_at(s["start"]) if r["worker"] == worker]
            assert len(here) == len(set(here))
    assert run["peak"] == 3
    assert "up to date" in run["status"]
    assert run["after"] == dict(limit=2, declared={"b-2gpus-gpu": 2})
