"""The figures of the docs site and the README, read from the result files they report, never copied by hand.

The Markdown sources hold the figures themselves, each beside where it comes from, so a page reads the same raw on
a Git host as built by MkDocs. ``render_page`` rewrites them from what the files under a results root hold (the
repository: ``metrics/``, ``bench/results/``, ``params.yaml``), or a profile composes (``conf:<overrides>``, the
parameters ``dvc exp run -S <overrides>`` runs):

    <!-- table: results -->                            the headline table, a row per method, written below the
    ...                                                marker line down to the end marker
    <!-- table: end -->
    <span data-from="params.yaml#glam.train.updates">4</span>            one value (dotted key; list items by index)
    <span data-from="conf:glam=paper#glam.train.updates">...</span>     the same key in GLAM's paper profile
    <span data-from="bench/results/score.json#ratio" data-format=".2f">...</span>   through a format spec

An author writes a marker line alone (``<!-- table: NAME -->`` for all tables of NAME, ``<!-- table: NAME ID -->``
for one) and a value as a placeholder, ``{{ FILE#KEY }}`` or ``{{ FILE#KEY | FORMAT }}``; rendering turns them into
the forms above, and rendering a rendered page changes it only where a file changed. A value is a bare ``span``, not
an HTML comment: GFM and python-markdown read a line that opens with ``<!--`` as an HTML block, which would break
the paragraph a wrapped value starts a line of. Code (fenced blocks, code spans) is left as written. Links in a
table (the headline table's method pages) are relative to the page's own file, as a Git host resolves them.
``scripts/docs_sources.py --write`` renders the README and every page under ``docs/``; ``tests/test_docs.py`` fails
when one differs from its rendering.

Values print as the files hold them (``str`` of the number; ``null`` as an em dash in result files and as
``null`` in params), or through a format spec (``.2f``, ``yesno`` for booleans).
"""

from __future__ import annotations

import html
import json
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmrl.files import read_json
from llmrl.report.collect import MissingResultError

__all__ = ["Figure", "Cell", "DocTable", "ResultFieldError", "TABLES", "TABLE_END", "read_value", "format_value",
           "results_table", "to_markdown", "source_pages", "render_page", "unrendered", "llm4teach_claims_table",
           "kalm_grounding_tables"]

EM_DASH = "—"


