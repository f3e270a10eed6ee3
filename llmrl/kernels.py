"""One float path on x86-64 CPUs of different vector widths: ATen's and oneDNN's kernels pinned to AVX2.

A stage's numbers should not depend on which CPU of a kind it landed on. Measured on an AVX-512 (Zen 5) machine
against results from an AVX2-only EPYC (same wheels, one thread):

- oneDNN picks its convolution kernels by CPU: a DoorKey student (``GridStudent``) trained for 30,720 frames
  ended at greedy curve success 0.70 on the AVX-512 machine and 0.65 on the AVX2 one; with
  ``ONEDNN_MAX_CPU_ISA=AVX2`` the AVX-512 machine reproduced the AVX2 machine's bytes.
- ATen's own vector kernels (norms, softmax, reductions) follow ``ATEN_CPU_CAPABILITY``: an LLM's logits differ
  in the last bits between ``avx2`` and ``avx512`` (greedy tokens were equal in the test that measured it).
- MKL's default sgemm gave identical bytes on both CPUs; ``MKL_CBWR=AVX2`` *changes* them, so it is not set.

Cost on the AVX-512 machine: an fp32 LLM forward is unchanged (GEMMs are MKL's), DoorKey training ~5-10 %
slower. bf16 autocast needs oneDNN's AVX-512-BF16 kernels (10x slower when pinned to AVX2), and code that picks
bf16 by the kernel level (KALM's grounding) sees AVX2 and stays fp32: ``LLMRL_PIN_KERNELS=0`` switches the
pinning off for a run that wants the CPU's own kernels, whose numbers are then those of that CPU.

This module imports nothing heavy: it must run before torch's first kernel dispatch (both libraries read their
variable once, then).
"""

from __future__ import annotations

import os
import platform

__all__ = ["PINNED", "OPT_OUT", "cpu_flags", "pin_cpu_kernels", "cpu_supports_bf16", "cpu_runs_bf16",
           "unpinned_environ"]

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
OPT_OUT = "LLMRL_PIN_KERNELS"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pin_cpu_kernels(flags: set[str] | None = None) -> dict[str, str]:
    """Set ``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2`` where the CPU is x86-64 with AVX2 and
    the variable is unset (a value the user exported wins); returns the variables this call set.

    ``flags`` (the CPU's feature flags) defaults to /proc/cpuinfo's; elsewhere, or with ``LLMRL_PIN_KERNELS=0``,
    nothing is set.
    """
    if os.environ.get(OPT_OUT, "1") == "0":
        return {}
    if flags is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return {}
        flags = cpu_flags()
    if "avx2" not in flags:
        return {}
    set_now = {k: v for k, v in PINNED.items() if k not in os.environ}
    os.environ.update(set_now)
    return set_now


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) at which its kernels still run bf16 natively; below them bf16 is emulated.
_ONEDNN_BF16_LEVELS = ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX10_1_512", "AVX10_2_512", "ALL", "DEFAULT")


def cpu_supports_bf16(flags: set[str] | None = None) -> bool:
    """True where the CPU has native bf16 matrix instructions (AVX-512-BF16 or AMX-BF16)."""
    return bool((cpu_flags() if flags is None else flags) & {"avx512_bf16", "amx_bf16"})


def cpu_runs_bf16(flags: set[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    """True where bf16 is fast on this CPU: it has native bf16 and oneDNN is not capped below that level
    (pin_cpu_kernels caps it at AVX2, where bf16 autocast measured ~10x slower than fp32)."""
    environ = os.environ if environ is None else environ
    if not cpu_supports_bf16(flags):
        return False
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return not cap or cap.startswith(_ONEDNN_BF16_LEVELS)


def unpinned_environ() -> dict[str, str]:
    """This process's environment for a child that runs on the CPU's own kernels (bf16 benchmarks): the pinned
    values removed and pinning switched off."""
    env = {k: v for k, v in os.environ.items() if PINNED.get(k) != v}
    env[OPT_OUT] = "0"
    return env
