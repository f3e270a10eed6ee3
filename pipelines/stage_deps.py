"""Every DVC stage's `deps` cover the project code its script imports, transitively.

For each stage of dvc.yaml (plain, `foreach` and `matrix` stages alike) the stage module named in `cmd`
(`python -m stages.<name> ...`, or a script `python <path>.py ...`) is parsed with `ast`, never executed, and its
import closure is followed through the project's own files only: `stages/*.py` and `llmrl/**/*.py`, including every
package `__init__.py` an import passes through and those of the module's own package (Python runs them). Imports inside
functions count too (they run when that code path runs); imports of third-party packages are outside the closure.
Package data a module reads is counted with it: a non-Python entry beside the module (a file, or a folder that is
not a package, e.g. `llmrl/algos/props_templates/`) whose name appears in one of the module's string literals.

    python pipelines/stage_deps.py --check            # exit 1 and list each stage's missing deps
    python pipelines/stage_deps.py --write            # add the missing deps to dvc.yaml (comments kept)
    python pipelines/stage_deps.py --write --prune    # ... and drop project .py deps outside the closure

`--write` only inserts (and with `--prune` deletes) single lines of the deps lists, so comments, ordering and
every non-Python dep (data and model folders, other files) stay as they were.

Why by hand: modulefinder executes nothing either but follows every third-party import (torch, transformers:
minutes and thousands of modules) and cannot be restricted to one tree; the resolution below is ~60 lines.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_RE = re.compile(r"(?:^|\s)(?:python3?|\S*/python3?)\s+(?:-\S+\s+)*(\S+\.py)\b")
MODULE_RE = re.compile(r"(?:^|\s)(?:python3?|\S*/python3?)\s+-m\s+([\w.]+)")
DYNAMIC_RE = re.compile(r"((?:llmrl)(?:\.\w+)+)(?::[\w.]+)?")
PROJECT_CODE_DIRS = ("stages", "llmrl")  # a .py dep under one of these is project code, owned by this tool


class StageDepsError(Exception):
    """dvc.yaml or a stage script cannot be analysed (message names the stage / file)."""


# ---------------------------------------------------------------------------------------------- import closure
def _module_file(root: Path, dotted: str, search: list[Path]) -> tuple[Path | None, list[Path]]:
    """Resolve `a.b.c` against the search folders: (the module's file or None, the package __init__ files on the way)."""
    parts = dotted.split(".")
    for base in search:
        inits: list[Path] = []
        cur = base
        ok = True
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            pkg = cur / part
            if (pkg / "__init__.py").is_file():
                inits.append(pkg / "__init__.py")
                cur = pkg
                if last:
                    return pkg / "__init__.py", inits
            elif last and (cur / f"{part}.py").is_file():
                return cur / f"{part}.py", inits
            else:
                ok = False
                break
        if ok:
            return None, inits
    return None, []


def _package_of(root: Path, file: Path) -> list[str]:
    """Dotted package parts of a project file (`llmrl/algos/distilled_ppo.py` -> ['llmrl', 'algos']); [] for a script folder."""
    parts: list[str] = []
    d = file.parent
    while (d / "__init__.py").is_file() and d != root:
        parts.insert(0, d.name)
        d = d.parent
    return parts


def _imports(file: Path, root: Path) -> list[str]:
    """Every module name the file may import (absolute, dotted); `from x import y` yields x and x.y (y may be a module)."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except SyntaxError as exc:
        raise StageDepsError(f"{file.relative_to(root)}: cannot parse: {exc}") from exc
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = _package_of(root, file)
                up = node.level - 1
                if up > len(pkg):
                    raise StageDepsError(f"{file.relative_to(root)}: relative import beyond the top package")
                base = pkg[: len(pkg) - up] if up else pkg
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod:
                names.append(mod)
            names.extend(f"{mod}.{alias.name}" if mod else alias.name for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # dynamic imports name their module in a string: importlib.import_module("llmrl.envs.doorkey"),
            # gymnasium entry points "llmrl.envs.babyai_text:make_text_env"
            m = DYNAMIC_RE.fullmatch(node.value)
            if m:
                names.append(m.group(1))
    return names


def _data_deps(file: Path) -> list[Path]:
    """Non-Python entries beside a module that the module names in a string literal (its package data)."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except SyntaxError:
        return []
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    found = []
    for entry in sorted(file.parent.iterdir()):
        if entry.name.startswith((".", "__pycache__")) or entry.suffix in (".py", ".pyc"):
            continue
        if entry.is_dir() and (entry / "__init__.py").exists():
            continue  # a sub-package: reached through imports if used
        if any(entry.name in s for s in strings):
            found.append(entry)
    return found


def import_closure(script: Path, root: Path = ROOT) -> list[str]:
    """Project files (repo-relative, posix) the script imports transitively, the script first, then sorted."""
    script = script.resolve()
    if not script.is_file():
        raise StageDepsError(f"stage script {script} does not exist")
    seen: set[Path] = set()
    data: set[Path] = set()
    todo = [script]
    folder = script.parent  # a module of a package (`python -m stages.<name>`): its packages' __init__ files run first
    while folder != root and (folder / "__init__.py").is_file():
        todo.append(folder / "__init__.py")
        folder = folder.parent
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        data.update(_data_deps(f))
        # top-level names resolve against the repo root (llmrl) and, for scripts, their own folder (sys.path[0]).
        search = [root] if _package_of(root, f) else [f.parent, root]
        for name in _imports(f, root):
            mod_file, inits = _module_file(root, name, search)
            for p in inits + ([mod_file] if mod_file else []):
                if p.resolve() not in seen:
                    todo.append(p.resolve())
    rel = sorted(p.relative_to(root).as_posix() for p in seen if p != script)
    rel += sorted(p.relative_to(root).as_posix() for p in data)
    return [script.relative_to(root).as_posix()] + rel


# ---------------------------------------------------------------------------------------------- dvc.yaml
@dataclass
class StageReport:
    name: str
    script: str | None
    closure: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    deps_node: object = None  # the ruamel sequence of this stage's deps (None when the stage has none)
    body: object = None


def _dep_name(item) -> str:
    return next(iter(item)) if isinstance(item, dict) else str(item)


def _is_project_code(dep: str) -> bool:
    return dep.endswith(".py") and dep.split("/", 1)[0] in PROJECT_CODE_DIRS


def _script_of(name: str, cmd, root: Path) -> str | None:
    cmds = cmd if isinstance(cmd, list) else [cmd]
    for c in cmds:
        m = SCRIPT_RE.search(str(c))
        if m:
            return m.group(1)
        m = MODULE_RE.search(str(c))
        if m:
            f, _ = _module_file(root, m.group(1), [root])
            if f is not None:
                return f.relative_to(root).as_posix()
    return None


def analyse(dvc_yaml: Path, root: Path | None = None) -> list[StageReport]:
    root = (root or dvc_yaml.parent).resolve()
    yaml = YAML()
    try:
        doc = yaml.load(dvc_yaml.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - any YAML error is reported with the file name
        raise StageDepsError(f"{dvc_yaml}: cannot read: {exc}") from exc
    reports = []
    for name, stage in (doc.get("stages") or {}).items():
        body = stage["do"] if "foreach" in stage else stage  # matrix stages keep cmd/deps at top level
        script = _script_of(name, body.get("cmd", ""), root)
        rep = StageReport(name, script, deps_node=body.get("deps"), body=body)
        if script is not None:
            if not (root / script).is_file():
                raise StageDepsError(f"stage {name}: script {script} named in cmd does not exist")
            rep.closure = import_closure(root / script, root)
            declared = {_dep_name(d).rstrip("/") for d in (body.get("deps") or [])}
            rep.missing = [p for p in rep.closure if p not in declared]
            rep.extra = sorted(d for d in declared if _is_project_code(d) and d not in rep.closure)
        reports.append(rep)
    return reports


def write(dvc_yaml: Path, reports: list[StageReport], prune: bool = False) -> int:
    """Insert the missing deps (and with prune drop the extra ones) line by line; returns the number of lines changed."""
    lines = dvc_yaml.read_text(encoding="utf-8").splitlines(keepends=True)
    inserts: dict[int, list[str]] = {}  # line index -> lines to insert before it
    deletes: set[int] = set()
    for rep in reports:
        if not rep.missing and not (prune and rep.extra):
            continue
        seq = rep.deps_node
        if seq is None or len(seq) == 0:
            # no deps list yet: add one right after the cmd line
            line, col = rep.body.lc.key("cmd")
            key_indent = " " * col
            new = [f"{key_indent}deps:\n"] + [f"{key_indent}  - {p}\n" for p in rep.missing]
            end = line + 1
            while end < len(lines) and lines[end].startswith(key_indent + " "):
                end += 1  # a multi-line cmd
            inserts.setdefault(end, []).extend(new)
            continue
        col = seq.lc.item(0)[1]
        indent = " " * max(col - 2, 0)
        # after the last plain code dep (single-line scalars), else before the first item
        code_items = [i for i, d in enumerate(seq) if not isinstance(d, dict) and _is_project_code(str(d))]
        at = seq.lc.item(code_items[-1])[0] + 1 if code_items else seq.lc.item(0)[0]
        inserts.setdefault(at, []).extend(f"{indent}- {p}\n" for p in rep.missing)
        if prune:
            for i, d in enumerate(seq):
                if not isinstance(d, dict) and str(d) in rep.extra:
                    deletes.add(seq.lc.item(i)[0])
    out = []
    for i, line in enumerate(lines + [""]):
        out.extend(inserts.get(i, []))
        if i < len(lines) and i not in deletes:
            out.append(line)
    tmp = dvc_yaml.with_name(dvc_yaml.name + ".tmp")
    tmp.write_text("".join(out), encoding="utf-8")
    tmp.replace(dvc_yaml)  # atomic: nothing half-written
    return sum(len(v) for v in inserts.values()) + len(deletes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml")
    ap.add_argument("--root", type=Path, default=None, help="repository root (default: the dvc.yaml's folder)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when a stage misses a module of its closure")
    mode.add_argument("--write", action="store_true", help="add the missing deps to dvc.yaml")
    ap.add_argument("--prune", action="store_true", help="with --write: also drop project .py deps outside the closure")
    ap.add_argument("--show", action="store_true", help="print every stage's closure")
    args = ap.parse_args(argv)
    try:
        reports = analyse(args.dvc_yaml, args.root)
    except StageDepsError as exc:
        print(f"stage_deps: {exc}", file=sys.stderr)
        return 2
    n_missing = sum(len(r.missing) for r in reports)
    for r in reports:
        if args.show:
            print(f"{r.name}: {r.script}\n  " + "\n  ".join(r.closure))
        if r.script is None:
            print(f"{r.name}: no python script in cmd (not checked)")
        if r.missing:
            print(f"{r.name}: missing {len(r.missing)}: {', '.join(r.missing)}")
        if r.extra:
            print(f"{r.name}: outside the closure (extra) {len(r.extra)}: {', '.join(r.extra)}")
    stale = [r.name for r in reports if r.missing]
    print(f"{len(reports)} stages, {len(stale)} with missing deps, {n_missing} missing deps in total")
    if args.write:
        changed = write(args.dvc_yaml, reports, prune=args.prune)
        print(f"wrote {args.dvc_yaml}: {changed} lines changed")
        return 0
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
