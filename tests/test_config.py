import pytest

from llmrl.config import DemosParams, EvalBaselinesParams, ParamsError, load_section, read_params

from .conftest import ROOT

GOOD = {"envs": ["BabyAI-GoToLocal-v0"], "episodes": 5, "seed": 0}


def test_repo_params_validate():
    params = read_params(ROOT / "params.yaml")
    assert load_section(params, "demos", DemosParams).episodes > 0
    load_section(params, "eval_baselines", EvalBaselinesParams)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"episodes": -3}, "demos.episodes: must be > 0, got -3"),
        ({"episodes": "many"}, "demos.episodes: "),
        ({"typo_key": 1}, "demos.typo_key: unknown key"),
        ({"envs": []}, "demos.envs: "),
    ],
)
def test_bad_params_name_the_key(override, message):
    with pytest.raises(ParamsError) as err:
        load_section({"demos": {**GOOD, **override}}, "demos", DemosParams)
    assert message in str(err.value)


def test_missing_key_and_section():
    # a key left out takes the model's default (the default tier); a key without one is required
    assert load_section({"demos": {"envs": ["x"], "episodes": 1}}, "demos", DemosParams).seed == DemosParams().seed
    from llmrl.config.kalm import OfflineAlgo

    with pytest.raises(ParamsError, match="kalm.offline.algos.x.steps: required key missing"):
        load_section({"kalm": {"offline": {"algos": {"x": {"benchmark": "babyai", "algo": "DiscreteBC"}}}}},
                     "kalm.offline.algos.x", OfflineAlgo)
    with pytest.raises(ParamsError, match="eval_baselines: section missing"):
        load_section({}, "eval_baselines", EvalBaselinesParams)


def test_bad_params_file(tmp_path):
    (tmp_path / "params.yaml").write_text("demos: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        read_params(tmp_path / "params.yaml")
    with pytest.raises(ParamsError, match="not found"):
        read_params(tmp_path / "absent.yaml")


def test_stage_exits_before_writing(tmp_path):
    """A stage with an invalid section stops with exit 2 and the key path, and writes nothing."""
    import subprocess
    import sys

    params = tmp_path / "params.yaml"
    params.write_text("demos:\n  envs: [BabyAI-GoToLocal-v0]\n  episodes: -3\n  seed: 0\n")
    code = (
        "from stages import common;"
        f"from llmrl.config import DemosParams; common.stage_params('demos', DemosParams, {str(params)!r})"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "demos.episodes: must be > 0, got -3" in proc.stderr


def test_every_setting_has_help_text():
    """The typed model is the one definition of a setting, so its help text lives there."""
    import importlib
    import inspect
    import pkgutil

    from pydantic import BaseModel

    import llmrl.config

    models = {cls for m in pkgutil.iter_modules(llmrl.config.__path__, "llmrl.config.")
              for cls in vars(importlib.import_module(m.name)).values()
              if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__.startswith("llmrl.config")}
    models |= {cls for cls in vars(llmrl.config).values()
               if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == "llmrl.config"}
    assert len(models) > 30
    missing = sorted(f"{cls.__module__}.{cls.__name__}.{name}" for cls in models
                     for name, info in cls.model_fields.items() if not info.description)
    assert not missing, missing
