"""Independent seeds side by side: one fresh single-process interpreter per worker.

A stage that trains several seeds of a small network would leave the second core idle (one thread per seed is
what makes those runs byte-identical across CPU kernel levels, see README "Reproducibility"). Running the seeds
in ``spawn``-started worker processes keeps every seed exactly as it is alone: nothing is inherited from the
parent (no thread pool, no RNG state), each seed seeds itself. Written by hand because ``concurrent.futures``
already is the library; this only fixes the start method and the error path.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor


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