class ResultFieldError(KeyError):
    """A file lacks the field a page reads, or a page asks for a table that does not exist; the message names the
    file and the key path, or the table."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


# ---------------------------------------------------------------------------------------------- reading
def _load(root: Path, rel: str) -> Any:
    if rel.startswith(CONF_SOURCE):  # a composed profile: conf:kalm=paper is `dvc exp run -S kalm=paper`'s params
        from llmrl.config.profiles import compose

        return compose(Path(root) / "conf", rel.removeprefix(CONF_SOURCE).split(","))
    path = Path(root) / rel
    if not path.is_file():
        raise MissingResultError(f"{rel}: missing (the docs read it; run or pull the stage that writes it)")
    if path.suffix in (".yaml", ".yml"):
        return yaml.safe_load(path.read_text())
    if rel.startswith(UNCHECKED_JSON):
        return json.loads(path.read_text())
    return read_json(path)  # the report's reader: a file whose checksum does not match is a DamagedFileError


CONF_SOURCE = "conf:"
# bench/results/*.json are timings written by the bench scripts, most without a checksum; every other JSON source
# (metrics/, plots/props/report.json, under study/ too) is a stage's write_json output and is checked.
UNCHECKED_JSON = ("bench/",)


def split_key(key: str | Sequence[str | int]) -> tuple[str | int, ...]:
    """``a.b.0`` or ``a/b/0`` or a sequence → the path; digits index lists."""
    parts = re.split(r"[./]", key) if isinstance(key, str) else list(key)
    return tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in parts)


def read_value(root: Path, source: str, key: str | Sequence[str | int]) -> Any:
    """The value at ``key`` in the JSON or YAML file ``source`` (relative to ``root``)."""
    return _field(_load(root, source), source, key)


def _field(value: Any, source: str, key: str | Sequence[str | int]) -> Any:
    path = split_key(key)
    for i, part in enumerate(path):
        try:
            value = value[str(part)] if isinstance(value, dict) and isinstance(part, int) else value[part]
        except (KeyError, IndexError, TypeError):
            raise ResultFieldError(f"{source}: no field {'/'.join(map(str, path[:i + 1]))}") from None
    return value


def format_value(value: Any, fmt: str = "", *, yaml_source: bool = False) -> str:
    """A value as the page prints it (see the module docstring)."""
    if value is None:
        return "null" if yaml_source else EM_DASH
    if isinstance(value, bool):
        return ("yes" if value else "no") if fmt == "yesno" else str(value).lower()
    if isinstance(value, (int, float)):
        return format(value, fmt) if fmt and fmt != "yesno" else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v, fmt, yaml_source=yaml_source) for v in value) + "]"
    if isinstance(value, str):
        return value
    raise ResultFieldError(f"not a printable value (a {type(value).__name__}): {value!r}")


# ---------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Figure:
    """One value read from a file: what a page prints and where it came from."""

    source: str
    key: tuple[str | int, ...]
    value: Any
    fmt: str = ""

    @property
    def text(self) -> str:
        return format_value(self.value, self.fmt, yaml_source=self.source.endswith((".yaml", ".yml"))
                            or self.source.startswith(CONF_SOURCE))


def figure(root: Path, source: str, key: str | Sequence[str | int], fmt: str = "") -> Figure:
    return Figure(source, split_key(key), read_value(root, source, key), fmt)


@dataclass(frozen=True)
class Cell:
    """Markdown text and figures in order."""

    parts: tuple[str | Figure, ...]

    def markdown(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts).replace("|", "\\|")


def label(text: str) -> Cell:
    return Cell((text,))


@dataclass
class DocTable:
    id: str
    caption: str
    sources: list[str]  # the files or globs the figures come from, shown under the table
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)


def to_markdown(table: DocTable) -> str:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(c.markdown() for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _table_block(table: DocTable) -> str:
    """The table as a page holds it: caption, the table wrapped so a link or a test finds it by id, its sources."""
    sources = ", ".join(f"`{s}`" for s in table.sources)
    return (f'<div class="generated-table" id="table-{table.id}" markdown>\n\n{table.caption}\n\n'
            f"{to_markdown(table)}\n\n<small>Source: {sources}</small>\n\n</div>")


# ---------------------------------------------------------------------------------------------- headline entries
MODES = ("greedy", "sampled")


def _with_interval(root: Path, source: str, key: tuple, metric: str, fmt: str = "") -> list[str | Figure]:
    """``value [lo, hi]`` of ``metric`` in the headline entry at ``key`` (``value`` alone where the file has no
    interval), or the scalar at ``key`` itself."""
    entry = read_value(root, source, key)
    if not isinstance(entry, dict):
        return [Figure(source, key, entry, fmt)]
    parts: list[str | Figure] = [figure(root, source, (*key, metric), fmt)]
    if f"{metric}_lo" in entry:
        parts += [" [", figure(root, source, (*key, f"{metric}_lo"), fmt), ", ",
                  figure(root, source, (*key, f"{metric}_hi"), fmt), "]"]
    return parts


def _files(root: Path, folder: str, pattern: str = "*.json") -> list[Path]:
    found = sorted((Path(root) / folder).glob(pattern))
    if not found:
        raise MissingResultError(f"{folder}/{pattern}: nothing there (the docs read it)")
    return found


def headline_folder_table(root: Path, table_id: str, caption: str, folder: str, *,
                          extras: Sequence[tuple[str, str]] = (), extras_folder: str | None = None,
                          order: Sequence[str] = ()) -> DocTable:
    """One row per agent file (``llmrl.eval.headline`` entries) and mode in ``folder``: success and return with
    their intervals, seeds, episodes, the ``extras`` (column, key: read from the mode's entry, else the file's; from
    the same-named file in ``extras_folder`` where given, which holds the entries the headline leaves out) and a note
    where the file says ``beats_random: false``. ``order`` puts these agents first."""
    rank = {name: i for i, name in enumerate(order)}
    paths = sorted(_files(root, folder), key=lambda p: (rank.get(p.stem, len(rank)), p.stem))
    rows: list[dict[str, Cell]] = []
    for path in paths:
        rel = f"{folder}/{path.name}"
        data = _load(root, rel)
        for mode in MODES:
            if mode not in data:
                continue
            entry = data[mode]
            row = {"agent": label(f"`{path.stem}`"), "mode": label(mode)}
            for metric in ("success", "return"):
                if metric in entry:
                    row[metric] = Cell(tuple(_with_interval(root, rel, (mode,), metric)))
            for column in ("seeds", "episodes"):
                row[column] = Cell((figure(root, rel, (mode, column)),))
            extra_rel = f"{extras_folder}/{path.name}" if extras_folder else rel
            extra_data = _load(root, extra_rel) if extras_folder else data
            for column, key in extras:
                if key in extra_data.get(mode, {}):
                    row[column] = Cell((figure(root, extra_rel, (mode, key)),))
                elif key in extra_data:
                    row[column] = Cell((figure(root, extra_rel, (key,)),))
            if data.get("beats_random") is False:
                row["note"] = label("not converged")
            rows.append(row)
    order_cols = ["agent", "mode", "success", "return", "seeds", "episodes", *(c for c, _ in extras), "note"]
    columns = [c for c in order_cols if any(c in r for r in rows)]
    headers = {"success": "success [95 % CI]", "return": "return [95 % CI]"}
    if "note" in columns:
        caption += " *Not converged*: the agent's seed-level interval does not clear random's interval."
    sources = [f"{folder}/*.json", *([f"{extras_folder}/*.json"] if extras_folder else [])]
    return DocTable(table_id, caption, sources, [headers.get(c, c) for c in columns],
                    [[r.get(c, label(EM_DASH if c != "note" else "")) for c in columns] for r in rows])


def scalar_files_table(root: Path, table_id: str, caption: str, folder: str, pattern: str, name: Callable[[str], str],
                       columns: Sequence[tuple[str, str]], fmt: str = "") -> DocTable:
    """One row per file matching ``pattern``: its name (``name(stem)``) and the scalar ``columns`` (header, key)."""
    rows = []
    for path in _files(root, folder, pattern):
        rel = f"{folder}/{path.name}"
        rows.append([label(name(path.stem)), *(Cell((figure(root, rel, key, fmt),)) for _, key in columns)])
    return DocTable(table_id, caption, [f"{folder}/{pattern}"], ["", *(h for h, _ in columns)], rows)


# ---------------------------------------------------------------------------------------------- the headline table
@dataclass(frozen=True)
class Shown:
    """An agent in the headline table: its label, file and the key of its headline entry or scalar."""

    label: str
    source: str
    key: str


@dataclass(frozen=True)
class HeadlineRow:
    method: str
    page: str  # the method's docs page, relative to docs/
    task: str
    metric: str  # success | return
    agents: tuple[Shown, ...]  # the method's own agents
    references: tuple[Shown, ...]  # what they are compared with


GLAM_EVAL = "metrics/glam/eval/BabyAI-Text-GoToObjS4-v0"
DOORKEY = "metrics/llm4teach/eval/simpledoorkey"
KALM_SUCCESS = "metrics/kalm/success"  # <benchmark>/<row>.json: success per level and the mean over levels
PROPS_MC = "metrics/props/eval/mountaincar_continuous"
HEADLINE_ROWS = (
    HeadlineRow("GLAM", "methods/glam.md", "BabyAI-Text GoToObjS4: success, greedy", "success",
                (Shown("GLAM-LoRA", f"{GLAM_EVAL}/glam_lora.json", "greedy"),),
                (Shown("zero-shot LLM", f"{GLAM_EVAL}/zero_shot.json", "greedy"),
                 Shown("BC", f"{GLAM_EVAL}/bc.json", "greedy"),
                 Shown("Symbolic-PPO", f"{GLAM_EVAL}/symbolic_ppo.json", "greedy"),
                 Shown("random (sampled)", f"{GLAM_EVAL}/random.json", "sampled"))),
    HeadlineRow("LLM_RL", "methods/llm_rl.md", "generated word problems: accuracy, greedy", "success",
                (Shown("REINFORCE-KL", "metrics/llm_rl/eval/reinforce_kl.json", "greedy"),
                 Shown("GRPO (TRL)", "metrics/llm_rl/eval/grpo.json", "greedy")),
                (Shown("base model", "metrics/llm_rl/eval/base.json", "greedy"),)),
    HeadlineRow("LLM4Teach", "methods/llm4teach.md", "MiniGrid SimpleDoorKey: success, greedy", "success",
                (Shown("LLM-taught student", f"{DOORKEY}/student_llm.json", "greedy"),
                 Shown("scoring-teacher student", f"{DOORKEY}/student_llm_score.json", "greedy"),
                 Shown("oracle-taught student", f"{DOORKEY}/student_oracle.json", "greedy")),
                (Shown("PPO", f"{DOORKEY}/ppo.json", "greedy"),
                 Shown("random (sampled)", f"{DOORKEY}/random.json", "sampled"))),
    HeadlineRow("KALM", "methods/kalm.md", "BabyAI goals not seen in training: success, mean over goal levels",
                "success",
                (Shown("DiscreteBC, real + imagined", f"{KALM_SUCCESS}/babyai/babyai-dbc-imagine.json", "mean"),
                 Shown("DiscreteCQL, real + imagined", f"{KALM_SUCCESS}/babyai/babyai-dcql-imagine.json", "mean")),
                (Shown("DiscreteBC, real", f"{KALM_SUCCESS}/babyai/babyai-dbc-real.json", "mean"),
                 Shown("DiscreteCQL, real", f"{KALM_SUCCESS}/babyai/babyai-dcql-real.json", "mean"),
                 Shown("random", f"{KALM_SUCCESS}/babyai/random.json", "mean"))),
    HeadlineRow("ProPS", "methods/props.md", "MountainCarContinuous: held-out return, greedy", "return",
                (Shown("ProPS", f"{PROPS_MC}/props.json", "greedy"),
                 Shown("ProPS+", f"{PROPS_MC}/props_plus.json", "greedy")),
                (Shown("random search", f"{PROPS_MC}/random_search.json", "greedy"),
                 Shown("CEM", f"{PROPS_MC}/cem.json", "greedy"),
                 Shown("SB3 PPO", f"{PROPS_MC}/ppo.json", "greedy"))),
)


def _shown_cell(root: Path, shown: Sequence[Shown], metric: str) -> Cell:
    """Each agent's ``value [lo, hi]``; an entry of one run (``seeds: 1``) says its interval is over items alone."""
    parts: list[str | Figure] = []
    for i, s in enumerate(shown):
        key = split_key(s.key)
        entry = read_value(root, s.source, key)
        one_run = isinstance(entry, dict) and entry.get("seeds") == 1 and f"{metric}_lo" in entry
        parts += (["<br>"] if i else []) + [f"{s.label} "] + _with_interval(root, s.source, key, metric) + \
            ([" (one run, interval over items)"] if one_run else [])
    return Cell(tuple(parts))


