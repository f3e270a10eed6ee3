"""The pipeline's DAG as the flow runs it: DVC's own index (foreach and matrix items resolved) read into
``StageNode``s in dependency order, each with its resources (``meta``: cpus, mem_gib, gpu) and its priority (the
minutes of the longest chain of stages waiting on it), restricted to target stages and, with ``allow_missing``, to
the parts still to do."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StageNode", "read_dag"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class StageNode:
    name: str
    upstream: tuple[str, ...]
    gpu: bool
    cpus: int = 1
    mem_gib: float = 1.0
    # DVC keeps no run-cache entry for a stage with a `persist` out (e.g. a reply cache that grows across
    # runs): such a stage cannot move between workspaces through it (one with a plain uncached out can:
    # `pipelines.clones.save_run_cache`).
    run_cacheable: bool = True
    # The longest chain of stages (this one included) that wait on this stage's outputs, in minutes (each stage's
    # `meta.minutes`, measured; 1 where none is declared): its priority for cores (critical path first).
    chain: float = 1
    # Its `metrics:` outputs (files or folders), relative to the repository root: what its artifact shows.
    metrics: tuple[str, ...] = ()


def _absent(dep) -> bool:
    """``dep`` is not on this machine: deleted, or a folder holding nothing but the ``.gitignore`` files DVC commits
    beside the outputs it caches (a fresh clone has such a folder wherever stages wrote items into it)."""
    path = Path(dep.fs_path)
    if not path.exists():
        return True
    return path.is_dir() and all(f.name == ".gitignore" for f in path.rglob("*") if f.is_file())


def _changed(stage) -> bool:
    """``Stage.changed(allow_missing=True)``, with an input folder that holds only DVC's ``.gitignore`` files counted
    as missing (DVC calls it modified)."""
    if stage.changed_stage():
        return True
    for dep in stage.deps:
        if dep.status() and not _absent(dep):
            return True
    return stage.changed_outs(allow_missing=True)


def _needs_from(stage, up) -> bool:
    """``stage`` reads an output of ``up`` that is not here (a git-tracked result of ``up`` is here in any clone)."""
    outs = [Path(o.fs_path) for o in up.outs]
    for dep in stage.deps:
        path = Path(dep.fs_path)
        if any(path == o or o in path.parents or path in o.parents for o in outs) and _absent(dep):
            return True
    return False


def _to_run(graph, order: list) -> list:
    """``order``'s stages that ``dvc repro --allow-missing`` would run, and the upstream stages whose outputs they
    need (``read_dag``)."""
    import networkx as nx

    members = set(order)
    # DVC counts a stage without a dvc.lock entry as unchanged when its inputs are missing too: a stage is done only
    # when the lock records every dep and out of it (hash_info set) and nothing but missing data differs
    recorded = {s for s in order if all(x.hash_info for x in (*s.deps, *s.outs))}
    needed = {s for s in order if s not in recorded or _changed(s)}
    for s in list(needed):
        needed |= nx.ancestors(graph, s) & members  # downstream of a stale stage: its inputs will change
    for s in reversed(order):  # downstream first: a stage that runs pulls in upstream stages with missing outputs
        if s in needed:
            for up in graph.successors(s):
                if up in members and up not in needed and _needs_from(s, up):
                    needed.add(up)
    return [s for s in order if s in needed]


def read_dag(root: Path = ROOT, targets: list[str] | None = None, pipeline: str = "dvc.yaml",
             allow_missing: bool = False) -> list[StageNode]:
    """Stages of the ``pipeline`` file (dvc.yaml, or study/dvc.yaml) and their upstream stages, in dependency order,
    restricted to ``targets`` and their upstream stages.

    ``allow_missing``: a stage whose outputs are missing but whose deps, params and command are as ``dvc.lock``
    records is done (``dvc repro --allow-missing``), unless a stage that runs needs its outputs: the stale stages
    run, with every stage downstream of them and the done stages upstream whose outputs are not here. A fresh clone
    of a study part committed elsewhere thus runs only the parts still to do.
    """
    import networkx as nx
    from dvc.repo import Repo

    # Stage addresses are relative to the working directory: read the index from the repository root.
    with contextlib.chdir(root), Repo(str(root)) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        stages = {s.addressing: s for s in graph.nodes if s.addressing != "dvc.yaml" and s.cmd}
        order = [s for s in reversed(list(nx.topological_sort(graph))) if s.addressing in stages]
        in_file = {s for s in order if os.path.relpath(s.dvcfile.path, repo.root_dir) == pipeline}
        if not in_file:
            raise ValueError(f"{pipeline}: no stages (known pipeline files: "
                             f"{sorted({os.path.relpath(s.dvcfile.path, repo.root_dir) for s in order})})")
        kept = set(in_file)
        for s in in_file:
            kept |= nx.descendants(graph, s)
        order = [s for s in order if s in kept]
        if targets:
            unknown = [t for t in targets if t not in stages and not any(a.startswith(f"{t}@") for a in stages)]
            if unknown:
                raise ValueError(f"unknown stage(s) {unknown}; known: {sorted(stages)}")
            wanted = {s for s in stages.values() if s.addressing in targets or s.addressing.split("@")[0] in targets}
            for s in list(wanted):
                wanted |= nx.descendants(graph, s)
            order = [s for s in order if s in wanted]
        if allow_missing:
            with repo.lock:  # Stage.changed reads the workspace under the repository's lock
                order = _to_run(graph, order)
        chain: dict = {}
        for s in order[::-1]:  # dependents first: a stage's chain is its minutes plus its longest dependent's
            minutes = (s.meta or {}).get("minutes", 1)
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0:
                raise ValueError(f"stage {s.addressing}: meta.minutes must be a positive number, got {minutes!r}")
            chain[s] = minutes + max((chain[d] for d in graph.predecessors(s) if d in chain), default=0)
        nodes = []
        for s in order:
            meta = s.meta or {}
            cpus = meta.get("cpus", 1)
            if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1:
                raise ValueError(f"stage {s.addressing}: meta.cpus must be a positive integer, got {cpus!r}")
            mem = meta.get("mem_gib", 1.0)
            if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0:
                raise ValueError(f"stage {s.addressing}: meta.mem_gib must be a positive number, got {mem!r}")
            nodes.append(StageNode(
                name=s.addressing,
                upstream=tuple(d.addressing for d in graph.successors(s) if d.addressing in stages),
                gpu=bool(meta.get("gpu", False)),
                cpus=cpus,
                mem_gib=float(mem),
                run_cacheable=not any(o.persist for o in s.outs),
                chain=chain[s],
                metrics=tuple(os.path.relpath(o.fs_path, repo.root_dir) for o in s.outs
                              if o.is_metric and o.is_in_repo),
            ))
        return nodes
