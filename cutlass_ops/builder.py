"""Compile the CUDA kernel libraries with nvcc through ninja, cache them on disk, load them with ctypes.

The libraries do not link against torch: a cached build serves every torch version, and a build made on a
machine without a GPU runs on one with a GPU.  Cache layout: ``<cache>/<library>-<key>/lib<library>.so`` where
the key hashes the sources (the library's .cu and every header in csrc/), the nvcc version, the gencodes, the
flags and, for CUTLASS users, the CUTLASS version.  A file lock per entry lets concurrent processes share it.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from .libraries import LIBRARIES, KernelLibrary

BUILD_FORMAT = "1"  # bump to invalidate every cached build
NVCC_FLAGS = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-shared", "--expt-relaxed-constexpr", "-lineinfo")


class BuildError(RuntimeError):
    pass


def csrc_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):  # installed wheel, then source checkout
        if candidate.is_dir():
            return candidate
    raise BuildError(f"fullfuse: CUDA sources not found next to {here}")


def cache_dir() -> Path:
    if os.environ.get("FULLFUSE_CACHE_DIR"):
        return Path(os.environ["FULLFUSE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fullfuse"


@lru_cache(maxsize=None)
def find_nvcc() -> Optional[str]:
    for env in ("FULLFUSE_NVCC", "CUDACXX"):
        if os.environ.get(env):
            return os.environ[env]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and Path(home, "bin", "nvcc").exists():
            return str(Path(home, "bin", "nvcc"))
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None


@lru_cache(maxsize=None)
def nvcc_version() -> Optional[str]:
    nvcc = find_nvcc()
    if not nvcc:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1]


def find_ninja() -> Optional[str]:
    try:
        import ninja  # the PyPI package ships the binary

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("ninja")


@lru_cache(maxsize=None)
def cutlass_include_dirs() -> List[str]:
    try:
        import cutlass_library
    except ImportError as exc:
        raise BuildError("fullfuse: the CUTLASS headers come from the 'nvidia-cutlass' package: pip install nvidia-cutlass") from exc
    root = Path(cutlass_library.source_path)
    return [str(root / "include"), str(root / "tools" / "util" / "include")]


def _cutlass_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-cutlass")
    except Exception:
        return "unknown"


def compile_command(lib: KernelLibrary, source: Path, output: Path) -> List[str]:
    cmd = [find_nvcc() or "nvcc", *NVCC_FLAGS]
    for gencode in lib.gencodes:
        cmd.append(f"-gencode={gencode}")
    cmd += [f"-D{d}" for d in lib.defines]
    cmd += [f"-I{csrc_dir()}"]
    if lib.uses_cutlass:
        cmd += [f"-I{d}" for d in cutlass_include_dirs()]
    cmd += ["-o", str(output), str(source)]
    return cmd


def cache_key(lib: KernelLibrary) -> str:
    src = csrc_dir()
    digest = hashlib.sha256()
    digest.update(f"{BUILD_FORMAT}|{nvcc_version()}|{NVCC_FLAGS}|{lib.gencodes}|{lib.defines}".encode())
    if lib.uses_cutlass:
        digest.update(_cutlass_version().encode())
    for path in [src / lib.source, *sorted(p for p in src.rglob("*") if p.suffix in (".h", ".cuh", ".hpp"))]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def library_path(name: str) -> Path:
    lib = LIBRARIES[name]
    return cache_dir() / f"{lib.name}-{cache_key(lib)}" / f"lib{lib.name}.so"


def _ninja_file(lib: KernelLibrary, out: Path) -> str:
    cmd = compile_command(lib, csrc_dir() / lib.source, out)
    quoted = " ".join(_ninja_escape(c) for c in cmd[:-3])  # everything but "-o OUT SRC"
    return (
        "ninja_required_version = 1.3\n"
        f"rule nvcc\n  command = {quoted} -o $out $in\n  description = nvcc {lib.name}\n"
        f"build {_ninja_escape(str(out))}: nvcc {_ninja_escape(str(csrc_dir() / lib.source))}\n"
    )


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


class _Progress:
    """Prints a line when a compile starts, one every 15 s while it runs, and one when it ends."""

    def __init__(self, name: str, quiet: bool):
        self.name, self.quiet, self.start = name, quiet, time.time()
        self._done = threading.Event()

    def __enter__(self):
        if not self.quiet:
            print(f"fullfuse: compiling {self.name} with nvcc (first use; cached afterwards) ...", file=sys.stderr, flush=True)
            threading.Thread(target=self._tick, daemon=True).start()
        return self

    def _tick(self):
        while not self._done.wait(15):
            print(f"fullfuse:   ... still compiling {self.name} ({time.time() - self.start:.0f} s)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        self._done.set()
        if not self.quiet and exc[0] is None:
            print(f"fullfuse: compiled {self.name} in {time.time() - self.start:.0f} s", file=sys.stderr, flush=True)


def build(name: str, quiet: bool = False) -> Path:
    """Return the path of the compiled library, compiling it first if the cache has no entry."""
    lib = LIBRARIES[name]
    out = library_path(name)
    if out.exists():
        return out
    if find_nvcc() is None:
        raise BuildError(f"fullfuse: nvcc not found (set CUDA_HOME or FULLFUSE_NVCC) and {out} is not cached")
    ninja = find_ninja()
    if ninja is None:
        raise BuildError("fullfuse: ninja not found: pip install ninja")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be compiling the same entry
        if out.exists():
            return out
        (out.parent / "build.ninja").write_text(_ninja_file(lib, out))
        with _Progress(name, quiet):
            proc = subprocess.run([ninja, "-C", str(out.parent)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise BuildError(f"fullfuse: compiling {name} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return out


def build_all(names: Optional[Iterable[str]] = None, jobs: Optional[int] = None, quiet: bool = False) -> Dict[str, Path]:
    """Compile every library (in parallel); used by ``fullfuse build`` and CI."""
    names = list(names or LIBRARIES)
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        paths = pool.map(lambda n: build(n, quiet=quiet), names)
        return dict(zip(names, paths))


_loaded: Dict[str, ctypes.CDLL] = {}
_load_lock = threading.Lock()


def load(name: str) -> ctypes.CDLL:
    with _load_lock:
        if name not in _loaded:
            _loaded[name] = ctypes.CDLL(str(build(name)))
        return _loaded[name]
