"""What one compile unit is: a kernel template instantiation (a C++ name expression) and the header defining it.

Each family's table of the instantiations its planner may pick lives beside its ABI (``cutlass_ops/<family>.py``);
``instantiations.all_variants()`` collects them for ``fullfuse build``.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Tuple

# Architectures a kernel that uses only sm_80 instructions (mma.sync, cp.async, ldmatrix) is built for ahead of time;
# at run time every kernel is compiled for the GPU's own architecture (runtime.arch_of).
PORTABLE = ("sm_80", "sm_90a")
# The oldest architecture any kernel is written for (Ampere: cp.async, bf16 mma.sync, min / max with .NaN): an older
# GPU runs PyTorch's ops, and nothing is compiled for it
MIN_ARCH = 80
HOPPER = ("sm_90a",)  # wgmma, TMA, setmaxnreg: sm_90a only


def loaded_arch(cc: int) -> str:
    """The architecture name a GPU of compute capability ``cc`` (major * 10 + minor) loads its kernels as: sm_90a on
    Hopper (wgmma), sm_NN elsewhere."""
    return HOPPER[0] if cc == 90 else f"sm_{cc}"


@dataclass(frozen=True)
class Variant:
    header: str                  # csrc-relative path of the header that defines the kernel template
    kernel: str                  # the instantiation: "fa_wgmma_kernel<0, false, 6, 10, 3, false>"
    archs: Tuple[str, ...]       # architectures `fullfuse build` compiles it for (run time: the GPU's own)
    checks: str = ""             # C++ appended to the unit: static_asserts that the Python ABI mirror matches
    min_nvrtc: Tuple[int, int] = (0, 0)   # the oldest NVRTC that compiles it (nvrtc.compile_variant refuses older)

    @property
    def label(self) -> str:
        return self.kernel.replace(" ", "")


# offsetof for NVRTC: 13.0 has neither offsetof nor __builtin_offsetof; its EDG front end has __INTADDR__ (13.5: both)
OFFSETOF = ("#ifndef FF_OFFSETOF\n#define FF_OFFSETOF(T, f) ((unsigned long long)__INTADDR__(&(((T*)0)->f)))\n"
            "#endif")


def layout_asserts(struct: type, cname: str) -> str:
    """static_asserts that C++ struct ``cname`` has the size and field offsets of ctypes Structure ``struct``: a
    Python mirror that drifts from the kernel's parameter struct fails the compile instead of corrupting a launch."""
    lines = [OFFSETOF, f"static_assert(sizeof({cname}) == {ctypes.sizeof(struct)}, "
                       f"\"{cname}: size differs from the Python "
             f"mirror\");"]
    for field in struct._fields_:
        name = field[0]
        if name.startswith("_pad"):
            continue
        off = getattr(struct, name).offset
        lines.append(f"static_assert(FF_OFFSETOF({cname}, {name}) == {off}, \"{cname}.{name}: offset differs from the "
                     f"Python mirror\");")
    return "\n".join(lines) + "\n"
