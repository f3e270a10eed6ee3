"""Atomic file writes: outputs appear complete or not at all; and checksums, so a damaged file is named, never read.

- ``atomic_path`` writes through a temporary sibling renamed over the target; a full disk there is a
  ``DiskFullError`` naming the output, whose previous version stays as it was.
- ``write_json`` / ``read_json``: a JSON object carries the checksum of its content under the key ``checksum``
  (64 bits of sha256 over its canonical form, so ``dvc metrics show`` stays narrow); ``read_json`` returns the
  object without it, or raises ``DamagedFileError`` naming the file.
- ``write_checksums`` / ``verify_checksums``: a model folder (safetensors, peft adapter, ``.pt``, d3rlpy ``.d3``)
  carries a ``SHA256SUMS`` manifest (``sha256sum -c`` reads it), written inside the folder's atomic swap; loaders
  verify it before any file is parsed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["DamagedFileError", "DiskFullError", "is_disk_full", "CHECKSUM_KEY", "CHECKSUMS_FILE", "atomic_path",
           "write_json", "read_json", "json_checksum", "write_text", "save_torch", "sha256_file", "write_checksums",
           "verify_checksums"]

CHECKSUM_KEY = "checksum"
CHECKSUMS_FILE = "SHA256SUMS"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_MANIFEST_LINE = re.compile(rb"([0-9a-f]{64})  ([^\0/][^\0]*)")
_VERIFIED: set[tuple] = set()  # (file, inode, size, mtime_ns, sha256) checked in this process


class DamagedFileError(ValueError):
    """A file whose bytes are not those its writer checksummed, or that cannot be parsed; the message names it."""


class DiskFullError(OSError):
    """No space left to write an output; the message names it (``output``). Its previous version is left as it
    was."""

    def __init__(self, output: Path, cause: BaseException, inside: str = ""):
        where = f" (writing {inside})" if inside else ""
        super().__init__(errno.ENOSPC, f"{output}: no space left on the device to write it{where}; its previous "
                                       f"version is left as it was ({type(cause).__name__}: {cause})")
        self.output = Path(output)


def is_disk_full(err: BaseException) -> bool:
    """``err`` (or what caused it) says the device is full: an ``OSError`` errno, or the text libraries that wrap
    it pass on (safetensors, h5py)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in _FULL:
            return True
        if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system or the
    file system cannot, for the caller's two-rename fallback."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _sweep_stale(path: Path) -> None:
    """Clear what a killed earlier writer of ``path`` left: its temporaries (``.<name>.<8 chars>.tmp``) and a
    previous version set aside (``.<name>.old``, put back if ``path`` is missing). One output has one writer at a
    time, so they are stale."""
    old = path.with_name(f".{path.name}.old")
    if old.exists() and not path.exists():  # killed between the two renames of the fallback swap: put it back
        old.rename(path)
    stale = re.compile(re.escape(f".{path.name}.") + r"(?:[a-z0-9_]{8}\.tmp|old)")
    for sibling in path.parent.iterdir():
        if stale.fullmatch(sibling.name):
            _remove(sibling)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; on success rename it over ``path`` (a folder is swapped with the
    previous one in a single step where the system can), so ``path`` always holds one whole version.

    On an exception the temporary is removed and ``path`` keeps its previous content; a full disk is re-raised as
    ``DiskFullError`` naming ``path``. Temporaries of an earlier writer that was killed are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(path)
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    # mkstemp/mkdtemp create owner-only entries; published outputs get the usual permissions.
    tmp.chmod(0o755 if is_dir else 0o644)
    try:
        yield tmp
        if is_dir and path.exists():
            if _exchange(tmp, path):  # tmp now holds the previous version
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                old = path.with_name(f".{path.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                path.rename(old)
                tmp.rename(path)
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException as err:
        _remove(tmp)
        if isinstance(err, DiskFullError) and err.output.is_relative_to(tmp):  # an output written inside this one
            raise DiskFullError(path, err.__cause__ or err, err.output.relative_to(tmp).as_posix()) from err
        if isinstance(err, Exception) and not isinstance(err, DiskFullError) and is_disk_full(err):
            raise DiskFullError(path, err) from err
        raise


def json_checksum(obj: Any) -> str:
    """64 bits of the sha256 of ``obj``'s canonical JSON (sorted keys, no spaces): what ``write_json`` stores."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """``obj`` as indented JSON, atomically; an object (dict) gets its ``checksum`` key for ``read_json``."""
    if isinstance(obj, dict):
        if CHECKSUM_KEY in obj:
            raise ValueError(f"write_json {path}: key {CHECKSUM_KEY!r} is reserved for the file's checksum")
        obj = {**obj, CHECKSUM_KEY: json_checksum(obj)}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> dict:
    """The object ``write_json`` wrote to ``path`` (without its checksum), or ``DamagedFileError`` naming the file
    when it is not JSON, carries no checksum, or its content does not match the checksum."""
    path = Path(path)
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise DamagedFileError(f"{path}: not a JSON file ({type(err).__name__}: {err}); the file is damaged") from err
    if not isinstance(obj, dict) or not isinstance(obj.get(CHECKSUM_KEY), str):
        raise DamagedFileError(f"{path}: field {CHECKSUM_KEY!r} is missing: damaged, or written before files carried "
                               "checksums (re-run the stage that wrote it)")
    stored = obj.pop(CHECKSUM_KEY)
    if json_checksum(obj) != stored:
        raise DamagedFileError(f"{path}: field {CHECKSUM_KEY!r} does not match the content: the file is damaged")
    return obj


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` with the same bytes for the same tensors, written atomically.

    ``torch.save`` to a path names the archive's root folder after the file, so saving through a temporary
    file (as ``atomic_path`` does) put a random name into every archive and DVC saw identical models as
    changed. Serialising to memory fixes the root name ("archive").
    """
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_checksums(folder: str | os.PathLike) -> None:
    """``folder/SHA256SUMS``: the sha256 of every file under ``folder`` (``sha256sum`` format), written last, inside
    the folder's atomic swap, so the manifest and the files it lists appear together."""
    folder = Path(folder)
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.relative_to(folder).as_posix() != CHECKSUMS_FILE)
    write_text(folder / CHECKSUMS_FILE, "".join(f"{sha256_file(f)}  {f.relative_to(folder).as_posix()}\n"
                                                for f in files))


