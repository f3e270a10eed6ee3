"""The environment a result was computed in: CPU, kernel level, threads and library versions.

Small networks trained on CPU can take different float paths on CPUs with different vector units (ATen picks
its kernels by ISA level; oneDNN/MKL by CPU), so every headline metrics file records where it was computed.
``fingerprint_line()`` is one compact string (one column in ``dvc metrics show``); ``environment_fingerprint()``
the full record.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform

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


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def cpu_supports_bf16() -> bool:
    """True where the CPU has native bf16 matrix instructions (AVX-512-BF16 or AMX-BF16)."""
    flags = _cpu_flags()
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_fingerprint() -> dict:
    import torch

    flags = _cpu_flags()
    return {
        "cpu": _cpu_model(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "bf16": cpu_supports_bf16(),
        "amx": "amx_tile" in flags,
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "python": platform.python_version(),
        "libraries": {name: v for name in _LIBRARIES if (v := _version(name))},
    }


def fingerprint_line() -> str:
    """e.g. ``AMD EPYC | AVX512 bf16 | 1 thread | torch 2.13.0 numpy 2.4.6``: one metrics field."""
    fp = environment_fingerprint()
    isa = fp["isa"] + (" bf16" if fp["bf16"] else "") + (" amx" if fp["amx"] else "")
    if fp["aten_cpu_capability"]:
        isa += f" (ATEN_CPU_CAPABILITY={fp['aten_cpu_capability']})"
    libs = " ".join(f"{k} {fp['libraries'][k]}" for k in ("torch", "numpy") if k in fp["libraries"])
    parts = [fp["cpu"], isa, f"{fp['threads']} thread{'s' if fp['threads'] != 1 else ''}", libs]
    if fp["cuda"]:
        parts.insert(1, fp["cuda"])
    return " | ".join(parts)
