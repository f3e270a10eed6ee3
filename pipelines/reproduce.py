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
hold. Transient failures (e.g. a lock held by another process) are retried.

Prefect UI: each stage's task logs what the stage printed (the tail of its stdout and stderr) and publishes a
markdown artifact ``stage-<name>`` with its metrics (its ``metrics:`` files in dvc.yaml), whether it ran or was
up to date, and its wall time; each run of the flow adds a version to that artifact.

Run: ``python pipelines/reproduce.py [--stages glam_eval ...] [--gpus N] [--workers N] [--remote NAME]``
(ephemeral Prefect, no server), or against ``make prefect-ui`` with
``PREFECT_API_URL=http://127.0.0.1:4200/api``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import filecmp
import hashlib
import itertools
import json
import os
import re
import queue
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.task_runners import ThreadPoolTaskRunner

ROOT = Path(__file__).resolve().parents[1]
GPU_LIMIT = "gpu"
_workspace_lock = threading.Lock()  # DVC's repository lock admits one repro per workspace


@dataclass(frozen=True)
class StageNode:
    name: str
    upstream: tuple[str, ...]
    gpu: bool
    cpus: int = 1
    mem_gib: float = 1.0
    # DVC keeps no run-cache entry for a stage with a `persist` out (e.g. a reply cache that grows across
    # runs) or an uncached out that is not a metric or plot: such a stage cannot move between workspaces.
    run_cacheable: bool = True
    # The longest chain of stages (this one included) that wait on this stage's outputs, in minutes (each stage's
    # `meta.minutes`, measured; 1 where none is declared): its priority for cores (critical path first).
    chain: float = 1
    # Its `metrics:` outputs (files or folders), relative to the repository root: what its artifact shows.
    metrics: tuple[str, ...] = ()


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
                run_cacheable=not any(o.persist or not (o.use_cache or o.is_metric or o.is_plot) for o in s.outs),
                chain=chain[s],
                metrics=tuple(os.path.relpath(o.fs_path, repo.root_dir) for o in s.outs
                              if o.is_metric and o.is_in_repo),
            ))
        return nodes


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


def _stage_env() -> dict[str, str]:
    # Stage commands say `python`: make it this interpreter (the project's venv), as `make` does.
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _tail(text: str, limit: int = 4000) -> str:
    # A progress bar redraws its line with \r: keep each line's last state.
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))[-limit:]


