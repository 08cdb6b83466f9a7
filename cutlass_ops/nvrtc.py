"""Compile one kernel instantiation to a cubin with NVRTC through cuda-python (``cuda.core.Program``).

No CUDA toolkit is needed: NVRTC is the ``nvidia-cuda-nvrtc`` wheel (a CUDA build of torch depends on it) and the
headers the kernels include (``cuda_fp16.h``, ``cuda_bf16.h``) come from the ``nvidia-cuda-runtime`` wheel, a CUDA
toolkit if there is one, or, failing both, the headers NVRTC bundles (NVRTC >= 13.1).  The sm_90a kernels'
wgmma wrappers (csrc/arch_sm90.cuh) are CuTe's: the CUTLASS headers come from the ``nvidia-cutlass`` wheel
(``cutlass_library.source_path``) and the CCCL headers they need (libcu++, ``cuda/std/...``) from the
``nvidia-cuda-cccl`` wheel or a CUDA toolkit.  A compile unit is the variant's header plus one explicit instantiation
and the ABI checks (static_asserts on the parameter struct).
"""
from __future__ import annotations

import dataclasses
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
CUTE_FIX = "pip install 'nvidia-cutlass>=4.2' nvidia-cuda-cccl (the CUTLASS / CuTe and CCCL headers)"
# the CuTe header csrc/arch_sm90.cuh includes: present in every CUTLASS this works with (>= 4.2)
CUTE_PROBE = Path("cute", "arch", "mma_sm90_gmma.hpp")


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


def _wheel_include_dirs(*packages: str) -> List[Path]:
    """The include/ folders of NVIDIA's CUDA wheels on sys.path: nvidia/<package>/include (cu13 / cu12 hold every
    wheel of that CUDA release; older wheels have a folder each)."""
    return [base / "nvidia" / sub / "include" for base in map(Path, sys.path) for sub in packages]


def _site_include_dirs() -> List[Path]:
    return [inc for inc in _wheel_include_dirs("cu13", "cu12", "cuda_runtime") if (inc / "cuda_fp16.h").is_file()]


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


@lru_cache(maxsize=None)
def cutlass_dir() -> Optional[str]:
    """The CUTLASS include directory (holding cute/ and cutlass/) of the nvidia-cutlass wheel, or None."""
    import importlib.util
    try:   # located, not imported: the package's Python side needs more (cuda-python, networkx...) than its headers
        spec = importlib.util.find_spec("cutlass_library")
        inc = Path(list(spec.submodule_search_locations)[0], "source", "include")
    except Exception:  # not installed
        return None
    return str(inc) if (inc / CUTE_PROBE).is_file() else None


@lru_cache(maxsize=None)
def cccl_dir() -> Optional[str]:
    """The folder holding CCCL's cuda/std/ (CuTe includes <cuda/std/...>): <include>/cccl of the nvidia-cuda-cccl wheel
    (site-packages nvidia/cu13 or cu12, as the CUDA headers) or of a CUDA 13 toolkit, a CUDA 12 toolkit's include, or
    None.  Beside the CUDA headers found first, so that the two come from one CUDA release where both are installed."""
    try:
        cands = [Path(d) for d in header_dirs()[0]]
    except CompileError:
        cands = []
    cands += _wheel_include_dirs("cu13", "cu12", "cuda_cccl")
    for inc in cands:
        for d in (inc / "cccl", inc):
            if (d / "cuda" / "std" / "version").is_file():
                return str(d)
    try:
        from cuda import pathfinder
        located = pathfinder.find_nvidia_header_directory("cccl")
        if located and Path(located, "cuda", "std", "version").is_file():
            return str(located)
    except Exception:
        pass
    return None


_QUOTED = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_CUTE = re.compile(r'^\s*#\s*include\s*<(cute|cutlass)/', re.M)


@lru_cache(maxsize=None)
def unit_sources(header: str) -> Tuple[Tuple[str, bytes], ...]:
    """The csrc files a unit compiles, as (relative path, content): ``header`` and every file it includes with
    quotes, transitively (resolved against csrc/ and the including file's folder)."""
    root, seen, todo, found = csrc_dir(), set(), [csrc_dir() / header], []
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_bytes()
        found.append((str(path.relative_to(root)), text))
        for name in _QUOTED.findall(text.decode("utf-8", "replace")):
            todo += [root / name, path.parent / name]
    return tuple(found)


def needs_cutlass(header: str) -> bool:
    """Whether ``header`` (csrc-relative) or a file it includes with quotes includes a CUTLASS / CuTe header."""
    return any(_CUTE.search(text.decode("utf-8", "replace")) for _, text in unit_sources(header))


