"""The stages as a package: one module per DVC stage with ``main(argv)``, run as
``python -m stages.<name> <args>``; no ``sys.path`` edits, no import-order hacks; the accelerate preamble in one place
(``stages.launch``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import shlex
from pathlib import Path

import pytest
import yaml

from stages.launch import launched

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "stages"
# Modules of the package that are not stages: what the stages share.
SHARED = {"__init__", "common", "paths", "launch", "props_common", "props_heldout_common", "props_transfer_common", "llm4teach_common",
          "kalm_offline_common"}


def commands() -> dict[str, list[str]]:
    """Every stage of dvc.yaml: the argv of its command (foreach bodies included)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: shlex.split(stage.get("do", stage)["cmd"]) for name, stage in stages.items()}


def stage_modules() -> list[str]:
    return sorted(p.stem for p in STAGES.glob("*.py") if p.stem not in SHARED)


@pytest.mark.parametrize("name,argv", sorted(commands().items()))
def test_every_stage_runs_as_a_module_of_the_package(name, argv):
    assert argv[:3] == ["python", "-m", f"stages.{name}"], argv
    assert (STAGES / f"{name}.py").is_file()


def test_every_stage_module_is_a_stage_of_dvc_yaml():
    assert stage_modules() == sorted(commands())


@pytest.mark.parametrize("name", stage_modules())
def test_a_stage_module_has_main_argv_and_runs_it_as_a_program(name):
    tree = ast.parse((STAGES / f"{name}.py").read_text())
    last = tree.body[-1]
    assert ast.unparse(last) == "if __name__ == '__main__':\n    main()", f"{name}.py: {ast.unparse(last)}"
    module = importlib.import_module(f"stages.{name}")
    params = inspect.signature(module.main).parameters
    assert list(params) == ["argv"] and params["argv"].default is None, f"stages.{name}.main{params}"


@pytest.mark.parametrize("name", stage_modules())
def test_a_stage_names_its_arguments_and_refuses_others(name, capsys):
    main = importlib.import_module(f"stages.{name}").main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and f"python -m stages.{name}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["a", "b", "c", "d"])  # no stage takes four arguments
    assert refused.value.code == 2


@pytest.mark.parametrize("path", sorted(STAGES.glob("*.py")), ids=lambda p: p.stem)
def test_no_stage_module_edits_sys_path_or_orders_imports_by_hand(path):
    text = path.read_text()
    assert "sys.path" not in text and "isort: skip" not in text, path.name
    tree = ast.parse(text)
    relative = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0
            and (n.module or "").split(".")[0] in {p.stem for p in STAGES.glob("*.py")}]
    assert not relative and not bare, f"{path.name}: import stages modules as stages.<name> (lines {relative + bare})"


def test_the_accelerate_preamble_lives_in_stages_launch():
    """Only stages/launch.py reads WORLD_SIZE or builds an Accelerator / PartialState."""
    for path in STAGES.glob("*.py"):
        if path.name != "launch.py":
            text = path.read_text()
            assert "WORLD_SIZE" not in text and "Accelerator(" not in text and "PartialState(" not in text, path.name


def test_one_process_keeps_the_params_device_and_writes(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    launch = launched("cpu", own_loop=True)
    assert (launch.device, launch.is_main, launch.processes, launch.accelerator) == ("cpu", True, 1, None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launched(None, own_loop=False).device is None