def results_table(root: Path, *, link: Callable[[str], str] = lambda page: page) -> DocTable:
    """The headline table, a row per method: the method's agents and the references they are compared with, each
    ``value [95 % CI]`` (over training seeds; a row of one run says its interval is over items alone; KALM's means
    over levels carry none). ``link`` maps a method's
    docs page to the link written in the Method column."""
    rows = [[label(f"[{r.method}]({link(r.page)})"), label(r.task), _shown_cell(root, r.agents, r.metric),
             _shown_cell(root, r.references, r.metric)] for r in HEADLINE_ROWS]
    sources = sorted({s.source for r in HEADLINE_ROWS for s in (*r.agents, *r.references)})
    return DocTable("results", "Headline results of the default pipeline, a row per method: value [95 % "
                    "interval over training seeds; a row of one run says so, its interval over episodes or problems] "
                    "as the metrics files hold them.", sources,
                    ["Method", "Task: measure", "The method", "Compared with"], rows)


# ---------------------------------------------------------------------------------------------- per method
def baselines_tables(root: Path) -> list[DocTable]:
    folder = "metrics/baselines/eval"
    return [headline_folder_table(root, f"baselines-{d.name}", f"{d.name}: the BabyAI bot and a uniform random "
                                  "policy.", f"{folder}/{d.name}")
            for d in sorted((Path(root) / folder).iterdir()) if d.is_dir()]


def glam_tables(root: Path) -> list[DocTable]:
    gen = "metrics/glam/generalisation"
    tests = sorted((d.name for d in (Path(root) / gen).iterdir() if d.is_dir()), key=lambda t: (t != "none", t))
    if not tests:
        raise MissingResultError(f"{gen}/*/: nothing there (the docs read it)")
    rows = []
    for test in tests:
        for path in _files(root, f"{gen}/{test}"):
            rel = f"{gen}/{test}/{path.name}"
            rows.append([label(f"`{test}`"), label(f"`{path.stem}`"),
                         Cell(tuple(_with_interval(root, rel, ("greedy",), "success"))),
                         Cell((figure(root, rel, "greedy/seeds"),)), Cell((figure(root, rel, "greedy/episodes"),))])
    vs_rows = []
    paired = "plots/glam/eval/paired.json"
    level = GLAM_EVAL.rsplit("/", 1)[1]
    for variant, refs in read_value(root, paired, (level,)).items():
        for ref, modes in refs.items():
            for mode in [m for m in MODES if m in modes]:
                key = (level, variant, ref, mode)
                vs_rows.append([label(f"`{variant}`"), label(f"`{ref}`"), label(mode),
                                Cell((figure(root, paired, (*key, "difference")), " [", figure(root, paired, (*key, "ci_low")),
                                      ", ", figure(root, paired, (*key, "ci_high")), "]")),
                                Cell((figure(root, paired, (*key, "runs")), " / ", figure(root, paired, (*key, "reference_runs")))),
                                Cell((figure(root, paired, (*key, "items")),))])
    bc = "metrics/glam/bc.json"
    bc_rows = [[label(seed), Cell((figure(root, bc, ("seeds", seed, "samples")), " (",
                                   figure(root, bc, ("seeds", seed, "distinct_prompts")), ")")),
                Cell((figure(root, bc, ("seeds", seed, "best_epoch")), " of ", figure(root, bc, ("seeds", seed, "epochs_run")))),
                Cell((figure(root, bc, ("seeds", seed, "validation_loss", 0)), " → ",
                      figure(root, bc, ("seeds", seed, "validation_loss", read_value(root, bc, ("seeds", seed, "best_epoch")))))),
                Cell((figure(root, bc, ("seeds", seed, "validation_accuracy", 0)), " → ",
                      figure(root, bc, ("seeds", seed, "validation_accuracy", read_value(root, bc, ("seeds", seed, "best_epoch"))))))]
               for seed in read_value(root, bc, ("seeds",))]
    return [
        headline_folder_table(root, "glam-eval", "Every agent on the test levels of BabyAI-Text GoToObjS4: trained "
                              "agents once per training seed; random and the zero-shot model once per sampling "
                              "stream, as many (the zero-shot greedy once: it is deterministic); the bot once.",
                              GLAM_EVAL, order=("glam_lora", "zero_shot", "bc", "symbolic_ppo", "bot", "random")),
        DocTable("glam-vs", "GLAM against each reference: the difference in success on the same evaluation starts, "
                 "paired by start, with a bootstrap over runs and starts as crossed factors (`llmrl.eval.paired`).",
                 ["plots/glam/eval/paired.json"], ["variant", "reference", "mode", "difference [95 % CI]",
                                                 "runs (variant / reference)", "starts"], vs_rows),
        DocTable("glam-bc", "Behaviour cloning per training seed: the bot's steps it trains on (distinct prompts), the "
                 "epoch kept (lowest validation loss) of those run, and the validation loss and accuracy before "
                 "training → at the kept epoch.", [bc],
                 ["seed", "samples (distinct)", "epoch kept", "validation loss", "validation accuracy"], bc_rows),
        DocTable("glam-generalisation", "Generalisation: the trained agents under changed wording (greedy; "
                 "`none` = the unchanged wording).", [f"{gen}/*/*.json"],
                 ["test", "agent", "success [95 % CI]", "seeds", "episodes"], rows),
    ]


