"""One static results page from the pipeline's ``metrics/`` and ``plots/``: every method's agents with the
seed-level intervals their metrics hold, learning curves, GLAM's generalisation matrix, LLM4Teach's teachers and
students, KALM's real vs imagined table and rollout quality, ProPS's curves and videos.

    report = collect_report(root, methods, props_videos=True)   # reads root/metrics, root/plots
    write_report(report, out_dir)                                # out_dir/index.html, summary.md, videos/
"""

from llmrl.report.collect import MissingResultError, Report, collect_report
from llmrl.report.render import write_report

__all__ = ["MissingResultError", "Report", "collect_report", "write_report"]
