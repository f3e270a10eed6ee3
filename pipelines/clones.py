"""Where a stage runs when it does not run here: clones of this workspace (local ``.cache/workers/w<i>``, or a pool
worker's clone of the coordinator's commit with its uncommitted changes), their inputs from DVC, and how the result
comes back without computing it twice: from DVC's run-cache, or, for a stage DVC keeps no run-cache for (a
``persist`` output), by adopting the clone's ``dvc.lock`` entry and checking its outputs out."""

from __future__ import annotations

import base64
import contextlib
import filecmp
import itertools
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

from pipelines.dvc_run import WORKSPACE_LOCK, dvc
from pipelines.hosts import lock_first_free

__all__ = ["sync_clone", "run_in_clone", "adopt_lock_entry", "copy_uncached_outs", "forget_recorded_outs", "restore",
           "workspace_overlay", "apply_overlay", "OverlayTooLarge", "OVERLAY_LIMIT_BYTES", "slot_lock",
           "push_uncached_outs", "save_run_cache", "dvc_remote_url"]

ROOT = Path(__file__).resolve().parents[1]


def _git_files(repo: Path) -> set[str]:
    """Files git sees in ``repo``'s working tree: tracked (unless deleted) and untracked but not ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=repo, capture_output=True, check=True).stdout
    return {p for p in out.decode().split("\0") if p}


def dvc_remote_url(root: Path, remote: str) -> str:
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
        if clone.exists():  # what a clone that broke off before git finished leaves: no clone to sync
            shutil.rmtree(clone)
        clone.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "-q", "--shared", str(root), str(clone)], check=True, capture_output=True)
    else:  # the clone's git index as root's HEAD: DVC refuses an output that the clone's git still tracks
        subprocess.run(["git", "fetch", "-q", str(root), "HEAD"], cwd=clone, check=True, capture_output=True)
        subprocess.run(["git", "reset", "-q", "FETCH_HEAD"], cwd=clone, check=True, capture_output=True)
    wanted = {p for p in _git_files(root) if (root / p).is_file()}
    for rel in _git_files(clone) - wanted:
        (clone / rel).unlink(missing_ok=True)
        # and the folders that leaves empty: a stage reading a folder of results would see an empty entry
        parent = (clone / rel).parent
        while parent != clone and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
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
        lines += ["[core]", f"    remote = {remote}", f"['remote \"{remote}\"']",
                  f"    url = {dvc_remote_url(root, remote)}"]
    (clone / ".dvc" / "config.local").write_text("\n".join(lines) + "\n")


def run_in_clone(clone: Path, name: str, upstream: tuple[str, ...] | list[str], remote: str | None,
                 env: dict[str, str], run_cacheable: bool = True, log=None) -> str:
    """In a clone already holding this workspace's files: fetch the stage's inputs, run it, publish it."""
    if upstream:  # the stage's inputs, as the synced dvc.lock records them; an upstream stage done elsewhere (a
        # study part) may have outputs this stage does not read in no cache here: `dvc repro` fails on a missing input
        dvc(["pull" if remote else "checkout", "--allow-missing", *upstream], clone, env)
    if not run_cacheable:  # persisted outputs the stage continues from, as this workspace's dvc.lock records them
        dvc(["pull" if remote else "checkout", "--force", "--allow-missing", name], clone, env)
    out = dvc(["repro", "--single-item", name], clone, env, log)
    if run_cacheable:
        _run_python(f"save_run_cache({str(clone)!r}, {name!r})", clone, env)
    if remote:
        dvc(["push", *(["--run-cache"] if run_cacheable else []), name], clone, env)
        _run_python(f"push_uncached_outs({str(clone)!r}, {name!r}, {remote!r})", clone, env)
    return out


def save_run_cache(root: str, name: str) -> None:
    """Save stage ``name``'s run-cache entry from its ``dvc.lock`` entry where ``dvc repro`` saved none.

    DVC skips the run-cache for a stage with a git-tracked output that is neither a metric nor a plot (a training
    summary, a folder of plans), although the run-cache can hold such outputs as it holds metrics (a copy in the
    cache). Without the entry the stage could not leave the workspace it ran in. A stage with a ``persist`` output
    has none by design (``pipelines.dag``); an entry already there is kept.
    """
    from dvc.repo import Repo
    from dvc.stage.cache import _can_hash  # DVC's own rule for which stages the run-cache can take

    with contextlib.chdir(root), Repo(root) as repo:
        (stage,) = [s for s in repo.index.stages if s.addressing == name]
        if _can_hash(stage) and any(not (o.use_cache or o.is_metric or o.is_plot) for o in stage.outs):
            repo.stage_cache.save(stage)


def _lock_of(name: str) -> tuple[str, str]:
    """The lock file and entry of stage ``name``: ``dvc.lock`` for a stage of ``dvc.yaml``,
    ``study/dvc.lock`` and ``props_eval`` for ``study/dvc.yaml:props_eval``."""
    if ":" not in name:
        return "dvc.lock", name
    dvcfile, stage = name.rsplit(":", 1)
    return os.path.join(os.path.dirname(dvcfile), "dvc.lock"), stage


def adopt_lock_entry(root: Path, clone: Path, name: str) -> None:
    """Copy stage ``name``'s ``dvc.lock`` entry from ``clone`` into ``root``'s (the rest of the file stays).

    For a stage DVC keeps no run-cache entry for (a ``persist`` output): the clone ran it on the same files as
    this workspace, so its entry is the one a run here would have written; its outputs are then checked out.
    """
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip, as forget_recorded_outs
    rel, key = _lock_of(name)
    entry = yaml.load((clone / rel).read_text())["stages"][key]
    lock = root / rel
    data = yaml.load(lock.read_text()) if lock.is_file() else None
    if not data:
        data = {"schema": "2.0", "stages": {}}
    data.setdefault("stages", {})[key] = entry  # replaced in place, or appended as DVC appends a new entry
    lock.parent.mkdir(parents=True, exist_ok=True)
    tmp = lock.with_name(lock.name + ".tmp")
    with tmp.open("w") as handle:
        yaml.dump(data, handle)
    os.replace(tmp, lock)


def copy_uncached_outs(root: str, clone: str, name: str) -> None:
    """Copy stage ``name``'s git-tracked outputs (``cache: false``: files or folders) from ``clone`` into ``root``,
    each replacing the old one in one rename."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(root) as repo:
        (stage,) = [s for s in repo.index.stages if s.addressing == name]
        paths = [out.def_path for out in stage.outs if not out.use_cache]
    for rel in paths:
        src, dst = Path(clone) / rel, Path(root) / rel
        if not src.exists():
            raise FileNotFoundError(f"stage {name}: its output {rel} is missing in {clone}")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".adopt-tmp")
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        shutil.copytree(src, tmp) if src.is_dir() else shutil.copy2(src, tmp)
        if dst.is_dir() and not dst.is_symlink():
            old = dst.with_name(dst.name + ".adopt-old")
            os.replace(dst, old)
            os.replace(tmp, dst)
            shutil.rmtree(old)
        else:
            os.replace(tmp, dst)


