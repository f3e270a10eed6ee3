"""The study's results page: each study method's claim at study scale beside the default pipeline's numbers.

For every method of the study (``pipelines/tiers.py``: KALM, ProPS, LLM_RL) the page shows, from the study's
results tree (``study/metrics``, ``study/plots``) and the default pipeline's (``metrics``, ``plots``):

- what RL researchers read first, through rliable's statistics (``llmrl.eval.rliable_stats``): each row's
  interquartile mean over its run x task scores with a stratified-bootstrap interval, in the study and in the default
  pipeline, and the probability that the method improves on its reference (real + imagined over real data for
  KALM, ProPS over random search, each trained LLM over the base model), with the reading that interval allows;
- the method's own tables (seed-level intervals, the project's hierarchical bootstrap) for the study tier and the
  default tier, one after the other (``llmrl.report.collect``).

KALM's reading is gated on the imagination itself: the train-goal control's replay success against random actions
from the same starts says whether the grounded model imagines at all; where it does not, the page says that the
imagination failed, not that KALM did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmrl.eval.rliable_stats import iqm, probability_of_improvement
from llmrl.files import read_json
from llmrl.report.collect import MissingResultError, Report, Section, Table, collect_report, kalm_eval_table

__all__ = ["STUDY_METHODS", "Comparison", "collect_study", "kalm_comparisons", "kalm_gates", "kalm_rows",
           "llm_rl_comparisons", "llm_rl_rows", "poi_reading", "props_comparisons", "props_rows", "summary_section"]

STUDY_METHODS = ("kalm", "props", "llm_rl")


@dataclass
class Comparison:
    """One claim: does ``row`` improve on ``reference`` (scores [runs, tasks] each, same tasks)?"""

    group: str  # e.g. the benchmark or task family
    row: str
    reference: str
    row_scores: np.ndarray
    reference_scores: np.ndarray
    gate: str | None = None  # why no claim may be read (e.g. the imagination failed), or None


def _json(root: Path, rel: str):
    path = root / rel
    if not path.is_file():
        raise MissingResultError(f"{path}: missing (run the stage that writes it)")
    return read_json(path)


def _cell(s: dict) -> str:
    return f"{s['value']} [{s['ci_low']}, {s['ci_high']}]"


def poi_reading(s: dict) -> str:
    """The reading a probability-of-improvement interval allows: better / worse only when it excludes 0.5."""
    if s["ci_low"] > 0.5:
        return "improves"
    if s["ci_high"] < 0.5:
        return "worse"
    return "no difference shown"


# ---- KALM -----------------------------------------------------------------------------------------------------------


def kalm_scores(root: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per benchmark and row: success per training seed (runs) and level (tasks), from kalm_eval's table."""
    table = kalm_eval_table(root)
    levels = table["levels"]
    out: dict[str, dict[str, np.ndarray]] = {}
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in table["rows"]:
        cells.setdefault((r["benchmark"], r["row"]), {})[r["level"]] = r["per_seed"]
    for (bench, row), by_level in cells.items():
        if all(lv in by_level for lv in levels) and len({len(v) for v in by_level.values()}) == 1:
            out.setdefault(bench, {})[row] = np.array([by_level[lv] for lv in levels], dtype=float).T
    return out


def kalm_gates(root: Path, benchmarks) -> dict[str, str | None]:
    """Per benchmark: None when the train-goal control shows that the model imagines (its replay success clears
    random actions' from the same starts), else why no claim about imagined data may be read."""
    gates = {}
    for bench in benchmarks:
        path = root / f"metrics/kalm/imagine_{bench}_train.json"
        if not path.is_file():
            gates[bench] = "no train-goal control was imagined"
            continue
        q = read_json(path)
        gates[bench] = None if q.get("imagines") else (
            f"the imagination failed: imagined actions for training goals, replayed, succeed {q['replay_success']} "
            f"{q['replay_success_ci']} against {q['random_replay_success']} {q['random_replay_success_ci']} for "
            "random actions")
    return gates


def kalm_comparisons(root: Path) -> list[Comparison]:
    scores = kalm_scores(root)
    gates = kalm_gates(root, scores)
    out = []
    for bench, rows in scores.items():
        for row, values in rows.items():
            if row.endswith("-imagine") and row.replace("-imagine", "-real") in rows:
                real = row.replace("-imagine", "-real")
                out.append(Comparison(bench, row, real, values, rows[real], gates[bench]))
            if row.endswith("-real") and "random" in rows:
                out.append(Comparison(bench, row, "random", values, rows["random"]))
    return out


def kalm_rows(root: Path) -> dict[tuple[str, str], np.ndarray]:
    return {(b, r): v for b, rows in kalm_scores(root).items() for r, v in rows.items()}


# ---- ProPS -----------------------------------------------------------------------------------------------------------


def props_rows(root: Path) -> dict[tuple[str, str], np.ndarray]:
    """Per task (each search task and the quadratic) and method: the held-out return of each seed's final policy
    (runs) on that one task, from props_eval's report. Tasks stay apart: their returns have different scales."""
    report = _json(root, "plots/props/report.json")
    tables = {**report["tasks"], "quadratic": report["quadratic"]["table"]}
    return {(task, method): np.asarray(h["final"]["per_seed"], dtype=float)[:, None]
            for task, table in tables.items() for method, h in table.items()}