def llm_rl_study_tables(root: Path) -> list[DocTable]:
    """The study's LLM_RL evaluation (3 training seeds, every test problem): each model's accuracy with its interval
    over training seeds and problems, and each variant's paired gain over the base model (``vs_base`` of its per-model
    entry)."""
    table = headline_folder_table(
        root, "llm_rl-study-eval", "Study: test problems (success = the correct final answer), each variant over its "
        "training seeds (the interval is over seeds and problems, crossed), the base model once (over problems).", "study/metrics/llm_rl/eval",
        extras=(("answer tokens", "tokens"), ("cut by the cap", "truncated"), ("parse failure", "parse_failure")),
        extras_folder="study/metrics/llm_rl/responses", order=("base", "reinforce_kl", "grpo"))
    responses = "study/metrics/llm_rl/responses"
    rows = [[label(f"`{path.stem}`"), label(mode), Cell((figure(root, f"{responses}/{path.name}", (mode, "vs_base")),))]
            for path in sorted(_files(root, responses)) for mode in MODES
            if path.stem != "base" and "vs_base" in _load(root, f"{responses}/{path.name}").get(mode, {})]
    against = DocTable("llm_rl-study-vs-base", "Study: each variant's gain over the base model, paired on the same "
                       "problems, with an interval over seeds and problems (`higher`/`lower` only where it excludes "
                       "0, else `no difference`).",
                       [f"{responses}/*.json"], ["variant", "mode", "against the base model"], rows)
    return [table, against]


def llm_rl_tables(root: Path) -> list[DocTable]:
    curve = "bench/results/llm_rl_curve.json"
    rows = []
    for i, _ in enumerate(read_value(root, curve, "table")):
        rows.append([Cell((figure(root, curve, f"table/{i}/iteration"),)),
                     Cell((figure(root, curve, f"table/{i}/samples"),)),
                     *(Cell((figure(root, curve, f"table/{i}/{k}/value"), " [", figure(root, curve, f"table/{i}/{k}/lo"),
                             ", ", figure(root, curve, f"table/{i}/{k}/hi"), "]"))
                       for k in ("accuracy", "gain_over_base")),
                     Cell((figure(root, curve, f"table/{i}/accuracy/seeds"),))])
    return [
        headline_folder_table(root, "llm_rl-eval", "Test problems (success = the correct final answer): the base "
                              "model and both variants at the same budget.", "metrics/llm_rl/eval",
                              extras=(("answer tokens", "tokens"), ("cut by the cap", "truncated"),
                                      ("parse failure", "parse_failure")),
                              extras_folder="metrics/llm_rl/responses", order=("base", "reinforce_kl", "grpo")),
        DocTable("llm_rl-curve", "REINFORCE-KL trained longer, outside the pipeline (`scripts/llm_rl_curve.py`): "
                 "greedy accuracy on a validation slice of the train split, and the gain over the base model paired "
                 "per problem, with intervals over seeds.", [curve],
                 ["iterations", "samples", "accuracy [95 % CI]", "gain over the base model [95 % CI]", "seeds"], rows),
    ]


def _teach_order(folder_root: Path, folder: str) -> list[str]:
    stems = [p.stem for p in _files(folder_root, folder)]
    return sorted(stems, key=lambda s: (0 if s.startswith("teacher_") else 1 if s.startswith("student_") else 2, s))


def llm4teach_claims_table(root: Path) -> DocTable:
    """Per task and mode: the scoring-taught student's paired difference from each control-taught student, and
    whether the LLM's scores help (every difference's interval above 0)."""
    rows, controls = [], []
    for env in ("simpledoorkey", "mpe"):
        rel = f"metrics/llm4teach/claims/{env}.json"
        data = read_value(root, rel, ())
        for mode in MODES:
            if mode not in data:
                continue
            found = [k.removeprefix("vs_") for k in data[mode] if k.startswith("vs_") and not k.endswith(("_lo", "_hi"))]
            if controls and found != controls:
                raise ResultFieldError(f"{rel}: controls {found}, the other tasks' are {controls}")
            controls = found
            rows.append([label(env), label(mode),
                         *(Cell(tuple(_with_interval(root, rel, (mode,), f"vs_{c}"))) for c in controls),
                         Cell((figure(root, rel, (mode, "llm_scores_help"), "yesno"),)),
                         Cell((figure(root, rel, (mode, "seeds")),)), Cell((figure(root, rel, (mode, "episodes")),))])
    return DocTable(
        "llm4teach-claims", "Do the LLM's scores help? The scoring-taught student minus the student taught by each "
        "control (the same candidate plans with uniform or random scores), paired over the same test episodes, "
        "seeds and episodes drawn as crossed factors; *yes* only where every interval lies above 0 (DoorKey: "
        "success; MPE: return).", ["metrics/llm4teach/claims/*.json"],
        ["task", "mode", *(f"minus `student_{c}` [95 % CI]" for c in controls), "scores help", "seeds", "episodes"],
        rows)


def llm4teach_tables(root: Path) -> list[DocTable]:
    tables = []
    for env, caption in (("simpledoorkey", "MiniGrid SimpleDoorKey: teachers, the students they taught, pure PPO "
                          "and random on the test levels."),
                         ("mpe", "MPE simple_spread: teachers, the students they taught, MAPPO and random.")):
        folder = f"metrics/llm4teach/eval/{env}"
        tables.append(headline_folder_table(root, f"llm4teach-{env}", caption, folder,
                                            extras=(("AULC", "aulc"), ("frames", "frames"), ("updates", "updates")),
                                            order=_teach_order(root, folder)))
    tables.append(llm4teach_claims_table(root))
    rel = "metrics/llm4teach/result/simpledoorkey.json"
    checks = read_value(root, rel, ())
    tables.append(DocTable(
        "llm4teach-result", "Result check on SimpleDoorKey: does the student reach the success target (greedy) "
        "while PPO stays below its ceiling?", [rel, "params.yaml"],
        ["student", "target", "PPO ceiling", "met"],
        [[label(f"`student_{k.removeprefix('met_')}`"), Cell((figure(root, "params.yaml", "llm4teach/eval/success_target"),)),
          Cell((figure(root, "params.yaml", "llm4teach/eval/ppo_ceiling"),)), Cell((figure(root, rel, k, "yesno"),))]
         for k in sorted(checks)]))
    return tables