def forget_recorded_outs(root: Path, name: str) -> None:
    """Drop the output hashes ``dvc.lock`` records for stage ``name`` (the rest of the file stays as it is).

    Needed before taking a stage's new result from the run-cache: when a stage's deps and params match its
    dvc.lock entry (it re-ran only because its outputs were missing), ``dvc repro`` restores the outputs that
    entry records and, when those are not in the cache, runs the command, without looking at the run-cache.
    Without its recorded outputs the entry counts as changed and DVC takes the newest run-cache entry.
    """
    from ruamel.yaml import YAML

    rel, key = _lock_of(name)
    lock = root / rel
    if not lock.is_file():
        return
    yaml = YAML()  # round-trip: keeps order, quoting and comments of every other entry
    data = yaml.load(lock.read_text())
    entry = (data or {}).get("stages", {}).get(key)
    if entry is None or "outs" not in entry:
        return
    del entry["outs"]
    tmp = lock.with_name(lock.name + ".tmp")
    with tmp.open("w") as handle:
        yaml.dump(data, handle)
    os.replace(tmp, lock)


def restore(name: str, root: str, remote: str | None, env: dict[str, str], where: str, ran: bool,
            clone: Path | None = None) -> str:
    """Take a stage that ran elsewhere into this workspace from DVC's run-cache (never computing it again);
    with ``clone``, a stage without run-cache entries: its dvc.lock entry from the clone, its outputs checked out."""
    if clone is not None:
        with WORKSPACE_LOCK:
            if not ran:
                return "cached"
            adopt_lock_entry(Path(root), clone, name)
            # git-tracked outputs (cache: false) are in no cache to check out from: taken from the clone's files
            _run_python(f"copy_uncached_outs({root!r}, {str(clone)!r}, {name!r})", Path(root), env)
            dvc(["pull" if remote else "checkout", "--force", name], root, env)
            if "up to date" not in dvc(["status", name], root, env):
                raise RuntimeError(f"stage {name} ran in {where}, but this workspace is not up to date with the "
                                   "dvc.lock entry taken from there")
        return "ran"
    with WORKSPACE_LOCK:
        if ran:
            forget_recorded_outs(Path(root), name)
        restored = dvc(["repro", "--single-item", *(["--pull"] if remote else []), name], root, env)
    if "is cached - skipping run" in restored:
        return "ran"
    if "didn't change, skipping" in restored:
        return "cached"
    raise RuntimeError(f"stage {name} ran in {where} but this workspace could not restore it from the "
                       f"run-cache and computed it again:\n{restored[-2000:]}")


