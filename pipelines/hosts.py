"""The machines of the pool route (``pipelines/reproduce.py --deployment``): a worker host, its GPUs, and a stage's flow run
followed to its end by the coordinator.

A host joins the pool with ``python pipelines/hosts.py worker --pool POOL --name NAME --limit K [--gpus N]``: a
Prefect process worker on the pool's ``default`` work queue that runs up to K stages at once and, with GPUs, a second
one named ``NAME-gpu`` on the pool's ``gpu`` queue that runs up to N, one per GPU. The host declares its GPUs to the
Prefect API (a variable per GPU worker) and withdraws them when it stops; the global concurrency limit ``gpu`` is
the sum of the GPUs declared by the pool's online GPU workers, so a coordinator holds one of its slots for each GPU
stage it has in flight anywhere in the pool. On the host, a GPU stage takes one of the declared devices that no other
stage holds (a file lock per device) and sees it alone in ``CUDA_VISIBLE_DEVICES``.

Another machine fails in ways a process beside the coordinator does not: it dies, or its link does, mid-stage, and
nobody reports the flow run's end. The Prefect server marks a worker offline after three missed heartbeats
(``PREFECT_WORKER_HEARTBEAT_SECONDS``, 30 by default; checked every ``PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS``,
15), and the flow run keeps the name of the worker that took it (its ``prefect.worker.name`` label). The
coordinator follows each stage's flow run: when the worker running it goes offline, it marks the run crashed and
submits it once more for another worker (:class:`WorkerLost` if that one is lost too, or if no worker takes it); a
run that waits while no worker for its queue is online for ``no_worker_s`` fails with :class:`NoWorkerOnline`
instead of waiting for ever. Neither touches the coordinator's workspace: it takes a stage's result only from a
completed run, through the DVC remote, where DVC writes each object under a temporary name and renames it into place,
so a transfer cut short leaves no object with partial content.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_QUEUE",
    "DEVICES_ENV",
    "GPU_LIMIT",
    "GPU_QUEUE",
    "GpuDeclaration",
    "NoWorkerOnline",
    "PoolError",
    "WORKER_LABEL",
    "WorkerLost",
    "declare_gpus",
    "declared_gpus",
    "hold_device",
    "lock_first_free",
    "main",
    "online_gpus",
    "online_workers",
    "retry_unless_pool_error",
    "run_on_pool",
    "serve",
    "sync_gpu_limit",
    "withdraw_gpus",
    "worker_devices",
]

GPU_LIMIT = "gpu"  # the global concurrency limit GPU stages hold a slot of (also the local route's)
GPU_QUEUE = "gpu"  # the work queue GPU stages go to, polled only by GPU workers
DEFAULT_QUEUE = "default"  # Prefect's own first queue of a pool; every host's worker polls it
DEVICES_ENV = "LLMRL_WORKER_GPUS"  # the device ids a GPU worker gives its flow runs, comma-separated
WORKER_LABEL = "prefect.worker.name"  # the label a Prefect worker puts on the flow runs it takes
_DECLARATION_TAG = "llmrl-gpus"


class PoolError(RuntimeError):
    """The pool could not run a stage (its worker was lost, or no worker took it): not the stage's own failure."""


class WorkerLost(PoolError):
    """The worker running a stage's flow run went offline (no heartbeat), and no other worker finished the stage."""


class NoWorkerOnline(PoolError):
    """No worker of the pool for a stage's work queue was online for ``no_worker_s`` while its run waited."""


@dataclass(frozen=True)
class GpuDeclaration:
    """The GPUs a worker of ``pool`` offers: ``devices`` are the ids its stages see in ``CUDA_VISIBLE_DEVICES``."""

    pool: str
    worker: str
    devices: tuple[str, ...]


def _variable_name(pool: str, worker: str) -> str:
    # Variable names admit letters, digits, dashes and underscores; pool and worker names (host names) need not.
    return "llmrl_gpus_" + hashlib.sha256(f"{pool}\0{worker}".encode()).hexdigest()[:20]


