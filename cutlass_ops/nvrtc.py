"""Compile one kernel instantiation to a cubin with NVRTC through cuda-python (``cuda.core.Program``).

No CUDA toolkit is needed: NVRTC is the ``nvidia-cuda-nvrtc`` wheel (a CUDA build of torch depends on it) and the
headers the kernels include (``cuda_fp16.h``, ``cuda_bf16.h``) come from the ``nvidia-cuda-runtime`` wheel, a CUDA
toolkit if there is one, or, failing both, the headers NVRTC bundles (NVRTC >= 13.1).  A compile unit is the
variant's header plus one explicit instantiation and the ABI checks (static_asserts on the parameter struct).
"""
from __future__ import annotations

import hashlib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Tuple

from .variants import Variant

# Options every unit is compiled with (part of the cache key).  -lineinfo keeps source lines for the profilers; the
# rest are nvcc's defaults (-O3, IEEE division and square root, FMA contraction on).
OPTIONS = dict(std="c++17", lineinfo=True, device_as_default_execution_space=True)
FIX = ("install NVRTC and the CUDA headers: pip install cuda-python nvidia-cuda-nvrtc nvidia-cuda-runtime (a CUDA "
       "build of torch already brings both wheels), or point CUDA_HOME at a CUDA toolkit >= 12.4")


class CompileError(RuntimeError):
    """NVRTC is missing or refused a unit; the message says which and how to fix it."""


def csrc_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):  # installed wheel, then source checkout
        if candidate.is_dir():
            return candidate
    raise CompileError(f"fullfuse: CUDA sources not found next to {here}")


@lru_cache(maxsize=None)
def version() -> Tuple[int, int]:
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # ImportError, or the library not found
        raise CompileError(f"fullfuse: NVRTC is not available ({str(exc).splitlines()[0]}); {FIX}") from exc
    if int(err) != 0:
        raise CompileError(f"fullfuse: NVRTC is not available ({err}); {FIX}")
    return int(major), int(minor)


@lru_cache(maxsize=None)
def supported_archs() -> Tuple[int, ...]:
    from cuda.bindings import nvrtc
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    return tuple(int(a) for a in archs) if int(err) == 0 else ()


def _site_include_dirs() -> List[Path]:
    found = []
    for base in map(Path, sys.path):
        for sub in ("cu13", "cu12", "cuda_runtime"):
            inc = base / "nvidia" / sub / "include"
            if (inc / "cuda_fp16.h").is_file():
                found.append(inc)
    return found


@lru_cache(maxsize=None)
def header_dirs() -> Tuple[Tuple[str, ...], bool]:
    """Include directories for the CUDA headers, and whether NVRTC's bundled headers stand in for them."""
    site = _site_include_dirs()
    if site:
        return (str(site[0]),), False
    try:
        from cuda import pathfinder
        located = pathfinder.find_nvidia_header_directory("cudart")
        if located and Path(located, "cuda_fp16.h").is_file():
            return (str(located),), False
    except Exception:
        pass
    if version() >= (13, 1):
        return (), True
    raise CompileError(f"fullfuse: the CUDA headers (cuda_fp16.h) are not installed; {FIX}")


def arch_option(arch: str) -> str:
    """NVRTC's --gpu-architecture value for "sm_90a" / "sm_86" / ...: the cubin for that GPU."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise CompileError(f"fullfuse: unknown architecture {arch!r}")
    return arch


def source(variant: Variant) -> str:
    """The unit's text: the header and the ABI checks; the instantiation itself is NVRTC's name expression."""
    return f'#include "{variant.header}"\n{variant.checks}'


def compile_variant(variant: Variant, arch: str) -> Tuple[bytes, str]:
    """The cubin of ``variant`` for ``arch`` and the kernel's lowered (mangled) name in it."""
    from cuda.core import Program, ProgramOptions
    version()
    includes, bundled = header_dirs()
    opts = ProgramOptions(arch=arch_option(arch), include_path=[str(csrc_dir()), *includes],
                          use_bundled_headers=bundled or None, **OPTIONS)
    try:
        program = Program(source(variant), "c++", options=opts)
        code = program.compile("cubin", name_expressions=(variant.kernel,))
    except Exception as exc:
        raise CompileError(f"fullfuse: NVRTC failed to compile {variant.kernel} for {arch}:\n{exc}") from exc
    name = code.symbol_mapping[variant.kernel]
    return bytes(code.code), name.decode() if isinstance(name, bytes) else name


def describe() -> str:
    try:
        major, minor = version()
    except CompileError as exc:
        return str(exc)
    includes, bundled = header_dirs()
    where = "NVRTC's bundled headers" if bundled else ", ".join(includes)
    return f"NVRTC {major}.{minor} (headers: {where})"


def options_key() -> str:
    return repr(sorted(OPTIONS.items()))


def headers_version() -> Optional[str]:
    includes, bundled = header_dirs()
    if bundled:
        return "bundled"
    return hashlib.sha256(Path(includes[0], "cuda_fp16.h").read_bytes()).hexdigest()[:12]
