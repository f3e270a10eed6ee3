"""Every stage's deps in dvc.yaml cover its script's import closure: no stale cache by construction."""

import textwrap
from pathlib import Path

import pytest

from pipelines.stage_deps import StageDepsError, analyse, import_closure, main

from .conftest import ROOT


def test_real_dvc_yaml_declares_every_module_of_each_closure():
    reports = analyse(ROOT / "dvc.yaml")
    assert reports, "dvc.yaml has no stages"
    unchecked = [r.name for r in reports if r.script is None]
    assert not unchecked, f"stages whose cmd names no python script: {unchecked}"
    missing = {r.name: r.missing for r in reports if r.missing}
    assert not missing, (
        "stages whose deps miss project modules they import (run `python pipelines/stage_deps.py --write`):\n"
        + "\n".join(f"  {k}: {', '.join(v)}" for k, v in missing.items()))


def _toy(tmp_path: Path, glam_deps: str) -> Path:
    files = {
        "llmrl/__init__.py": "",
        "llmrl/util.py": "import os\n",
        "llmrl/algos/__init__.py": "from llmrl.algos.rule import update\n",
        "llmrl/algos/rule.py": "from ..util import *\nimport numpy\n\ndef update():\n    from . import helper\n",
        "llmrl/algos/helper.py": "X = 'templates'\n",
        "llmrl/algos/templates/a.j2": "hi",
        "llmrl/envs/__init__.py": "",
        "llmrl/envs/make.py": "import importlib\nimportlib.import_module('llmrl.envs.textenv')\n",
        "llmrl/envs/textenv.py": "",
        "stages/common.py": "import llmrl.envs.make\n",
        "stages/train.py": "from common import ROOT\nfrom llmrl.algos import update\n",
        "dvc.yaml": textwrap.dedent("""\
            stages:
              # a comment that must survive --write
              train:
                matrix:
                  seed: [0, 1]
                cmd: python stages/train.py ${item.seed}
                deps:
            DEPS
                  - data/demos   # a data folder, kept
                outs:
                  - models/x
              other:
                foreach: [a, b]
                do:
                  cmd: python stages/common.py ${item}
                  deps:
                    - stages/common.py
            """).replace("DEPS", glam_deps),
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path / "dvc.yaml"


def test_closure_follows_transitive_relative_dynamic_imports_and_package_data(tmp_path):
    _toy(tmp_path, "      - stages/train.py")
    closure = import_closure(tmp_path / "stages/train.py", tmp_path)
    assert closure[0] == "stages/train.py"
    assert set(closure) == {
        "stages/train.py", "stages/common.py", "llmrl/__init__.py", "llmrl/util.py", "llmrl/algos/__init__.py",
        "llmrl/algos/rule.py", "llmrl/algos/helper.py", "llmrl/algos/templates", "llmrl/envs/__init__.py",
        "llmrl/envs/make.py", "llmrl/envs/textenv.py"}


def test_check_detects_a_missing_transitive_dep_and_write_fixes_it_keeping_the_rest(tmp_path, capsys):
    # everything declared except llmrl/algos/helper.py, reached only through a function-level relative import
    declared = ["stages/train.py", "stages/common.py", "llmrl/__init__.py", "llmrl/util.py", "llmrl/algos/__init__.py",
                "llmrl/algos/rule.py", "llmrl/algos/templates", "llmrl/envs/__init__.py", "llmrl/envs/make.py",
                "llmrl/envs/textenv.py", "llmrl/stale.py"]
    dvc_yaml = _toy(tmp_path, "\n".join(f"      - {d}" for d in declared))
    reports = {r.name: r for r in analyse(dvc_yaml)}
    assert reports["train"].missing == ["llmrl/algos/helper.py"]
    assert reports["train"].extra == ["llmrl/stale.py"]
    assert reports["other"].missing == ["llmrl/__init__.py", "llmrl/envs/__init__.py", "llmrl/envs/make.py",
                                        "llmrl/envs/textenv.py"]
    assert main(["--check", "--dvc-yaml", str(dvc_yaml)]) == 1
    assert "train: missing 1: llmrl/algos/helper.py" in capsys.readouterr().out

    before = dvc_yaml.read_text()
    assert main(["--write", "--prune", "--dvc-yaml", str(dvc_yaml)]) == 0
    after = dvc_yaml.read_text()
    assert "# a comment that must survive --write" in after and "- data/demos   # a data folder, kept" in after
    assert "llmrl/stale.py" not in after and "llmrl/stale.py" in before
    assert main(["--check", "--dvc-yaml", str(dvc_yaml)]) == 0
    import yaml
    doc = yaml.safe_load(after)
    assert doc["stages"]["train"]["outs"] == ["models/x"]
    assert doc["stages"]["train"]["matrix"] == {"seed": [0, 1]}
    assert "llmrl/algos/helper.py" in doc["stages"]["train"]["deps"]
    assert "llmrl/envs/textenv.py" in doc["stages"]["other"]["do"]["deps"]


def test_missing_script_is_a_named_error(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages:\n  s:\n    cmd: python stages/nope.py\n")
    with pytest.raises(StageDepsError, match="stage s: script stages/nope.py"):
        analyse(tmp_path / "dvc.yaml")


def test_a_module_run_with_dash_m_counts_its_packages_init(tmp_path):
    """`python -m stages.<name>`: Python runs stages/__init__.py (and what it imports) before the module."""
    for rel, text in {"llmrl/__init__.py": "", "llmrl/util.py": "", "stages/__init__.py": "import llmrl.util\n",
                      "stages/train.py": "X = 1\n",
                      "dvc.yaml": "stages:\n  train:\n    cmd: python -m stages.train 0\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (report,) = analyse(tmp_path / "dvc.yaml")
    assert report.script == "stages/train.py"
    assert set(report.closure) == {"stages/train.py", "stages/__init__.py", "llmrl/__init__.py", "llmrl/util.py"}
