"""The docs site and the README: a strict build, figures that agree with their files, history kept apart.

- The site builds with ``mkdocs build --strict`` (any warning fails: broken links and anchors, pages left out of
  the nav, docstrings mkdocstrings cannot read), importing no deep-learning stack.
- Every page and the README are what ``scripts/docs_sources.py --write`` gives from the result files of a clone (the
  generator writes the figures and tables into the Markdown sources; the build serves them as they are), and no
  placeholder or bare table marker is left in them.
- Every value of the built site (``<span data-from="FILE#KEY">``) equals the value at KEY in FILE, read here
  independently; each method's page and the benchmarks page carry generated tables.
- The README is short, shows the quick start on its first screen, and holds the headline results table.
- No history ("this revision", "this session", "that session", "before this change", "used to be", "no longer",
  an ISO date, "re-run is pending", "has not been re-run", "issue 47") or commit hash in the README, the docs (the
  measurements log apart) or the library's docstrings; the README states no set-up or run time (one home: Getting
  started, "Time and memory").
- The API reference documents every name of every module's ``__all__``.
- The KALM page opens in headless Chromium without an error; its screenshot is kept in
  ``.cache/test-artifacts/docs-kalm.png`` (and under the test's tmp path).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from llmrl.report.collect import MissingResultError
from llmrl.report.docs_tables import TABLE_END, ResultFieldError, render_page, source_pages, unrendered

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACT = ROOT / ".cache" / "test-artifacts" / "docs-kalm.png"
HEAVY = ("torch", "transformers", "trl", "peft", "d3rlpy", "gymnasium", "prefect", "dvc")
README_MAX_LINES = 200
FIRST_SCREEN = 40  # lines of the README a reader sees before scrolling
GENERATED_PAGES = {"index.html", "results.html", "benchmarks.html", "gpu.html", "reproducibility.html",
                   *(f"methods/{m}.html" for m in ("glam", "llm_rl", "llm4teach", "kalm", "props"))}

BUILD = """
import sys
from mkdocs.__main__ import cli
sys.argv = ["mkdocs", "build", "--strict", "--config-file", sys.argv[1], "--site-dir", sys.argv[2]]
try:
    cli()
except SystemExit as exit:
    code = exit.code
print("HEAVY_MODULES", [m for m in {heavy!r} if m in sys.modules])
sys.exit(code)
"""


def clone_view(dest: Path) -> Path:
    """The files a fresh clone of this workspace holds (git-tracked and untracked-but-not-ignored), copied to
    ``dest``: what CI builds the docs from, without the DVC outputs a run left here."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the workspace is not there for a clone either
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A clone's files: a page that reads a DVC output a clone lacks fails here as it fails in CI."""
    return clone_view(tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="module")
def site(tmp_path_factory, clone) -> Path:
    """The site built strictly into a tmp folder, in a fresh interpreter, from a clone's files."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-c", BUILD.format(heavy=HEAVY), str(clone / "mkdocs.yml"), str(out)],
                         cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{log[-6000:]}"
    assert "WARNING" not in log, log[-6000:]
    assert "HEAVY_MODULES []" in log, f"the docs build imported a deep-learning stack: {log[-500:]}"
    return out


# ---------------------------------------------------------------------------------------------- reading the HTML
class FigureParser(HTMLParser):
    """Every value span (``span[data-from="FILE#KEY"]``: source, key, format, text) and every generated table's id."""

    def __init__(self):
        super().__init__()
        self.figures: list[dict] = []
        self.tables: list[str] = []  # ids of the generated-table blocks
        self._stack: list[bool] = []  # per open span: is it a value

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "generated-table" in (a.get("class") or "").split():
            self.tables.append(a.get("id", ""))
        if tag != "span":
            return
        if a.get("data-from"):
            source, key = a["data-from"].split("#")
            self.figures.append({"source": source, "key": key.replace(".", "/"), "format": a.get("data-format", ""),
                                 "text": ""})
        self._stack.append(bool(a.get("data-from")))

    def handle_endtag(self, tag):
        if tag == "span" and self._stack:
            self._stack.pop()

    def handle_data(self, data):
        if self._stack and self._stack[-1]:
            self.figures[-1]["text"] += data


def parse(html: str) -> FigureParser:
    p = FigureParser()
    p.feed(html)
    return p


@functools.cache
def source_data(root: Path, source: str):
    """The JSON or YAML file ``source``, or the parameters a profile composes (``conf:<overrides>``, through DVC's
    own Hydra composition)."""
    if source.startswith("conf:"):
        from pipelines.tiers import params_text

        return yaml.safe_load(params_text(source.removeprefix("conf:").split(",")))
    path = root / source
    return yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())


