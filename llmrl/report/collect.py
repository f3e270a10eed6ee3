"""What the results page shows, read from a results tree: the ``metrics/`` and ``plots/`` folders under one root.

Numbers pass through as the metrics files hold them: a cell is the file's value, its interval the file's
``[<key>_lo, <key>_hi]``, seeds and episodes the file's counts. Nothing is re-aggregated here; curves are the
logged points, one line per training seed (ProPS's curves are the seed means ``props_eval`` wrote).

A section that is collected needs every file its stages write: a missing one raises ``MissingResultError``
naming it, a damaged metrics file (its checksum does not match) ``llmrl.files.DamagedFileError`` naming it. A
section left out (switched off) is not read at all and shows as "not run".
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmrl.config.report import REPORT_SECTIONS
from llmrl.files import read_json

__all__ = ["NOT_CONVERGED", "MissingResultError", "Table", "Series", "CurvePlot", "Video", "Section", "Report",
           "collect_report", "kalm_eval_table"]

MODES = ("greedy", "sampled")
NOT_CONVERGED = "not converged"
# why, once per table that flags a row: the metrics file says beats_random: false
NOT_CONVERGED_MEANING = "not converged: its seed-level interval does not clear random's interval"


class MissingResultError(FileNotFoundError):
    """A file or folder the pipeline should have produced is missing; the message names it."""


@dataclass
class Table:
    id: str
    caption: str
    source: str  # the file or folder the rows come from, relative to the results root
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Series:
    label: str  # legend entry; series with one label (the seeds of one agent) share a colour
    x: list[float]
    y: list[float]
    markers_only: bool = False  # marks points of another series (no line)


@dataclass
class CurvePlot:
    id: str
    title: str
    source: str
    xlabel: str
    ylabel: str
    series: list[Series]


@dataclass
class Video:
    caption: str
    file: Path  # the MP4 under plots/
    name: str  # its file name in the page's videos/ folder


@dataclass
class Section:
    key: str
    title: str
    summary: str
    ran: bool = True
    tables: list[Table] = field(default_factory=list)
    plots: list[CurvePlot] = field(default_factory=list)
    videos: list[Video] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    sections: list[Section]


TITLES = {
    "baselines": "BabyAI baselines",
    "glam": "GLAM",
    "llm_rl": "LLM_RL (REINFORCE-KL vs GRPO)",
    "llm4teach": "LLM4Teach",
    "kalm": "KALM",
    "props": "ProPS",
}
SUMMARIES = {
    "baselines": "The BabyAI bot and a uniform random policy on the BabyAI levels (stage eval_baselines).",
    "glam": "An LLM scoring action strings, fine-tuned by PPO in BabyAI-Text, beside the bot, random, zero-shot, "
            "behaviour-cloned and symbolic PPO agents on the same test levels; the generalisation matrix replays "
            "the trained agents under changed wording.",
    "llm_rl": "Stepwise REINFORCE with KL and TRL's GRPO at the same sample budget, and the base model, answering "
            "the same test problems (success = correct final answer).",
    "llm4teach": "A teacher (the LLM's plans, or an oracle) distilled into a PPO student; teachers, students, pure "
             "PPO/MAPPO and random on the same test levels or episodes.",
    "kalm": "Offline RL on real data against real + imagined rollouts of the grounded LLM, per level of goal "
            "novelty; then how the imagined rollouts fare when replayed in the simulator.",
    "props": "The LLM proposes linear-policy parameters in context (ProPS; ProPS+ also reads the environment's "
             "description), beside random search, CEM and PPO; held-out return of each run's final policy.",
}


# ---------------------------------------------------------------------------------------------- reading
def _need(root: Path, rel: str) -> Path:
    path = root / rel
    if not path.exists():
        raise MissingResultError(f"{rel}: missing; the pipeline should have produced it (run or pull its stage)")
    return path


def _json(root: Path, rel: str) -> dict:
    """A metrics file, checked against its checksum (``llmrl.files.read_json``): a damaged one raises
    ``DamagedFileError`` naming it, never shows as a number."""
    return read_json(_need(root, rel))


def _plot_json(root: Path, rel: str):
    """A dvclive plot file (written by dvclive, without a checksum)."""
    return json.loads(_need(root, rel).read_text())


def _entries(root: Path, rel: str, pattern: str = "*.json") -> list[Path]:
    """The files or folders matching ``pattern`` in ``rel``, sorted; none at all is a missing result."""
    found = sorted(_need(root, rel).glob(pattern))
    if not found:
        raise MissingResultError(f"{rel}/{pattern}: nothing there; the pipeline should have produced it")
    return found


def _tsv_series(root: Path, rel: str, label: str) -> Series:
    """A dvclive curve (``step<TAB>value`` rows)."""
    with _need(root, rel).open(newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    return Series(label, [float(r[0]) for r in rows], [float(r[1]) for r in rows])


# ---------------------------------------------------------------------------------------------- formatting
def _num(value) -> str:
    return "—" if value is None else str(value)


def _interval(entry: dict, key: str) -> str:
    return f"[{entry[key + '_lo']}, {entry[key + '_hi']}]"


def headline_table(table_id: str, caption: str, source: str, agents: Sequence[tuple[str, dict]], *,
                   extra: Sequence[tuple[str, str]] = (), role: Callable[[str], str] | None = None) -> Table:
    """One row per agent and mode of ``llmrl.eval.headline`` entries.

    ``extra``: (column, key) figures read from the mode's entry, else from the agent's (per-mode answer
    tokens, per-agent parse-failure rates). Success or return columns appear when some row has them; a note
    column when some agent's file flags ``beats_random: false``.
    """
    rows = []
    for name, entry in agents:
        for mode in MODES:
            if mode not in entry:
                continue
            h = entry[mode]
            row = {"agent": name, "mode": mode}
            if role:
                row["role"] = role(name)
            for key in ("success", "return"):
                if key in h:
                    row[key], row[f"{key} interval"] = _num(h[key]), _interval(h, key)
            row["seeds"], row["episodes"] = _num(h["seeds"]), _num(h["episodes"])
            for column, key in extra:
                row[column] = _num(h.get(key, entry.get(key)))
            if entry.get("beats_random") is False:
                row["note"] = NOT_CONVERGED
            rows.append(row)
    order = ["agent", *(["role"] if role else []), "mode", "success", "success interval", "return",
             "return interval", "seeds", "episodes", *(c for c, _ in extra), "note"]
    columns = [c for c in order if any(c in r for r in rows)]
    if "note" in columns:
        caption = f"{caption} ({NOT_CONVERGED_MEANING})"
    return Table(table_id, caption, source, columns, [[r.get(c, "") for c in columns] for r in rows])


def _agents(root: Path, rel: str) -> list[tuple[str, dict]]:
    return [(p.stem, read_json(p)) for p in _entries(root, rel)]


def _env_tables(root: Path, rel: str, prefix: str, caption: str, **kw) -> list[Table]:
    """One headline table per sub-folder (an environment or task) of ``rel``."""
    return [headline_table(f"{prefix}-{d.name}", caption.format(d.name), f"{rel}/{d.name}/",
                           _agents(root, f"{rel}/{d.name}"), **kw)
            for d in _entries(root, rel, "*/")]


# ---------------------------------------------------------------------------------------------- sections
def baselines_section(root: Path) -> Section:
    s = Section("baselines", TITLES["baselines"], SUMMARIES["baselines"])
    s.tables = _env_tables(root, "metrics/baselines/eval", "baselines", "{}")
    return s


def glam_section(root: Path) -> Section:
    s = Section("glam", TITLES["glam"], SUMMARIES["glam"])
    s.tables = _env_tables(root, "metrics/glam/eval", "glam-eval", "{}: every agent on the test levels")
    rel = "metrics/glam/generalisation"
    tests = sorted((d.name for d in _entries(root, rel, "*/")), key=lambda t: (t != "none", t))
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for test in tests:
        for agent, entry in _agents(root, f"{rel}/{test}"):
            for mode in MODES:
                if mode in entry:
                    cells.setdefault((agent, mode), {})[test] = entry[mode]
    rows = []
    for (agent, mode), by_test in sorted(cells.items()):
        counts = [(h["seeds"], h["episodes"]) for h in by_test.values()]
        rows.append([agent, mode, *(f"{_num(by_test[t]['success'])} {_interval(by_test[t], 'success')}"
                                    if t in by_test else "—" for t in tests),
                     " / ".join(dict.fromkeys(str(c[0]) for c in counts)),
                     " / ".join(dict.fromkeys(str(c[1]) for c in counts))])
    s.tables.append(Table("glam-generalisation", "Generalisation matrix: success [interval] per test (none = the "
                          "unchanged wording)", f"{rel}/", ["agent", "mode", *tests, "seeds", "episodes per test"],
                          rows))
    rel = "plots/glam/train"
    s.plots.append(CurvePlot(
        "glam-train", "GLAM training: success rate of the rollout episodes", f"{rel}/", "update", "success rate",
        [_tsv_series(root, f"{rel}/{d.name}/plots/metrics/success_rate.tsv", d.name.rsplit("-", 1)[0])
         for d in _entries(root, rel, "*/")]))
    return s


def llm_rl_section(root: Path) -> Section:
    s = Section("llm_rl", TITLES["llm_rl"], SUMMARIES["llm_rl"])
    # the models of metrics/llm_rl/eval, each by its whole entry beside its responses (the metrics file holds the
    # headline only)
    rel = "metrics/llm_rl/responses"
    agents = []
    for name, entry in [(p.stem, _json(root, f"{rel}/{p.name}")) for p in _entries(root, "metrics/llm_rl/eval")]:
        # each seed's accuracy as one cell: "0.2 / 0.25 / 0.3"
        agents.append((name, {k: {**v, "per_seed": " / ".join(str(x) for x in v["per_seed"])}
                              if k in MODES and "per_seed" in v else v for k, v in entry.items()}))
    s.tables.append(headline_table(
        "llm_rl-eval", "Test problems: success = correct final answer, the interval over training seeds and problems "
        "(crossed; the base model, one run: over problems); vs base: the paired gain on the same problems with its "
        "interval, higher / lower only where it excludes 0", f"{rel}/", agents,
        extra=[("per seed", "per_seed"), ("vs base", "vs_base"), ("answer tokens", "tokens"),
               ("truncated", "truncated"), ("parse failure", "parse_failure")]))
    # "base" is the untrained model llm_rl_eval scores for reference; every other model has one training curve
    # per training seed
    trained = [name for name, _ in agents if name != "base"]
    curves = "plots/llm_rl/train"
    s.plots.append(CurvePlot(
        "llm_rl-train", "Training: mean reward of the sampled answers at each trainer's logged step (REINFORCE-KL: "
        "iteration, GRPO: optimizer step), one curve per training seed", f"{curves}/", "logged step",
        "average reward",
        [_tsv_series(root, f"{curves}/{m}/{d.name}/plots/metrics/train/average_reward.tsv", f"{m} {d.name}")
         for m in trained for d in _entries(root, f"{curves}/{m}", "seed-*/")]))
    return s


def _teach_role(agent: str) -> str:
    return "teacher" if agent.startswith("teacher_") else "student" if agent.startswith("student_") else "baseline"


def llm4teach_section(root: Path) -> Section:
    s = Section("llm4teach", TITLES["llm4teach"], SUMMARIES["llm4teach"])
    rel = "metrics/llm4teach/eval"
    order = {"teacher": 0, "student": 1, "baseline": 2}
    envs = [d.name for d in _entries(root, rel, "*/")]
    for env in envs:
        agents = sorted(_agents(root, f"{rel}/{env}"), key=lambda a: (order[_teach_role(a[0])], a[0]))
        s.tables.append(headline_table(f"llm4teach-{env}", f"{env}: teachers and the students they taught",
                                       f"{rel}/{env}/", agents,
                                       extra=[("AULC", "aulc"), ("frames", "frames"), ("updates", "updates")],
                                       role=_teach_role))
    report = _json(root, "metrics/llm4teach/report.json")
    rows = []
    for f in _entries(root, "metrics/llm4teach/result"):
        claim = report[f.stem]["result"]
        for key, met in sorted(read_json(f).items()):
            rows.append([f.stem, f"student_{key.removeprefix('met_')}", claim["mode"], claim["statistic"],
                         _num(claim["target"]), _num(claim["ppo_ceiling"]), "met" if met else "not met"])
    s.tables.append(Table("llm4teach-result", "Result check: the student reaches the target success while PPO stays "
                          "below the ceiling", "metrics/llm4teach/result/",
                          ["env", "student", "mode", "statistic", "target", "PPO ceiling", "result"], rows))
    rows = []
    # a file per task that trained the scoring teacher (and so its controls); the folder is always written
    for f in sorted(_need(root, "metrics/llm4teach/claims").glob("*.json")):
        for mode, claim in read_json(f).items():
            if mode not in MODES:
                continue
            diffs = [f"{k.removeprefix('vs_')}: {_num(v)} {_interval(claim, k)}" for k, v in claim.items()
                     if k.startswith("vs_") and not k.endswith(("_lo", "_hi"))]
            rows.append([f.stem, mode, "; ".join(diffs), "yes" if claim["llm_scores_help"] else "no",
                         _num(claim["seeds"]), _num(claim["episodes"])])
    s.tables.append(Table("llm4teach-claims", "Do the LLM's scores help? The scoring-taught student minus each "
                          "control-taught student (same candidate plans, uniform or random scores), paired over the "
                          "same test episodes; yes only where every interval lies above 0", "metrics/llm4teach/claims/",
                          ["env", "mode", "difference [95 % CI] per control", "scores help", "seeds", "episodes"],
                          rows))
    rel = "plots/llm4teach/train"
    for env in envs:
        items = _entries(root, rel, f"{env}-*/")
        # success where the task has it (DoorKey), the episode return where it has none (MPE)
        first_seed = _entries(root, f"{rel}/{items[0].name}", "seed-*/")[0]
        metric = "success" if (first_seed / "plots/metrics/success_rate.tsv").exists() else "return"
        series = {"success": "success_rate", "return": "return_mean"}[metric]
        s.plots.append(CurvePlot(
            f"llm4teach-train-{env}", f"{env}: training episodes' {metric} per teacher (one line per seed)",
            f"{rel}/{env}-*/", "environment steps", metric,
            [_tsv_series(root, f"{rel}/{item.name}/{seed.name}/plots/metrics/{series}.tsv",
                         item.name.removeprefix(f"{env}-"))
             for item in items for seed in _entries(root, f"{rel}/{item.name}", "seed-*/")]))
    return s


def _kalm_policy(row: str) -> tuple[str, str]:
    for suffix, data in (("-real", "real"), ("-imagine", "real + imagined")):
        if row.endswith(suffix):
            return row.removesuffix(suffix), data
    return row, "—"


KALM_EVAL = "metrics/kalm/eval"  # <benchmark>/table.json: one per stage kalm_eval@<benchmark>


def kalm_eval_table(root: Path) -> dict:
    """Every benchmark's kalm_eval table as one: ``levels`` (in the order first seen) and every row (each names its
    benchmark)."""
    tables = []
    for folder in _entries(root, KALM_EVAL, "*/"):
        rel = f"{KALM_EVAL}/{folder.name}/table.json"
        table = _json(root, rel)
        if table.get("benchmark") != folder.name:
            raise MissingResultError(f"{rel}: holds benchmark {table.get('benchmark')!r}, not {folder.name!r} "
                                     "(kalm_eval@<benchmark> writes its own folder)")
        tables.append(table)
    levels = list(dict.fromkeys(lv for t in tables for lv in t["levels"]))
    return {"levels": levels, "rows": [r for t in tables for r in t["rows"]]}


def kalm_section(root: Path) -> Section:
    from llmrl.eval.stats import compare_intervals

    s = Section("kalm", TITLES["kalm"], SUMMARIES["kalm"])
    table = kalm_eval_table(root)
    success = "metrics/kalm/success"  # <benchmark>/<row>.json: the row's success per level and their mean
    levels = table["levels"]
    benchmarks = list(dict.fromkeys(r["benchmark"] for r in table["rows"]))
    for bench in benchmarks:
        by_row: dict[str, dict[str, dict]] = {}
        for r in table["rows"]:
            if r["benchmark"] == bench:
                by_row.setdefault(r["row"], {})[r["level"]] = r
        rows = []
        for name, cells in by_row.items():
            policy, data = _kalm_policy(name)
            rows.append([policy, data,
                         *(f"{cells[lv]['value']} [{cells[lv]['ci_low']}, {cells[lv]['ci_high']}]" if lv in cells
                           else "—" for lv in levels),
                         _num(_json(root, f"{success}/{bench}/{name}.json")["mean"]),
                         " / ".join(dict.fromkeys(str(c["n_seeds"]) for c in cells.values())),
                         " / ".join(dict.fromkeys(str(c["episodes"]) for c in cells.values()))])
        s.tables.append(Table(f"kalm-{bench}", f"{bench}: success [interval] per goal level, real vs imagined data",
                              f"{KALM_EVAL}/{bench}/table.json",
                              ["policy", "data", *levels, "mean over levels", "seeds", "episodes per level"],
                              rows))
        # the claims: real + imagined against real, and each learner against random, by interval separation
        rows = []
        for name, cells in by_row.items():
            policy, data = _kalm_policy(name)
            if data == "—":
                continue
            against = [(f"{policy}-real", "real data") if data != "real" else ("random", "random")]
            for other, label in against:
                if other in by_row:
                    rows.append([policy, data, label, *(compare_intervals(cells[lv], by_row[other][lv])
                                                        if lv in cells and lv in by_row[other] else "—"
                                                        for lv in levels)])
        s.tables.append(Table(f"kalm-{bench}-claims", f"{bench}: does the row beat its reference? higher / lower "
                              "only where the seed-level intervals do not overlap", f"{KALM_EVAL}/{bench}/table.json",
                              ["policy", "data", "against", *levels], rows))
    rows = []
    for bench in benchmarks:
        for lv in levels:
            q = _json(root, f"metrics/kalm/imagine_{bench}_{lv}.json")
            rows.append([bench, lv, *(_num(q.get(k)) for k in (
                "goals", "rollouts", "consistent", "written", "mean_length", "imagined_success", "replay_success",
                "replay_success_given_imagined", "replay_success_consistent", "first_step_mae", "last_step_mae"))])
    s.tables.append(Table("kalm-imagination", "Imagined rollouts: how many the grounded model names after their own "
                          "task (consistent), how many feed offline RL (written), and, as a diagnostic only, their "
                          "actions replayed in the simulator", "metrics/kalm/imagine_*.json",
                          ["benchmark", "level", "goals", "rollouts", "consistent", "written", "mean length",
                           "imagined success", "replay success", "replay success | imagined success",
                           "replay success | consistent", "first-step MAE", "last-step MAE"], rows))
    rel = "plots/kalm/ground"
    s.plots.append(CurvePlot("kalm-ground", "Grounding fine-tune of the LLM: training loss per grounding seed",
                             f"{rel}/", "update", "loss",
                             # one curve per grounding seed that recorded its metrics (a folder without them is
                             # no seed's: left over from another layout)
                             [_tsv_series(root, f"{rel}/{b}/{f.stem}/plots/metrics/loss.tsv", f"{b} seed {f.stem}")
                              for b in benchmarks for f in _entries(root, f"metrics/kalm/ground/{b}")]))
    return s


def props_section(root: Path, *, videos: bool) -> Section:
    s = Section("props", TITLES["props"], SUMMARIES["props"])
    rel = "metrics/props/eval"
    tasks = [d.name for d in _entries(root, rel, "*/")]
    # beside every LLM row: the share of its proposals the LLM made (the rest are random fallbacks)
    extra = [("search episodes", "train_episodes"), ("LLM-proposed", "llm_proposed"),
             ("parse failure", "parse_failure")]
    for task in tasks:
        agents = _agents(root, f"{rel}/{task}")
        s.tables.append(headline_table(f"props-{task}", f"{task}: held-out return of the final policies",
                                       f"{rel}/{task}/", agents, extra=extra))
        curves = f"plots/props/curves/{task}"
        series = []
        for method, _ in agents:
            points = _plot_json(root, f"{curves}/{method}/plots/custom/best_return.json")
            series.append(Series(method, [p["episodes"] for p in points], [p["best_return"] for p in points]))
            fell = [p for p in points if p.get("fallbacks")]
            if fell:  # where some seed's point was a random fallback, not the LLM's
                series.append(Series(f"{method}: random fallback", [p["episodes"] for p in fell],
                                     [p["best_return"] for p in fell], markers_only=True))
        s.plots.append(CurvePlot(f"props-curve-{task}", f"{task}: best return found against episodes used (mean "
                                 "over seeds)", f"{curves}/", "episodes", "best return", series))
        if videos and task != "quadratic":  # the environment-free check has no episode to show
            rel_video = f"plots/props/videos/{task}.mp4"
            s.videos.append(Video(f"{task}: the best LLM-found policy's held-out episode", _need(root, rel_video),
                                  f"{task}.mp4"))
    s.tables += props_heldout_tables(root)
    grpo = "plots/props/grpo"
    seeds = [d.name for d in _entries(root, grpo, "*/")]
    s.plots.append(CurvePlot("props-grpo-validation", "GRPO of the optimizer: mean validation reward (replies to "
                             "validation functions) against the optimiser step, per training seed", f"{grpo}/", "step",
                             "validation reward", [_tsv_series(root, f"{grpo}/{seed}/plots/metrics/validation/score.tsv",
                                                               f"seed {seed}") for seed in seeds]))
    if not videos:
        s.notes.append("Videos not recorded: switched off in params.")
    return s


def props_heldout_tables(root: Path) -> list[Table]:
    """The tuned optimizer on test functions: each method's IQM of the functions' gap-closed scores and its reply
    shares, and each comparison's probability of improvement and paired difference."""
    rel = "metrics/props/heldout.json"
    h = _json(root, rel)
    b = h["budget"]
    cols = ["improve_share", "repeat_share", "parse_failure_share", "fallback_share"]
    rows = [[m, f"{_num(e['iqm'])} [{_num(e['iqm_lo'])}, {_num(e['iqm_hi'])}]", _num(e["mean"]), _num(e["runs"]),
             _num(e["items"]), *(_num(e.get(c)) if c in e else "—" for c in cols)] for m, e in h["methods"].items()]
    comps = [[k.replace("_over_", " over "), f"{_num(v['poi'])} [{_num(v['poi_lo'])}, {_num(v['poi_hi'])}]",
              f"{_num(v['paired_difference'])} [{_num(v['paired_lo'])}, {_num(v['paired_hi'])}]", v["verdict"]]
             for k, v in h["comparisons"].items()]
    return [Table("props-heldout", f"Test functions never seen in training ({b['test_functions']} functions, "
                  f"{b['evaluations_per_search']} evaluations per search): score = orders of magnitude of the gap to "
                  "the optimum closed; IQM with a two-level bootstrap interval (functions, then runs)", rel,
                  ["method", "IQM [95 % CI]", "mean", "runs per function", "functions", "proposals improving",
                   "proposals repeating", "replies unparsed", "random fallbacks"], rows),
            Table("props-heldout-comparisons", "Paired by function: rliable's probability of improvement and the "
                  "mean score difference with functions and runs bootstrapped as crossed factors", rel,
                  ["comparison", "P(improvement) [95 % CI]", "paired difference [95 % CI]", "verdict"], comps)]


def collect_report(root: Path, methods: Sequence[str], *, props_videos: bool) -> Report:
    """Every section in page order; those not in ``methods`` are marked not run and not read."""
    collectors: dict[str, Callable[[Path], Section]] = {
        "baselines": baselines_section, "glam": glam_section, "llm_rl": llm_rl_section, "llm4teach": llm4teach_section,
        "kalm": kalm_section, "props": lambda r: props_section(r, videos=props_videos)}
    return Report([collectors[key](Path(root)) if key in methods
                   else Section(key, TITLES[key], SUMMARIES[key], ran=False) for key in REPORT_SECTIONS])
