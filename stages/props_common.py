"""Shared by the props_* stages: dvclive curves of best return against episodes used (mean over seeds)."""

from __future__ import annotations

from pathlib import Path

from llmrl.eval.props import mean_curve
from stages.common import open_live


def log_curves(root: Path, runs: list[dict]) -> None:
    """One dvclive folder per method: a custom plot of the seed-mean best return against episodes used."""
    for method in sorted({r["method"] for r in runs}):
        curve = mean_curve([r["rows"] for r in runs if r["method"] == method])
        with open_live(root / method) as live:
            live.log_plot("best_return", curve, x="episodes", y="best_return", template="linear",
                          title=f"{method}: best return vs episodes", x_label="episodes", y_label="best return")