# Prefect's server refuses a flow run whose parameters exceed 524,288 bytes as JSON (HTTP 422; its setting
# PREFECT_SERVER_API_MAX_PARAMETER_SIZE). The overlay is most of a stage's parameters: kept well under that.
OVERLAY_LIMIT_BYTES = 400_000


class OverlayTooLarge(ValueError):
    """The workspace's uncommitted changes are too large to travel as a pool flow run's parameters."""


def workspace_overlay(root: Path, limit_bytes: int = OVERLAY_LIMIT_BYTES) -> tuple[str, dict[str, str | None]]:
    """``root``'s HEAD commit and its working-tree changes: path -> its content zlib-compressed and base64-encoded
    (:func:`apply_overlay` writes it back), or None if deleted.

    Compressed because an edited ``dvc.lock`` alone is about 400 KB (530 KB in base64, over Prefect's limit on a
    flow run's parameters), about 42 KB compressed. Raises :class:`OverlayTooLarge`, naming the largest files,
    when the encoded changes exceed ``limit_bytes``: commit them, and the workers fetch them through git.
    """
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames"],
                            cwd=root, capture_output=True, check=True).stdout.decode()
    files: dict[str, str | None] = {}
    for entry in filter(None, status.split("\0")):
        rel = entry[3:]
        path = root / rel
        files[rel] = base64.b64encode(zlib.compress(path.read_bytes(), 6)).decode() if path.is_file() else None
    size = sum(len(rel) + len(content or "") for rel, content in files.items())
    if size > limit_bytes:
        largest = sorted(files, key=lambda rel: len(files[rel] or ""), reverse=True)[:5]
        raise OverlayTooLarge(
            f"the uncommitted changes of {root} take {size:,} bytes encoded, over the {limit_bytes:,} a pool flow run's "
            f"parameters may carry; commit them (the workers fetch commits through git). Largest: "
            + ", ".join(f"{rel} ({len(files[rel] or ''):,} bytes)" for rel in largest))
    return commit, files


def apply_overlay(clone: Path, files: dict[str, str | None]) -> None:
    """Write :func:`workspace_overlay`'s changes into ``clone`` (a checkout of the same commit)."""
    for rel, content in files.items():
        path = clone / rel
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(zlib.decompress(base64.b64decode(content)))


@contextlib.contextmanager
def slot_lock(base: Path):
    """The first free slot index under ``base`` (an exclusive file lock held while the run lasts)."""
    with lock_first_free(base, (f"slot-{i}" for i in itertools.count())) as name:
        yield int(name.removeprefix("slot-"))


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
    proc = subprocess.run([sys.executable, "-c", f"from pipelines.clones import *; {code}"], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{code}` in {cwd} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
