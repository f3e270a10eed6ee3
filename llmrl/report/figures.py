"""Curve plots as inline SVG (matplotlib), the same bytes for the same data."""

from __future__ import annotations

import io

from llmrl.report.collect import CurvePlot

__all__ = ["curve_svg"]


def curve_svg(plot: CurvePlot) -> str:
    """An ``<svg>`` element: one line per series, one colour and legend entry per label."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    # text stays text (smaller, selectable); a fixed hash salt and no date keep the SVG byte-stable
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": plot.id, "font.size": 9}):
        fig = Figure(figsize=(5.6, 3.4))
        ax = fig.add_subplot()
        colours: dict[str, str] = {}
        for s in plot.series:
            first = s.label not in colours
            colours.setdefault(s.label, f"C{len(colours) % 10}")
            if s.markers_only:
                ax.plot(s.x, s.y, color=colours[s.label], label=s.label if first else "_nolegend_", linestyle="none",
                        marker="x", markersize=6)
                continue
            ax.plot(s.x, s.y, color=colours[s.label], label=s.label if first else "_nolegend_", linewidth=1.3,
                    alpha=0.8, marker="o" if len(s.x) <= 8 else None, markersize=3)
        ax.set_xlabel(plot.xlabel)
        ax.set_ylabel(plot.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # the XML prolog and doctype are not allowed inside HTML
