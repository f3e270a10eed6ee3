"""bench/gpu_paper.py's plan stays valid on CPU, where a broken key would otherwise surface only on a lent GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_paper():
    spec = importlib.util.spec_from_file_location("gpu_paper", ROOT / "bench" / "gpu_paper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("on_cpu", [False, True])
def test_every_paper_profile_with_the_gpu_budgets_validates(gpu_paper, on_cpu):
    from llmrl.config.profiles import validate_params

    params = gpu_paper.compose_on_gpu(on_cpu)
    validate_params(params)
    assert {params[m]["tier"] for m in gpu_paper.METHODS} == {"paper"}
    assert sorted(params["kalm"]["offline"]["algos"]) == sorted(gpu_paper.KALM_ALGOS_KEPT)
    assert params["props"]["grpo"]["device"] == (None if on_cpu else "cuda")


def test_every_stage_of_the_plan_exists(gpu_paper):
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    planned = [name for names in gpu_paper.STAGES.values() for name in names]
    assert sorted(set(planned) - set(stages)) == []


def test_make_bench_skips_it_without_a_step():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_paper.py")], capture_output=True, text=True,
                         check=True).stdout
    assert "skipped" in out


def test_the_plan_runs_every_stage_after_the_stages_it_reads(gpu_paper, monkeypatch):
    plan = gpu_paper.resolve_plan(gpu_paper.compose_on_gpu())
    ground = [f"kalm_ground@{b}-{s}" for b in ("metaworld", "babyai") for s in (0, 1, 2)]  # the paper's 3 seeds
    assert [name for name, _ in plan["kalm"]][:7] == ["kalm_data", *ground]
    assert all(plan[m] for m in gpu_paper.METHODS)
    monkeypatch.setitem(gpu_paper.STAGES, "kalm", ("kalm_ground", "kalm_imagine"))
    with pytest.raises(SystemExit, match=r"kalm_ground@\w+-\d+ reads data/kalm/real/\w+\.h5, written by kalm_data"):
        gpu_paper.resolve_plan(gpu_paper.compose_on_gpu())