def kalm_imagination_table(root: Path, tier: str = "") -> DocTable:
    """KALM's imagined rollouts, from the default pipeline's results or (``tier="study/"``) the study's."""
    return scalar_files_table(
        root, f"kalm-{tier.replace('/', '-')}imagination", "Imagined rollouts: the control on training goals (train) "
        "says whether the model imagines at all (its replayed actions against random ones from the same starts); how "
        "many the model names after their own task (consistent: the ones offline RL gets); the share the model "
        "believes succeed, the share that do when replayed, and the per-step error of the imagined states.",
        f"{tier}metrics/kalm", "imagine_*.json", lambda stem: stem.removeprefix("imagine_").replace("_", ", "),
        [("rollouts", "rollouts"), ("consistent", "consistent"), ("imagined success", "imagined_success"),
         ("replay success", "replay_success"), ("random actions' success", "random_replay_success"),
         ("imagines", "imagines"), ("first-step MAE", "first_step_mae"), ("last-step MAE", "last_step_mae")])


# gate 0's rows in the order read: the grounded model and its control, BC (greedy, sampled, sampled's control), random
GATE0_ROWS = {"grounded": "`grounded`", "grounded_swapped": "`grounded`, another task's instruction",
              "bc": "`bc` greedy", "bc_sampled": "`bc` sampled",
              "bc_sampled_swapped": "`bc` sampled, another task's instruction", "random": "`random`"}


def _reads_goal_cell(root: Path, rel: str, recorded: dict, row: str) -> Cell:
    """The own-minus-swapped success difference of gate 0's ``row`` with its interval, where it was recorded."""
    if row not in recorded.get("reads_goal", {}):
        return label("")
    key = ("gate0", "reads_goal", row)
    return Cell((figure(root, rel, (*key, "difference")), " [", figure(root, rel, (*key, "ci_low")), ", ",
                 figure(root, rel, (*key, "ci_high")), "]"))


def kalm_grounding_tables(root: Path, tier: str = "") -> list[DocTable]:
    """KALM's grounding, read before imagination: gate 0 per benchmark (the grounded model as a policy on training
    goals from validation starts, beside random actions and BC on the same real data; Wilson intervals over the
    grounding seeds' pooled episodes) and each grounding seed's one-step state error beside copying the last
    state."""
    gates = f"{tier}metrics/kalm/gate0"
    rows = []
    for path in _files(root, gates):
        rel = f"{gates}/{path.name}"
        recorded = json.loads(path.read_text()).get("gate0", {})
        for row in [r for r in GATE0_ROWS if r in recorded]:
            name = GATE0_ROWS[row]
            rows.append([label(path.stem), label(name),
                         Cell((figure(root, rel, ("gate0", row, "success")), " [",
                               figure(root, rel, ("gate0", row, "ci_low")), ", ",
                               figure(root, rel, ("gate0", row, "ci_high")), "]")),
                         Cell((figure(root, rel, ("gate0", row, "episodes")),)),
                         _reads_goal_cell(root, rel, recorded, row),
                         Cell((figure(root, rel, ("gate0", "passed"), "yesno"),)) if row == "grounded" else label("")])
    gate = DocTable(f"kalm-{tier.replace('/', '-')}gate0", "Gate 0: does the grounded model act? Its closed-loop "
                    "success on training goals from validation starts (real simulator, no imagination), pooled over "
                    "the grounding seeds, beside BC trained on the same real data (greedy, and on BabyAI also sampled "
                    "from its action distribution), random actions from the same starts and, where recorded, the "
                    "same policies under another task's instruction (success still on the own goal); passed only "
                    "where the grounded interval lies wholly above random's. *Own − swapped*: the success under the "
                    "own instruction minus under another task's, paired by grounding seed and start (bootstrap "
                    "within each seed and start); a policy that reads its goal scores above 0.", [f"{gates}/*.json"],
                    ["benchmark", "policy", "success [95 % CI]", "episodes", "own − swapped [95 % CI]",
                     "gate 0 passed"], rows)
    ground = f"{tier}metrics/kalm/ground"
    rows = []
    # the seeds of a benchmark whose grounding has a gate 0 record (a tier part re-run benchmark by benchmark)
    for bench in sorted(p.stem for p in _files(root, gates)):
        for path in _files(root, f"{ground}/{bench}"):
            rel = f"{ground}/{bench}/{path.name}"
            rows.append([label(bench), label(path.stem),
                         *(Cell((figure(root, rel, ("state_error", k)),))
                           for k in ("metric", "model", "copy_last_state")),
                         Cell((figure(root, rel, ("state_error", "beats_copy"), "yesno"),)),
                         Cell((figure(root, rel, "selected_update"), " of ", figure(root, rel, "updates"))),
                         Cell((figure(root, rel, "heldout_selection_loss_before"), " → ",
                               figure(root, rel, "heldout_selection_loss_after")))])
    state = DocTable(f"kalm-{tier.replace('/', '-')}state-error", "Grounding per seed: the one-step error of the "
                     "predicted state on held-out transitions (Meta-World: mean absolute error; BabyAI: the share of "
                     "wrong compact-state fields) beside copying the last state, the update the selection kept (on "
                     "held-out action and observation loss) and that loss before and after.", [f"{ground}/*/*.json"],
                     ["benchmark", "grounding seed", "error", "model", "copy the last state", "beats copying",
                      "selected update", "selection loss"], rows)
    rows = []
    for bench in sorted(p.stem for p in _files(root, gates)):
        for path in _files(root, f"{ground}/{bench}"):
            rel = f"{ground}/{bench}/{path.name}"
            if "goal_sensitivity" not in read_value(root, rel, ()):
                continue  # a grounding recorded before the goal-sensitivity check
            cells = [label(bench), label(path.stem),
                     Cell((figure(root, rel, ("goal_sensitivity", "own_goal", "metric")),))]
            for who, key in (("grounded", ("goal_sensitivity",)), ("bc", ("gate0", "bc_goal_sensitivity"))):
                cells.append(Cell((figure(root, rel, (*key, "own_goal", "value")), " / ",
                                   figure(root, rel, (*key, "other_goal", "value")))))
            majority = read_value(root, rel, ("goal_sensitivity",)).get("majority_action")
            cells.append(Cell((figure(root, rel, ("goal_sensitivity", "majority_action")),)) if majority is not None
                         else label("—"))
            rows.append(cells)
    if not rows:
        return [gate, state]
    goal = DocTable(f"kalm-{tier.replace('/', '-')}goal-sensitivity", "Does the policy read its goal? Teacher-forced "
                    "actions on held-out expert episodes (real states, the expert's actions fed in) against the "
                    "expert's, under a training phrasing of the episode's own task and of another task (own / "
                    "other; BabyAI: share of steps agreeing, Meta-World: mean absolute action error), for the "
                    "grounded model and gate 0's BC; a policy that ignores its goal scores both alike. BabyAI's "
                    "last column: always taking the expert's most common action.", [f"{ground}/*/*.json"],
                    ["benchmark", "grounding seed", "metric", "grounded: own / other", "BC: own / other",
                     "majority action"], rows)
    return [gate, state, goal]


