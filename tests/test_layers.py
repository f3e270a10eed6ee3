"""Layers point down: a module may import only from its own layer or the layers below it.

From the bottom: utilities (files, config, kernels, seeding, fingerprint) → data (formats) → llm, envs → agents →
algos → eval.
The check reads every module's imports (top-level and inside functions) with ``ast``.
"""

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "llmrl"
# Packages a layer must never import (its own layer and those below it stay allowed).
FORBIDDEN = {
    "files": {"llm", "envs", "agents", "algos", "eval"},
    "config": {"llm", "envs", "agents", "algos", "eval"},
    "kernels": {"llm", "envs", "agents", "algos", "eval"},
    "seeding": {"llm", "envs", "agents", "algos", "eval"},
    "fingerprint": {"llm", "envs", "agents", "algos", "eval"},
    "data": {"llm", "envs", "agents", "algos", "eval"},
    "llm": {"agents", "algos", "eval"},
    "envs": {"agents", "algos", "eval"},
    "agents": {"algos", "eval"},
    "algos": {"eval"},
}


def llmrl_imports(path: Path) -> set[str]:
    """Second components of every ``llmrl.<x>`` this module imports (``from llmrl import x`` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "llmrl":
                found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("llmrl.")}
    return found


def layer_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


MODULES = sorted(p for p in PKG.rglob("*.py") if layer_of(p) in FORBIDDEN)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_module_imports_only_its_layer_and_below(path):
    upward = llmrl_imports(path) & FORBIDDEN[layer_of(path)]
    assert not upward, f"llmrl/{path.relative_to(PKG)} ({layer_of(path)}) imports llmrl.{sorted(upward)}"


def test_the_checker_sees_function_level_imports(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from llmrl.algos.distilled_ppo import train\n    import llmrl.eval.stats\n")
    assert llmrl_imports(mod) == {"algos", "eval"}


ALL_MODULES = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", ALL_MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_shadows_the_standard_library(path):
    """A module named like the standard library's (math.py, io.py) reads as the stdlib in imports and tracebacks."""
    assert path.stem not in sys.stdlib_module_names, f"llmrl/{path.relative_to(PKG)} shadows the stdlib"


def test_data_holds_formats_only():
    """Task content (problem generators, answer checks, environment episodes) lives with its environment."""
    names = {p.stem for p in (PKG / "data").glob("*.py")}
    assert names <= {"__init__", "trajectories", "embeddings"}, sorted(names)


def top_level_imports(path: Path) -> set[str]:
    """First components of every module this file imports (top-level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found


@pytest.mark.parametrize("path", sorted((PKG.parent / "bench").glob("*.py")) + sorted(PKG.rglob("*.py")) +
                         sorted((PKG.parent / "stages").glob("*.py")) + sorted((PKG.parent / "pipelines").glob("*.py")),
                         ids=lambda p: str(p.relative_to(PKG.parent)))
def test_nothing_outside_the_tests_imports_them(path):
    assert "tests" not in top_level_imports(path), f"{path.relative_to(PKG.parent)} imports from tests/"
