"""Atomic writes and byte-stable model files."""

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmrl.files import atomic_path, read_json, save_torch, write_json


def test_atomic_file_and_dir(tmp_path):
    write_json(tmp_path / "m.json", {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "m.json") as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert read_json(tmp_path / "m.json") == {"a": 1}
    with atomic_path(tmp_path / "d", is_dir=True) as tmp:
        (tmp / "x").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "d", is_dir=True) as tmp:
            (tmp / "x").write_text("2")
            raise RuntimeError("interrupted")
    assert (tmp_path / "d" / "x").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m.json"]


def test_save_torch_same_tensors_same_bytes(tmp_path):
    torch.manual_seed(0)
    state = {"w": torch.randn(8, 4), "b": torch.zeros(4)}
    save_torch(state, tmp_path / "a.pt")
    save_torch({k: v.clone() for k, v in state.items()}, tmp_path / "b.pt")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(tmp_path / "a.pt") == digest(tmp_path / "b.pt")
    loaded = torch.load(tmp_path / "a.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"])


def test_plain_torch_save_through_a_temporary_differs(tmp_path):
    """The failure save_torch avoids: the temporary's name ends up in the archive."""
    state = {"w": torch.ones(3)}
    with atomic_path(tmp_path / "a.pt") as tmp:
        torch.save(state, tmp)
    with atomic_path(tmp_path / "b.pt") as tmp:
        torch.save(state, tmp)
    assert (tmp_path / "a.pt").read_bytes() != (tmp_path / "b.pt").read_bytes()


def _run_stage_code(code: str, cwd) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(root)))


def test_a_killed_stage_leaves_the_previous_runs_curves(tmp_path):
    """open_live publishes a stage's dvclive folder only when its block ends: a run killed with SIGKILL, or one
    that fails, leaves the previous run's curves whole; a finished run replaces them."""
    folder = tmp_path / "plots" / "curves"
    folder.mkdir(parents=True)
    (folder / "previous.tsv").write_text("step\tx\n0\t1\n")
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    log_and = ("from stages.common import open_live\n"
               f"with open_live({str(folder)!r}) as live:\n"
               "    for i in range(3):\n"
               "        live.log_metric('x', i); live.next_step()\n"
               "    {end}\n")
    killed = _run_stage_code(log_and.format(end="import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), tmp_path)
    assert killed.returncode == -signal.SIGKILL
    failed = _run_stage_code(log_and.format(end="raise RuntimeError('bug')"), tmp_path)
    assert failed.returncode == 1 and "RuntimeError" in failed.stderr
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    done = _run_stage_code(log_and.format(end="pass"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (folder / "previous.tsv").exists() and (folder / "plots" / "metrics" / "x.tsv").is_file()


def test_a_killed_writers_leftovers_are_cleared_and_a_set_aside_version_put_back(tmp_path):
    """A writer killed mid-write leaves its temporary; one killed between the two renames of a folder swap (where
    the file system has no one-step exchange) leaves the previous version set aside. The next writer of the same
    output clears the first and puts the second back before it starts."""
    out = tmp_path / "out"
    (tmp_path / ".out.k1ll3d_x.tmp").mkdir()
    (tmp_path / ".out.a1b2c3d4.tmp").write_text("half")
    (tmp_path / ".other.a1b2c3d4.tmp").write_text("another output's")
    (tmp_path / ".out.old").mkdir()
    (tmp_path / ".out.old" / "x").write_text("previous")
    with pytest.raises(RuntimeError), atomic_path(out, is_dir=True) as tmp:
        (tmp / "x").write_text("new, never finished")
        raise RuntimeError("failed")
    assert (out / "x").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.a1b2c3d4.tmp", "out"]


def test_a_full_disk_is_a_named_error_and_keeps_the_previous_output(tmp_path):
    import errno

    from llmrl.files import DiskFullError

    write_json(tmp_path / "m.json", {"a": 1})
    with pytest.raises(DiskFullError, match=r"m.json: no space left on the device"), \
            atomic_path(tmp_path / "m.json") as tmp:
        tmp.write_text("{")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(DiskFullError, match=r"d: no space left on the device .*SafetensorError"), \
            atomic_path(tmp_path / "d", is_dir=True):
        class SafetensorError(Exception):  # what safetensors raises, the errno only in its text
            pass

        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")
    assert read_json(tmp_path / "m.json") == {"a": 1} and not (tmp_path / "d").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
