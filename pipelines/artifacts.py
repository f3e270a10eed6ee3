"""A stage's Prefect artifact: a markdown report (``stage-<name>``) of its status, wall time and the numbers in its
``metrics:`` files, one version per run of the flow; publishing never fails the stage."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prefect.artifacts import create_markdown_artifact

__all__ = ["artifact_key", "stage_markdown", "read_metrics_files", "publish"]


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


def publish(name: str, status: str, seconds: float, waited: float, root: str, metrics: tuple[str, ...], log) -> None:
    """The stage's artifact (``artifact_key(name)``) on the Prefect API; a failure here never fails the stage."""
    try:
        markdown = stage_markdown(name, status, seconds, read_metrics_files(Path(root), metrics), waited)
        create_markdown_artifact(markdown=markdown, key=artifact_key(name), description=f"DVC stage `{name}`: {status}")
    except Exception as exc:  # noqa: BLE001 - the report is a view of the stage, not part of it
        log.warning("stage %s: could not publish its metrics artifact: %r", name, exc)
