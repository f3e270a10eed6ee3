"""MkDocs hook of the docs site: the API reference from ``__all__``, optional pages.

- The pages are built as their Markdown sources hold them: ``scripts/docs_sources.py --write`` writes the figures
  and tables into the sources, and tests/test_docs.py (as ``make docs``, through ``--check``) fails when a page is
  stale. The build reads no result file, so the site is the pages a Git host shows, and a stale page is caught once,
  for the README and the pages alike.
- The API reference is one generated page per ``llmrl`` package (``api/<package>.md``): each module's docstring
  and the names of its ``__all__`` (read with ``ast``: the public surface, tests/test_public_surface.py), rendered
  by mkdocstrings from the source (griffe's static analysis; nothing is imported).
- Pages other sessions add (listed in ``OPTIONAL_PAGES``) join the nav when their file exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llmrl"
# nav entries kept only where their page exists (pages written beside this site, possibly later)
OPTIONAL_PAGES = {"tiers.md", "faults.md", "scale-out.md"}
API_NAV_TITLE = "API reference"


def public_names(path: Path) -> tuple[list[str], set[str]]:
    """A module's literal ``__all__`` and the names among them it defines itself (not imported)."""
    tree = ast.parse(path.read_text())
    names: list[str] = []
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    defined.add(t.id)
                    if t.id == "__all__" and isinstance(node.value, ast.List):
                        names = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return names, defined


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def api_pages() -> dict[str, tuple[str, str]]:
    """src_uri → (nav title, Markdown) for every package of the library, and one page for its top-level modules."""
    groups: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        groups.setdefault(rel.parts[0] if len(rel.parts) > 1 else "", []).append(path)
    pages = {}
    for group, paths in sorted(groups.items()):
        title = f"llmrl.{group}" if group else "llmrl (utilities)"
        lines = [f"# {title}", "", "Generated from the source: each module's docstring and the names in its "
                 "`__all__`, its public surface.", ""]
        for path in sorted(paths, key=lambda p: (p.name != "__init__.py", module_name(p))):
            name = module_name(path)
            public, defined = public_names(path)
            own = [n for n in public if n in defined]
            lines += [f"::: {name}", "    options:", f"      members: {own if own else 'false'}".replace("'", '"'), ""]
            imported = [n for n in public if n not in defined]
            if imported:
                lines += ["Also public here, defined in a submodule: " + ", ".join(f"`{n}`" for n in imported) + ".", ""]
        pages[f"api/{group or 'utilities'}.md"] = (title, "\n".join(lines))
    return pages


def on_config(config, **_):
    docs = Path(config["docs_dir"])

    def keep(item) -> bool:
        page = next(iter(item.values())) if isinstance(item, dict) else item
        return not (isinstance(page, str) and page in OPTIONAL_PAGES and not (docs / page).is_file())

    def prune(items):
        out = []
        for item in items:
            if isinstance(item, dict) and isinstance(next(iter(item.values())), list):
                (title, children), = item.items()
                if title == API_NAV_TITLE:
                    children = children + [{t: uri} for uri, (t, _) in api_pages().items()]
                out.append({title: prune(children)})
            elif keep(item):
                out.append(item)
        return out

    config["nav"] = prune(config["nav"])
    return config


def on_files(files, config, **_):
    for uri, (_, content) in api_pages().items():
        files.append(File.generated(config, uri, content=content))
    return files

