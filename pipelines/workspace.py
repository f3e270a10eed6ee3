"""A copy of this workspace for runs that must not touch it (tests, benchmarks): the files git sees (tracked, and
untracked but not ignored: edits and new files included), never the outputs, caches or DVC lock of the workspace
itself; and where a stage item's outputs lie (``stages/paths.py``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["workspace_files", "copy_workspace", "stage_outputs"]

ROOT = Path(__file__).resolve().parents[1]


def workspace_files(root: Path = ROOT) -> list[str]:
    """Paths (relative, posix) of the files git sees in ``root``'s working tree."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def copy_workspace(dst: Path, root: Path = ROOT, *, commit: bool = False, skip: tuple[str, ...] = ()) -> Path:
    """``root``'s files as git sees them, copied to ``dst`` (created), a git repository of their own (so DVC finds
    its root and its ignores there), but those under the top folders ``skip`` names (git's .gitignore files there
    kept); with ``commit`` they are its first commit (dvclive, as a stage runs it, reads the repository's HEAD)."""
    for rel in workspace_files(root):
        if rel.split("/", 1)[0] in skip and not rel.endswith(".gitignore"):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst / rel)
    git = ["git", "-c", "user.name=tests", "-c", "user.email=tests@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=dst, check=True)
    if commit:
        subprocess.run([*git, "add", "-A"], cwd=dst, check=True)
        subprocess.run([*git, "commit", "-qm", "scratch"], cwd=dst, check=True)
    return dst


def stage_outputs(root: Path, stage: str, argv: list[str]) -> list[Path]:
    """The outputs stages/paths.py names for the stage item (its command's arguments after the module), under
    ``root``."""
    from stages import paths

    outputs = getattr(paths, stage.split("@")[0])(*argv[1:])
    return [root / p.relative_to(paths.ROOT) for p in outputs.values()]
