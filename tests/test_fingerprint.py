import os
import shutil
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


PROBE = """\
import os
import torch
from llmrl.fingerprint import fingerprint_line
print(torch.backends.cpu.get_cpu_capability(), os.environ["ONEDNN_MAX_CPU_ISA"], fingerprint_line())
"""


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="pinning applies to x86-64 CPUs with AVX2")
def test_a_stage_module_runs_on_avx2_kernels_and_importing_the_package_changes_nothing(tmp_path):
    """``python -m stages.<name>`` prepares the process (stages/__init__.py) before the stage module imports torch,
    so ATen reports AVX2 even on an AVX-512 CPU and the fingerprint says so; importing the package anywhere else
    (here, or in a test) sets nothing."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED and k != OPT_OUT}
    code = ("import os; before = dict(os.environ); import stages, stages.common, stages.paths; "
            "assert dict(os.environ) == before, 'importing the stages package changed the environment'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    # a stage module of a copy of the package: the probe above, run as Python runs every stage
    shutil.copytree(ROOT / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "stages" / "probe.py").write_text(PROBE)
    out = subprocess.run([sys.executable, "-m", "stages.probe"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)
    kernels, onednn, line = out.stdout.strip().split(" ", 2)
    assert (kernels, onednn) == ("AVX2", "AVX2") and "(kernels AVX2)" in line


def test_cpu_runs_bf16_only_unpinned_with_native_bf16():
    from llmrl.kernels import cpu_runs_bf16

    assert cpu_runs_bf16({"avx512f", "avx512_bf16"}, {})
    assert cpu_runs_bf16({"amx_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"})
    assert not cpu_runs_bf16({"avx512f", "avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"})  # pin_cpu_kernels' cap
    assert not cpu_runs_bf16({"avx2", "avx512f"}, {})  # AVX-512 without bf16: emulated
