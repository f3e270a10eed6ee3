import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrl.fingerprint import environment_fingerprint, fingerprint_line
from llmrl.kernels import OPT_OUT, PINNED, cpu_flags, pin_cpu_kernels

ROOT = Path(__file__).resolve().parents[1]


def test_fingerprint_names_cpu_isa_kernels_threads_and_versions():
    import torch

    fp = environment_fingerprint()
    assert fp["kernels"] == torch.backends.cpu.get_cpu_capability()
    assert fp["isa"] in ("AVX512", "AVX2") or not {"avx2", "avx512f"} & cpu_flags()
    assert fp["threads"] == torch.get_num_threads()
    assert fp["libraries"]["torch"].startswith("2.13")
    line = fingerprint_line()
    assert fp["cpu"] in line and fp["isa"] in line and "torch 2.13" in line


def test_pin_sets_only_unset_variables_and_only_with_avx2(monkeypatch):
    for k in PINNED:
        monkeypatch.delenv(k, raising=False)
    assert pin_cpu_kernels({"sse4_2"}) == {} and not any(k in os.environ for k in PINNED)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # the user's choice wins
    assert pin_cpu_kernels({"avx2", "avx512f"}) == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx512" and os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("LLMRL_PIN_KERNELS", "0")  # the opt-out: the CPU's own kernels
    assert pin_cpu_kernels({"avx2"}) == {} and "ONEDNN_MAX_CPU_ISA" not in os.environ


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="pinning applies to x86-64 CPUs with AVX2")
def test_stage_process_runs_on_avx2_kernels_and_importing_common_changes_nothing():
    """``prepare_stage_process()`` pins the kernels before torch dispatches anything, so ATen reports AVX2 even on
    an AVX-512 CPU and the fingerprint says so; importing stages/common.py alone sets nothing."""
    code = ("import sys, os; sys.path.insert(0, 'stages'); before = dict(os.environ); import common; "
            "assert dict(os.environ) == before, 'importing common changed the environment'; "
            "common.prepare_stage_process(); import torch; "
            "from llmrl.fingerprint import fingerprint_line; "
            "print(torch.backends.cpu.get_cpu_capability(), os.environ['ONEDNN_MAX_CPU_ISA'], fingerprint_line())")
    env = {k: v for k, v in os.environ.items() if k not in PINNED and k != OPT_OUT}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    kernels, onednn, line = out.stdout.strip().split(" ", 2)
    assert (kernels, onednn) == ("AVX2", "AVX2") and "(kernels AVX2)" in line


STAGE_SCRIPTS = sorted(p for p in (ROOT / "stages").glob("*.py") if not p.stem.endswith("common") and p.stem != "paths")


@pytest.mark.parametrize("script", STAGE_SCRIPTS, ids=lambda p: p.stem)
def test_every_stage_script_prepares_its_process_before_other_imports(script):
    """The statement after ``from common import ...`` is ``prepare_stage_process(...)``: nothing (torch, HF, a
    shared stage module) is imported before the caches and kernels are set."""
    body = [n for n in ast.parse(script.read_text()).body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]  # the docstring
    first, second = body[0], body[1]
    assert isinstance(first, ast.ImportFrom) and first.module == "common", script.name
    assert (isinstance(second, ast.Expr) and isinstance(second.value, ast.Call)
            and getattr(second.value.func, "id", None) == "prepare_stage_process"), script.name


def test_cpu_runs_bf16_only_unpinned_with_native_bf16():
    from llmrl.kernels import cpu_runs_bf16

    assert cpu_runs_bf16({"avx512f", "avx512_bf16"}, {})
    assert cpu_runs_bf16({"amx_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"})
    assert not cpu_runs_bf16({"avx512f", "avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"})  # pin_cpu_kernels' cap
    assert not cpu_runs_bf16({"avx2", "avx512f"}, {})  # AVX-512 without bf16: emulated