def declare_gpus(client, pool: str, worker: str, devices: list[str] | tuple[str, ...]) -> None:
    """Record on the Prefect API that ``worker`` of ``pool`` runs GPU stages on ``devices`` (replacing any earlier
    declaration of that worker)."""
    from prefect.client.schemas.actions import VariableCreate, VariableUpdate
    from prefect.exceptions import ObjectAlreadyExists

    if not devices:
        raise ValueError(f"worker {worker!r}: a GPU declaration needs at least one device")
    name = _variable_name(pool, worker)
    value = {"pool": pool, "worker": worker, "devices": list(devices)}
    try:
        client.create_variable(VariableCreate(name=name, value=value, tags=[_DECLARATION_TAG]))
    except ObjectAlreadyExists:
        client.update_variable(VariableUpdate(name=name, value=value, tags=[_DECLARATION_TAG]))


def withdraw_gpus(client, pool: str, worker: str) -> None:
    """Remove ``worker``'s GPU declaration (none is fine)."""
    from prefect.exceptions import ObjectNotFound

    with contextlib.suppress(ObjectNotFound):
        client.delete_variable_by_name(_variable_name(pool, worker))


def declared_gpus(client, pool: str) -> list[GpuDeclaration]:
    """Every GPU declaration of ``pool``'s workers, online or not."""
    found = []
    for variable in client.read_variables():
        value = variable.value
        if _DECLARATION_TAG in (variable.tags or []) and isinstance(value, dict) and value.get("pool") == pool:
            found.append(GpuDeclaration(pool, str(value["worker"]), tuple(str(d) for d in value["devices"])))
    return found


def online_workers(client, pool: str) -> set[str]:
    """The names of ``pool``'s workers that are online now (a heartbeat within three intervals)."""
    from prefect.client.schemas.objects import WorkerStatus

    return {w.name for w in client.read_workers_for_work_pool(pool) if w.status == WorkerStatus.ONLINE}


def online_gpus(client, pool: str) -> dict[str, int]:
    """GPUs per worker, for the declared workers of ``pool`` that are online now (a heartbeat within three
    intervals): a host that died or lost its link stops counting without having withdrawn anything."""
    online = online_workers(client, pool)
    return {d.worker: len(d.devices) for d in declared_gpus(client, pool) if d.worker in online}


def sync_gpu_limit(client, pool: str) -> int:
    """Set the ``gpu`` concurrency limit to the GPUs of ``pool``'s online workers (created if missing); that sum.

    A pool with no GPU online leaves the limit as it is: its GPU stages run on CPU without a slot, and a CPU-only
    pool must not take the slots of a GPU pool on the same Prefect server (the limit is the server's, so one pool
    per server has GPUs)."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    total = sum(online_gpus(client, pool).values())
    if total == 0:
        return 0
    try:
        if client.read_global_concurrency_limit_by_name(GPU_LIMIT).limit != total:
            client.update_global_concurrency_limit(GPU_LIMIT, GlobalConcurrencyLimitUpdate(limit=total))
    except ObjectNotFound:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=GPU_LIMIT, limit=total))
    return total


# --- on a worker host ---


def worker_devices(environ: dict[str, str] | None = None) -> list[str]:
    """The device ids this host's GPU worker declared (``LLMRL_WORKER_GPUS``); none for a CPU worker."""
    text = (os.environ if environ is None else environ).get(DEVICES_ENV, "")
    return [d.strip() for d in text.split(",") if d.strip()]


