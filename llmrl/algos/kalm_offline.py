"""KALM's offline RL: d3rlpy on real (and imagined) episodes, the policy input = observation + instruction embedding.

Dataset: each step's input is the observation (``observations["obs"]``), on BabyAI with
``kalm.env.babyai_egocentric_input`` followed by its egocentric features
(``llmrl.agents.offline_policy.policy_observation``, the columns ``OfflinePolicy`` builds when acting), then the
frozen embedding of the episode's instruction (``llmrl.llm.embed.EmbeddingTable``), by default its first principal
components
(``fit_projection``; the algorithm's ``instruction_components``) with the whole input standardised
(``standardise``), built through ``llmrl.data.trajectories.to_d3rlpy``, which flags every episode's end (d3rlpy
silently drops the steps after an episode's last terminal/timeout flag).
The mixed dataset is all real episodes plus imagined ones drawn in a seeded order, each at most once, until imagined
transitions make up ``mix_ratio`` of the total or none are left (``mix_episodes``; the realised share and the
counts offered and used are reported).

Training runs d3rlpy's own loop (``fitter``) with its config class from ``OfflineAlgo.d3rlpy_config()``:
``NoopAdapterFactory`` (no log folders), d3rlpy's structlog filtered to warnings, ``d3rlpy.seed`` and a fixed
torch thread count. ``train_offline`` yields one metrics row per ``log_every`` updates (d3rlpy's epoch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmrl.agents.offline_policy import policy_observation
from llmrl.config.kalm import OfflineAlgo
from llmrl.data.trajectories import Episode, to_d3rlpy
from llmrl.envs import kalm_levels as kl
from llmrl.data.embeddings import EmbeddingTable, InstructionProjection

__all__ = ["quiet_d3rlpy", "MixStats", "mix_episodes", "fit_projection", "build_dataset", "bc_algo", "make_learnable", "train_offline"]


def quiet_d3rlpy() -> None:
    """d3rlpy logs every epoch through structlog at INFO: keep warnings and errors only."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@dataclass
class MixStats:
    real_steps: int
    imagined_steps: int
    imagined_episodes: int  # used: each at most once
    imagined_available: int = 0  # passed the imagination's filter (the episodes offered)

    @property
    def imagined_share(self) -> float:
        total = self.real_steps + self.imagined_steps
        return self.imagined_steps / total if total else 0.0


def mix_episodes(real: Sequence[Episode], imagined: Sequence[Episode], mix_ratio: float, seed: int
                 ) -> tuple[list[Episode], MixStats]:
    """Real episodes plus imagined ones, each used at most once, until imagined steps are ``mix_ratio`` of all.

    Imagined episodes are taken in a seeded random order; the last one added is the one that brings the share
    closest to ``mix_ratio``, so with enough rollouts the realised share is within half an imagined episode's
    length of the target. With too few the share falls short and the stats say by how much: repeating a handful of
    rollouts until they make up the target share would give each of them many times the weight of a real
    episode (the remedy is more rollouts, ``kalm.imagine.rollouts``). Without imagined episodes the result is the
    real data alone.
    """
    if not 0 < mix_ratio < 1:
        raise ValueError(f"mix_ratio must be in (0, 1), got {mix_ratio}")
    real_steps = sum(len(e) for e in real)
    target = mix_ratio / (1 - mix_ratio) * real_steps
    chosen: list[Episode] = []
    steps = 0
    for i in np.random.default_rng(seed).permutation(len(imagined)):
        ep = imagined[int(i)]
        if abs(steps + len(ep) - target) >= abs(steps - target):
            break
        chosen.append(ep)
        steps += len(ep)
    return list(real) + chosen, MixStats(real_steps, steps, len(chosen), len(imagined))


def fit_projection(episodes: Sequence[Episode], table: EmbeddingTable, algo: OfflineAlgo
                   ) -> InstructionProjection | None:
    """``algo.instruction_components`` principal components of the embeddings of the distinct instructions of
    ``episodes``: the real training episodes, for every arm and seed alike (a fit that also saw the imagined
    episodes' instructions, which are the test levels' goals, would give the imagine arm a different input from the
    real arm's and fit on test instructions); None when the algorithm reads the raw embedding."""
    if not algo.instruction_components:
        return None
    return InstructionProjection.fit(table.lookup(sorted({ep.mission for ep in episodes})),
                                     algo.instruction_components)


def build_dataset(episodes: Sequence[Episode], table: EmbeddingTable, benchmark: str,
                  projection: InstructionProjection | None = None, *, egocentric: bool):
    """d3rlpy ``MDPDataset`` of obs (⊕ its egocentric features with ``egocentric``, BabyAI only:
    ``KalmEnvParams.egocentric_input``) ⊕ instruction embedding (``projection`` of it when given); wrong observation
    sizes raise ``ObservationSizeError``."""
    if egocentric and benchmark != "babyai":
        raise ValueError(f"build_dataset: egocentric features are BabyAI's (kalm.env.babyai_egocentric_input), "
                         f"not {benchmark}'s")
    for ep in episodes:
        kl.check_obs(benchmark, ep.observations["obs"], f"episode {ep.env_id!r} seed {ep.seed} observations/obs")
    if egocentric:
        episodes = [replace(ep, observations={
            **ep.observations, "obs": policy_observation(ep.observations["obs"], True)}) for ep in episodes]
    quiet_d3rlpy()
    spec = kl.action_spec(benchmark)

    def condition(ep: Episode) -> np.ndarray:
        vector = table.get(ep.mission)
        return vector if projection is None else projection.apply(vector)

    return to_d3rlpy(episodes, ["obs"], discrete=spec.discrete, condition=condition, action_size=spec.n)


def bc_algo(benchmark: str, steps: int) -> OfflineAlgo:
    """Behaviour cloning for ``benchmark`` (DiscreteBC on BabyAI, BC on Meta-World) at kalm.offline's default
    batch size and learning rate: the reference policy trained on real data beside the grounded one (gate 0)."""
    algo = "DiscreteBC" if kl.action_spec(benchmark).discrete else "BC"
    return OfflineAlgo(benchmark=benchmark, algo=algo, steps=steps, config={"batch_size": 64, "learning_rate": 1e-3})


def make_learnable(algo: OfflineAlgo, seed: int, threads: int = 1):
    """A fresh d3rlpy algorithm from our config, seeded, on CPU with ``threads`` torch threads."""
    import d3rlpy
    import torch

    quiet_d3rlpy()
    torch.set_num_threads(threads)
    d3rlpy.seed(seed)
    return algo.d3rlpy_config().create(device=False)


def train_offline(learnable, dataset, steps: int, log_every: int) -> Iterator[dict[str, Any]]:
    """Run d3rlpy's training loop; yield a row per ``log_every`` updates (losses, updates/s)."""
    from d3rlpy.logging import NoopAdapterFactory

    start = time.perf_counter()
    for epoch, metrics in learnable.fitter(dataset, n_steps=steps, n_steps_per_epoch=min(log_every, steps),
                                           logger_adapter=NoopAdapterFactory(), show_progress=False,
                                           save_interval=10**9, with_timestamp=False):
        done = min(epoch * min(log_every, steps), steps)
        elapsed = time.perf_counter() - start
        row = {"step": done, "updates_per_s": round(done / elapsed, 2) if elapsed else 0.0}
        for key, value in metrics.items():
            if key.endswith("_loss") or key == "loss":
                row["loss" if key == "loss" else key] = float(value)
        yield row
