"""The kernel libraries fullfuse compiles: one shared library per CUDA source, each with a small extern "C" API.

Shapes are run-time arguments of every kernel, so the list stays short: a new variant here costs compile time
on every machine (``fullfuse build`` and CI compile all of them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# Generic CUDA code: SASS for Ampere and Hopper plus PTX so newer GPUs can JIT it.
PORTABLE = ("arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90")
# Kernels that may use Hopper-only instructions (wgmma, setmaxnreg) on sm_90a, with an sm_80 build beside.
HOPPER_AND_AMPERE = ("arch=compute_90a,code=sm_90a", "arch=compute_80,code=sm_80")


@dataclass(frozen=True)
class KernelLibrary:
    name: str                      # library file is lib<name>.so
    source: str                    # path relative to csrc/
    gencodes: Tuple[str, ...]
    uses_cutlass: bool = False     # adds the nvidia-cutlass wheel's include dirs
    defines: Tuple[str, ...] = field(default_factory=tuple)


LIBRARIES = {
    lib.name: lib
    for lib in (
        KernelLibrary("fallback_act_pool", "fallback_act_pool.cu", PORTABLE),
        KernelLibrary("fallback_window_reduce", "fallback_window_reduce.cu", PORTABLE),
        KernelLibrary("fused_conv_act_pool", "fused_conv_act_pool.cu", HOPPER_AND_AMPERE, uses_cutlass=True),
        KernelLibrary("fused_convt_pool_reduce", "fused_convt_pool_reduce.cu", ("arch=compute_90a,code=sm_90a",)),
    )
}
