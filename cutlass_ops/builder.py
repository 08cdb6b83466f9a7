"""Compile the CUDA kernel libraries with nvcc through ninja, cache them on disk, load them with ctypes.

The libraries do not link against torch: a cached build serves every torch version, and a build made on a
machine without a GPU runs on one with a GPU.  Cache layout: ``<cache>/<library>-<key>/lib<library>.so`` where
the key hashes the sources (the library's .cu and every header in csrc/), the nvcc version, the gencodes, the
flags and, for CUTLASS users, the CUTLASS version.

Concurrent processes and threads share the cache: an entry is compiled under a file lock (``<entry>/.lock``) into a
temporary file that is then renamed to its final name, so ``lib<library>.so`` exists only as a complete file and
the fast path (it exists: load it) never sees a half-written library.  Every failure of the environment (no nvcc,
no ninja, a cache directory that cannot be written, a failed compile, a library that does not load) raises
BuildError whose first line says what is wrong and how to fix it; callers turn it into a reason to step down.

Each entry also holds ``sources.key``: the key without the nvcc version.  A machine without nvcc uses any complete
entry whose sources.key matches (prebuilt kernels: run ``fullfuse build`` on a machine with nvcc, then point
FULLFUSE_CACHE_DIR at that cache).
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


# What to do when a kernel library can neither be found in the cache nor compiled here.
FIX = ("install a CUDA toolkit (nvcc >= 12 on the PATH, or set CUDA_HOME / FULLFUSE_NVCC) and ninja (pip install "
       "ninja), or set FULLFUSE_CACHE_DIR to a writable directory holding prebuilt kernels: run `fullfuse build` there")
SOURCES_KEY = "sources.key"


class BuildError(RuntimeError):
    """A kernel library could not be found in the cache, compiled or loaded; the first line says why and the fix."""


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
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:  # FULLFUSE_NVCC / CUDACXX names no runnable file: the compile then fails with the reason
        return None
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
        raise BuildError("fullfuse: the CUTLASS headers come from the 'nvidia-cutlass' package: "
                         "pip install nvidia-cutlass") from exc
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
    return _digest(lib, nvcc_version())


def sources_key(lib: KernelLibrary) -> str:
    """The cache key without the nvcc version: any compiler's build of these sources and flags serves."""
    return _digest(lib, "any nvcc")


def _digest(lib: KernelLibrary, nvcc: Optional[str]) -> str:
    src = csrc_dir()
    digest = hashlib.sha256()
    digest.update(f"{BUILD_FORMAT}|{nvcc}|{NVCC_FLAGS}|{lib.gencodes}|{lib.defines}".encode())
    if lib.uses_cutlass:
        digest.update(_cutlass_version().encode())
    for path in [src / lib.source, *sorted(p for p in src.rglob("*") if p.suffix in (".h", ".cuh", ".hpp"))]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def library_path(name: str) -> Path:
    """Where the library's build lives.  Without nvcc: a complete prebuilt entry of the same sources if the cache
    has one (the newest), else the path a build would take (which then does not exist)."""
    lib = LIBRARIES[name]
    path = cache_dir() / f"{lib.name}-{cache_key(lib)}" / f"lib{lib.name}.so"
    if find_nvcc() is None and not path.is_file():
        prebuilt = _prebuilt(lib)
        if prebuilt is not None:
            return prebuilt
    return path


def _prebuilt(lib: KernelLibrary) -> Optional[Path]:
    want, found = sources_key(lib), []
    for marker in cache_dir().glob(f"{lib.name}-*/{SOURCES_KEY}"):
        so = marker.parent / f"lib{lib.name}.so"
        try:
            if marker.read_text().strip() == want and so.is_file():
                found.append((so.stat().st_mtime, str(so)))
        except OSError:
            continue  # an unreadable entry is not a candidate
    return Path(max(found)[1]) if found else None


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
            print(f"fullfuse: compiling {self.name} with nvcc (first use; cached afterwards) ...", file=sys.stderr,
                  flush=True)
            threading.Thread(target=self._tick, daemon=True).start()
        return self

    def _tick(self):
        while not self._done.wait(15):
            print(f"fullfuse:   ... still compiling {self.name} ({time.time() - self.start:.0f} s)", file=sys.stderr,
                  flush=True)

    def __exit__(self, *exc):
        self._done.set()
        if not self.quiet and exc[0] is None:
            print(f"fullfuse: compiled {self.name} in {time.time() - self.start:.0f} s", file=sys.stderr, flush=True)


