"""Prefect flow that runs the DVC pipeline stage by stage.

It reads the DAG from dvc.yaml (through DVC's own index, foreach/matrix items included), submits one task
per stage in dependency order, and each task runs ``dvc repro --single-item <stage>``, so DVC still decides
what is stale and caches what it runs. DVC allows one ``repro`` per workspace (its repository lock), so the
tasks of one flow run take turns on a workspace lock; for several stages at once, run flows in separate
clones (one Prefect worker per clone or machine) that share artifacts through the DVC remote.

Stages with ``meta: {gpu: true}`` take a slot of the Prefect global concurrency limit ``gpu`` (sized to the
number of GPUs; created if missing) and get ``CUDA_VISIBLE_DEVICES`` for the GPU they hold. Transient
failures (e.g. a lock held by another process) are retried.

Run: ``python pipelines/reproduce.py [--stages glam_eval ...] [--gpus N]`` (ephemeral Prefect, no server),
or against ``make prefect-ui`` with ``PREFECT_API_URL=http://127.0.0.1:4200/api``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.concurrency.sync import concurrency

ROOT = Path(__file__).resolve().parents[1]
GPU_LIMIT = "gpu"
_workspace_lock = threading.Lock()  # DVC's repository lock admits one repro per workspace


@dataclass(frozen=True)
class StageNode:
    name: str
    upstream: tuple[str, ...]
    gpu: bool


def read_dag(root: Path = ROOT, targets: list[str] | None = None) -> list[StageNode]:
    """Stages of dvc.yaml in dependency order, restricted to ``targets`` and their upstream stages."""
    import networkx as nx
    from dvc.repo import Repo

    # Stage addresses are relative to the working directory: read the index from the repository root.
    with contextlib.chdir(root), Repo(str(root)) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        stages = {s.addressing: s for s in graph.nodes if s.addressing != "dvc.yaml" and s.cmd}
        order = [s for s in reversed(list(nx.topological_sort(graph))) if s.addressing in stages]
        if targets:
            unknown = [t for t in targets if t not in stages and not any(a.startswith(f"{t}@") for a in stages)]
            if unknown:
                raise ValueError(f"unknown stage(s) {unknown}; known: {sorted(stages)}")
            wanted = {s for s in stages.values() if s.addressing in targets or s.addressing.split("@")[0] in targets}
            for s in list(wanted):
                wanted |= nx.descendants(graph, s)
            order = [s for s in order if s in wanted]
        return [
            StageNode(
                name=s.addressing,
                upstream=tuple(d.addressing for d in graph.successors(s) if d.addressing in stages),
                gpu=bool((s.meta or {}).get("gpu", False)),
            )
            for s in order
        ]


def _ensure_gpu_limit(n_gpus: int) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            current = client.read_global_concurrency_limit_by_name(GPU_LIMIT)
            if current.limit != n_gpus:
                client.update_global_concurrency_limit(GPU_LIMIT, GlobalConcurrencyLimitUpdate(limit=n_gpus))
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=GPU_LIMIT, limit=n_gpus))


@task(retries=2, retry_delay_seconds=15, task_run_name="dvc:{name}")
def run_stage(name: str, gpu: bool, free_gpus: queue.Queue | None, root: str = str(ROOT)) -> str:
    """``dvc repro --single-item`` for one stage; a GPU stage holds a GPU slot while it runs."""
    log = get_run_logger()
    # Stage commands say `python`: make it this interpreter (the project's venv), as `make` does.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    held: str | None = None
    if gpu and free_gpus is not None:
        slot = concurrency(GPU_LIMIT, occupy=1, strict=True)
        slot.__enter__()
        held = free_gpus.get()  # the limit guarantees a free index is there
        env["CUDA_VISIBLE_DEVICES"] = held
    elif gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPUs configured: the stage runs on CPU
    try:
        with _workspace_lock:
            log.info("dvc repro --single-item %s%s", name, f" on GPU {held}" if held is not None else "")
            proc = subprocess.run(
                [sys.executable, "-m", "dvc", "repro", "--single-item", name],
                cwd=root, env=env, capture_output=True, text=True,
            )
        if proc.stdout:
            log.info(proc.stdout[-4000:])
        if proc.returncode != 0:
            raise RuntimeError(f"stage {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return "cached" if "didn't change, skipping" in proc.stdout else "ran"
    finally:
        if held is not None:
            free_gpus.put(held)
            slot.__exit__(None, None, None)


@flow(name="llmrl-reproduce", log_prints=True)
def reproduce(stages: list[str] | None = None, gpus: int | None = None, root: str = str(ROOT)) -> dict[str, str]:
    """Run the DVC DAG (or the named stages and their upstream) as Prefect tasks in dependency order."""
    nodes = read_dag(Path(root), stages)
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    free_gpus: queue.Queue | None = None
    if gpus > 0 and any(n.gpu for n in nodes):
        _ensure_gpu_limit(gpus)
        free_gpus = queue.Queue()
        for i in range(gpus):
            free_gpus.put(str(i))
    futures = {}
    for node in nodes:
        futures[node.name] = run_stage.with_options(tags=["gpu"] if node.gpu else []).submit(
            node.name, node.gpu, free_gpus, root, wait_for=[futures[u] for u in node.upstream if u in futures]
        )
    return {name: fut.result() for name, fut in futures.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the llmrl DVC pipeline as a Prefect flow.")
    parser.add_argument("--stages", nargs="*", default=None, help="stages to bring up to date (default: all)")
    parser.add_argument("--gpus", type=int, default=None, help="GPU slots (default: the GPUs torch sees)")
    parser.add_argument("--root", default=str(ROOT), help="the DVC repository (default: this project)")
    args = parser.parse_args(argv)
    result = reproduce(stages=args.stages, gpus=args.gpus, root=args.root)
    for name, status in result.items():
        print(f"{name}: {status}")


if __name__ == "__main__":
    main()