def _dvc(args: list[str], cwd: Path | str, env: dict[str, str], log=None) -> str:
    """``dvc ARGS`` in ``cwd``; its stdout. With ``log``, the tails of its stdout and stderr (a stage's command
    prints to both: DVC passes them through) go to that logger: the Prefect task's log."""
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` in {cwd} failed (exit {proc.returncode}):\n"
                           f"{_tail(proc.stdout, 2000)}\n{_tail(proc.stderr)}")
    if log is not None:
        for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            if text.strip():
                log.info("%s of `dvc %s`:\n%s", stream, " ".join(args), _tail(text))
    return proc.stdout


def artifact_key(stage: str) -> str:
    """The Prefect artifact key of a stage's report: ``stage-`` and its name in lowercase letters, digits and
    dashes (Prefect's rule for keys), e.g. ``glam_train@lora-0`` -> ``stage-glam-train-lora-0``."""
    return "stage-" + (re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-") or "unnamed")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _number(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _flatten(value: object, prefix: str = ""):
    """``(a.b.c, number)`` for every number or boolean nested in dicts and lists (list items by index)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _flatten(item, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(value, (int, float)):
        yield prefix or "(value)", value


def stage_markdown(stage: str, status: str, seconds: float, files: dict[str, str | None], waited: float = 0.0,
                   max_rows: int = 40) -> str:
    """A stage's report as markdown: its status and wall time, then a table of the numbers in its metrics files.

    ``files`` maps each metrics file (relative path) to its text, None when it is missing; JSON (YAML for
    ``.yaml``/``.yml``). Nested numbers become ``a.b.c`` rows; after ``max_rows`` of them the rest are counted, not
    shown. A missing or unreadable file gets a row saying so, always shown.
    """
    import yaml

    rows: list[tuple[str, str, str]] = []
    left_out = 0
    shown = 0
    for path, text in files.items():
        if text is None:
            rows.append((path, "*missing*", ""))
            continue
        try:
            data = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
        except (ValueError, yaml.YAMLError) as exc:
            kind = "YAML" if path.endswith((".yaml", ".yml")) else "JSON"
            rows.append((path, f"*not {kind}: {str(exc).splitlines()[0][:80]}*", ""))
            continue
        numbers = list(_flatten(data))
        if not numbers:
            rows.append((path, "*no numbers*", ""))
        first = True
        for key, value in numbers:
            if shown >= max_rows:
                left_out += 1
                continue
            rows.append((path if first else "", key, _number(value)))
            first = False
            shown += 1
    waiting = f" (after {waited:.1f} s waiting for cores, GPU or workspace)" if waited >= 0.05 else ""
    lines = [f"### DVC stage `{stage}`", "", f"**{status}**, {seconds:.1f} s wall time{waiting}", ""]
    if rows:
        lines += ["| file | metric | value |", "|---|---|---|"]
        lines += [f"| {_cell(f)} | {_cell(k)} | {_cell(v)} |" for f, k, v in rows]
    else:
        lines.append("No `metrics:` in dvc.yaml for this stage.")
    if left_out:
        lines += ["", f"*{left_out} more metrics left out (at most {max_rows} shown; `dvc metrics show` lists all).*"]
    return "\n".join(lines) + "\n"


def read_metrics_files(root: Path, metrics: tuple[str, ...] | list[str], max_files: int = 200) -> dict[str, str | None]:
    """The text of each metrics output of a stage (a folder's JSON and YAML files, sorted), None if missing."""
    files: dict[str, str | None] = {}
    for rel in metrics:
        path = root / rel
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".json", ".yaml", ".yml"))
            if not found:
                files[rel] = None
            for p in found[:max_files]:
                files[p.relative_to(root).as_posix()] = p.read_text(errors="replace")
        else:
            files[rel] = path.read_text(errors="replace") if path.is_file() else None
    return files


def _publish(name: str, status: str, seconds: float, waited: float, root: str, metrics: tuple[str, ...], log) -> None:
    """The stage's artifact (``artifact_key(name)``) on the Prefect API; a failure here never fails the stage."""
    try:
        markdown = stage_markdown(name, status, seconds, read_metrics_files(Path(root), metrics), waited)
        create_markdown_artifact(markdown=markdown, key=artifact_key(name), description=f"DVC stage `{name}`: {status}")
    except Exception as exc:  # noqa: BLE001 - the report is a view of the stage, not part of it
        log.warning("stage %s: could not publish its metrics artifact: %r", name, exc)


def _git_files(repo: Path) -> set[str]:
    """Files git sees in ``repo``'s working tree: tracked (unless deleted) and untracked but not ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=repo, capture_output=True, check=True).stdout
    return {p for p in out.decode().split("\0") if p}


def _remote_url(root: Path, remote: str) -> str:
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        remotes = repo.config["remote"]
        if remote not in remotes:
            raise ValueError(f"--remote {remote!r} is not a DVC remote of {root}; known: {sorted(remotes)}")
        return remotes[remote]["url"]  # DVC resolves a relative local path against the config file's folder


def _cache_dir(root: Path) -> str:
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return repo.cache.local_cache_dir  # .dvc/cache, or the folder `dvc cache dir` set


def sync_clone(root: Path, clone: Path, remote: str | None = None) -> None:
    """Make ``clone`` a copy of ``root``'s files as git sees them (edits and new files included).

    DVC outputs are not copied: they come from the shared cache or the remote when a stage needs them.
    """
    if not (clone / ".git").exists():
        clone.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "-q", "--shared", str(root), str(clone)], check=True, capture_output=True)
    wanted = {p for p in _git_files(root) if (root / p).is_file()}
    for rel in _git_files(clone) - wanted:
        (clone / rel).unlink(missing_ok=True)
    for rel in wanted:
        src, dst = root / rel, clone / rel
        if dst.is_file() and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".sync-tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    lines = []
    if remote is None:
        lines += ["[cache]", f"    dir = {_cache_dir(root)}"]
    else:
        lines += ["[core]", f"    remote = {remote}", f"['remote \"{remote}\"']", f"    url = {_remote_url(root, remote)}"]
    (clone / ".dvc" / "config.local").write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def _gpu(gpu: bool, free_gpus: queue.Queue | None, env: dict[str, str]):
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


@task(retries=2, retry_delay_seconds=15, task_run_name="dvc:{name}", cache_policy=NO_CACHE)
def run_stage(name: str, gpu: bool, free_gpus: queue.Queue | None, root: str = str(ROOT), cpus: int = 1,
              cores: CoreSlots | None = None, mem_gib: float = 0.0, metrics: tuple[str, ...] = ()) -> str:
    """``dvc repro --single-item`` for one stage in this workspace; a GPU stage holds a GPU slot."""
    log = get_run_logger()
    env = _stage_env()
    asked = time.monotonic()
    with cores.hold(cpus, mem_gib) if cores else contextlib.nullcontext(), _gpu(gpu, free_gpus, env) as held, \
            _workspace_lock:
        started = time.monotonic()
        log.info("dvc repro --single-item %s%s", name, f" on GPU {held}" if held is not None else "")
        out = _dvc(["repro", "--single-item", name], root, env, log)
    status = "cached" if "didn't change, skipping" in out else "ran"
    _publish(name, "ran in this workspace" if status == "ran" else "up to date (not run)",
             time.monotonic() - started, started - asked, root, metrics, log)
    return status


def _run_in_clone(clone: Path, name: str, upstream: tuple[str, ...] | list[str], remote: str | None,
                  env: dict[str, str], run_cacheable: bool = True, log=None) -> str:
    """In a clone already holding this workspace's files: fetch the stage's inputs, run it, publish it."""
    if upstream:  # the stage's inputs, as the synced dvc.lock records them
        _dvc(["pull" if remote else "checkout", *upstream], clone, env)
    if not run_cacheable:  # persisted outputs the stage continues from, as this workspace's dvc.lock records them
        _dvc(["pull" if remote else "checkout", "--force", "--allow-missing", name], clone, env)
    out = _dvc(["repro", "--single-item", name], clone, env, log)
    if remote:
        _dvc(["push", *(["--run-cache"] if run_cacheable else []), name], clone, env)
        _run_python(f"push_uncached_outs({str(clone)!r}, {name!r}, {remote!r})", clone, env)
    return out


def adopt_lock_entry(root: Path, clone: Path, name: str) -> None:
    """Copy stage ``name``'s ``dvc.lock`` entry from ``clone`` into ``root``'s (the rest of the file stays).

    For a stage DVC keeps no run-cache entry for (a ``persist`` output): the clone ran it on the same files as
    this workspace, so its entry is the one a run here would have written; its outputs are then checked out.
    """
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip, as forget_recorded_outs
    entry = yaml.load((clone / "dvc.lock").read_text())["stages"][name]
    lock = root / "dvc.lock"
    data = yaml.load(lock.read_text()) if lock.is_file() else None
    if not data:
        data = {"schema": "2.0", "stages": {}}
    data.setdefault("stages", {})[name] = entry  # replaced in place, or appended as DVC appends a new entry
    tmp = lock.with_name(lock.name + ".tmp")
    with tmp.open("w") as handle:
        yaml.dump(data, handle)
    os.replace(tmp, lock)


def forget_recorded_outs(root: Path, name: str) -> None:
    """Drop the output hashes ``dvc.lock`` records for stage ``name`` (the rest of the file stays as it is).

    Needed before taking a stage's new result from the run-cache: when a stage's deps and params match its
    dvc.lock entry (it re-ran only because its outputs were missing), ``dvc repro`` restores the outputs that
    entry records and, when those are not in the cache, runs the command, without looking at the run-cache.
    Without its recorded outputs the entry counts as changed and DVC takes the newest run-cache entry.
    """
    from ruamel.yaml import YAML

    lock = root / "dvc.lock"
    if not lock.is_file():
        return
    yaml = YAML()  # round-trip: keeps order, quoting and comments of every other entry
    data = yaml.load(lock.read_text())
    entry = (data or {}).get("stages", {}).get(name)
    if entry is None or "outs" not in entry:
        return
    del entry["outs"]
    tmp = lock.with_name(lock.name + ".tmp")
    with tmp.open("w") as handle:
        yaml.dump(data, handle)
    os.replace(tmp, lock)


def _restore(name: str, root: str, remote: str | None, env: dict[str, str], where: str, ran: bool,
             clone: Path | None = None) -> str:
    """Take a stage that ran elsewhere into this workspace from DVC's run-cache (never computing it again);
    with ``clone``, a stage without run-cache entries: its dvc.lock entry from the clone, its outputs checked out."""
    if clone is not None:
        with _workspace_lock:
            if not ran:
                return "cached"
            adopt_lock_entry(Path(root), clone, name)
            _dvc(["pull" if remote else "checkout", "--force", name], root, env)
            if "up to date" not in _dvc(["status", name], root, env):
                raise RuntimeError(f"stage {name} ran in {where}, but this workspace is not up to date with the "
                                   "dvc.lock entry taken from there")
        return "ran"
    with _workspace_lock:
        if ran:
            forget_recorded_outs(Path(root), name)
        restored = _dvc(["repro", "--single-item", *(["--pull"] if remote else []), name], root, env)
    if "is cached - skipping run" in restored:
        return "ran"
    if "didn't change, skipping" in restored:
        return "cached"
    raise RuntimeError(f"stage {name} ran in {where} but this workspace could not restore it from the "
                       f"run-cache and computed it again:\n{restored[-2000:]}")


def _up_to_date(name: str, root: str, env: dict[str, str]) -> bool:
    with _workspace_lock:  # its upstream stages are done: an up-to-date stage needs no worker
        return "up to date" in _dvc(["status", name], root, env)


@task(retries=1, retry_delay_seconds=15, task_run_name="dvc:{name}", cache_policy=NO_CACHE)
def run_stage_in_clone(name: str, upstream: tuple[str, ...], gpu: bool, cpus: int, free_gpus: queue.Queue | None,
                       clones: queue.Queue, cores: CoreSlots, root: str, remote: str | None,
                       mem_gib: float = 0.0, run_cacheable: bool = True, priority: int = 0,
                       metrics: tuple[str, ...] = ()) -> str:
    """Run one stage in a free clone, then restore its result in this workspace from DVC's run-cache (or, for a
    stage with a ``persist`` output, from the clone's dvc.lock entry), so no stage holds this workspace's DVC
    lock while it computes."""
    log = get_run_logger()
    env = _stage_env()
    asked = time.monotonic()
    if _up_to_date(name, root, env):  # its upstream stages are done; a second of DVC needs no core slot
        _publish(name, "up to date (not run)", time.monotonic() - asked, 0.0, root, metrics, log)
        return "cached"
    clone = None
    try:
        # Cores first, then a clone: a stage waiting for cores must not sit on a clone another stage could use.
        with cores.hold(cpus, mem_gib, priority):
            clone = clones.get()
            with _gpu(gpu, free_gpus, env) as held:
                started = time.monotonic()
                with _workspace_lock:  # a consistent snapshot: no restore writes dvc.lock meanwhile
                    sync_clone(Path(root), clone, remote)
                log.info("dvc repro --single-item %s in %s%s", name, clone.name,
                         f" on GPU {held}" if held is not None else "")
                out = _run_in_clone(clone, name, upstream, remote, env, run_cacheable, log)
        # The cores are free again: the restore (a few seconds of DVC, one at a time) need not hold back the
        # next stage. The clone stays taken until this workspace holds the result: a sync before that would
        # find the stage's outputs unknown to this workspace's .gitignore files and delete them from the clone.
        status = _restore(name, root, remote, env, str(clone), ran="didn't change, skipping" not in out,
                          clone=None if run_cacheable else clone)
        how = "DVC's run-cache" if run_cacheable else "the clone's dvc.lock entry"
        _publish(name, f"ran in clone {clone.name}, restored here from {how}" if status == "ran"
                 else "up to date (not run)", time.monotonic() - started, started - asked, root, metrics, log)
        return status
    finally:
        if clone is not None:
            clones.put(clone)


def workspace_overlay(root: Path) -> tuple[str, dict[str, str | None]]:
    """``root``'s HEAD commit and its working-tree changes (path -> base64 content, or None if deleted)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames"],
                            cwd=root, capture_output=True, check=True).stdout.decode()
    files: dict[str, str | None] = {}
    for entry in filter(None, status.split("\0")):
        rel = entry[3:]
        path = root / rel
        files[rel] = base64.b64encode(path.read_bytes()).decode() if path.is_file() else None
    return commit, files


@flow(name="llmrl-stage", log_prints=True)
def run_stage_flow(stage: str, upstream: list[str], git_url: str, commit: str, files: dict[str, str | None],
                   remote: str, remote_url: str | None = None) -> str:
    """One stage on a worker (any machine with this project set up and a Prefect worker on the pool).

    Checks out the coordinator's commit in a clone of its own (under ``$LLMRL_WORKER_DIR``, by default
    ``.cache/stage-workers/`` of the worker's folder; one per concurrent run), applies the coordinator's uncommitted changes (``files``),
    pulls the stage's inputs from the DVC remote, runs the stage and pushes its outputs and run-cache entry.
    """
    log = get_run_logger()
    env = _stage_env()
    base = Path(os.environ.get("LLMRL_WORKER_DIR") or Path.cwd() / ".cache" / "stage-workers")
    base = base / hashlib.sha256(git_url.encode()).hexdigest()[:12]
    base.mkdir(parents=True, exist_ok=True)
    with _slot_lock(base) as slot:
        clone = base / f"clone-{slot}"
        if not (clone / ".git").exists():
            subprocess.run(["git", "clone", "-q", "--no-checkout", git_url, str(clone)], check=True, capture_output=True)
        subprocess.run(["git", "fetch", "-q", "origin", commit], cwd=clone, check=True, capture_output=True)
        subprocess.run(["git", "checkout", "-q", "--force", commit], cwd=clone, check=True, capture_output=True)
        for rel, content in files.items():
            path = clone / rel
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(content))
        lines = ["[core]", f"    remote = {remote}"]
        if remote_url:
            lines += [f"['remote \"{remote}\"']", f"    url = {remote_url}"]
        (clone / ".dvc" / "config.local").write_text("\n".join(lines) + "\n")
        log.info("dvc repro --single-item %s in %s", stage, clone)
        out = _run_in_clone(clone, stage, upstream, remote, env, log=log)
        return "cached" if "didn't change, skipping" in out else "ran"


@contextlib.contextmanager
def _slot_lock(base: Path):
    """The first free slot index under ``base`` (an exclusive file lock held while the run lasts)."""
    import fcntl

    for i in itertools.count():
        handle = open(base / f"slot-{i}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield i
        finally:
            handle.close()
        return


@task(retries=1, retry_delay_seconds=15, task_run_name="dvc:{name}", cache_policy=NO_CACHE)
def run_stage_on_pool(name: str, upstream: tuple[str, ...], root: str, deployment: str, git_url: str, remote: str,
                      remote_url: str | None, metrics: tuple[str, ...] = ()) -> str:
    """Run one stage as a flow run of the ``llmrl-stage`` deployment (a worker of its pool picks it up),
    then restore its result here through the DVC remote."""
    from prefect.deployments import run_deployment

    log = get_run_logger()
    env = _stage_env()
    started = time.monotonic()
    if _up_to_date(name, root, env):
        _publish(name, "up to date (not run)", time.monotonic() - started, 0.0, root, metrics, log)
        return "cached"
    with _workspace_lock:  # a consistent snapshot: no restore writes dvc.lock meanwhile
        commit, files = workspace_overlay(Path(root))
    run = run_deployment(deployment, parameters=dict(stage=name, upstream=list(upstream), git_url=git_url,
                                                      commit=commit, files=files, remote=remote,
                                                      remote_url=remote_url), timeout=None)
    if not run.state or not run.state.is_completed():
        raise RuntimeError(f"stage {name}: flow run {run.name} of {deployment} ended {run.state}")
    # Whether the worker ran it or found it up to date, this workspace was not: its result is the worker's.
    status = _restore(name, root, remote, env, f"flow run {run.name}", ran=True)
    # The stage's output is in that flow run's log (the worker's); its metrics are here now.
    _publish(name, f"ran by flow run {run.name} of {deployment}, restored here" if status == "ran"
             else "up to date (not run)", time.monotonic() - started, 0.0, root, metrics, log)
    return status


def push_uncached_outs(root: str, name: str, remote: str) -> None:
    """Push the cache objects of a stage's git-tracked (``cache: false``) outputs to ``remote``.

    DVC's run-cache keeps a copy of such outputs, but ``dvc push --run-cache`` sends only the objects of
    cached outputs, so a workspace on another machine could not restore a stage whose outputs include a
    metrics or plots file (it would compute the stage again). This closes that gap.
    """
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(root) as repo:
        (stage,) = [s for s in repo.index.stages if s.addressing == name]
        objs = set()
        for out in stage.outs:
            if not out.use_cache and out.hash_info:
                out.use_cache = True  # get_used_objs() skips uncached outputs; their objects are in the cache
                for ids in out.get_used_objs().values():
                    objs |= ids
        if objs:
            repo.cloud.push(objs, remote=remote)


def _run_python(code: str, cwd: Path, env: dict[str, str]) -> None:
    # This module, also when the repository it works on is not this project (tests use toy repositories).
    env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", f"from pipelines.reproduce import *; {code}"], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{code}` in {cwd} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def _gpu_slots(nodes: list[StageNode], gpus: int | None) -> queue.Queue | None:
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


