"""``fullfuse build``: compile every kernel variant ahead of time into the cubin cache, in parallel worker processes.

NVRTC needs no GPU, so a CPU machine can fill a cache that GPU machines then read (FULLFUSE_CACHE_DIR).  Each
(variant, architecture) is one job; a job whose cubin is cached already costs a file read.
"""
from __future__ import annotations

import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Dict, Iterable, List, Optional, Tuple

from . import cache, nvrtc
from .instantiations import all_variants
from .variants import MIN_ARCH, Variant, loaded_arch


def jobs_for(archs: Optional[Iterable[str]] = None, families: Optional[Iterable[str]] = None
             ) -> List[Tuple[Variant, str]]:
    """Every (variant, architecture) to compile: each variant's own architectures, or those of ``archs`` it is
    built for (a Hopper-only kernel is not compiled for sm_80)."""
    wanted = None if archs is None else list(archs)
    jobs = []
    for family, variants in all_variants().items():
        if families is not None and family not in families:
            continue
        for v in variants:
            for arch in (v.archs if wanted is None else [a for a in wanted if _builds_for(v, a)]):
                jobs.append((v, arch))
    return jobs


def check_archs(archs: Iterable[str]) -> None:
    """Raises cache.BuildError, saying what to give instead, for an architecture list that would build nothing a GPU
    loads: empty, a name that is no GPU architecture, one older than the kernels (MIN_ARCH), one this NVRTC cannot
    target, or a name no GPU loads its kernels as (``loaded_arch``)."""
    archs = list(archs)
    if not archs:
        raise cache.BuildError("fullfuse build: --arch names no architecture (e.g. --arch sm_90a sm_80)")
    known = nvrtc.supported_archs()
    for arch in archs:
        m = re.fullmatch(r"sm_(\d+)([af]?)", arch)
        if m is None:
            raise cache.BuildError(f"fullfuse build: {arch!r} is no GPU architecture (e.g. sm_90a, sm_80, sm_86, "
                                   f"sm_120)")
        cc = int(m.group(1))
        if cc < MIN_ARCH:
            raise cache.BuildError(f"fullfuse build: {arch} predates the kernels, which need sm_{MIN_ARCH} (Ampere) "
                                   f"or newer; on such a GPU PyTorch's ops run")
        loaded = loaded_arch(cc)
        if arch != loaded:
            raise cache.BuildError(f"fullfuse build: a GPU of compute capability {cc // 10}.{cc % 10} loads kernels "
                                   f"built as {loaded}; give {loaded}, not {arch}")
        if known and cc not in known:
            version = ".".join(map(str, nvrtc.version()))
            raise cache.BuildError(f"fullfuse build: NVRTC {version} cannot target {arch} (it knows "
                                   f"{', '.join(f'sm_{a}' for a in known if a >= MIN_ARCH)})")


def _builds_for(variant: Variant, arch: str) -> bool:
    """A variant is built for its own architectures and, if portable (sm_80 code), for any other from sm_80 on."""
    return arch in variant.archs or (arch != "sm_90a" and "sm_80" in variant.archs)


def _compile(job: Tuple[Variant, str]) -> Tuple[str, str, float, Optional[str]]:
    variant, arch = job
    start = time.time()
    try:
        cache.cubin(variant, arch, quiet=True)
        return variant.label, arch, time.time() - start, None
    except Exception as exc:  # reported with the variant; the build goes on and fails at the end
        return variant.label, arch, time.time() - start, str(exc)


def build(archs: Optional[Iterable[str]] = None, workers: Optional[int] = None,
          families: Optional[Iterable[str]] = None, stream=sys.stderr) -> Dict[str, object]:
    """Compile (or find cached) every job; prints a progress line per finished job.  Returns a summary; raises
    cache.BuildError listing the failures, if any."""
    try:
        nvrtc.check_compiler()  # fail early, with the fix, where nothing can be compiled here
    except nvrtc.CompileError as exc:
        raise cache.BuildError(str(exc)) from exc
    if archs is not None:
        check_archs(archs)
    jobs = jobs_for(archs, families)
    workers = max(1, workers or os.cpu_count() or 1)
    start, done, failures, slowest = time.time(), 0, [], (0.0, "")
    print(f"fullfuse build: {len(jobs)} kernels ({nvrtc.describe()}), {workers} worker processes, cache "
          f"{cache.cache_dir()}", file=stream, flush=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_compile, job) for job in jobs]
        for future in as_completed(futures):
            label, arch, seconds, error = future.result()
            done += 1
            if error:
                failures.append(f"{label} ({arch}): {error}")
            slowest = max(slowest, (seconds, f"{label} ({arch})"))
            bar = "#" * (30 * done // len(jobs))
            print(f"fullfuse build: [{bar:<30}] {done}/{len(jobs)} {time.time() - start:6.1f} s  {label} {arch} "
                  f"{seconds:.1f} s{'  FAILED' if error else ''}", file=stream, flush=True)
    total = time.time() - start
    summary = {"kernels": len(jobs), "seconds": round(total, 1), "failed": len(failures),
               "slowest": f"{slowest[1]} {slowest[0]:.1f} s"}
    if failures:
        raise cache.BuildError(f"fullfuse build: {len(failures)} of {len(jobs)} kernels failed:\n" +
                               "\n".join(failures))
    return summary
