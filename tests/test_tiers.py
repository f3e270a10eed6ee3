"""Tiers: every method's default, study and paper profile composes from conf/ and validates with the stages' own
models; params.yaml and the study's files are what conf/ and dvc.yaml give; the study pipeline is apart."""

from __future__ import annotations

import re

import pytest
import yaml

from llmrl.config import ParamsError
from llmrl.config.profiles import GENERATED_KEY, SECTIONS, validate_params
from pipelines import tiers

from .conftest import ROOT


@pytest.mark.parametrize("tier", tiers.TIERS)
@pytest.mark.parametrize("method", tiers.METHODS)
def test_every_profile_composes_and_validates(method, tier):
    params = tiers.compose([f"{method}={tier}"])
    assert list(params)[0] == GENERATED_KEY and "conf/" in params[GENERATED_KEY]  # the reader's first line
    assert set(params) == set(SECTIONS) | {GENERATED_KEY}
    sections = validate_params(params)
    assert sections[method].tier == tier
    for other in tiers.METHODS:
        if other != method:
            assert sections[other].tier == "default"


def test_a_profile_with_a_bad_key_names_it():
    params = tiers.compose(["kalm=study"])
    params["kalm"]["eval"]["metaworld_episodes"] = -1
    params["props"]["typo"] = 1
    with pytest.raises(ParamsError) as err:
        validate_params(params)
    assert "kalm.eval.metaworld_episodes: must be > 0" in str(err.value) and "props.typo: unknown key" in str(err.value)


def test_generated_files_are_up_to_date():
    """params.yaml is exactly what `dvc exp run` composes (an experiment never rewrites it), study/params.yaml every
    method at its study profile, study/dvc.yaml the study's stages (python -m pipelines.tiers --write)."""
    assert tiers.write(check=True) == []