def cutlass_include_dirs() -> Tuple[str, ...]:
    """The CUTLASS and CCCL include directories, or CompileError naming the wheels to install.  CUTLASS includes CCCL
    both as <cuda/std/...> and as <cccl/cuda/std/...>: a CCCL folder named cccl/ comes with its parent too."""
    cut, cccl = cutlass_dir(), cccl_dir()
    if cut and cccl:
        return (cut, cccl, str(Path(cccl).parent)) if Path(cccl).name == "cccl" else (cut, cccl)
    wanted = (("CUTLASS (nvidia-cutlass >= 4.2)", cut), ("CCCL (nvidia-cuda-cccl)", cccl))
    missing = " and ".join(name for name, found in wanted if not found)
    raise CompileError(f"fullfuse: the {missing} headers are not installed (the sm_90a kernels include CuTe's wgmma "
                       f"wrappers); {CUTE_FIX}")


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
    Program, ProgramOptions = _program_api()
    have = version()
    if have < variant.min_nvrtc:   # (an NVRTC that would crash the process on the unit is never handed it)
        need = ".".join(map(str, variant.min_nvrtc))
        raise CompileError(f"fullfuse: NVRTC {have[0]}.{have[1]} cannot compile {variant.kernel} (it crashes on it); "
                           f"NVRTC >= {need} can: pip install -U 'nvidia-cuda-nvrtc-cu{have[0]}>={need}' (a newer "
                           f"NVRTC of the same CUDA release serves torch too), or point CUDA_HOME at a CUDA toolkit "
                           f">= {need}")
    includes, bundled = header_dirs()
    if needs_cutlass(variant.header):   # only these units: the others compile without CUTLASS / CCCL installed
        includes = (*includes, *cutlass_include_dirs())
    extra = {}
    if bundled:   # (cuda-core >= 1.2 has the option; only NVRTC >= 13.1 without CUDA headers installed needs it)
        if "use_bundled_headers" not in {f.name for f in dataclasses.fields(ProgramOptions)}:
            raise CompileError(f"fullfuse: NVRTC's bundled CUDA headers need cuda-core >= 1.2 (pip install -U "
                               f"cuda-core); or {FIX}")
        extra["use_bundled_headers"] = True
    opts = ProgramOptions(arch=arch_option(arch), include_path=[str(csrc_dir()), *includes], **extra, **OPTIONS)
    try:
        program = Program(source(variant), "c++", options=opts)
        code = program.compile("cubin", name_expressions=(variant.kernel,))
    except Exception as exc:
        raise CompileError(f"fullfuse: NVRTC failed to compile {variant.kernel} for {arch}:\n{exc}") from exc
    # (cuda-core 0.4 names the mapping _sym_map)
    mapping = code.symbol_mapping if hasattr(code, "symbol_mapping") else code._sym_map
    name = mapping[variant.kernel]
    return bytes(code.code), name.decode() if isinstance(name, bytes) else name


def _program_api():
    """cuda.core's (Program, ProgramOptions): top-level from cuda-core 0.5 on, in cuda.core.experimental before (0.4,
    the last release for Python 3.9, which also needs the CUDA driver to compile: ``check_compiler``)."""
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # (its notice that Python 3.9 support is deprecated)
            from cuda.core.experimental import Program, ProgramOptions
    return Program, ProgramOptions


@lru_cache(maxsize=None)
def check_compiler() -> None:
    """Raises CompileError, with the fix, where no unit can be compiled here: NVRTC or the CUDA headers missing, or a
    cuda-core that needs the CUDA driver to compile (0.4, on Python 3.9) on a machine without one.  Once per
    process: one tiny unit."""
    version()
    header_dirs()
    Program, ProgramOptions = _program_api()
    try:
        Program("__global__ void ff_probe() {}", "c++", options=ProgramOptions(arch="sm_80")).compile("cubin")
    except Exception as exc:
        hint = ("cuda-core < 0.5 (the last for Python 3.9) compiles only where the CUDA driver (libcuda) is: compile "
                "on a GPU machine, or with Python >= 3.10 and cuda-core >= 0.5" if "libcuda" in str(exc) else FIX)
        raise CompileError(f"fullfuse: NVRTC cannot compile here ({str(exc).splitlines()[0]}); {hint}") from exc


def describe() -> str:
    try:
        major, minor = version()
    except CompileError as exc:
        return str(exc)
    includes, bundled = header_dirs()
    where = "NVRTC's bundled headers" if bundled else ", ".join(includes)
    cute = ", ".join(f"{name} {ver}" for name, ver in _cute_versions().items())
    return f"NVRTC {major}.{minor} (headers: {where}; {cute})"


def options_key() -> str:
    return repr(sorted(OPTIONS.items()))


def _version_of(path: Path, pattern: str) -> str:
    try:
        return ".".join(re.search(pattern, path.read_text("utf-8", "replace"), re.S).groups())
    except (OSError, AttributeError):
        return "unknown"


@lru_cache(maxsize=None)
def _cute_versions() -> dict:
    """{"CUTLASS": "4.2.0", "CCCL": "3.0.1"}, "missing" for one not installed."""
    cut, cccl = cutlass_dir(), cccl_dir()
    pattern = r"CUTLASS_MAJOR (\d+).*CUTLASS_MINOR (\d+).*CUTLASS_PATCH (\d+)"
    return {"CUTLASS": _version_of(Path(cut, "cutlass", "version.h"), pattern) if cut else "missing",
            "CCCL": _cccl_version(Path(cccl, "cuda", "std", "__cccl", "version.h")) if cccl else "missing"}


def _cccl_version(path: Path) -> str:
    v = _version_of(path, r"#define CCCL_VERSION (\d+)")   # major * 1000000 + minor * 1000 + patch
    return f"{int(v) // 1000000}.{int(v) // 1000 % 1000}.{int(v) % 1000}" if v.isdigit() else v


def headers_version() -> Optional[str]:
    """Part of every cache key: the CUDA headers (a digest of cuda_fp16.h, or "bundled") and the CUTLASS and CCCL
    versions (a new wheel recompiles the kernels)."""
    includes, bundled = header_dirs()
    cuda = "bundled" if bundled else hashlib.sha256(Path(includes[0], "cuda_fp16.h").read_bytes()).hexdigest()[:12]
    return "|".join([cuda, *(f"{name} {ver}" for name, ver in _cute_versions().items())])
