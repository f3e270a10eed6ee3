"""Independent seeds side by side: one fresh single-process interpreter per worker.

A stage that trains several seeds of a small network would leave the second core idle (one thread per seed is
what makes those runs byte-identical across CPU kernel levels, see README "Reproducibility"). Running the seeds
in ``spawn``-started worker processes keeps every seed exactly as it is alone: nothing is inherited from the
parent (no thread pool, no RNG state), each seed seeds itself. Written by hand because ``concurrent.futures``
already is the library; this only fixes the start method and the error path.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from llmrl.files import atomic_path

__all__ = ["run_seeds", "run_seeds_into"]


def run_seeds(run_seed: Callable[[int], None], seeds: Sequence[int], workers: int) -> None:
    """``run_seed(seed)`` for every seed, ``workers`` at a time (in this process when ``workers`` is 1).

    ``run_seed`` must be picklable (a module-level function or a ``functools.partial`` of one). The first
    seed that raises is re-raised here after the pool shuts down, so the caller publishes nothing.
    """
    if workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers}")
    if workers == 1 or len(seeds) <= 1:
        for seed in seeds:
            run_seed(seed)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(seeds)), mp_context=ctx) as pool:
        futures = [pool.submit(run_seed, seed) for seed in seeds]
        for future in futures:
            future.result()


def run_seeds_into(folders: Mapping[str, str | Path], run_seed: Callable[..., None], seeds: Sequence[int],
                   workers: int) -> None:
    """``run_seeds`` into temporary siblings of ``folders``, published together when every seed succeeded.

    ``run_seed(seed, **{name: temporary folder})``: a stage item's seeds write its models, records and curves;
    a failed or killed item leaves every previous folder whole.
    """
    with contextlib.ExitStack() as stack:
        tmp = {name: stack.enter_context(atomic_path(path, is_dir=True)) for name, path in folders.items()}
        run_seeds(functools.partial(run_seed, **tmp), seeds, workers)