@contextlib.contextmanager
def lock_first_free(folder: Path, names: Iterable[str]):
    """The first of ``names`` whose ``folder/<name>.lock`` no other process holds, locked (an exclusive ``flock``)
    until the block ends; None where every one is held (``names`` may be endless: then it never is)."""
    for name in names:
        handle = open(folder / f"{name}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield name
        finally:
            handle.close()
        return
    yield None


@contextlib.contextmanager
def hold_device(folder: Path, devices: list[str], poll_s: float = 0.2):
    """One of ``devices`` that no other stage on this host holds (an exclusive lock on ``folder/gpu-<id>.lock`` while
    the stage runs); waits while every one is held. The GPU worker's limit is its number of devices, so one is
    normally free at once."""
    if not devices:
        raise ValueError(f"no GPU devices declared on this host (set {DEVICES_ENV} or start the worker with --gpus)")
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        with lock_first_free(folder, [f"gpu-{d}" for d in devices]) as held:
            if held is not None:
                yield held.removeprefix("gpu-")
                return
        time.sleep(poll_s)


# --- on the coordinator ---


def retry_unless_pool_error(task, task_run, state) -> bool:
    """A Prefect ``retry_condition_fn``: a task retries its own failures but not the pool's, which
    :func:`run_on_pool` already retried on another worker or found no worker to take."""
    return not isinstance(state.data, PoolError)


def _seconds_since(moment: datetime.datetime | None) -> float:
    if moment is None:
        return float("inf")
    return (datetime.datetime.now(datetime.timezone.utc) - moment).total_seconds()


def _serves(worker: str, queue: str, gpu_workers: set[str]) -> bool:
    # A host's GPU worker (declared) polls only the gpu queue, its other worker only the default one.
    return (worker in gpu_workers) == (queue == GPU_QUEUE)


def _follow(client, run, stage: str, pool: str, queue: str, no_worker_s: float, poll_s: float):
    """Wait for flow run ``run`` to end; raise :class:`WorkerLost` (after marking it crashed) when the worker that
    took it goes offline, :class:`NoWorkerOnline` (after cancelling it) when, while it waited, no worker that polls
    ``queue`` was online for ``no_worker_s``. Liveness is Prefect's: a heartbeat within three intervals."""
    from prefect.client.schemas.objects import WorkerStatus
    from prefect.states import Cancelled, Crashed

    served = time.monotonic()  # the last moment a worker for the run's queue was online
    while True:
        run = client.read_flow_run(run.id)
        if run.state is not None and run.state.is_final():
            return run
        workers = {w.name: w for w in client.read_workers_for_work_pool(pool)}
        taker = (run.labels or {}).get(WORKER_LABEL)
        if taker is not None:
            found = workers.get(taker)
            if found is None or found.status != WorkerStatus.ONLINE:
                silent = _seconds_since(found.last_heartbeat_time) if found else float("inf")
                message = (f"stage {stage}: worker {taker!r} of pool {pool!r} went offline (no heartbeat for "
                           f"{silent:.0f} s) while running flow run {run.name}")
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                raise WorkerLost(message + "; marked it crashed")
        else:  # not taken yet (or taken by a worker that died before labelling it)
            gpu_workers = {d.worker for d in declared_gpus(client, pool)}
            if any(w.status == WorkerStatus.ONLINE and _serves(name, queue, gpu_workers)
                   for name, w in workers.items()):
                served = time.monotonic()
            elif time.monotonic() - served > no_worker_s:
                message = (f"stage {stage}: no worker of pool {pool!r} for queue {queue!r} was online in the last "
                           f"{no_worker_s:g} s (no_worker_s), so nothing took flow run {run.name}")
                client.set_flow_run_state(run.id, Cancelled(message=message), force=True)
                raise NoWorkerOnline(message + "; cancelled it")
        time.sleep(poll_s)


def run_on_pool(deployment: str, parameters: dict, stage: str, gpu: bool = False, no_worker_s: float = 120.0,
                poll_s: float = 2.0, log=None):
    """Run one stage as a flow run of ``deployment`` and return the ended flow run (completed, failed or crashed by
    the stage itself).

    A GPU stage holds a slot of the ``gpu`` limit (first set to the GPUs of the pool's online workers) and goes to the
    pool's ``gpu`` queue; with no GPU online anywhere in the pool it goes to the deployment's queue and runs on CPU.
    A run whose worker is lost is marked crashed and submitted once more; see :func:`_follow` for the errors.
    """
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.deployments import run_deployment

    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        pool = found.work_pool_name
        gpus = sync_gpu_limit(client, pool) if gpu else 0
        queue = GPU_QUEUE if gpus else (found.work_queue_name or DEFAULT_QUEUE)
        lost: WorkerLost | None = None
        with concurrency(GPU_LIMIT, occupy=1, strict=True) if gpus else contextlib.nullcontext():
            while True:
                run = run_deployment(deployment, parameters=parameters, timeout=0,
                                     work_queue_name=queue if gpus else None)
                try:
                    return _follow(client, run, stage, pool, queue, no_worker_s, poll_s)
                except PoolError as exc:
                    if lost is not None:
                        raise WorkerLost(f"{lost}; its second run: {exc}") from exc
                    if not isinstance(exc, WorkerLost):
                        raise
                    lost = exc
                    if log is not None:
                        log.warning("%s; submitting it once more for another worker", exc)


# --- a worker host's command line ---


def _prefect() -> str:
    return str(Path(sys.executable).parent / "prefect")


def _ensure_pool(client, pool: str, queues: list[str]) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    for queue in queues:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_queue(name=queue, work_pool_name=pool)


def serve(pool: str, name: str, limit: int, devices: list[str], ready_s: float = 120.0) -> int:
    """Run this host's workers of ``pool`` until one of them exits or this process is asked to stop (SIGTERM,
    SIGINT); their exit status. ``limit`` CPU stages at once (0: GPU stages only). With ``devices``, the GPU worker
    ``<name>-gpu`` declares them, and the ``gpu`` limit is synced once it is online and again when it stops."""
    from prefect.client.orchestration import get_client

    if limit < 0 or (limit == 0 and not devices):
        raise ValueError(f"--limit must be >= 1 (0 only on a host that offers GPUs), got {limit}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"--devices must not repeat a device, got {devices}")
    gpu_worker = f"{name}-gpu"
    with get_client(sync_client=True) as client:
        _ensure_pool(client, pool, [DEFAULT_QUEUE] + ([GPU_QUEUE] if devices else []))
        if devices:
            declare_gpus(client, pool, gpu_worker, devices)

    def start(worker: str, queue: str, n: int, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen([_prefect(), "worker", "start", "--pool", pool, "--type", "process", "--name", worker,
                                 "--work-queue", queue, "--limit", str(n)], env=env)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cpu_env = {k: v for k, v in os.environ.items() if k != DEVICES_ENV}
    workers = [start(name, DEFAULT_QUEUE, limit, cpu_env)] if limit else []
    try:
        if devices:
            gpu_env = dict(os.environ, **{DEVICES_ENV: ",".join(devices)})
            workers.append(start(gpu_worker, GPU_QUEUE, len(devices), gpu_env))
            deadline = time.monotonic() + ready_s
            with get_client(sync_client=True) as client:
                while gpu_worker not in online_workers(client, pool):
                    if time.monotonic() > deadline or stop.is_set() or workers[-1].poll() is not None:
                        raise RuntimeError(f"GPU worker {gpu_worker!r} of pool {pool!r} did not come online "
                                           f"within {ready_s:g} s")
                    time.sleep(0.5)
                print(f"{gpu_worker}: {len(devices)} GPU(s) declared; pool {pool!r} now has "
                      f"{sync_gpu_limit(client, pool)} in limit {GPU_LIMIT!r}", flush=True)
        while not stop.is_set() and all(w.poll() is None for w in workers):
            stop.wait(1.0)
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a Prefect worker once hung in its SIGTERM handling
                w.kill()
                w.wait()
        if devices:
            with get_client(sync_client=True) as client:
                withdraw_gpus(client, pool, gpu_worker)
                sync_gpu_limit(client, pool)
    return max((w.returncode or 0 for w in workers), default=0) if not stop.is_set() else 0


def _devices(args) -> list[str]:
    if args.devices is not None and args.gpus is not None:
        raise SystemExit("give --gpus or --devices, not both")
    if args.devices is not None:
        return [d.strip() for d in args.devices.split(",") if d.strip()]
    if args.gpus is not None and args.gpus < 0:
        raise SystemExit(f"--gpus must be >= 0, got {args.gpus}")
    return [str(i) for i in range(args.gpus or 0)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A worker host of the llmrl pool (pipelines/reproduce.py --deployment).")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="run this host's Prefect workers of a pool")
    worker.add_argument("--pool", required=True, help="the work pool of the `stage` deployment (prefect.yaml)")
    worker.add_argument("--name", default=socket.gethostname(),
                        help="this host's worker name, unique in the pool (default: the host name)")
    worker.add_argument("--limit", type=int, default=1,
                        help="CPU stages this host runs at once (default 1; 0 with --gpus: GPU stages only)")
    worker.add_argument("--gpus", type=int, default=None, help="GPUs this host offers: devices 0..N-1")
    worker.add_argument("--devices", default=None, help="or the GPU device ids it offers, comma-separated")
    args = parser.parse_args(argv)
    return serve(args.pool, args.name, args.limit, _devices(args))


if __name__ == "__main__":
    sys.exit(main())
