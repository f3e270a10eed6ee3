"""Prefect flow that runs the DVC pipeline stage by stage, serially in this workspace or in parallel clones.

It reads the DAG from dvc.yaml (through DVC's own index, foreach/matrix items included) and submits one task
per stage in dependency order. DVC still decides what is stale and caches what runs: every task is a
``dvc repro --single-item <stage>``.

Serial (``--workers 0``, the default): the tasks take turns on this workspace, because DVC's repository lock
admits one ``repro`` per workspace.

Parallel (``--workers N``): N clones of this workspace (``.cache/workers/w<i>``, synced to the workspace's
files, committed or not, before each stage) run independent stages at the same time. A clone gets the
stage's inputs from DVC, runs the stage and leaves its outputs and DVC's run-cache entry where this
workspace can read them; this workspace then runs ``dvc repro --single-item <stage>`` itself, which DVC
answers from the run-cache ("is cached - skipping run, checking out outputs"), so it ends with the same
``dvc.lock``, metrics and outputs as a serial run and never computes a stage twice. A stage DVC keeps no
run-cache for (a ``persist`` out) also runs in a clone, from the persisted outputs this workspace records; this
workspace then takes the clone's ``dvc.lock`` entry for it and checks its outputs out. So no stage computes
while holding this workspace's DVC lock, which every other stage needs to start and to finish. On one machine the
clones share this workspace's DVC cache; with ``--remote NAME`` they pull inputs from and push outputs and
run-cache to that remote instead (the route for clones on other machines), and this workspace pulls them
back with ``dvc repro --pull`` (NAME must then be its default remote).

Resources: a stage's ``meta: {cpus: k}`` (default 1) is the number of cores it keeps busy (torch threads
or its own worker processes); stages run side by side only while their cores fit in ``--cpus`` (default:
this machine's). Stages with ``meta: {gpu: true}`` take a slot of the Prefect global concurrency limit
``gpu`` (sized to the number of GPUs; created if missing) and get ``CUDA_VISIBLE_DEVICES`` for the GPU they
hold. Transient failures (e.g. a lock held by another process) are retried. With ``--deployment``, the limit counts the
GPUs the pool's workers declare, and a lost worker's stage runs again elsewhere (``pipelines/hosts.py``,
docs/scale-out.md).

Prefect UI: each stage's task logs what the stage printed (the tail of its stdout and stderr) and publishes a
markdown artifact ``stage-<name>`` with its metrics (its ``metrics:`` files in dvc.yaml), whether it ran or was
up to date, and its wall time; each run of the flow adds a version to that artifact.

The parts, one module each: the DAG (``pipelines.dag``), core, memory and GPU slots (``pipelines.slots``), worker
clones and taking their results back (``pipelines.clones``), DVC as a subprocess and this workspace's lock
(``pipelines.dvc_run``), the stage artifacts (``pipelines.artifacts``); this module is the flow itself: a Prefect task
per stage (here, in a clone, or on the pool) and the flow that submits them in dependency order.

Run: ``python pipelines/reproduce.py [--stages glam_eval ...] [--gpus N] [--workers N] [--remote NAME]``
(ephemeral Prefect, no server), or against ``make prefect-ui`` with
``PREFECT_API_URL=http://127.0.0.1:4200/api``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (`python pipelines/reproduce.py`): the `pipelines` package by name
    sys.path.insert(0, str(ROOT))

from pipelines import hosts  # noqa: E402
from pipelines.artifacts import publish  # noqa: E402
from pipelines.clones import (apply_overlay, dvc_remote_url, restore, run_in_clone, slot_lock, sync_clone,  # noqa: E402
                              workspace_overlay)
from pipelines.dag import read_dag  # noqa: E402
from pipelines.dvc_run import WORKSPACE_LOCK, dvc, stage_env, up_to_date  # noqa: E402
from pipelines.slots import CoreSlots, gpu_slot, gpu_slots  # noqa: E402


@task(retries=2, retry_delay_seconds=15, task_run_name="dvc:{name}", cache_policy=NO_CACHE)
def run_stage(name: str, gpu: bool, free_gpus: queue.Queue | None, root: str = str(ROOT), cpus: int = 1,
              cores: CoreSlots | None = None, mem_gib: float = 0.0, metrics: tuple[str, ...] = ()) -> str:
    """``dvc repro --single-item`` for one stage in this workspace; a GPU stage holds a GPU slot."""
    log = get_run_logger()
    env = stage_env()
    asked = time.monotonic()
    with cores.hold(cpus, mem_gib) if cores else contextlib.nullcontext(), gpu_slot(gpu, free_gpus, env) as held, \
            WORKSPACE_LOCK:
        started = time.monotonic()
        log.info("dvc repro --single-item %s%s", name, f" on GPU {held}" if held is not None else "")
        out = dvc(["repro", "--single-item", name], root, env, log)
    status = "cached" if "didn't change, skipping" in out else "ran"
    publish(name, "ran in this workspace" if status == "ran" else "up to date (not run)",
             time.monotonic() - started, started - asked, root, metrics, log)
    return status


@task(retries=1, retry_delay_seconds=15, task_run_name="dvc:{name}", cache_policy=NO_CACHE)
def run_stage_in_clone(name: str, upstream: tuple[str, ...], gpu: bool, cpus: int, free_gpus: queue.Queue | None,
                       clones: queue.Queue, cores: CoreSlots, root: str, remote: str | None,
                       mem_gib: float = 0.0, run_cacheable: bool = True, priority: int = 0,
                       metrics: tuple[str, ...] = ()) -> str:
    """Run one stage in a free clone, then restore its result in this workspace from DVC's run-cache (or, for a
    stage with a ``persist`` output, from the clone's dvc.lock entry), so no stage holds this workspace's DVC
    lock while it computes."""
    log = get_run_logger()
    env = stage_env()
    asked = time.monotonic()
    if up_to_date(name, root, env):  # its upstream stages are done; a second of DVC needs no core slot
        publish(name, "up to date (not run)", time.monotonic() - asked, 0.0, root, metrics, log)
        return "cached"
    workers_dir = Path(root) / ".cache" / "workers"
    workers_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as taken:  # the clone stays taken until this workspace holds the result (below)
        # Cores first, then a clone: a stage waiting for cores must not sit on a clone another stage could use.
        with cores.hold(cpus, mem_gib, priority):
            taken.callback(clones.put, clones.get())
            # the first clone no process holds (a file lock): another flow run on this host takes from the same
            # folder, and two stages synced into one clone would delete each other's files
            clone = workers_dir / f"w{taken.enter_context(slot_lock(workers_dir))}"
            with gpu_slot(gpu, free_gpus, env) as held:
                started = time.monotonic()
                with WORKSPACE_LOCK:  # a consistent snapshot: no restore writes dvc.lock meanwhile
                    sync_clone(Path(root), clone, remote)
                log.info("dvc repro --single-item %s in %s%s", name, clone.name,
                         f" on GPU {held}" if held is not None else "")
                out = run_in_clone(clone, name, upstream, remote, env, run_cacheable, log)
        # The cores are free again: the restore (a few seconds of DVC, one at a time) need not hold back the
        # next stage. The clone stays taken until this workspace holds the result: a sync before that would
        # find the stage's outputs unknown to this workspace's .gitignore files and delete them from the clone.
        status = restore(name, root, remote, env, str(clone), ran="didn't change, skipping" not in out,
                          clone=None if run_cacheable else clone)
        how = "DVC's run-cache" if run_cacheable else "the clone's dvc.lock entry"
        publish(name, f"ran in clone {clone.name}, restored here from {how}" if status == "ran"
                 else "up to date (not run)", time.monotonic() - started, started - asked, root, metrics, log)
        return status


@flow(name="llmrl-stage", log_prints=True)
def run_stage_flow(stage: str, upstream: list[str], git_url: str, commit: str, files: dict[str, str | None],
                   remote: str, remote_url: str | None = None, gpu: bool = False) -> str:
    """One stage on a worker (any machine with this project set up and a Prefect worker on the pool).

    Checks out the coordinator's commit in a clone of its own (under ``$LLMRL_WORKER_DIR``, by default
    ``.cache/stage-workers/`` of the worker's folder; one per concurrent run), applies the coordinator's uncommitted changes (``files``),
    pulls the stage's inputs from the DVC remote, runs the stage and pushes its outputs and run-cache entry.
    A ``gpu`` stage runs on one of the GPUs the host's worker declared (``pipelines/hosts.py``), on CPU without one.
    """
    log = get_run_logger()
    env = stage_env()
    work = Path(os.environ.get("LLMRL_WORKER_DIR") or Path.cwd() / ".cache" / "stage-workers")
    base = work / hashlib.sha256(git_url.encode()).hexdigest()[:12]
    base.mkdir(parents=True, exist_ok=True)
    with slot_lock(base) as slot:
        clone = base / f"clone-{slot}"
        if not (clone / ".git").exists():
            subprocess.run(["git", "clone", "-q", "--no-checkout", git_url, str(clone)], check=True, capture_output=True)
        subprocess.run(["git", "fetch", "-q", "origin", commit], cwd=clone, check=True, capture_output=True)
        subprocess.run(["git", "checkout", "-q", "--force", commit], cwd=clone, check=True, capture_output=True)
        apply_overlay(clone, files)
        lines = ["[core]", f"    remote = {remote}"]
        if remote_url:
            lines += [f"['remote \"{remote}\"']", f"    url = {remote_url}"]
        (clone / ".dvc" / "config.local").write_text("\n".join(lines) + "\n")
        devices = hosts.worker_devices() if gpu else []
        with hosts.hold_device(work / "gpus", devices) if devices else contextlib.nullcontext() as device:
            if gpu:
                env["CUDA_VISIBLE_DEVICES"] = device or ""
            log.info("dvc repro --single-item %s in %s%s", stage, clone, f" on GPU {device}" if device else "")
            out = run_in_clone(clone, stage, upstream, remote, env, log=log)
        return "cached" if "didn't change, skipping" in out else "ran"


@task(retries=1, retry_delay_seconds=15, retry_condition_fn=hosts.retry_unless_pool_error, task_run_name="dvc:{name}",
      cache_policy=NO_CACHE)
def run_stage_on_pool(name: str, upstream: tuple[str, ...], root: str, deployment: str, git_url: str, remote: str,
                      remote_url: str | None, metrics: tuple[str, ...] = (), gpu: bool = False,
                      no_worker_s: float = 120.0) -> str:
    """Run one stage as a flow run of the ``llmrl-stage`` deployment (a worker of its pool picks it up; a GPU stage
    one with a GPU while the pool has any), then restore its result here through the DVC remote. A run whose worker
    goes offline is retried once on another worker; see ``pipelines/hosts.py`` for the errors."""
    log = get_run_logger()
    env = stage_env()
    started = time.monotonic()
    if up_to_date(name, root, env):
        publish(name, "up to date (not run)", time.monotonic() - started, 0.0, root, metrics, log)
        return "cached"
    with WORKSPACE_LOCK:  # a consistent snapshot: no restore writes dvc.lock meanwhile
        commit, files = workspace_overlay(Path(root))
    run = hosts.run_on_pool(deployment, dict(stage=name, upstream=list(upstream), git_url=git_url, commit=commit,
                                             files=files, remote=remote, remote_url=remote_url, gpu=gpu),
                            stage=name, gpu=gpu, no_worker_s=no_worker_s, log=log)
    if not run.state or not run.state.is_completed():
        raise RuntimeError(f"stage {name}: flow run {run.name} of {deployment} ended {run.state}")
    # Whether the worker ran it or found it up to date, this workspace was not: its result is the worker's.
    status = restore(name, root, remote, env, f"flow run {run.name}", ran=True)
    # The stage's output is in that flow run's log (the worker's); its metrics are here now.
    publish(name, f"ran by flow run {run.name} of {deployment}, restored here" if status == "ran"
             else "up to date (not run)", time.monotonic() - started, 0.0, root, metrics, log)
    return status


# Threads only wait (on upstream tasks, slots or subprocesses): one per stage never deadlocks.
@flow(name="llmrl-reproduce", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=256))
def reproduce(stages: list[str] | None = None, gpus: int | None = None, root: str = str(ROOT),
              workers: int = 0, cpus: int | None = None, remote: str | None = None, pool: str | None = None,
              git_url: str | None = None, remote_url: str | None = None,
              mem_gib: float | None = None, no_worker_s: float = 120.0, pipeline: str = "dvc.yaml",
              allow_missing: bool = False) -> dict[str, str]:
    """Run the DVC DAG (or the named stages and their upstream) as Prefect tasks in dependency order.

    ``workers`` > 0 runs up to that many stages at once, each in its own clone, while their ``meta.cpus``
    fit in ``cpus`` cores and their ``meta.mem_gib`` in ``mem_gib`` GiB. ``pool`` (a deployment of
    ``run_stage_flow``, e.g. ``llmrl-stage/stage``) runs every stage as a flow run that the deployment's workers
    pick up, on any machine, exchanging data through the DVC ``remote`` and code through ``git_url`` (default: this
    workspace's path). Either way the workspace ends as after a serial run. In the pool, the ``gpu`` limit counts
    the GPUs its workers declare (``pipelines/hosts.py``); a stage that cannot leave this workspace (no run-cache)
    then runs here on CPU. A stage's run that waits ``no_worker_s`` seconds with no worker for it online fails.
    ``pipeline`` names the pipeline file (study/dvc.yaml: the study); ``allow_missing`` skips the stages done
    elsewhere whose outputs are not here (``read_dag``).
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    if remote is not None and workers == 0 and pool is None:
        raise ValueError("remote is only used with workers > 0 or a pool (they exchange results through it)")
    if pool is not None and remote is None:
        raise ValueError("pool needs remote: flow runs on other machines exchange data through a DVC remote")
    nodes = read_dag(Path(root), stages, pipeline, allow_missing)
    free_gpus = None if pool else gpu_slots(nodes, gpus)
    if pool:
        remote_url = remote_url or dvc_remote_url(Path(root), remote)
    futures = {}
    cores = CoreSlots(cpus or os.cpu_count() or 1, mem_gib or float("inf")) if workers else None
    clones: queue.Queue = queue.Queue()  # how many clones this run may hold at once (which ones: slot_lock)
    for i in range(2 * workers):  # a clone per running stage, and one per stage whose result is being restored
        clones.put(i)
    for node in nodes:
        upstream = [futures[u] for u in node.upstream if u in futures]
        tags = ["gpu"] if node.gpu else []
        if pool and node.run_cacheable:  # the pool's workers hold their machines' cores and GPUs
            futures[node.name] = run_stage_on_pool.with_options(tags=tags).submit(
                node.name, node.upstream, root, pool, git_url or root, remote, remote_url, node.metrics, node.gpu,
                no_worker_s, wait_for=upstream)
        elif workers:
            futures[node.name] = run_stage_in_clone.with_options(tags=tags).submit(
                node.name, node.upstream, node.gpu, node.cpus, free_gpus, clones, cores, root, remote,
                node.mem_gib, node.run_cacheable, node.chain, node.metrics, wait_for=upstream)
        else:  # here, in turn (holding its cores when stages run side by side)
            futures[node.name] = run_stage.with_options(tags=tags).submit(
                node.name, node.gpu, free_gpus, root, node.cpus, cores, node.mem_gib, node.metrics,
                wait_for=upstream)
    return {name: fut.result() for name, fut in futures.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the llmrl DVC pipeline as a Prefect flow.")
    parser.add_argument("--stages", nargs="*", default=None, help="stages to bring up to date (default: all)")
    parser.add_argument("--gpus", type=int, default=None, help="GPU slots (default: the GPUs torch sees)")
    parser.add_argument("--root", default=str(ROOT), help="the DVC repository (default: this project)")
    parser.add_argument("--workers", type=int, default=0,
                        help="stages run at once, each in its own clone (default 0: serially in this workspace)")
    parser.add_argument("--cpus", type=int, default=None,
                        help="cores shared by parallel stages, against their meta.cpus (default: this machine's)")
    parser.add_argument("--mem-gib", type=float, default=None,
                        help="memory shared by parallel stages, against their meta.mem_gib (default: no limit)")
    parser.add_argument("--remote", default=None,
                        help="DVC remote the clones or pool workers exchange results through (default with "
                             "--workers: this workspace's cache)")
    parser.add_argument("--deployment", dest="pool", metavar="DEPLOYMENT", default=None,
                        help="deployment of run_stage_flow whose workers run the stages (e.g. llmrl-stage/stage; "
                             "see prefect.yaml); needs --remote")
    parser.add_argument("--git-url", default=None,
                        help="where pool workers fetch this workspace's commit (default: its path; push first)")
    parser.add_argument("--remote-url", default=None,
                        help="the remote's URL as pool workers must use it (default: the URL in .dvc/config)")
    parser.add_argument("--no-worker-timeout", type=float, default=120.0,
                        help="with --deployment: fail a stage whose run waited this many seconds with no worker for it "
                             "online (default 120)")
    parser.add_argument("--pipeline", default="dvc.yaml",
                        help="the pipeline file whose stages run, with their upstream stages (default dvc.yaml; "
                             "study/dvc.yaml: the study)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="a stage done elsewhere (only its outputs are missing here) is not run unless a "
                             "running stage needs them, as `dvc repro --allow-missing` (make study)")
    args = parser.parse_args(argv)
    result = reproduce(stages=args.stages, gpus=args.gpus, root=args.root, workers=args.workers, cpus=args.cpus,
                       remote=args.remote, pool=args.pool, git_url=args.git_url, remote_url=args.remote_url,
                       mem_gib=args.mem_gib, no_worker_s=args.no_worker_timeout, pipeline=args.pipeline,
                       allow_missing=args.allow_missing)
    for name, status in result.items():
        print(f"{name}: {status}")


if __name__ == "__main__":
    main()