def kalm_tables(root: Path, tier: str = "") -> list[DocTable]:
    """KALM's tables from the default pipeline's results, or (``tier="study/"``) from the study's."""
    success = f"{tier}{KALM_SUCCESS}"
    files = [(bench.name, path) for bench in sorted(p for p in (Path(root) / success).glob("*/") if p.is_dir())
             for path in _files(root, f"{success}/{bench.name}")]
    if not files:
        raise MissingResultError(f"{success}/*/*.json: nothing there (the docs read it)")
    levels = [k for k in read_value(root, f"{success}/{files[0][0]}/{files[0][1].name}", ()) if k != "mean"]
    rows = [[label(bench), label(f"`{path.stem}`"),
             *(Cell((figure(root, f"{success}/{bench}/{path.name}", lv),)) for lv in [*levels, "mean"])]
            for bench, path in files]
    return [
        DocTable(f"kalm-{tier.replace('/', '-')}headline", "Success per goal level and averaged over them, per "
                 "benchmark and policy: real data alone against real + imagined rollouts (seed-level intervals: the "
                 "results page).", [f"{success}/*/*.json"], ["benchmark", "policy", *levels, "mean"], rows),
        kalm_imagination_table(root, tier),
    ]


def props_tables(root: Path, tier: str = "") -> list[DocTable]:
    """ProPS's tables from the default pipeline's results, or (``tier="study/"``) from the study's."""
    tables = []
    evals, ids = f"{tier}metrics/props/eval", tier.replace("/", "-")
    order = ("props", "props_plus", "props_untuned", "props_untuned_repeats_random", "props_tuned", "random_search",
             "cem", "ppo")
    extras = (("search episodes", "train_episodes"), ("LLM-proposed", "llm_proposed"),
              ("parse failure", "parse_failure"))
    if not (Path(root) / evals).is_dir():
        raise MissingResultError(f"{evals}: missing (the docs read it; run or pull the stage that writes it)")
    for task in sorted(d.name for d in (Path(root) / evals).iterdir() if d.is_dir()):
        tables.append(headline_folder_table(
            root, f"props-{ids}{task}", f"{task}: held-out return of each run's final policy; every method spends "
            "the same training episodes (`props_tuned`: the GRPO-tuned optimizer, where the task is a transfer "
            "task; `props_untuned`: the base model run as it is, one search per call; "
            "`props_untuned_repeats_random`: the same with each repeated point replaced by a random one).",
            f"{evals}/{task}", extras=extras, order=order))
    heldout = f"{tier}metrics/props/heldout.json"
    if tier and not (Path(root) / heldout).is_file():
        return tables  # the study is run in parts: its held-out test may not have run yet (the page says so)
    h = read_value(root, heldout, ())
    if "gate" in h:  # read before the comparison: did the fine-tune change the optimizer on validation functions
        gate = [Cell((figure(root, heldout, ("gate", k)),)) for k in
                ("seeds", "last_above_base", "selected_after_step_0", "validation_gain_last_mean", "passed")]
        tables.append(DocTable(f"props-{ids}gate", "The tuning gate, on validation functions (never the test's): "
                               "training seeds whose last step scores above their base weights, seeds whose "
                               "selection kept a step after 0, the mean validation gain of the last step, and the "
                               "verdict (every seed above its base and past step 0).", [heldout],
                               ["training seeds", "last step above base", "selected after step 0",
                                "validation gain (last - base)", "passed"], [gate]))
    rows = [[label(f"`{m}`"), Cell(tuple(_with_interval(root, heldout, ("methods", m), "iqm"))),
             *(Cell((figure(root, heldout, ("methods", m, k)),)) if k in e else label(EM_DASH)
               for k in ("runs", "items", "improve_share", "repeat_share", "parse_failure_share"))]
            for m, e in h["methods"].items()]
    tables.append(DocTable(f"props-{ids}heldout", "Test functions the optimizer never saw: each method's IQM of the "
                           "functions' scores (orders of magnitude of the gap to the optimum closed) over runs x "
                           "functions, and the shares of the LLM's proposals that improve on the best so far, repeat "
                           "an evaluated point, and of its replies that fail to parse.", [heldout],
                           ["method", "IQM [95 % CI]", "runs per function", "functions", "improving", "repeating",
                            "unparsed"], rows))
    comps = [[label(k.replace("_over_", " over ")), Cell(tuple(_with_interval(root, heldout, ("comparisons", k), "poi"))),
              Cell((figure(root, heldout, ("comparisons", k, "paired_difference")), " [",
                    figure(root, heldout, ("comparisons", k, "paired_lo")), ", ",
                    figure(root, heldout, ("comparisons", k, "paired_hi")), "]")),
              Cell((figure(root, heldout, ("comparisons", k, "verdict")),))] for k in h["comparisons"]]
    tables.append(DocTable(f"props-{ids}heldout-comparisons", "Paired by test function: rliable's probability of "
                           "improvement and the mean score difference with functions and runs bootstrapped as "
                           "crossed factors (verdict: higher or lower only where the interval excludes 0).", [heldout],
                           ["comparison", "P(improvement) [95 % CI]", "paired difference [95 % CI]", "verdict"],
                           comps))
    return tables


# ---------------------------------------------------------------------------------------------- benchmarks
@dataclass(frozen=True)
class Bench:
    script: str
    result: str  # under bench/results/
    what: str
    ratio: str
    target: str | None = None
    met: str | None = None
    others: tuple[tuple[str, str], ...] = ()  # (label, key) more ratios of the same file


