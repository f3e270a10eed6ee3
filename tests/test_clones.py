"""The flow's parts below the flow itself: worker clones and taking their results back
(``pipelines.clones``) and DVC as a subprocess (``pipelines.dvc_run``). The toy-DAG runs in tests/test_pipeline.py
exercise them together; these check each on its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from pipelines.clones import (OVERLAY_LIMIT_BYTES, OverlayTooLarge, adopt_lock_entry, apply_overlay, forget_recorded_outs,
                              restore, run_in_clone, slot_lock, sync_clone, workspace_overlay)
from pipelines.dvc_run import dvc, stage_env, tail

from .test_pipeline import _dvc, _git

ROOT = Path(__file__).resolve().parents[1]

LOCK = {"schema": "2.0", "stages": {
    "a": {"cmd": "make a", "deps": [{"path": "x", "md5": "1"}], "outs": [{"path": "a.txt", "md5": "2"}]},
    "b": {"cmd": "make b", "outs": [{"path": "b.txt", "md5": "3"}]},
}}


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "kept.txt").write_text("kept\n")
    (root / "gone.txt").write_text("gone\n")
    (root / "ignored.log").write_text("ignored\n")
    (root / ".gitignore").write_text("*.log\n")
    _git("init", "-q", cwd=root)
    _dvc("init", "-q", cwd=root)
    _git("add", "-A", cwd=root)
    _git("commit", "-qm", "base", cwd=root)
    return root


def test_a_clone_holds_the_workspace_files_as_git_sees_them(workspace, tmp_path):
    clone = tmp_path / "clone"
    (clone / "study").mkdir(parents=True)  # a clone that broke off before git finished: replaced, not an error
    sync_clone(workspace, clone)
    assert (clone / "kept.txt").read_text() == "kept\n" and not (clone / "ignored.log").exists()
    assert "dir = " in (clone / ".dvc" / "config.local").read_text()  # this workspace's cache, shared
    # uncommitted edits, new files and deletions all reach the clone on the next sync
    (workspace / "kept.txt").write_text("edited\n")
    (workspace / "new.txt").write_text("new\n")
    (workspace / "gone.txt").unlink()
    sync_clone(workspace, clone)
    assert (clone / "kept.txt").read_text() == "edited\n" and (clone / "new.txt").read_text() == "new\n"
    assert not (clone / "gone.txt").exists()
    # a folder whose files all went goes too (a results folder a stage lists)
    (workspace / "results" / "old").mkdir(parents=True)
    (workspace / "results" / "old" / "a.json").write_text("{}")
    sync_clone(workspace, clone)
    assert (clone / "results" / "old" / "a.json").is_file()
    shutil.rmtree(workspace / "results" / "old")
    sync_clone(workspace, clone)
    assert not (clone / "results").exists()
    with pytest.raises(ValueError, match="'team' is not a DVC remote"):
        sync_clone(workspace, clone, remote="team")


def test_a_clone_follows_what_the_workspace_commits_out_of_git(workspace, tmp_path):
    """A file the workspace stops tracking (a result that became a DVC output) is untracked in the clone too:
    DVC in the clone would otherwise refuse to write it ("already tracked by SCM")."""
    clone = tmp_path / "clone"
    sync_clone(workspace, clone)
    _git("rm", "-q", "--cached", "kept.txt", cwd=workspace)
    (workspace / ".gitignore").write_text("*.log\n/kept.txt\n")
    _git("commit", "-qam", "kept.txt is an output now", cwd=workspace)
    sync_clone(workspace, clone)
    tracked = subprocess.run(["git", "ls-files"], cwd=clone, capture_output=True, text=True, check=True).stdout
    assert "kept.txt" not in tracked.split() and ".gitignore" in tracked.split()


def test_the_overlay_carries_a_commit_and_its_uncommitted_changes(workspace):
    (workspace / "kept.txt").write_text("edited\n")
    (workspace / "gone.txt").unlink()
    (workspace / "new.txt").write_text("new\n")
    commit, files = workspace_overlay(workspace)
    assert len(commit) == 40
    assert files["gone.txt"] is None and set(files) == {"kept.txt", "gone.txt", "new.txt"}
    clone = workspace.parent / "overlay-clone"
    subprocess.run(["git", "clone", "-q", str(workspace), str(clone)], check=True)
    apply_overlay(clone, files)
    assert (clone / "kept.txt").read_text() == "edited\n" and (clone / "new.txt").read_text() == "new\n"
    assert not (clone / "gone.txt").exists()


def test_an_edited_dvc_lock_travels_and_too_large_a_change_is_refused_by_name(workspace):
    # this project's dvc.lock (about 400 KB) was 530 KB in plain base64: Prefect's server refused the flow run (422)
    (workspace / "dvc.lock").write_bytes((ROOT / "dvc.lock").read_bytes())
    _, files = workspace_overlay(workspace)
    assert sum(len(content or "") for content in files.values()) < OVERLAY_LIMIT_BYTES / 4
    (workspace / "weights.bin").write_bytes(os.urandom(OVERLAY_LIMIT_BYTES))
    with pytest.raises(OverlayTooLarge, match=r"commit them .*weights\.bin"):
        workspace_overlay(workspace)


def test_a_stage_with_a_plain_git_tracked_output_leaves_its_clone_through_the_run_cache(workspace, tmp_path):
    # DVC itself saves no run-cache entry for such a stage (a training summary with `cache: false`, not a metric)
    (workspace / "x.txt").write_text("3\n")
    (workspace / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"double": {
        "cmd": "python -c \"n=int(open('x.txt').read()); open('big.txt','w').write(str(2*n)); "
               "open('summary.json','w').write(str(n))\"",
        "deps": ["x.txt"], "outs": ["big.txt", {"summary.json": {"cache": False}}]}}}))
    _git("add", "-A", cwd=workspace)
    _git("commit", "-qm", "stage", cwd=workspace)
    env = stage_env()
    clone = tmp_path / "clone"
    sync_clone(workspace, clone)
    out = run_in_clone(clone, "double", (), None, env)
    assert "Running stage 'double'" in out
    assert restore("double", str(workspace), None, env, "the clone", ran=True) == "ran"  # not computed again
    assert (workspace / "big.txt").read_text() == "6" and (workspace / "summary.json").read_text() == "3"
    assert "up to date" in dvc(["status", "double"], workspace, env)


def test_lock_entries_are_adopted_and_forgotten_one_stage_at_a_time(tmp_path):
    root, clone = tmp_path / "root", tmp_path / "clone"
    root.mkdir()
    clone.mkdir()
    (root / "dvc.lock").write_text(yaml.safe_dump(LOCK, sort_keys=False))
    theirs = yaml.safe_load(yaml.safe_dump(LOCK))
    theirs["stages"]["a"]["outs"][0]["md5"] = "9"
    theirs["stages"]["c"] = {"cmd": "make c"}
    (clone / "dvc.lock").write_text(yaml.safe_dump(theirs, sort_keys=False))
    adopt_lock_entry(root, clone, "a")
    adopt_lock_entry(root, clone, "c")
    ours = yaml.safe_load((root / "dvc.lock").read_text())
    assert ours["stages"]["a"]["outs"][0]["md5"] == "9" and ours["stages"]["b"] == LOCK["stages"]["b"]
    assert list(ours["stages"]) == ["a", "b", "c"]  # a new entry is appended, as DVC appends one
    forget_recorded_outs(root, "b")
    ours = yaml.safe_load((root / "dvc.lock").read_text())
    assert "outs" not in ours["stages"]["b"] and ours["stages"]["a"]["outs"][0]["md5"] == "9"
    forget_recorded_outs(root, "unknown")  # nothing to forget: the file stays as it is
    assert yaml.safe_load((root / "dvc.lock").read_text()) == ours
    # a stage of another pipeline file (the study's): its entry in that file's lock, under its own name
    (clone / "study").mkdir()
    (clone / "study" / "dvc.lock").write_text(yaml.safe_dump(theirs, sort_keys=False))
    adopt_lock_entry(root, clone, "study/dvc.yaml:a")
    assert yaml.safe_load((root / "study" / "dvc.lock").read_text())["stages"] == {"a": theirs["stages"]["a"]}
    forget_recorded_outs(root, "study/dvc.yaml:a")
    assert "outs" not in yaml.safe_load((root / "study" / "dvc.lock").read_text())["stages"]["a"]
    assert yaml.safe_load((root / "dvc.lock").read_text()) == ours  # the default's lock untouched


def test_concurrent_runs_take_distinct_slots(tmp_path):
    held, release = [], threading.Event()

    def run():
        with slot_lock(tmp_path) as slot:
            held.append(slot)
            release.wait(5)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    while len(held) < 3:
        pass
    release.set()
    for t in threads:
        t.join(5)
    assert sorted(held) == [0, 1, 2]
    with slot_lock(tmp_path) as slot:  # all free again
        assert slot == 0


def test_a_progress_bar_keeps_its_last_state_in_the_log():
    assert tail("step 1\rstep 2\rstep 3\ndone\n") == "step 3\ndone\n"
    assert tail("x" * 10, limit=4) == "xxxx"


def test_a_failing_dvc_command_names_itself_and_its_output(tmp_path):
    with pytest.raises(RuntimeError, match=r"`dvc status` in .* failed \(exit"):
        dvc(["status"], tmp_path, stage_env())  # not a DVC repository


def test_a_stage_skips_a_clone_another_flow_run_holds(tmp_path, monkeypatch):
    """Two flow runs on one host take clones from the same folder: a stage must never be synced into a clone a
    stage of the other run is using (the sync deletes what its workspace does not track)."""
    import fcntl
    import logging
    import queue

    from pipelines import reproduce
    from pipelines.slots import CoreSlots

    workers = tmp_path / ".cache" / "workers"
    workers.mkdir(parents=True)
    other_run = open(workers / "slot-0.lock", "w")  # another process's hold on clone w0
    fcntl.flock(other_run, fcntl.LOCK_EX | fcntl.LOCK_NB)
    synced = []
    monkeypatch.setattr(reproduce, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(reproduce, "up_to_date", lambda *a: False)
    monkeypatch.setattr(reproduce, "sync_clone", lambda root, clone, remote: synced.append(clone.name))
    monkeypatch.setattr(reproduce, "run_in_clone", lambda *a, **k: "ran")
    monkeypatch.setattr(reproduce, "restore", lambda *a, **k: "ran")
    monkeypatch.setattr(reproduce, "publish", lambda *a, **k: None)
    clones: queue.Queue = queue.Queue()
    clones.put(0)
    try:
        for stage in ("a", "b"):
            assert reproduce.run_stage_in_clone.fn(stage, (), False, 1, None, clones, CoreSlots(2, 8.0),
                                                   str(tmp_path), None) == "ran"
    finally:
        other_run.close()
    assert synced == ["w1", "w1"]  # never w0; and w1 was given back after the first stage
    assert clones.qsize() == 1


def test_a_dvc_command_waits_for_a_lock_another_process_holds(workspace):
    """A user's DVC command beside a running flow holds the repository lock for minutes: the flow's own commands
    wait for it instead of failing their stage."""
    import threading
    import time

    from dvc.lock import Lock

    lock = Lock(str(workspace / ".dvc" / "tmp" / "lock"))
    lock.lock()
    threading.Timer(3.0, lock.unlock).start()
    start = time.monotonic()
    dvc(["status"], workspace, stage_env())  # raises on failure
    assert time.monotonic() - start >= 2.5  # it waited for the holder (without waiting: an immediate failure)