# Threads only wait (on upstream tasks, slots or subprocesses): one per stage never deadlocks.
@flow(name="llmrl-reproduce", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=256))
def reproduce(stages: list[str] | None = None, gpus: int | None = None, root: str = str(ROOT),
              workers: int = 0, cpus: int | None = None, remote: str | None = None, pool: str | None = None,
              git_url: str | None = None, remote_url: str | None = None,
              mem_gib: float | None = None) -> dict[str, str]:
    """Run the DVC DAG (or the named stages and their upstream) as Prefect tasks in dependency order.

    ``workers`` > 0 runs up to that many stages at once, each in its own clone, while their ``meta.cpus``
    fit in ``cpus`` cores and their ``meta.mem_gib`` in ``mem_gib`` GiB. ``pool`` (a deployment of
    ``run_stage_flow``, e.g. ``llmrl-stage/stage``) runs every stage as a flow run that the deployment's workers
    pick up, on any machine, exchanging data through the DVC ``remote`` and code through ``git_url`` (default: this
    workspace's path). Either way the workspace ends as after a serial run.
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    if remote is not None and workers == 0 and pool is None:
        raise ValueError("remote is only used with workers > 0 or a pool (they exchange results through it)")
    if pool is not None and remote is None:
        raise ValueError("pool needs remote: flow runs on other machines exchange data through a DVC remote")
    nodes = read_dag(Path(root), stages)
    free_gpus = _gpu_slots(nodes, gpus)
    if pool:
        remote_url = remote_url or _remote_url(Path(root), remote)
    futures = {}
    cores = CoreSlots(cpus or os.cpu_count() or 1, mem_gib or float("inf")) if workers else None
    clones: queue.Queue = queue.Queue()
    for i in range(2 * workers):  # a clone per running stage, and one per stage whose result is being restored
        clones.put(Path(root) / ".cache" / "workers" / f"w{i}")
    for node in nodes:
        upstream = [futures[u] for u in node.upstream if u in futures]
        tags = ["gpu"] if node.gpu else []
        if pool and node.run_cacheable:  # the pool's workers hold their machines' cores and GPUs
            futures[node.name] = run_stage_on_pool.with_options(tags=tags).submit(
                node.name, node.upstream, root, pool, git_url or root, remote, remote_url, node.metrics,
                wait_for=upstream)
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
    parser.add_argument("--pool", default=None,
                        help="deployment of run_stage_flow whose workers run the stages (e.g. llmrl-stage/stage; "
                             "see prefect.yaml); needs --remote")
    parser.add_argument("--git-url", default=None,
                        help="where pool workers fetch this workspace's commit (default: its path; push first)")
    parser.add_argument("--remote-url", default=None,
                        help="the remote's URL as pool workers must use it (default: the URL in .dvc/config)")
    args = parser.parse_args(argv)
    result = reproduce(stages=args.stages, gpus=args.gpus, root=args.root, workers=args.workers, cpus=args.cpus,
                       remote=args.remote, pool=args.pool, git_url=args.git_url, remote_url=args.remote_url,
                       mem_gib=args.mem_gib)
    for name, status in result.items():
        print(f"{name}: {status}")


if __name__ == "__main__":
    main()