def build(name: str, quiet: bool = False) -> Path:
    """Return the path of the compiled library, compiling it first if the cache has no entry.  Raises BuildError
    (never OSError) when the library is neither cached nor can be compiled here."""
    lib = LIBRARIES[name]
    try:
        out = library_path(name)
        if out.is_file():  # only ever a complete library: builds are published by rename
            _write_sources_key(lib, out)
            return out
    except OSError as exc:
        raise BuildError(f"fullfuse: cannot read the kernel cache {cache_dir()} or the CUDA sources for {name} "
                         f"({exc}); fix: {FIX}") from exc
    if find_nvcc() is None:
        raise BuildError(f"fullfuse: kernel library {name} is not in the cache {cache_dir()} and nvcc was not found; "
                         f"fix: {FIX}")
    ninja = find_ninja()
    if ninja is None:
        raise BuildError(f"fullfuse: kernel library {name} is not in the cache {cache_dir()} and ninja was not "
                         f"found; fix: {FIX}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.parent / ".lock", "a")
    except OSError as exc:
        raise BuildError(f"fullfuse: cannot write the kernel cache {out.parent} ({exc.strerror or exc}); "
                         f"fix: {FIX}") from exc
    with lock:
        # flock excludes other processes and, as every call opens its own file description, other threads too
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            return out
        # A name of this process and thread: a stale file of a killed compile is never taken as up to date by ninja.
        partial = out.with_name(f"{out.stem}.partial-{os.getpid()}-{threading.get_ident()}{out.suffix}")
        try:
            _remove(partial)
            (out.parent / "build.ninja").write_text(_ninja_file(lib, partial))
            with _Progress(name, quiet):   # says "compiled" only where no exception leaves the block
                proc = subprocess.run([ninja, "-C", str(out.parent)], capture_output=True, text=True)
                if proc.returncode != 0 or not partial.is_file():
                    raise BuildError(f"fullfuse: compiling {name} failed (ninja exit {proc.returncode}; its output "
                                     f"follows); fix the CUDA toolkit set-up (nvcc >= 12) or set FULLFUSE_CACHE_DIR "
                                     f"to a directory holding prebuilt kernels (`fullfuse build`)\n"
                                     f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
            _write_sources_key(lib, out)
            _publish(partial, out)
        except OSError as exc:
            raise BuildError(f"fullfuse: building {name} in the kernel cache {out.parent} failed ({exc}); "
                             f"fix: {FIX}") from exc
        finally:
            _remove(partial)
    return out


def _publish(partial: Path, out: Path) -> None:
    """Make ``partial`` (complete) appear as ``out`` in one step: on disk first, then renamed over the final name."""
    with open(partial, "rb") as done:
        os.fsync(done.fileno())
    os.replace(partial, out)


def _write_sources_key(lib: KernelLibrary, out: Path) -> None:
    """Mark the entry as a build of these sources for machines without nvcc (best effort: a read-only prebuilt
    cache already has its marker or serves only machines with the same nvcc)."""
    marker = out.parent / SOURCES_KEY
    try:
        if not marker.is_file():
            tmp = marker.with_name(f"{SOURCES_KEY}.{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(sources_key(lib) + "\n")
            os.replace(tmp, marker)
    except OSError:
        pass


def _remove(path: Path) -> None:
    """Delete ``path`` if it is there; a failure shows later (ninja cannot write it) with its own message."""
    try:
        path.unlink()
    except OSError:
        pass


def build_all(names: Optional[Iterable[str]] = None, jobs: Optional[int] = None,
              quiet: bool = False) -> Dict[str, Path]:
    """Compile every library (in parallel); used by ``fullfuse build`` and CI."""
    names = list(names or LIBRARIES)
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        paths = pool.map(lambda n: build(n, quiet=quiet), names)
        return dict(zip(names, paths))


_loaded: Dict[str, ctypes.CDLL] = {}
_load_locks: Dict[str, threading.Lock] = {}
_load_lock = threading.Lock()  # guards _load_locks; one lock per library so a long compile blocks only its users


def load(name: str) -> ctypes.CDLL:
    """The loaded library (compiled first if needed); BuildError if it can neither be found, built nor loaded."""
    cdll = _loaded.get(name)
    if cdll is not None:
        return cdll
    with _load_lock:
        lock = _load_locks.setdefault(name, threading.Lock())
    with lock:
        if name not in _loaded:
            path = build(name)
            try:
                _loaded[name] = ctypes.CDLL(str(path))
            except OSError as exc:
                raise BuildError(f"fullfuse: cannot load the kernel library {path} ({exc}); fix: delete "
                                 f"{path.parent} so that it is rebuilt, or {FIX}") from exc
        return _loaded[name]
