"""Artifact folders are named in one place, stages/paths.py (issue 15, item 7): every out, metric and plot that
dvc.yaml declares lies in one of its folders, and no stage script spells a top-level folder itself."""

import ast
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "stages"))
import paths  # noqa: E402

STAGE_SCRIPTS = sorted(p for p in (ROOT / "stages").glob("*.py") if p.name != "paths.py")
TOP_FOLDERS = {"data", "models", "metrics", "plots", "reports", ".cache"}


def declared_outputs() -> list[tuple[str, str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    found = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        for key in ("outs", "metrics", "plots"):
            for entry in body.get(key) or []:
                found.append((name, next(iter(entry)) if isinstance(entry, dict) else entry))
    return found


def allowed_prefixes() -> list[str]:
    folders = [getattr(f, kind) for f in paths.FOLDERS for kind in paths.KINDS]
    return [p.relative_to(paths.ROOT).as_posix() for p in (*folders, paths.BASE_LLM, paths.DEMOS, paths.REPORTS)]


@pytest.mark.parametrize("stage,path", declared_outputs(), ids=lambda x: str(x))
def test_every_declared_output_lies_in_a_folder_of_paths_py(stage, path):
    assert any(path == p or path.startswith(p + "/") for p in allowed_prefixes()), (
        f"{stage}: {path} is not under a folder named in stages/paths.py")


@pytest.mark.parametrize("script", STAGE_SCRIPTS, ids=lambda p: p.stem)
def test_no_stage_script_spells_a_top_level_folder(script):
    # a folder joined onto a path (`ROOT / "metrics"`) or spelled as one string ("metrics/glam/...")
    tree = ast.parse(script.read_text())
    joined = {n.right.value for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
              and isinstance(n.right, ast.Constant) and n.right.value in TOP_FOLDERS}
    strings = {n.value.split("/", 1)[0] for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and "/" in n.value and n.value.split("/", 1)[0] in TOP_FOLDERS}
    spelled = joined | strings
    assert not spelled, f"{script.name} names {sorted(spelled)}: take the folder from stages/paths.py"


def test_method_folders_carry_the_params_section_names():
    sections = yaml.safe_load((ROOT / "params.yaml").read_text())
    for folders in (paths.GLAM, paths.LLM_RL, paths.LLM4TEACH, paths.KALM, paths.PROPS):
        assert folders.name in sections, folders.name