def verify_checksums(folder: str | os.PathLike, names: Iterable[str] | None = None, *, required: bool = True
                     ) -> bool:
    """Check the files ``folder/SHA256SUMS`` lists (only ``names`` when given, which must be listed) against it.

    A listed file that is missing or differs, or a manifest line that is not ``<sha256>  <name>``, raises
    ``DamagedFileError`` naming the file. Without a manifest: ``DamagedFileError`` when ``required`` (a folder this
    project wrote before it kept checksums, or not one of its outputs), else False (a folder from elsewhere, e.g.
    a downloaded model). True when every file checked matches.
    """
    folder = Path(folder)
    manifest = folder / CHECKSUMS_FILE
    if not manifest.is_file():
        if required:
            raise DamagedFileError(f"{manifest}: missing, so {folder} cannot be checked (written before model folders "
                                   "carried checksums? re-run the stage that wrote it)")
        return False
    content = manifest.read_bytes()
    lines = content.split(b"\n")
    listed: dict[str, str] = {}
    for n, line in enumerate(lines[:-1], 1):
        match = _MANIFEST_LINE.fullmatch(line)
        if not match:
            raise DamagedFileError(f"{manifest}: line {n} is not '<sha256>  <file>': the manifest is damaged")
        try:
            listed[match[2].decode("utf-8")] = match[1].decode("ascii")
        except UnicodeDecodeError as err:
            raise DamagedFileError(f"{manifest}: line {n} names no file: the manifest is damaged") from err
    if lines[-1]:
        raise DamagedFileError(f"{manifest}: does not end with a line break: the manifest is damaged")
    wanted = list(listed) if names is None else list(names)
    for name in wanted:
        path = folder / name
        if name not in listed:
            raise DamagedFileError(f"{path}: not listed in {manifest}: the manifest is damaged or stale")
        if not path.is_file():
            raise DamagedFileError(f"{path}: listed in {manifest} but missing")
        # A file checked once in this process is not hashed again while its inode, size and mtime stay the same
        # (loading one model twice, e.g. a verified folder then its load_model, reads it once more, not twice).
        st = path.stat()
        seen = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, listed[name])
        if seen in _VERIFIED:
            continue
        if sha256_file(path) != listed[name]:
            raise DamagedFileError(f"{path}: its sha256 differs from the one in {manifest}: the file is damaged")
        _VERIFIED.add(seen)
    return True