def test_writing_a_bad_profile_names_the_key_and_writes_nothing(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    good = tiers.params_text()
    bad = good.replace("episodes: 100\n", "episodes: 60\n", 1)  # glam.eval.episodes, validated >= 100
    assert bad != good
    monkeypatch.setattr(tiers, "ROOT", tmp_path)
    monkeypatch.setattr(tiers, "params_text", lambda overrides=(): bad)
    with pytest.raises(ParamsError, match=r"params.yaml as conf/ composes it:\n(.|\n)*glam.eval.episodes"):
        tiers.write()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.yaml"]


def test_dvc_composes_params_at_exp_run():
    config = (ROOT / ".dvc" / "config").read_text()
    assert "[hydra]" in config and "enabled = true" in config


def test_the_study_pipeline_writes_under_study_and_tracks_its_results():
    study = yaml.safe_load((ROOT / "study" / "dvc.yaml").read_text())["stages"]
    default = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    names = {n for group in tiers.STUDY_STAGES.values() for n in group}
    pages = {tiers.study_report(m) for m in tiers.STUDY_STAGES}
    assert set(study) == names | pages and not set(default) & pages
    for name, stage in study.items():
        stage = stage.get("do", stage)  # a foreach stage's body
        assert stage["wdir"] == ".." and stage["cmd"].startswith("LLMRL_TIER=study "), name
        assert all(next(iter(p)) == "study/params.yaml" or not isinstance(p, dict) or "study" in next(iter(p))
                   for p in stage.get("params", []) if isinstance(p, dict)), name
        assert not any(isinstance(p, str) for p in stage.get("params", [])), name  # never the default params.yaml
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get(kind, []):
                path = next(iter(out)) if isinstance(out, dict) else out
                assert path.startswith("study/"), (name, path)
                if path.startswith(("study/metrics/", "study/plots/")):
                    assert isinstance(out, dict) and out[path].get("cache") is False, (name, path)


@pytest.mark.parametrize("lock", ["dvc.lock", "study/dvc.lock"])
def test_no_git_tracked_folder_out_is_empty(lock):
    """git keeps no empty folder: an empty cache: false folder out is missing from every fresh clone, so a
    committed stage looks changed there and a stage reading it fails."""
    pipeline = yaml.safe_load((ROOT / lock.replace(".lock", ".yaml")).read_text())["stages"]
    git_tracked = set()
    for stage in pipeline.values():
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get("do", stage).get(kind, []):
                if isinstance(out, dict) and next(iter(out.values())).get("cache") is False:
                    git_tracked.add(next(iter(out)))
    patterns = [re.compile(re.sub(r"\\\$\\\{[^}]*\\\}", "[^/]+", re.escape(p)) + "$") for p in git_tracked]
    empty = [(name, out["path"]) for name, stage in yaml.safe_load((ROOT / lock).read_text())["stages"].items()
             for out in stage.get("outs", []) if out.get("nfiles") == 0
             and any(p.match(out["path"]) for p in patterns)]
    assert patterns and not empty


def test_study_dag_maps_inputs_to_study_outputs():
    dvc_yaml = {"stages": {
        "a": {"cmd": "python stages/a.py", "deps": ["stages/a.py", "models/base_llm"], "params": ["m.a"],
              "outs": ["models/m/a"], "metrics": [{"metrics/m/a.json": {"cache": False}}]},
        "b": {"cmd": "python stages/b.py", "deps": ["models/m/a/x", "data/demos"], "params": ["m.b", {"other.yaml": ["k"]}],
              "plots": ["plots/m/b"]},
        # a matrix stage whose templated input resolves to another study stage's output
        "c": {"do": {"cmd": "python stages/c.py ${item}", "deps": ["models/m/${item}", "data/demos/${item}"],
                     "outs": ["data/m/c/${item}"]}, "foreach": ["a", "x"]},
        "report": {"cmd": "python stages/report.py", "deps": ["stages/report.py", "metrics/m", "metrics/glam"],
                   "params": ["report"], "outs": ["reports"]},
    }}
    dvc_yaml["stages"]["a"]["meta"] = {"mem_gib": 2, "minutes": 1}
    got = tiers.study_dag(dvc_yaml, {"m": ("a", "b", "c")}, minutes={"a": 30, "c": 4})["stages"]
    assert got["a"]["meta"] == {"mem_gib": 2, "minutes": 30} and got["c"]["do"]["meta"] == {"minutes": 4}
    assert "meta" not in got["b"]  # no study minutes: as in dvc.yaml
    assert got["b"]["deps"] == ["study/models/m/a/x", "data/demos"]  # a study output; the default pipeline's demos
    assert got["c"]["do"]["deps"] == ["study/models/m/${item}", "data/demos/${item}"]
    assert got["a"]["deps"] == ["stages/a.py", "models/base_llm"]
    assert got["b"]["params"] == [{"study/params.yaml": ["m.b"]}, {"other.yaml": ["k"]}]
    assert got["a"]["outs"] == ["study/models/m/a"] and got["b"]["plots"] == [{"study/plots/m/b": {"cache": False}}]
    assert got["a"]["metrics"] == [{"study/metrics/m/a.json": {"cache": False}}]
    page = got[tiers.study_report("m")]
    assert page["deps"] == ["stages/report.py", "metrics/m", "study/metrics/m"]
    assert page["outs"] == ["study/reports/m"] and page["cmd"] == "LLMRL_TIER=study python stages/report.py m"
    with pytest.raises(KeyError, match="lacks"):
        tiers.study_dag(dvc_yaml, {"m": ("a", "nope")})


def test_every_study_dependency_a_study_stage_writes_is_the_studys():
    """A study stage reads what another study stage wrote from under study/, never the default pipeline's copy
    (ProPS's GRPO parts: each resumes the previous study part, not the default's)."""
    from pipelines.tiers import STUDY_STAGES, _out_path, _under

    source = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    study = yaml.safe_load((ROOT / "study" / "dvc.yaml").read_text())["stages"]
    names = [n for group in STUDY_STAGES.values() for n in group]
    outputs = {_out_path(o) for n in names for kind in ("outs", "metrics", "plots")
               for o in source[n].get("do", source[n]).get(kind, []) or []}
    for name in names:
        body = study[name].get("do", study[name])
        values = [str(d) for d in body.get("deps", [])]
        for rows in (body.get("matrix") or {}).values():
            values += [v for row in rows if isinstance(row, dict) for v in row.values() if isinstance(v, str)]
        for v in values:
            if "${" not in v:
                assert not _under(v, outputs) or v.startswith("study/"), (name, v)
