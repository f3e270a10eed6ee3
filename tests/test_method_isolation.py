"""One method's edit re-runs one method: a stage's DVC deps are its import closure
(``pipelines/stage_deps.py``), and the library's packages import none of their modules on import, so a module of one
method is in no other method's closure.

In a scratch copy of the workspace, ``dvc.lock`` and ``study/dvc.lock`` are first written from the files as they are
(every stage's deps hashed, no stage run), so the edit is the only change DVC sees; then a module of each method is
edited in turn and ``dvc status`` must list, among the stages whose deps changed, that method's stages (of both
pipelines) and at most the results pages, nothing else.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path

import pytest

from pipelines.workspace import copy_workspace

# A module of each method that no other method's stages import (an environment or an update rule).
EDITED = {
    "glam": "llmrl/algos/ppo_llm.py",
    "llm_rl": "llmrl/envs/word_problems/env.py",
    "llm4teach": "llmrl/envs/doorkey.py",
    "kalm": "llmrl/envs/kalm_levels.py",
    "props": "llmrl/envs/control.py",
}
PAGES = {"report"}  # every method's results are on it (a study page, <method>_study_report, is its method's)


def method_of(stage: str) -> str:
    """``glam`` for ``glam_train@lora-0``, ``study/dvc.yaml:kalm_eval`` -> ``kalm``; shared stages by their name."""
    name = stage.rsplit(":", 1)[-1].split("@")[0]
    return next((m for m in EDITED if name.startswith(f"{m}_")), name)


def lock_from_files(root: Path) -> None:
    """Every pipeline's lock file as if each stage had just run on the files as they are: deps hashed (missing data
    left out), outputs unrecorded."""
    from dvc.repo import Repo
    from dvc.stage.serialize import to_single_stage_lockfile
    from dvc.utils.serialize import dump_yaml

    locks: dict[Path, dict] = defaultdict(dict)
    with contextlib.chdir(root), Repo(str(root)) as repo, repo.lock:
        for stage in repo.index.stages:
            stage.save_deps(allow_missing=True)
            locks[Path(stage.dvcfile.path).with_name("dvc.lock")][stage.name] = to_single_stage_lockfile(stage)
    for path, stages in locks.items():
        dump_yaml(path, {"schema": "2.0", "stages": stages})


def stages_changed_by(root: Path, path: str) -> set[str]:
    """The stages ``dvc status`` lists with ``path`` among their changed deps."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:
        status = repo.status()
    return {stage for stage, changes in status.items() for change in changes
            if isinstance(change, dict) and path in change.get("changed deps", {})}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = copy_workspace(tmp_path_factory.mktemp("isolation"))
    lock_from_files(root)
    return root


def test_the_fresh_lock_sees_no_code_change(scratch):
    assert not stages_changed_by(scratch, EDITED["kalm"])


@pytest.mark.parametrize("method", sorted(EDITED))
def test_an_edit_to_one_method_changes_only_its_stages(scratch, method):
    path = scratch / EDITED[method]
    original = path.read_text()
    path.write_text(original + "\n# an edit\n")
    try:
        changed = stages_changed_by(scratch, EDITED[method])
    finally:
        path.write_text(original)
    own = {s for s in changed if method_of(s) == method}
    others = sorted(s for s in changed if method_of(s) != method and s.rsplit(":", 1)[-1] not in PAGES)
    assert own, f"editing {EDITED[method]} changed none of {method}'s stages: {sorted(changed)}"
    assert not others, f"editing {EDITED[method]} ({method}) also changes {others}"
    # the study pipeline's stages of the method follow the default's
    if any(s.startswith("study/") for s in changed):
        assert {s.rsplit(":", 1)[-1].split("@")[0] for s in own if s.startswith("study/")} <= \
            {s.split("@")[0] for s in own if not s.startswith("study/")}