BENCHMARKS = (
    Bench("bench/score.py", "score.json", "LLM action scoring: the prompt's KV cache reused across the candidates "
          "vs one forward per candidate (embedded SmolLM2, GLAM's six actions)", "ratio", "target_ratio", "passed",
          (("bf16 over fp32", "bfloat16/kv_speedup_over_fp32"),)),
    Bench("bench/glam.py", "glam.json", "GLAM PPO env steps/s (collection + update): LoRA on the top layers over the "
          "frozen trunk's captured outputs vs LoRA on every layer with the whole LLM re-run per epoch", "trunk_ratio",
          "trunk_target_ratio", "trunk_passed", (("update alone", "trunk_update_ratio"),
                                                 ("bf16 over fp32, trunk path", "bf16_over_fp32/trunk"))),
    Bench("bench/glam.py", "glam.json", "GLAM: the KV-cache scorer vs naive per-candidate scoring at a small update",
          "ratio", "target_ratio", "passed"),
    Bench("bench/glam.py", "glam.json", "GLAM: the prompts' common prefix computed once per batch vs every row's "
          "whole prompt (trunk path)", "shared_prefix_over_whole_prompts/env_steps_per_s", None, None,
          (("collection", "shared_prefix_over_whole_prompts/collect"),
           ("update", "shared_prefix_over_whole_prompts/update"))),
    Bench("bench/reinforce.py", "reinforce.json", "stepwise REINFORCE samples/s vs TRL's GRPO through the project's "
          "GRPO trainer (tiny model)", "ratio", "target_ratio", "passed"),
    Bench("bench/grpo_prefix.py", "grpo_prefix.json", "a math GRPO round with the shared few-shot prefix computed "
          "once vs TRL's whole-prompt scoring with checkpointing (SmolLM2; the losses must agree)", "ratio",
          "target_ratio", "passed"),
    Bench("bench/student.py", "student.json", "student PPO frames/s vs Stable-Baselines3 PPO (DoorKey, same MLP "
          "and rollout; median of paired ratios)", "ratio", "target", "pass"),
    Bench("bench/kalm_rollouts.py", "kalm_rollouts.json", "KALM imagined transitions per CPU-second: the KV cache "
          "(one appended embedding per step) vs re-encoding the prefix", "ratio_cpu", "target_ratio", "meets_target"),
    Bench("bench/kalm_acting.py", "kalm_acting.json", "KALM's grounded LLM acting in Meta-World: a level's episodes "
          "as one batch vs one at a time (the same outcomes)", "ratio_wall", "target_ratio", "meets_target"),
    Bench("bench/kalm_offline.py", "kalm_offline.json", "d3rlpy updates per CPU-second through the project's HDF5 "
          "dataset path vs raw d3rlpy on the same arrays (worst of four learners)", "min_ratio", "target_ratio",
          "pass"),
    Bench("bench/props.py", "props.json", "ProPS search iterations/s: lockstep searches batched vs one after "
          "another", "search/ratio", "search/target", "search/meets_target",
          (("batched policy evaluation, MountainCarContinuous", "evaluation/mountaincar_continuous/ratio"),
           ("batched policy evaluation, CartPole", "evaluation/cartpole/ratio"))),
    Bench("bench/bf16.py", "bf16.json", "bf16 autocast vs fp32 on the CPU's own kernels (embedded SmolLM2): "
          "forward", "speedup_bf16/forward_s", "target_forward_speedup", "passed",
          (("forward + backward", "speedup_bf16/forward_backward_s"), ("action scoring", "speedup_bf16/score_s"))),
)


def benchmark_tables(root: Path) -> list[DocTable]:
    rows = []
    for b in BENCHMARKS:
        rel = f"bench/results/{b.result}"
        others: list[str | Figure] = []
        for i, (name, key) in enumerate(b.others):
            others += (["<br>"] if i else []) + [f"{name} ", figure(root, rel, key, ".2f"), "×"]
        rows.append([label(f"`{b.script}`"), label(b.what), Cell((figure(root, rel, b.ratio, ".2f"), "×")),
                     Cell((figure(root, rel, b.target, ".2f"), "×") if b.target else (EM_DASH,)),
                     Cell((figure(root, rel, b.met, "yesno"),) if b.met else (EM_DASH,)), Cell(tuple(others))])
    main = DocTable("benchmarks", "Each benchmark measures a ratio against its reference in the same run (`make "
                    "bench` writes `bench/results/<name>.json` with the machine, raw timings, ratio and target).",
                    ["bench/results/*.json"], ["benchmark", "what against what", "ratio", "target", "met",
                                               "more ratios"], rows)
    gpu_rows = []
    for rel, speed, unit in (("bench/results/gpu_glam_float32.json", "env_steps_per_s", "env steps/s"),
                             ("bench/results/gpu_llm_rl.json", "tokens_per_s", "tokens/s")):
        gpu_rows.append([label(f"`{rel.removeprefix('bench/results/')}`"), Cell((figure(root, rel, "benchmark"),)),
                         Cell((figure(root, rel, "machine/device"),)), Cell((figure(root, rel, "dtype"),)),
                         Cell((figure(root, rel, speed), f" {unit}")), Cell((figure(root, rel, "peak_gpu_gib"), " GiB"))])
    gpu = DocTable("gpu", "`bench/gpu.py` on a GPU, a few minutes at a paper profile: speeds and memory, not results.",
                   ["bench/results/gpu_glam_float32.json", "bench/results/gpu_llm_rl.json"],
                   ["file", "profile", "device", "dtype", "speed", "peak GPU memory"],
                   gpu_rows)
    paper_rows = []
    for path in sorted((Path(root) / "bench" / "results").glob("gpu_paper_*.json")):
        rel = str(path.relative_to(root))
        for i, stage in enumerate(read_value(root, rel, "stages")):
            state = ("ran" if "skipped" not in stage and "error" not in stage else "failed" if "error" in stage
                     else "not run: an earlier stage failed" if "failed" in stage["skipped"]
                     else "not run: the run's time was spent")
            cells = [Cell((figure(root, rel, ("stages", i, key)), unit)) if key in stage else label(EM_DASH)
                     for key, unit in (("seconds", " s"), ("peak_gpu_gib", " GiB"))]
            paper_rows.append([label(f"`{path.name}`"), Cell((figure(root, rel, ("stages", i, "stage")),)),
                               Cell((figure(root, rel, "device"),)), *cells, label(state)])
    gpu_paper = DocTable("gpu_paper", "`bench/gpu_paper.py` on a GPU: each method's paper profile through the "
                         "tiers switch, its stages with the iterations, seeds and episodes cut to minutes and a "
                         "random-weight model of Qwen2.5-0.5B's shape: speeds and memory, not results.",
                         ["bench/results/gpu_paper_*.json"],
                         ["file", "stage", "device", "wall time", "peak GPU memory (torch)", ""], paper_rows)
    det = "bench/results/determinism.json"
    groups = read_value(root, det, "groups_of_identical_results")
    det_rows = [[label(f"group {g + 1}"),
                 Cell(tuple(p for i in range(len(members))
                            for p in ([", "] if i else []) + [figure(root, det, f"groups_of_identical_results/{g}/{i}")]))]
                for g, members in enumerate(groups)]
    determinism = DocTable("determinism", "`bench/determinism.py`: student PPO on DoorKey, each variant in a fresh "
                           "process; variants in one group gave byte-identical weights and metrics.", [det],
                           ["", "variants (ATen ISA level, threads, MKL_CBWR, deterministic algorithms)"], det_rows)
    return [main, gpu, gpu_paper, determinism]


