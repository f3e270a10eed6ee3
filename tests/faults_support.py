"""What the fault, damage and interruption tests share: the three broken endpoints on 127.0.0.1, and a stage
run in a scratch copy of the repository (its own params.yaml and outputs; the library is this checkout's)."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HungEndpoint:
    """Accepts TCP connections on 127.0.0.1 and never answers."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def __exit__(self, *exc) -> None:
        self.sock.close()


class BrokenEndpoint:
    """An OpenAI-compatible URL on 127.0.0.1 whose completion routes answer HTTP 500 (``kind="500"``) or an HTML
    page with status 200 (``kind="html"``), served by uvicorn in a thread."""

    def __init__(self, kind: str):
        import uvicorn
        from fastapi import FastAPI
        from fastapi.responses import HTMLResponse, JSONResponse

        app = FastAPI()
        self.hits = 0

        @app.post("/v1/completions")
        @app.post("/v1/chat/completions")
        def broken():
            self.hits += 1
            if kind == "500":
                return JSONResponse({"error": {"message": "internal error"}}, status_code=500)
            return HTMLResponse("<html><body><h1>Down for maintenance</h1></body></html>")

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("test endpoint did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def endpoint(kind: str):
    """``hang`` (accepts, never answers), ``500`` or ``html`` (a 200 that is no completion)."""
    return HungEndpoint() if kind == "hang" else BrokenEndpoint(kind)


def stage_repo(tmp_path: Path, params: dict | None = None) -> Path:
    """A scratch repository root: a copy of stages/ and params.yaml (``params`` replaces the file's sections),
    so a stage's outputs (paths relative to its script's parent folder) land under ``tmp_path/repo``."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "stages", root / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    write_params(root, params or yaml.safe_load((ROOT / "params.yaml").read_text()))
    return root


def write_params(root: Path, params: dict) -> None:
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def repo_params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def stage_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    return env


def stage_command(script: str, *args: str) -> list[str]:
    """The stage's command as dvc.yaml runs it (``python -m stages.<name> <args>``) for its module file's name, run
    from the scratch root: its ``stages`` package and params.yaml are the scratch copy's."""
    return [sys.executable, "-m", f"stages.{Path(script).stem}", *args]


def run_stage(root: Path, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(stage_command(script, *args), cwd=root, env=stage_env(), capture_output=True, text=True,
                          timeout=timeout)


def start_stage(root: Path, script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(stage_command(script, *args), cwd=root, env=stage_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def snapshot(root: Path, skip: tuple[str, ...] = (".cache", "stages")) -> dict[str, str]:
    """sha256 of every file under ``root`` but the scratch folders, by relative path."""
    out = {}
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root)
        if f.is_file() and rel.parts[0] not in skip and rel.name != "params.yaml":
            out[rel.as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out
