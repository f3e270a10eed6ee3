"""The environment a result was computed in: CPU, kernel level, threads and library versions.

Small networks trained on CPU can take different float paths on CPUs with different vector units (ATen picks
its kernels by ISA level; oneDNN/MKL by CPU), so every headline metrics file records where it was computed.
``fingerprint_line()`` is one compact string (one column in ``dvc metrics show``); ``environment_fingerprint()``
the full record.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

from llmrl.kernels import cpu_flags, cpu_supports_bf16

__all__ = ["environment_fingerprint", "fingerprint_line"]

_LIBRARIES = ("torch", "numpy", "transformers", "peft", "trl", "d3rlpy", "gymnasium", "minigrid", "metaworld",
              "mujoco", "stable-baselines3")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_isa(flags: set[str]) -> str:
    """The CPU's widest x86 vector level (what ATen would pick unpinned), else the machine name."""
    for flag, name in (("avx512f", "AVX512"), ("avx2", "AVX2")):
        if flag in flags:
            return name
    return platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_fingerprint() -> dict:
    import torch

    flags = cpu_flags()
    return {
        "cpu": _cpu_model(),
        "isa": _cpu_isa(flags),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "bf16": cpu_supports_bf16(),
        "amx": "amx_tile" in flags,
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "python": platform.python_version(),
        "libraries": {name: v for name in _LIBRARIES if (v := _version(name))},
    }


def fingerprint_line() -> str:
    """e.g. ``AMD EPYC | AVX512 bf16 | 1 thread | torch 2.13.0 numpy 2.4.6``: one metrics field."""
    fp = environment_fingerprint()
    isa = fp["isa"] + (" bf16" if fp["bf16"] else "") + (" amx" if fp["amx"] else "")
    pinned = [v for v in (fp["aten_cpu_capability"], fp["onednn_max_cpu_isa"]) if v]
    if pinned:  # llmrl.kernels.pin_cpu_kernels (every stage) or the user's own setting
        isa += f" (kernels {'/'.join(dict.fromkeys(v.upper() for v in pinned))})"
    libs = " ".join(f"{k} {fp['libraries'][k]}" for k in ("torch", "numpy") if k in fp["libraries"])
    parts = [fp["cpu"], isa, f"{fp['threads']} thread{'s' if fp['threads'] != 1 else ''}", libs]
    if fp["cuda"]:
        parts.insert(1, fp["cuda"])
    return " | ".join(parts)