# ---------------------------------------------------------------------------------------------- pages
TABLES: dict[str, Callable[[Path], list[DocTable]]] = {
    "results": lambda root: [results_table(root)],
    "baselines": baselines_tables,
    "glam": glam_tables,
    "llm_rl": llm_rl_tables,
    "llm_rl_study": llm_rl_study_tables,
    "llm4teach": llm4teach_tables,
    "kalm": kalm_tables,
    "kalm_grounding": kalm_grounding_tables,
    "kalm_study": lambda root: kalm_tables(root, "study/"),
    "kalm_study_imagination": lambda root: [kalm_imagination_table(root, "study/")],
    "kalm_study_grounding": lambda root: kalm_grounding_tables(root, "study/"),
    "props": props_tables,
    "props_study": lambda root: props_tables(root, "study/"),
    "benchmarks": benchmark_tables,
}
TABLE_MARKER = re.compile(r"<!-- table: ([\w-]+)(?: ([\w-]+))? -->")
TABLE_END = "<!-- table: end -->"
PLACEHOLDER = re.compile(r"\{\{ *([\w./:=,-]+)#([\w./@-]+)(?: *\| *([\w.]+))? *\}\}")
VALUE = re.compile(r'<span data-from="([\w./:=,-]+)#([\w./@-]+)"(?: data-format="([\w.]+)")?>[^<]*</span>')
FENCE = re.compile(r"\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+).+?(?<!`)\1(?!`)", re.S)


def source_pages(root: Path) -> list[str]:
    """The pages that may hold generated figures, relative to ``root``: the README and every page under docs/."""
    return ["README.md", *sorted(p.relative_to(root).as_posix() for p in (Path(root) / "docs").rglob("*.md"))]


def _segments(text: str, page: str) -> list[tuple[str, str, re.Match | None]]:
    """``text`` cut in order into ``(kind, text, marker)``: ``code`` (a fenced block or a code span), ``prose``, and
    ``table`` (a marker line, its match in ``marker``, with its generated block down to the end marker, or alone)."""
    lines = text.splitlines(keepends=True)
    out: list[tuple[str, str, re.Match | None]] = []
    prose: list[str] = []

    def flush_prose() -> None:
        chunk, pos = "".join(prose), 0
        for code in CODE_SPAN.finditer(chunk):
            out.extend([("prose", chunk[pos:code.start()], None), ("code", code.group(0), None)])
            pos = code.end()
        out.append(("prose", chunk[pos:], None))
        prose.clear()

    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r\n")
        fence = FENCE.match(line)
        marker = TABLE_MARKER.fullmatch(line)
        if fence:
            flush_prose()
            j = next((j for j in range(i + 1, len(lines))
                      if (close := lines[j].strip()) and set(close) == {fence.group(1)[0]}
                      and len(close) >= len(fence.group(1))), len(lines) - 1)
            out.append(("code", "".join(lines[i:j + 1]), None))
            i = j + 1
        elif line == TABLE_END:
            raise ValueError(f"{page}:{i + 1}: '{TABLE_END}' without a table marker above it")
        elif marker:
            flush_prose()
            j = next((j for j in range(i + 1, len(lines)) if TABLE_MARKER.fullmatch(lines[j].rstrip("\r\n"))), None)
            end = j if j is not None and lines[j].rstrip("\r\n") == TABLE_END else i
            out.append(("table", "".join(lines[i:end + 1]), marker))
            i = end + 1
        else:
            prose.append(lines[i])
            i += 1
    flush_prose()
    return [s for s in out if s[1]]


def render_page(text: str, root: Path, *, page: str) -> str:
    """``text``, the page at ``page`` (relative to ``root``), with every table block and value rendered from the
    files under ``root`` (the module docstring: the forms it reads and writes). A missing file is a
    ``MissingResultError``, a missing field or table a ``ResultFieldError`` naming the file and key, or the table."""
    root = Path(root)
    loaded: dict[str, Any] = {}  # a profile takes a third of a second to compose, and a page reads it many times

    def value(match: re.Match) -> str:
        source, key, fmt = match.group(1), match.group(2), match.group(3) or ""
        if source not in loaded:
            loaded[source] = _load(root, source)
        shown = Figure(source, split_key(key), _field(loaded[source], source, key), fmt).text
        return (f'<span data-from="{source}#{key}"' + (f' data-format="{fmt}"' if fmt else "")
                + f">{html.escape(shown, quote=False)}</span>")

    def link(doc: str) -> str:
        return posixpath.relpath(f"docs/{doc}", posixpath.dirname(page) or ".")

    def tables(marker: re.Match, block: str) -> str:
        name, wanted = marker.group(1), marker.group(2)
        if name not in TABLES:
            raise ResultFieldError(f"unknown table {name!r} (known: {', '.join(TABLES)})")
        found = [results_table(root, link=link)] if name == "results" else TABLES[name](root)
        if wanted:
            found = [t for t in found if t.id == wanted]
            if not found:
                raise ResultFieldError(f"table {name!r} has no {wanted!r}")
        newline = block[len(block.rstrip("\r\n")):]
        return (f"{marker.group(0)}\n\n" + "\n\n".join(_table_block(t) for t in found)
                + f"\n\n{TABLE_END}{newline}")

    parts = []
    for kind, chunk, marker in _segments(text, page):
        if kind == "prose":
            chunk = VALUE.sub(value, PLACEHOLDER.sub(value, chunk))
        elif kind == "table":
            chunk = tables(marker, chunk)
        parts.append(chunk)
    return "".join(parts)


def unrendered(text: str, page: str) -> list[str]:
    """What an author wrote that rendering has not replaced: ``{{ }}`` placeholders (in code too, where they show as
    written: ``<code>`` around a placeholder renders it in code type) and marker lines without their block."""
    found = []
    for kind, chunk, marker in _segments(text, page):
        if kind == "table" and TABLE_END not in chunk:
            found.append(marker.group(0))
        elif kind != "table":
            found += [m.group(0) for m in PLACEHOLDER.finditer(chunk)]
    return found
