"""The on-disk cubin cache: one file per (variant, architecture), shared by threads and processes.

Location: ``$FULLFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fullfuse``, else ``~/.cache/fullfuse``.  Entry
``cubins/<kernel>-<arch>-<key>.cubin`` with the kernel's lowered name and the cubin's SHA-256 in ``.name`` beside it;
the key hashes the CUDA sources the unit includes, the NVRTC version, the CUDA headers and the CUTLASS / CCCL versions
(``nvrtc.headers_version``), the compile options, the architecture and the variant.  An entry is compiled under a file
lock into a private file that is renamed into place after its name file, so a ``.cubin`` that exists is complete and
its name is there: readers take no lock.  An entry whose cubin does not match its digest (a cache folder copied in
part, a disk fault) is compiled again, with a message, rather than handed to the driver, which would refuse it as if
the GPU could not run the kernel.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Tuple

from . import nvrtc
from .variants import Variant

try:
    import fcntl
except ImportError:   # Windows
    fcntl = None
    import msvcrt

CACHE_FORMAT = "3"  # bump to invalidate every cached cubin
FIX = "set FULLFUSE_CACHE_DIR to a writable directory (or one holding prebuilt kernels: run `fullfuse build` there)"


class BuildError(RuntimeError):
    """A kernel could neither be found in the cache nor compiled here; the first line says why and the fix."""


def cache_dir() -> Path:
    if os.environ.get("FULLFUSE_CACHE_DIR"):
        return Path(os.environ["FULLFUSE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fullfuse"


@lru_cache(maxsize=None)
def sources_digest(header: str) -> str:
    """The CUDA sources a unit compiles (nvrtc.unit_sources), by relative path and content.  Editing one family's
    headers leaves the other families' cubins valid."""
    digest = hashlib.sha256()
    for name, text in nvrtc.unit_sources(header):
        digest.update(name.encode() + b"\0" + text)
    return digest.hexdigest()


def key(variant: Variant, arch: str) -> str:
    major, minor = nvrtc.version()
    text = "|".join((CACHE_FORMAT, sources_digest(variant.header), f"nvrtc {major}.{minor}",
                     nvrtc.headers_version() or "",
                     nvrtc.options_key(), arch, variant.header, variant.kernel, variant.checks))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def entry_path(variant: Variant, arch: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", variant.kernel.split("<")[0])
    return cache_dir() / "cubins" / f"{stem}-{arch}-{key(variant, arch)}.cubin"


def cubin(variant: Variant, arch: str, quiet: bool = False) -> Tuple[bytes, str]:
    """The cubin of ``variant`` for ``arch`` and its kernel's lowered name, compiled first if the cache lacks it.
    Raises BuildError (never OSError) with the fix when it can neither be read nor made."""
    try:
        path = entry_path(variant, arch)
    except nvrtc.CompileError as exc:
        raise BuildError(str(exc)) from exc
    found = _read(path)
    if found is not None and found is not DAMAGED:
        return found
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")
    except OSError as exc:
        damaged = f"{path.name} there does not match its digest and " if found is DAMAGED else ""
        raise BuildError(f"fullfuse: {damaged}cannot write the kernel cache {path.parent} ({exc.strerror or exc}); "
                         f"fix: {FIX}") from exc
    with lock, _held(lock):
        found = _read(path)
        if found is not None and found is not DAMAGED:
            return found
        if found is DAMAGED:   # (said even when quiet: the user's cache folder holds a bad file)
            print(f"fullfuse: the cached {path.name} does not match its digest (a partial copy or a disk fault); "
                  f"compiling it again", file=sys.stderr, flush=True)
        start = time.time()
        if not quiet:
            print(f"fullfuse: compiling {variant.label} for {arch} (first use; cached in {path.parent}) ...",
                  file=sys.stderr, flush=True)
        try:
            code, name = nvrtc.compile_variant(variant, arch)
        except nvrtc.CompileError as exc:
            raise BuildError(str(exc)) from exc
        try:
            _publish(path.with_suffix(".name"), f"{name}\n{hashlib.sha256(code).hexdigest()}\n".encode())
            _publish(path, code)
        except OSError as exc:
            raise BuildError(f"fullfuse: writing the kernel cache {path.parent} failed ({exc}); fix: {FIX}") from exc
        if not quiet:
            print(f"fullfuse: compiled {variant.label} in {time.time() - start:.1f} s", file=sys.stderr, flush=True)
        return code, name


@contextlib.contextmanager
def _held(lock):
    """``lock`` (an open file) locked for this block: other processes and, as every call opens its own file
    description, other threads wait.  POSIX: flock; Windows: a lock on the file's first byte, retried, as one try
    gives up after ~10 s and a compile can take longer."""
    if fcntl is not None:
        fcntl.flock(lock, fcntl.LOCK_EX)   # (released when the file is closed)
        yield
        return
    lock.seek(0)
    while True:
        try:
            msvcrt.locking(lock.fileno(), msvcrt.LK_LOCK, 1)
            break
        except OSError:
            continue
    try:
        yield
    finally:
        lock.seek(0)
        msvcrt.locking(lock.fileno(), msvcrt.LK_UNLCK, 1)


DAMAGED = object()   # _read's answer for an entry whose cubin does not match the digest beside it


def _read(path: Path):
    """(cubin, lowered name) of a published entry; None where there is none; DAMAGED where its cubin does not match
    its digest or its name file is not one (1.3 MB of cubin hash in ~2 ms, once per kernel and process)."""
    try:
        code = path.read_bytes()
        lines = path.with_suffix(".name").read_text(encoding="utf-8", errors="replace").split("\n")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BuildError(f"fullfuse: cannot read the kernel cache {path.parent} ({exc}); fix: {FIX}") from exc
    if len(lines) < 2 or not lines[0] or lines[1] != hashlib.sha256(code).hexdigest():
        return DAMAGED
    return code, lines[0]


def _publish(path: Path, data: bytes) -> None:
    """Write ``data`` to a private file, flush it to disk, and rename it over ``path``: readers see all or nothing."""
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        for attempt in range(100):   # (Windows: a reader holding the old file open makes the rename fail a while)
            try:
                os.replace(tmp, path)
                break
            except PermissionError:
                if os.name != "nt" or attempt == 99:
                    raise
                time.sleep(0.05)
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
