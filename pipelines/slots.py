"""What a stage holds while it runs: cores and memory of this machine (``CoreSlots``), and a GPU (a slot of the
Prefect global concurrency limit ``gpu``, sized to the GPUs; ``CUDA_VISIBLE_DEVICES`` set to the one held)."""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading

from prefect.concurrency.sync import concurrency

from pipelines import hosts
from pipelines.dag import StageNode

__all__ = ["GPU_LIMIT", "CoreSlots", "gpu_slot", "gpu_slots"]

GPU_LIMIT = hosts.GPU_LIMIT


class CoreSlots:
    """Free cores and memory; a stage waits until the cores and the memory it declares are free.

    Written here because Prefect's concurrency limits live on the API server and poll, while these are one
    machine's resources. Waiting stages are served first-fit by priority, then arrival: the first request that
    fits goes first, so a one-core stage may start beside a running one while a two-core stage waits for both.
    The flow gives a stage the length of the longest chain of stages that wait on it, in declared minutes
    (``meta.minutes``, 1 by default), so a long chain (KALM's data → grounding → imagination → offline RL →
    evaluation) or a long stage (GLAM's 13-minute training seeds) starts early instead of last.
    Memory (``meta.mem_gib``, a stage's measured peak) keeps two large stages from running side by side.
    """

    def __init__(self, total: int, mem_gib: float = float("inf")):
        if total < 1:
            raise ValueError(f"cpus must be >= 1, got {total}")
        if mem_gib <= 0:
            raise ValueError(f"mem_gib must be > 0, got {mem_gib}")
        self.total = total
        self.mem_gib = mem_gib
        self._free = total
        self._free_mem = mem_gib
        self._waiting: list[tuple[int, int, object, int, float]] = []  # (-priority, arrival, ticket, cpus, GiB)
        self._arrivals = itertools.count()
        self._cond = threading.Condition()

    def _granted(self, ticket: object) -> bool:
        for _, _, t, n, mem in sorted(self._waiting, key=lambda w: w[:2]):
            # A stage larger than the whole budget runs alone rather than never.
            if n <= self._free and (mem <= self._free_mem or self._free_mem == self.mem_gib):
                return t is ticket
        return False

    @contextlib.contextmanager
    def hold(self, n: int, mem_gib: float = 0.0, priority: int = 0):
        n = min(n, self.total)
        ticket = object()
        with self._cond:
            self._waiting.append((-priority, next(self._arrivals), ticket, n, mem_gib))
            self._cond.wait_for(lambda: self._granted(ticket))
            self._waiting = [w for w in self._waiting if w[2] is not ticket]
            self._free -= n
            self._free_mem -= mem_gib
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._free += n
                self._free_mem += mem_gib
                self._cond.notify_all()


@contextlib.contextmanager
def gpu_slot(gpu: bool, free_gpus: queue.Queue | None, env: dict[str, str]):
    held: str | None = None
    if gpu and free_gpus is not None:
        slot = concurrency(GPU_LIMIT, occupy=1, strict=True)
        slot.__enter__()
        held = free_gpus.get()  # the limit guarantees a free index is there
        env["CUDA_VISIBLE_DEVICES"] = held
    elif gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPUs configured: the stage runs on CPU
    try:
        yield held
    finally:
        if held is not None:
            free_gpus.put(held)
            slot.__exit__(None, None, None)


def gpu_slots(nodes: list[StageNode], gpus: int | None) -> queue.Queue | None:
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    if gpus <= 0 or not any(n.gpu for n in nodes):
        return None
    _ensure_gpu_limit(gpus)
    free_gpus: queue.Queue = queue.Queue()
    for i in range(gpus):
        free_gpus.put(str(i))
    return free_gpus


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
