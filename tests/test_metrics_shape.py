"""Readable metrics: the committed metrics files of the whole pipeline fit in one terminal-readable table.

``dvc metrics show`` prints one row per metrics file and one column per distinct key path, so the shared
vocabulary (``llmrl.eval.headline``) keeps the column count small however many agents and seeds there are
(at most 40 columns for the default pipeline). Metrics files hold headline numbers only: training
summaries, environment lines, dtypes, verdicts, episode tables, prompt dumps and curves are plain outs or plots. The
one string a metrics file keeps is its ``checksum`` (``llmrl.files.write_json``: the report refuses a damaged file).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAX_COLUMNS = 40


def _declared_metrics() -> list[str]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    paths = []
    for stage in stages.values():
        body = stage.get("do", stage)
        for entry in body.get("metrics", []):
            paths.append(next(iter(entry)) if isinstance(entry, dict) else entry)
    return paths


def _metric_files() -> list[Path]:
    files = []
    for pattern in _declared_metrics():
        if "${" in pattern:  # foreach/matrix templates (${item...}) match every generated file
            base = ROOT / pattern.split("${")[0]
            candidates = sorted(base.parent.glob(base.name + "*"))
        else:
            candidates = [ROOT / pattern]
        for c in candidates:
            files += [c] if c.is_file() else sorted(c.rglob("*.json"))
    return sorted(set(files))


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, node


def test_metric_columns_fit_a_terminal_table():
    files = _metric_files()
    assert files, "no metrics files found"
    columns = set()
    for f in files:
        columns |= {k for k, _ in _leaves(json.loads(f.read_text()))}
    assert len(columns) <= MAX_COLUMNS, f"{len(columns)} metric columns (> {MAX_COLUMNS}): {sorted(columns)}"


def test_metrics_hold_headline_figures_not_tables():
    for f in _metric_files():
        for key, value in _leaves(json.loads(f.read_text())):
            if isinstance(value, list):
                assert len(value) <= 10 and all(not isinstance(v, (dict, list)) for v in value), \
                    f"{f.relative_to(ROOT)}: {key} is a table; write it to a plain out or a plot"


def non_numeric(files: list[Path]) -> list[str]:
    """``file: key=value`` for every leaf of the metrics ``files`` that is not a number or a boolean (their
    ``checksum`` aside)."""
    return [f"{f}: {key}={value!r}" for f in files for key, value in _leaves(json.loads(f.read_text()))
            if key != "checksum" and (isinstance(value, str) or not isinstance(value, (int, float, bool)))]


def test_metrics_hold_numbers_only():
    found = non_numeric(_metric_files())
    assert not found, "non-numeric metrics (move them to a plain out):\n" + "\n".join(found[:20])