def file_value(root: Path, source: str, key: str):
    """The value at ``key`` (``/``-separated; digits index lists) in ``source`` (``source_data``)."""
    value = source_data(root, source)
    for part in key.split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def shown(value, fmt: str, yaml_source: bool) -> str:
    """How the docs print a value: numbers as the file holds them or through ``fmt``; ``null`` in params, an em
    dash in results; booleans ``true``/``false`` or, with ``yesno``, ``yes``/``no``."""
    if value is None:
        return "null" if yaml_source else "—"
    if isinstance(value, bool):
        return ("yes" if value else "no") if fmt == "yesno" else ("true" if value else "false")
    if isinstance(value, (int, float)):
        return format(value, fmt) if fmt else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(shown(v, fmt, yaml_source) for v in value) + "]"
    return str(value)


def disagreements(html: str, root: Path) -> list[str]:
    """Every generated figure of ``html`` that differs from its file under ``root``, as a readable line."""
    found = []
    for f in parse(html).figures:
        try:
            expected = shown(file_value(root, f["source"], f["key"]), f["format"],
                             f["source"].endswith((".yaml", ".yml")) or f["source"].startswith("conf:"))
        except (OSError, KeyError, IndexError, ValueError, TypeError) as err:
            found.append(f"{f['source']}#{f['key']}: unreadable ({err!r})")
            continue
        if f["text"] != expected:
            found.append(f"{f['source']}#{f['key']}: the page shows {f['text']!r}, the file holds {expected!r}")
    return found


def pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}


# ---------------------------------------------------------------------------------------------- the sources
def test_every_page_is_what_the_files_give(clone):
    stale = [page for page in source_pages(clone)
             if render_page((clone / page).read_text(), clone, page=page) != (clone / page).read_text()]
    assert not stale, f"stale against the result files: {stale}: run python scripts/docs_sources.py --write"


def test_no_placeholder_or_bare_marker_is_left():
    left = {page: found for page in source_pages(ROOT) if (found := unrendered((ROOT / page).read_text(), page))}
    assert not left, f"not rendered (python scripts/docs_sources.py --write): {left}"


UPDATE_RULE = re.compile(r"^\*\*The update rule:\*\*.*?(?=\n\n|\Z)", re.M | re.S)  # the paragraph
SOURCE_REF = re.compile(r"`(llmrl/[\w/]+\.py)::([\w.]+)`")