def props_comparisons(root: Path) -> list[Comparison]:
    """ProPS, ProPS+ and the GRPO-tuned optimizer against random search on every task, and the tuned optimizer
    against the base model's ProPS, at equal episodes (props_eval checks the budgets)."""
    rows = props_rows(root)
    out = [Comparison(task, method, "random_search", v, rows[(task, "random_search")])
           for (task, method), v in rows.items()
           if method in ("props", "props_plus", "props_tuned") and (task, "random_search") in rows]
    return out + [Comparison(task, "props_tuned", "props_untuned", v, rows[(task, "props_untuned")])
                  for (task, method), v in rows.items() if method == "props_tuned" and (task, "props_untuned") in rows]


# ---- LLM_RL ----------------------------------------------------------------------------------------------------------


def llm_rl_rows(root: Path) -> dict[tuple[str, str], np.ndarray]:
    """Per decoding mode and model: the test accuracy of each training seed (runs; the base model one run), from
    llm_rl_eval's per-model entries."""
    folder = root / "metrics/llm_rl/responses"
    if not folder.is_dir():
        raise MissingResultError(f"{folder}: missing (run llm_rl_eval)")
    out = {}
    for f in sorted(folder.glob("*.json")):
        entry = read_json(f)
        for mode in ("greedy", "sampled"):
            if isinstance(entry.get(mode), dict) and "per_seed" in entry[mode]:
                out[(mode, f.stem)] = np.asarray(entry[mode]["per_seed"], dtype=float)[:, None]
    return out


def llm_rl_comparisons(root: Path) -> list[Comparison]:
    """Each trained variant against the base model, per decoding mode."""
    rows = llm_rl_rows(root)
    return [Comparison(mode, model, "base", v, rows[(mode, "base")])
            for (mode, model), v in rows.items() if model != "base" and (mode, "base") in rows]


# ---- the page -------------------------------------------------------------------------------------------------------

# Per method: its rows' scores [runs, tasks] by (group, row), and its claims; what a run and a task are.
METHOD_SCORES: dict[str, tuple[Callable[[Path], dict], Callable[[Path], list[Comparison]], str]] = {
    "kalm": (kalm_rows, kalm_comparisons, "runs: training seeds; tasks: the goal levels; score: success rate"),
    "props": (props_rows, props_comparisons, "runs: seeds; one task per group; score: held-out return of the "
                                             "final policy"),
    "llm_rl": (llm_rl_rows, llm_rl_comparisons, "runs: training seeds (the base model: one); score: test accuracy"),
}


def summary_section(method: str, root: Path, study_root: Path, reps: int = 2000) -> Section:
    rows_of, claims_of, units = METHOD_SCORES[method]
    s = Section(f"{method}-study", f"{method}: the study's reading", f"rliable's statistics ({units}); the "
                "default tier's figures beside the study's.")
    study_rows = rows_of(study_root)
    try:  # the default's per-run files may be DVC-cached only (not pulled): its column then stays empty
        default_rows = rows_of(root)
    except MissingResultError:
        default_rows = {}
    table = []
    for (group, row), values in study_rows.items():
        q = iqm(values, reps=reps)
        d = iqm(default_rows[(group, row)], reps=reps) if (group, row) in default_rows else None
        table.append([group, row, _cell(q), f"{q['runs']} x {q['tasks']}", _cell(d) if d else "—"])
    s.tables.append(Table(f"{method}-study-iqm", "Interquartile mean [95 % stratified-bootstrap interval] over runs x "
                          "tasks", f"{STUDY_ROOT_NAME}/metrics/{method}", ["group", "row", "IQM (study)",
                                                                           "runs x tasks", "IQM (default)"], table))
    table = []
    for c in claims_of(study_root):
        p = probability_of_improvement(c.row_scores, c.reference_scores, reps=reps)
        table.append([c.group, c.row, c.reference, _cell(p), c.gate or poi_reading(p)])
    s.tables.append(Table(f"{method}-study-claims", "Probability of improvement over the reference [95 % interval]: "
                          "a claim only where the interval excludes 0.5, and only where its gate holds",
                          f"{STUDY_ROOT_NAME}/metrics/{method}", ["group", "row", "reference", "P(row > reference)",
                                                                 "reading"], table))
    return s


STUDY_ROOT_NAME = "study"


def collect_study(root: Path, study_root: Path, methods, *, props_videos: bool = False, reps: int = 2000) -> Report:
    """The study page: per study method its rliable summary, then its study-tier and default-tier sections."""
    unknown = [m for m in methods if m not in STUDY_METHODS]
    if unknown:
        raise ValueError(f"collect_study: {unknown} are not study methods ({list(STUDY_METHODS)})")
    sections = []
    for method in methods:
        if method in METHOD_SCORES:
            sections.append(summary_section(method, root, study_root, reps))
        for tier, tree in (("study", study_root), ("default", root)):
            for sec in collect_report(tree, [method], props_videos=props_videos and tier == "default").sections:
                if sec.key == method:
                    sec.title = f"{sec.title} — {tier} tier"
                    sec.key = f"{method}-{tier}"
                    for item in (*sec.tables, *sec.plots):  # one page holds both tiers: ids stay unique
                        item.id = f"{tier}-{item.id}"
                    sections.append(sec)
    return Report(sections)
