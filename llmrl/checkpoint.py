"""Resume only from a checkpoint of the same run.

A run's identity is the hash of three parts, each kept apart so a mismatch can say what changed:

- ``params``: the run's settings (any JSON-serialisable dict);
- ``inputs``: the content hash of every input it reads (a base-model folder, data files), by name;
- ``code``: the content hash of every source file of the training (the project modules it imports).

``save_checkpoint`` stores the identity with the state (atomically: a killed writer leaves the previous checkpoint),
after a header holding the sha256 of the rest; ``load_resumable`` returns the state only when the file is whole (its
digest matches, checked before anything is unpickled) and the stored identity equals the current one, and otherwise
discards the file with a log line naming it and why (damaged; or the parts, inputs and files that changed). A
restart point only saves time, so a damaged one is a recorded miss: the run starts over and ends as it would have.

The code part: ``project_sources()`` lists the source files of every loaded module under the project's folders,
i.e. the training's runtime import closure (call it once the training's modules are imported).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llmrl.files import atomic_path

__all__ = ["project_sources", "RunIdentity", "run_identity", "save_checkpoint", "load_resumable"]

log = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parents[1]
_CHUNK = 1 << 20
MAGIC = b"llmrl-checkpoint sha256 "


def hash_path(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, or of a folder's sorted (relative path, file hash) pairs; dot-entries skipped."""
    p = Path(path)
    if p.is_file():
        h = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            rel = f.relative_to(p)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            h.update(rel.as_posix().encode() + b"\0" + hash_path(f).encode() + b"\n")
        return h.hexdigest()
    raise FileNotFoundError(f"run identity: input {p} does not exist")


def project_sources(root: str | os.PathLike = PROJECT_ROOT, folders: Iterable[str] = ("llmrl", "stages")
                    ) -> list[Path]:
    """Source files of the loaded modules under ``root/<folder>`` (plus ``__main__`` if it lives there)."""
    root = Path(root).resolve()
    bases = [root / f for f in folders]
    files = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        p = Path(f).resolve()
        if any(p.is_relative_to(b) for b in bases):
            files.add(p)
    return sorted(files)


@dataclass(frozen=True)
class RunIdentity:
    """Hashes of a run's params, inputs (by name) and code (by file); ``digest`` covers all three."""

    params: str
    inputs: dict[str, str] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        blob = json.dumps({"params": self.params, "inputs": self.inputs, "code": self.code}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_dict(self) -> dict:
        return {"params": self.params, "inputs": dict(self.inputs), "code": dict(self.code), "digest": self.digest}

    def changes(self, other: Mapping[str, Any]) -> list[str]:
        """What differs from a stored identity (``to_dict`` form): e.g. ['params', 'inputs (base_model)']."""
        out = []
        if other.get("params") != self.params:
            out.append("params")
        for part in ("inputs", "code"):
            mine, theirs = self.inputs if part == "inputs" else self.code, other.get(part) or {}
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            if diff:
                shown = ", ".join(diff[:5]) + (f", +{len(diff) - 5} more" if len(diff) > 5 else "")
                out.append(f"{part} ({shown})")
        return out


def run_identity(params: Mapping[str, Any], inputs: Mapping[str, str | os.PathLike] | None = None,
                 code: Iterable[str | os.PathLike] | None = None, *, root: str | os.PathLike = PROJECT_ROOT
                 ) -> RunIdentity:
    """Identity of a run: params (JSON), the content of each named input path, the content of each code file.

    Code files are keyed by their path relative to ``root`` (absolute if outside), so a moved clone matches.
    """
    try:
        params_blob = json.dumps(params, sort_keys=True, default=str)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"run identity: params are not JSON-serialisable: {exc}") from exc
    root = Path(root).resolve()
    code_hashes = {}
    for f in code or ():
        p = Path(f).resolve()
        key = p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p)
        code_hashes[key] = hash_path(p)
    return RunIdentity(params=hashlib.sha256(params_blob.encode()).hexdigest(),
                       inputs={name: hash_path(p) for name, p in (inputs or {}).items()},
                       code=code_hashes)


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Any], identity: RunIdentity) -> None:
    """Write ``state`` with the identity atomically (temporary file, then rename), after its digest."""
    buffer = io.BytesIO()
    torch.save({"identity": identity.to_dict(), "state": dict(state)}, buffer)
    payload = buffer.getvalue()
    with atomic_path(path) as tmp:
        tmp.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


class _Damaged(ValueError):
    pass


def _payload(p: Path) -> bytes:
    data = p.read_bytes()
    head, _, payload = data.partition(b"\n")
    if not head.startswith(MAGIC) or head[len(MAGIC):] != hashlib.sha256(payload).hexdigest().encode():
        raise _Damaged("its sha256 header does not match its content (damaged, or not a checkpoint of this llmrl)")
    return payload


def load_resumable(path: str | os.PathLike, identity: RunIdentity) -> dict | None:
    """The checkpoint's state when it is whole and belongs to this run, else None: a damaged, unreadable or
    mismatching file is deleted, with a log line naming it and why."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        blob = torch.load(io.BytesIO(_payload(p)), weights_only=False)
        stored = blob["identity"]
        state = blob["state"]
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file is never resumed; it is named and dropped
        log.warning("checkpoint %s discarded, training from scratch: %s (%s)", p,
                    "damaged" if isinstance(exc, _Damaged) else "unreadable", exc)
        p.unlink(missing_ok=True)
        return None
    if stored.get("digest") == identity.digest:
        log.info("checkpoint %s: same run, resuming", p)
        return state
    changed = identity.changes(stored) or ["identity format"]
    log.warning("checkpoint %s discarded, training from scratch: changed %s", p, "; ".join(changed))
    p.unlink(missing_ok=True)
    return None