def _defined(tree: ast.Module, dotted: str) -> ast.AST | None:
    """The top-level function or class (or a class's method: ``Class.method``) named ``dotted`` in ``tree``."""
    body, node = tree.body, None
    for part in dotted.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _computes_or_chooses_loss(node: ast.AST) -> bool:
    """``node`` assigns a name with "loss" in it (``loss = ...``, ``policy_loss, value_loss = ...``), is a function
    named for a loss that returns a value, or declares a field or passes a keyword ``loss_type`` (TRL's loss,
    chosen)."""
    if isinstance(node, ast.FunctionDef) and "loss" in node.name and any(
            isinstance(n, ast.Return) and n.value is not None for n in ast.walk(node)):
        return True
    for n in ast.walk(node):
        targets = (n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AnnAssign,
                   ast.AugAssign)) else [])
        names = [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
        if any("loss" in name for name in names) or (isinstance(n, ast.keyword) and n.arg == "loss_type"):
            return True
    return False


@pytest.mark.parametrize("page", sorted(p.name for p in (DOCS / "methods").glob("*.md")))
def test_a_method_page_reaches_its_loss_line_in_at_most_five_files(page):
    """A reader follows the page's update-rule line to the code: every file::name it gives exists, one of them
    computes or configures the loss, and the page plus those files are at most five."""
    lines = UPDATE_RULE.findall((DOCS / "methods" / page).read_text())
    refs = [ref for line in lines for ref in SOURCE_REF.findall(line)]
    assert refs, f"{page}: no '**The update rule:**' line naming `llmrl/...py::name`"
    assert 1 + len({file for file, _ in refs}) <= 5, f"{page}: the walk to the loss takes more than 5 files: {refs}"
    nodes = []
    for file, name in refs:
        node = _defined(ast.parse((ROOT / file).read_text()), name)
        assert node is not None, f"{page}: {file} defines no {name}"
        nodes.append(node)
    assert any(_computes_or_chooses_loss(node) for node in nodes), f"{page}: no loss line in {refs}"


PAGE = """# A page

The model is {{ params.yaml#glam.model }}, wrapped so that the next line opens with one:
{{ params.yaml#glam.train.lr | .4f }} and `{{ in code: left as written }}`.

| setting | default |
|---|---|
| updates | {{ params.yaml#glam.train.updates }} |

<!-- table: results -->

```
{{ params.yaml#glam.model }}
<!-- table: results -->
```
"""


@pytest.fixture
def results_root(tmp_path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(ROOT / "metrics", root / "metrics")
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    return root


def test_rendering_writes_values_beside_their_source_and_twice_gives_the_same(results_root):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    once = render_page(PAGE, results_root, page="docs/methods/x.md")
    assert render_page(once, results_root, page="docs/methods/x.md") == once
    assert f'The model is <span data-from="params.yaml#glam.model">{params["glam"]["model"]}</span>,' in once
    lr = format(params["glam"]["train"]["lr"], ".4f")
    assert f'one:\n<span data-from="params.yaml#glam.train.lr" data-format=".4f">{lr}</span> and' in once
    updates = params["glam"]["train"]["updates"]
    assert f'| updates | <span data-from="params.yaml#glam.train.updates">{updates}</span> |' in once
    assert "`{{ in code: left as written }}`" in once and once.endswith(PAGE[PAGE.index("```"):])
    block = once.split("<!-- table: results -->\n", 1)[1].split(TABLE_END, 1)[0]
    assert '<div class="generated-table" id="table-results" markdown>' in block
    assert "| [GLAM](glam.md) |" in block  # relative to docs/methods/x.md, as a Git host resolves it
    assert "| [GLAM](docs/methods/glam.md) |" in render_page(PAGE, results_root, page="README.md")
    assert "| [GLAM](methods/glam.md) |" in render_page(PAGE, results_root, page="docs/index.md")
    assert unrendered(PAGE, "x.md") == ["{{ params.yaml#glam.model }}", "{{ params.yaml#glam.train.lr | .4f }}",
                                        "{{ params.yaml#glam.train.updates }}", "<!-- table: results -->",
                                        "{{ params.yaml#glam.model }}"]
    assert unrendered(once, "x.md") == ["{{ params.yaml#glam.model }}"]  # the fenced example, shown as written


def test_a_changed_file_changes_the_rendered_page(results_root):
    once = render_page(PAGE, results_root, page="docs/x.md")
    params = yaml.safe_load((results_root / "params.yaml").read_text())
    params["glam"]["train"]["updates"] = 12345
    (results_root / "params.yaml").write_text(yaml.safe_dump(params))
    again = render_page(once, results_root, page="docs/x.md")
    assert [line for line in again.splitlines() if line not in once.splitlines()] == [
        '| updates | <span data-from="params.yaml#glam.train.updates">12345</span> |']


def test_a_missing_file_or_field_stops_rendering_naming_it(results_root):
    with pytest.raises(ResultFieldError, match=r"^params.yaml: no field glam/train/nope$"):
        render_page("x {{ params.yaml#glam.train.nope }}", results_root, page="docs/x.md")
    with pytest.raises(ResultFieldError, match=r"^params.yaml: no field glam/train/nope$"):
        render_page('x <span data-from="params.yaml#glam.train.nope">3</span>', results_root, page="docs/x.md")
    (results_root / "metrics/llm_rl/eval/grpo.json").unlink()
    with pytest.raises(MissingResultError, match=r"metrics/llm_rl/eval/grpo.json"):
        render_page("<!-- table: results -->\n", results_root, page="docs/x.md")
    with pytest.raises(ResultFieldError, match="unknown table 'nope'"):
        render_page("<!-- table: nope -->\n", results_root, page="docs/x.md")
    with pytest.raises(ValueError, match=f"docs/x.md:2: '{TABLE_END}' without a table marker"):
        render_page(f"text\n{TABLE_END}\n", results_root, page="docs/x.md")


def test_a_damaged_metrics_file_stops_the_docs_and_the_readme_naming_it(results_root):
    """A number changed on disk without its checksum (still valid JSON) is refused as the report refuses it."""
    from llmrl.files import DamagedFileError

    root, rel = results_root, "metrics/llm_rl/eval/grpo.json"
    render_page("<!-- table: results -->\n", root, page="docs/x.md")  # intact: it renders
    data = json.loads((root / rel).read_text())
    data["greedy"]["success"] = round(1 - data["greedy"]["success"], 4)
    (root / rel).write_text(json.dumps(data, indent=2))  # the old checksum kept
    with pytest.raises(DamagedFileError, match=f"{root / rel}: field 'checksum' does not match"):
        render_page("<!-- table: results -->\n", root, page="docs/x.md")
    with pytest.raises(DamagedFileError, match="grpo.json"):
        render_page(f"{{{{ {rel}#greedy.success }}}}", root, page="docs/x.md")
    with pytest.raises(DamagedFileError, match="grpo.json"):
        render_page((ROOT / "README.md").read_text(), root, page="README.md")


# ---------------------------------------------------------------------------------------------- the build
def test_every_value_of_the_site_equals_its_file(site):
    built = pages(site)
    total = 0
    for name, html in built.items():
        if not name.startswith("api/"):  # the API pages quote docstrings, which may show the placeholder syntax
            assert "{{" not in html.split("<article", 1)[-1].split("</article>", 1)[0], f"{name}: a placeholder left"
        assert not disagreements(html, ROOT), f"{name}:\n" + "\n".join(disagreements(html, ROOT))
        total += len(parse(html).figures)
    for name in GENERATED_PAGES:
        assert parse(built[name]).tables, f"{name}: no generated table"
    assert total > 200, total


def test_each_method_page_reads_its_defaults_from_params(site):
    for method in ("glam", "llm_rl", "llm4teach", "kalm", "props"):
        sources = {f["source"] for f in parse((site / "methods" / f"{method}.html").read_text()).figures}
        assert {"params.yaml", f"conf:{method}=paper"} <= sources, (method, sources)


def test_the_check_sees_a_value_that_disagrees(site, tmp_path):
    html = (site / "methods" / "glam.html").read_text()
    root = tmp_path / "root"
    for folder in ("conf", "metrics", "plots"):  # the page's values: parameters and, in its prose, results
        shutil.copytree(ROOT / folder, root / folder)
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    assert disagreements(html, root) == []
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["glam"]["train"]["updates"] = 12345
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    source_data.cache_clear()
    found = disagreements(html, root)
    assert len(found) == 1 and "params.yaml#glam/train/updates" in found[0] and "'12345'" in found[0], found


def test_optional_pages_join_the_nav_when_they_exist(tmp_path):
    spec = importlib.util.spec_from_file_location("docs_site_hook", DOCS / "hooks" / "site.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    nav = [{"Home": "index.md"}, {"Methods": [{"GLAM": "methods/glam.md"}, {"Tiers": "tiers.md"}]},
           {"Faults": "faults.md"}, {"API reference": ["api/index.md"]}]
    (tmp_path / "faults.md").write_text("# Faults\n")
    out = hook.on_config({"docs_dir": str(tmp_path), "nav": nav})["nav"]
    assert out[1] == {"Methods": [{"GLAM": "methods/glam.md"}]} and out[2] == {"Faults": "faults.md"}
    api = out[3]["API reference"]
    assert api[0] == "api/index.md" and {"llmrl.llm": "api/llm.md"} in api and len(api) > 5


def test_the_api_reference_documents_every_public_name(site):
    hook_spec = importlib.util.spec_from_file_location("docs_site_hook", DOCS / "hooks" / "site.py")
    hook = importlib.util.module_from_spec(hook_spec)
    hook_spec.loader.exec_module(hook)
    missing = []
    for path in sorted((ROOT / "llmrl").rglob("*.py")):
        rel = path.relative_to(ROOT / "llmrl")
        page = (site / "api" / f"{rel.parts[0] if len(rel.parts) > 1 else 'utilities'}.html").read_text()
        module = hook.module_name(path)
        public, defined = hook.public_names(path)
        missing += [f"{module}.{n}" for n in public if n in defined and f'id="{module}.{n}"' not in page]
    assert not missing, missing


# ---------------------------------------------------------------------------------------------- README
def test_readme_is_short_with_the_quick_start_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    first = "\n".join(lines[:FIRST_SCREEN])
    for text in ("make repro", "make test", "(docs/getting-started.md#time-and-memory)"):
        assert text in first, text


# a duration or a memory size: "35.6–51.8 min", "about 16 min", "the 45-minute target", "5.8 GiB", "2 h 53 min"
FIGURE = re.compile(r"\b\d+(?:[.,]\d+)?(?:\s?[–-]\s?\d+(?:[.,]\d+)?)?"
                    r"(?:\s?(?:min|minutes?|hours?|h|GiB)\b|-(?:minute|hour)\b)")


def test_readme_states_no_time_or_memory_figure_and_links_to_their_one_home():
    """Set-up and run times live in docs/getting-started.md ("Time and memory"), backed by the measurements log; the
    README only links there, so a new figure cannot disagree with it."""
    found = FIGURE.findall((ROOT / "README.md").read_text())
    assert not found, f"README.md states {found}: link to docs/getting-started.md#time-and-memory instead"
    assert FIGURE.findall("took 35.6–51.8 min, about 16 min, the 45-minute target, 5.8 GiB, 2 h 53 min") == [
        "35.6–51.8 min", "16 min", "45-minute", "5.8 GiB", "2 h", "53 min"]
    assert not FIGURE.findall("arXiv 2302.02662, 3 seeds, 576-dim, a 7B model, 20 minibatches, top-p 0.9")


def test_readme_holds_the_results_table():
    text = (ROOT / "README.md").read_text()
    assert text.count("<!-- table: results -->\n") == 1 and text.count(TABLE_END) == 1


METHODS = ("glam", "llm_rl", "llm4teach", "kalm", "props")


def method_stages() -> dict[str, list[str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {m: [s for s in stages if s.startswith(f"{m}_")] for m in METHODS}


def test_readme_and_method_pages_name_every_stage():
    readme = (ROOT / "README.md").read_text().splitlines()
    for method, stages in method_stages().items():
        assert stages, method
        row = next(line for line in readme if line.startswith("| ") and f"docs/methods/{method}.md" in line)
        page = (DOCS / "methods" / f"{method}.md").read_text()
        for stage in stages:
            assert f"`{stage}`" in row, f"README's method table: {stage} missing from {method}'s row"
            assert f"`{stage}" in page, f"docs/methods/{method}.md: {stage} missing from the code map"


# ---------------------------------------------------------------------------------------------- history
# phrases that only tell what was; "used to" and "no longer" alone also read innocently ("is used to draw", "no longer
# than 64 tokens"), so only their historical forms
# A run log's marks too: an ISO date (not inside a link's anchor, `measurements.md#2026-11-28-night-...`), a re-run
# still to come, an issue's number: user pages state what is, and link to the log for when and why.
HISTORY = re.compile(
    r"\bth(is|at) (revision|session)\b|\bbefore this change\b|\bused to (be|state)\b|\bno longer\b(?! than)"
    r"|(?<![#\w-])\d{4}-\d{2}-\d{2}\b|\bre-run is pending\b|\bhas not been re-run\b|\bissue #?\d+\b", re.I)
# 7 to 40 hex digits with a digit and a letter among them: a commit hash, not a number or a word
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def user_texts() -> dict[str, str]:
    """The README, every docs page but the measurements log (and a changelog, should one appear) and the library's
    docstrings."""
    texts = {"README.md": (ROOT / "README.md").read_text()}
    texts |= {p.relative_to(ROOT).as_posix(): p.read_text() for p in DOCS.rglob("*.md")
              if p.name != "measurements.md" and not p.name.lower().startswith("changelog")}
    for path in sorted((ROOT / "llmrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    texts[f"{path.relative_to(ROOT)}:{getattr(node, 'name', 'module')}"] = doc
    return texts


def test_no_history_outside_the_measurements_log():
    found = [f"{name}: {m.group(0)!r}" for name, text in user_texts().items()
             for pattern in (HISTORY, COMMIT) for m in pattern.finditer(text)]
    assert not found, "history belongs in docs/measurements.md:\n" + "\n".join(found)
    assert COMMIT.search((DOCS / "measurements.md").read_text())  # the log keeps them


def test_the_history_patterns_see_what_they_should():
    assert COMMIT.findall("ran 1b4d538 and f0cb724c") == ["1b4d538", "f0cb724c"]
    assert not COMMIT.search("arXiv 2302.02662, seed 15485863, a decade, facade, deadbeef, 1e-6")
    assert HISTORY.search("As of This Revision") and not HISTORY.search("this revisions")
    for history in ("the other runs of that session", "the committed run before this change",
                    "the format used to be shown", "ProPS+ used to state 500", "the stage no longer writes it"):
        assert HISTORY.search(history), history
    for present in ("the seed is used to draw the levels", "a reply no longer than the cap",
                    "before this changes anything"):
        assert not HISTORY.search(present), present
    for log in ("([Measurements](../measurements.md), 2026-11-29)", "its re-run is pending", "the grounding has not "
                "been re-run with them", "as issue 47 asked", "see Issue #49"):
        assert HISTORY.search(log), log
    for present in ("[log, 28 November 2026](measurements.md#2026-11-28-night-ci-over-its-90-minutes)",
                    "[log](measurements.md#moved-from-the-user-pages-2026-11-29)", "seed 10000, 2026 steps",
                    "the issue's length", "stale until the study's stages run again"):
        assert not HISTORY.search(present), present


# ---------------------------------------------------------------------------------------------- in a browser
def _chromium_or_skip():
    """Playwright driving Debian's chromium; without them: a failure under CI, a skip elsewhere."""
    reason = None
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[test]')"
    if reason is None and not CHROMIUM.is_file():
        reason = f"{CHROMIUM} missing (apt-get install chromium; `make test` installs it)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"headless Chromium test cannot run under CI: {reason}")
        pytest.skip(reason)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_kalm_page_in_headless_chromium(site, tmp_path):
    """Served over HTTP as a reader would (search needs it): no console error, no failed request, the code map and
    the generated tables visible, the headline table's link back to the page resolves."""
    _chromium_or_skip()
    from playwright.sync_api import sync_playwright

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    problems: list[str] = []
    shot = tmp_path / "docs-kalm.png"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                        if msg.type == "error" else None)
                page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
                page.on("requestfailed", lambda req: problems.append(f"request failed: {req.url}"))
                page.goto(f"{url}/index.html", wait_until="networkidle")
                page.locator("#table-results a", has_text="KALM").click()
                page.wait_for_load_state("networkidle")
                assert page.url.endswith("/methods/kalm.html"), page.url
                assert page.locator("h1").inner_text().startswith("KALM")
                assert page.locator("table", has_text="kalm_ground").first.is_visible()
                for table in ("kalm-headline", "kalm-imagination"):
                    assert page.locator(f"#table-{table} table").is_visible(), table
                assert page.locator("span[data-from]").count() > 20
                page.screenshot(path=str(shot), full_page=True)
            finally:
                browser.close()
    finally:
        server.shutdown()
    assert not problems, problems
    assert shot.stat().st_size > 20_000
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)


def test_the_docs_extra_pins_what_the_project_pins():
    """`make docs` installs the docs extra and the project without its dependencies: a package both list must
    have one version, or the docs-only environment would differ from the full one."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def pins(specs):
        return dict(s.split(" ")[0].split("==", 1) for s in specs if "==" in s)
    main, docs = pins(project["dependencies"]), pins(project["optional-dependencies"]["docs"])
    shared = {name.split("[")[0] for name in docs} & set(main)
    assert {"pydantic", "pyyaml", "jinja2", "hydra-core"} <= shared
    assert {name: docs[name] for name in shared} == {name: main[name] for name in shared}


def test_the_gate0_table_shows_own_minus_swapped_where_recorded(tmp_path):
    from llmrl.files import write_json
    from llmrl.report.docs_tables import kalm_grounding_tables, to_markdown
    row = {"success": 0.5, "ci_low": 0.2, "ci_high": 0.8, "episodes": 26}
    gate = {"grounded": row, "grounded_swapped": row, "random": row, "passed": False,
            "reads_goal": {"grounded": {"difference": 0.1234, "ci_low": -0.05, "ci_high": 0.31}}}
    folder = tmp_path / "metrics/kalm/gate0"
    folder.mkdir(parents=True)
    write_json(folder / "babyai.json", {"gate0": gate})
    write_json(folder / "metaworld.json", {"gate0": {k: gate[k] for k in ("grounded", "passed")}})
    grounding = {"state_error": {"metric": "mae", "model": 0.1, "copy_last_state": 0.2, "beats_copy": True},
                 "selected_update": 5, "updates": 10, "heldout_selection_loss_before": 2.0,
                 "heldout_selection_loss_after": 1.0}
    for bench in ("babyai", "metaworld"):
        (tmp_path / "metrics/kalm/ground" / bench).mkdir(parents=True)
        write_json(tmp_path / "metrics/kalm/ground" / bench / "0.json", grounding)
    table = to_markdown(kalm_grounding_tables(tmp_path)[0])
    lines = {line.split(" | ")[0] + " | " + line.split(" | ")[1]: line for line in table.splitlines()[2:]}
    assert "0.1234 [-0.05, 0.31]" in lines["| babyai | `grounded`"]
    assert "0.1234" not in lines["| babyai | `random`"]
    assert lines["| metaworld | `grounded`"].count("|") == table.splitlines()[0].count("|")
