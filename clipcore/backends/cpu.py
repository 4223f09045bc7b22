"""What this CPU is, as far as kernel choice goes: its model name and the instruction sets it runs.

onnxruntime and torch pick their kernels by instruction set (int8 with or without VNNI, bf16 with
or without native dot products), so decisions measured on one CPU (a refused export, the backend
``precision=auto`` chose) are keyed by them and not trusted on another. The instruction sets come
from numpy's runtime detection (the CPUID instruction itself), not from ``/proc/cpuinfo``: under
an emulator or a masking hypervisor that file can name the host's features, not those that run.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

# Native bf16 dot products (otherwise torch emulates bf16 on a CPU, slower than fp32).
NATIVE_BF16 = "AVX512BF16"


@functools.cache
def cpu_features() -> frozenset[str]:
    """Instruction sets this process can run, as numpy detected them at import (CPUID)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy < 2 kept it in numpy.core
        from numpy.core._multiarray_umath import __cpu_features__  # type: ignore[no-redef]
    return frozenset(name for name, present in __cpu_features__.items() if present)


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def has_native_bf16() -> bool:
    return NATIVE_BF16 in cpu_features()


def cpu_identity() -> str:
    """The CPU model, a digest of its instruction sets and onnxruntime's version: what decides
    which kernels a graph runs on."""
    try:
        import onnxruntime

        runtime = f"onnxruntime {onnxruntime.__version__}"
    except ImportError:  # torch-only installs still key decisions by CPU (clipcore.backends.auto)
        runtime = "no onnxruntime"
    digest = hashlib.sha256(" ".join(sorted(cpu_features())).encode()).hexdigest()[:12]
    return f"{platform.machine()} {cpu_model()} (instruction sets {digest}), {runtime}"
