"""DVC as the flow calls it: ``dvc`` in a subprocess of this interpreter (the project's venv), the tails of what a
stage printed for the Prefect log, and this workspace's lock: DVC's repository lock admits one ``repro`` per
workspace, so the flow's threads take ``WORKSPACE_LOCK`` before any DVC command here."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["WORKSPACE_LOCK", "stage_env", "tail", "dvc", "up_to_date"]

WORKSPACE_LOCK = threading.Lock()  # DVC's repository lock admits one repro per workspace


def stage_env() -> dict[str, str]:
    # Stage commands say `python`: make it this interpreter (the project's venv), as `make` does.
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def tail(text: str, limit: int = 4000) -> str:
    # A progress bar redraws its line with \r: keep each line's last state.
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))[-limit:]


def dvc(args: list[str], cwd: Path | str, env: dict[str, str], log=None) -> str:
    """``dvc ARGS`` in ``cwd``; its stdout. With ``log``, the tails of its stdout and stderr (a stage's command
    prints to both: DVC passes them through) go to that logger: the Prefect task's log. Where another process (a
    user's ``dvc commit`` beside a running flow, another flow) holds the repository's lock, DVC waits for it
    (``--wait-for-lock``; the lock is an OS file lock, released when its holder exits) rather than failing the stage."""
    proc = subprocess.run([sys.executable, "-m", "dvc", "--wait-for-lock", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` in {cwd} failed (exit {proc.returncode}):\n"
                           f"{tail(proc.stdout, 2000)}\n{tail(proc.stderr)}")
    if log is not None:
        for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            if text.strip():
                log.info("%s of `dvc %s`:\n%s", stream, " ".join(args), tail(text))
    return proc.stdout


def up_to_date(name: str, root: str, env: dict[str, str]) -> bool:
    with WORKSPACE_LOCK:  # its upstream stages are done: an up-to-date stage needs no worker
        return "up to date" in dvc(["status", name], root, env)
