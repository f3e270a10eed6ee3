"""Stage report: one static results page from metrics/ and plots/ only; in the study pipeline (study/dvc.yaml:
<method>_study_report, ``python -m stages.report <method>``) a study method's page, at study scale beside the
default's (llmrl.report.study), in study/reports/<method>/.

Writes reports/index.html (every method's tables with the seed-level intervals its metrics hold, learning curves
as inline SVG, ProPS's videos copied to reports/videos/ and linked relatively, so the page works opened from disk)
and reports/summary.md (the same tables in Markdown). A section left out of report.methods shows as "not run";
a missing file of a listed one fails the stage naming the file (llmrl.report.MissingResultError).
"""

import time

from llmrl.config.props import PropsSearchParams
from llmrl.config.report import ReportParams
from llmrl.files import atomic_path
from llmrl.report import collect_report, write_report
from llmrl.report.study import STUDY_METHODS, collect_study
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.paths import ROOT


def main(argv: list[str] | None = None) -> None:
    page = paths.report().page
    if paths.TIER == "default":
        stage_arguments("report", argv)
    else:
        method = stage_arguments("report", argv, method=f"the study method to report: {', '.join(STUDY_METHODS)}").method
        if method not in STUDY_METHODS:
            raise SystemExit(f"python -m stages.report: {method!r} is not a study method ({list(STUDY_METHODS)})")
        page = page / method  # study/reports/<method>: each method's study page is its own stage's output
    params = stage_params("report", ReportParams)
    # props_eval records videos only when props.search.video is on; the page expects them exactly then
    videos = stage_params("props.search", PropsSearchParams).video
    start = time.perf_counter()
    if paths.TIER == "default":
        report = collect_report(ROOT, params.methods, props_videos=videos)
    else:  # the method's study page: at study scale beside the default pipeline's results
        report = collect_study(ROOT, paths.OUT, [method], props_videos=videos)
    with atomic_path(page, is_dir=True) as tmp:
        write_report(report, tmp)
    log.info("%s/index.html and summary.md: %d sections, %d not run (%.1fs)", page, len(report.sections),
             sum(not s.ran for s in report.sections), time.perf_counter() - start)


if __name__ == "__main__":
    main()
