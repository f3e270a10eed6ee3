"""The results page: ``index.html`` (tables, inline SVG curves, videos), ``summary.md`` (the same tables)."""

from __future__ import annotations

import shutil
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from llmrl.report.collect import NOT_CONVERGED, Report
from llmrl.report.figures import curve_svg

__all__ = ["write_report"]

INTRO = ("Every number is as the pipeline's metrics files hold it: the value, its seed-level interval [lo, hi] "
         "(a bootstrap over training seeds, then episodes; episode-level where seeds is 1), the number of seeds and "
         "of episodes, greedy and sampled modes apart. Curves are the logged training points, one line per seed "
         "unless the title says otherwise.")


def _markdown_cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("llmrl.report", "templates"), autoescape=select_autoescape(["html.j2"]),
                      undefined=StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = _markdown_cell
    return env


def write_report(report: Report, out_dir: Path) -> None:
    """Write the page, its Markdown summary and copies of the videos (``videos/``, linked relatively, so the page
    works opened from disk) into ``out_dir``."""
    out_dir = Path(out_dir)
    env = _environment()
    figures = {p.id: curve_svg(p) for s in report.sections for p in s.plots}
    html = env.get_template("index.html.j2").render(report=report, figures=figures, intro=INTRO, flag=NOT_CONVERGED)
    (out_dir / "index.html").write_text(html)
    (out_dir / "summary.md").write_text(env.get_template("summary.md.j2").render(report=report, intro=INTRO))
    for video in (v for s in report.sections for v in s.videos):
        (out_dir / "videos").mkdir(exist_ok=True)
        shutil.copyfile(video.file, out_dir / "videos" / video.name)
