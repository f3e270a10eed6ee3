"""Every module of the library states its public surface, and the rest of the project keeps to it.

Each ``llmrl`` module binds ``__all__`` to a literal list of the names other code may use; a name it leaves out is
the module's own business even without a leading underscore. Every ``from llmrl.x import name`` and every
``module.name`` on an imported ``llmrl`` module, in the library, stages, pipelines, benchmarks, scripts and these
tests, must name a submodule or a name in ``__all__``. The checks read the source with ``ast``; nothing is imported.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "llmrl"
USERS = ("llmrl", "stages", "pipelines", "bench", "scripts", "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def declared_surface(path: Path) -> list[str] | None:
    """The literal ``__all__`` a module binds at top level, or None without one (or with a computed one)."""
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(target, ast.Name) and target.id == "__all__":
            if isinstance(node.value, ast.List) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                        for e in node.value.elts):
                return [e.value for e in node.value.elts]
            return None
    return None


def top_level_names(path: Path) -> set[str]:
    """Names a module binds at top level (definitions, assignments and imports, inside ``if``/``try`` too)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                    names |= {e.id for e in ast.walk(target) if isinstance(e, ast.Name)}
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names |= {a.asname or a.name.split(".")[0] for a in sub.names}
    return names


def uses_of_the_library(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) for every name this file takes from an llmrl module: ``from llmrl.x import name`` and
    ``alias.name`` where ``alias`` is an llmrl module it imported."""
    tree = ast.parse(path.read_text())
    uses, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "llmrl":
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                else:
                    uses.append((node.module, a.name, node.lineno))
        elif isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname and a.name.split(".")[0] == "llmrl"}
    for node in ast.walk(tree):
        # An assignment (a benchmark patching a module's reference to its scorer) reads nothing from the surface.
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and not isinstance(node.ctx, ast.Store)):
            uses.append((aliases[node.value.id], node.attr, node.lineno))
    return uses


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_declares_its_surface(name):
    path = MODULES[name]
    surface = declared_surface(path)
    assert surface is not None, f"{path.relative_to(ROOT)}: no literal __all__ at top level"
    assert len(surface) == len(set(surface)), f"{name}.__all__ repeats a name"
    missing = set(surface) - top_level_names(path)
    assert not missing, f"{name}.__all__ names what the module does not define: {sorted(missing)}"


def surface_breaches(path: Path) -> list[str]:
    breaches = []
    for module, name, line in uses_of_the_library(path):
        if module not in MODULES or module_name(path) == module or name.startswith("__"):
            continue
        if name not in (declared_surface(MODULES[module]) or []):
            breaches.append(f"{path.relative_to(ROOT)}:{line} uses {module}.{name}, not in its __all__")
    return breaches


def test_the_project_uses_only_declared_names():
    files = sorted(p for d in USERS for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts)
    breaches = [b for f in files for b in surface_breaches(f)]
    assert not breaches, "\n".join(breaches)


def test_the_checker_sees_a_breach(tmp_path):
    user = ROOT / "tests" / "_surface_probe.py"  # under the project root: names are reported relative to it
    user.write_text("def f():\n    from llmrl.llm.score import top_layers\n    from llmrl.llm import score as s\n"
                    "    return s.decoder_layers_of, s.score\n")
    try:
        found = surface_breaches(user)
    finally:
        user.unlink()
    assert len(found) == 2 and "llmrl.llm.score.top_layers" in found[0] and "decoder_layers_of" in found[1], found
