"""Stage report: one static results page from metrics/ and plots/ only (issue 13, item 3).

Writes reports/index.html (every method's tables with the seed-level intervals its metrics hold, learning curves
as inline SVG, ProPS's videos copied to reports/videos/ and linked relatively, so the page works opened from disk)
and reports/summary.md (the same tables in Markdown). A section left out of report.methods shows as "not run";
a missing file of a listed one fails the stage naming the file (llmrl.report.MissingResultError).
"""

from common import ROOT, log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import time

from llmrl.config.props import PropsSearchParams
from llmrl.config.report import ReportParams
from llmrl.files import atomic_path
from llmrl.report import collect_report, write_report

OUT = paths.report()


def main() -> None:
    params = stage_params("report", ReportParams)
    # props_eval records videos only when props.search.video is on; the page expects them exactly then
    videos = stage_params("props.search", PropsSearchParams).video
    start = time.perf_counter()
    report = collect_report(ROOT, params.methods, props_videos=videos)
    with atomic_path(OUT.page, is_dir=True) as out:
        write_report(report, out)
    log.info("%s/index.html and summary.md: %d sections, %d not run (%.1fs)", OUT.page.name, len(report.sections),
             sum(not s.ran for s in report.sections), time.perf_counter() - start)


if __name__ == "__main__":
    main()
