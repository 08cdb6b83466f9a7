"""The cubin cache and the NVRTC front end, on CPU (no GPU, no nvcc needed).

- the cache key changes with the sources, the NVRTC version, the architecture and the variant, and nothing else;
- concurrent threads and processes compile an entry once, and a reader never sees a half-written cubin (a fake
  compiler writes slowly while others read);
- every environment failure (no NVRTC, an unwritable cache, a failed compile) is a BuildError whose text says the fix;
- a real NVRTC compile of a small kernel, where NVRTC is installed.
"""
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nvrtc_available import requires_nvrtc

from cutlass_ops import cache, nvrtc
from cutlass_ops.variants import Variant

ROOT = Path(__file__).resolve().parent.parent
VARIANT = Variant("device_std.h", "no_such_kernel<1>", ("sm_80",))
CUBIN = b"\x7fELF fake cubin " * 4096


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "headers_version", lambda: "test")
    return tmp_path


def fake_compiler(monkeypatch, log, pause=0.2, fail=False):
    def compile_variant(variant, arch):
        log.append((variant.kernel, arch))
        time.sleep(pause)
        if fail:
            raise nvrtc.CompileError("fullfuse: NVRTC failed to compile (test)")
        return CUBIN, "_Z14no_such_kernelILi1EEvv"
    monkeypatch.setattr(nvrtc, "compile_variant", compile_variant)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FULLFUSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x" / "fullfuse"


def test_key_depends_on_arch_variant_nvrtc_and_sources(env, monkeypatch):
    base = cache.key(VARIANT, "sm_80")
    assert base == cache.key(VARIANT, "sm_80")
    assert base != cache.key(VARIANT, "sm_90a")
    assert base != cache.key(Variant("device_std.h", "no_such_kernel<2>", ("sm_80",)), "sm_80")
    assert base != cache.key(Variant("device_std.h", "no_such_kernel<1>", ("sm_80",), checks="x"), "sm_80")
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 1))
    assert base != cache.key(VARIANT, "sm_80")
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(cache, "sources_digest", lambda header: "other sources")
    assert base != cache.key(VARIANT, "sm_80")


def test_sources_digest_follows_the_includes(tmp_path, monkeypatch):
    """A unit's key covers the headers it includes, transitively, and no others."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.cuh").write_text('#include "sub/b.cuh"\n')
    (tmp_path / "sub" / "b.cuh").write_text('#include "c.h"\n')   # resolved next to b.cuh
    (tmp_path / "sub" / "c.h").write_text("int c;\n")
    (tmp_path / "other.cuh").write_text("int other;\n")
    monkeypatch.setattr(nvrtc, "csrc_dir", lambda: tmp_path)

    def digest(header):   # read afresh: both the file walk and the digest are cached per process
        nvrtc.unit_sources.cache_clear()
        return cache.sources_digest.__wrapped__(header)
    before = digest("a.cuh")
    (tmp_path / "other.cuh").write_text("int other2;\n")
    assert digest("a.cuh") == before
    (tmp_path / "sub" / "c.h").write_text("int c2;\n")
    assert digest("a.cuh") != before
    nvrtc.unit_sources.cache_clear()


def test_compiles_once_then_reads(env, monkeypatch):
    log = []
    fake_compiler(monkeypatch, log, pause=0.0)
    assert cache.cubin(VARIANT, "sm_80", quiet=True) == (CUBIN, "_Z14no_such_kernelILi1EEvv")
    assert cache.cubin(VARIANT, "sm_80", quiet=True)[0] == CUBIN
    assert log == [("no_such_kernel<1>", "sm_80")]
    path = cache.entry_path(VARIANT, "sm_80")
    assert path.is_file() and path.with_suffix(".name").is_file()
    assert not [p for p in path.parent.iterdir() if "partial" in p.name]


def test_concurrent_threads_compile_once_and_never_see_a_partial_cubin(env, monkeypatch):
    log, results, errors = [], [], []
    fake_compiler(monkeypatch, log, pause=0.3)

    def worker():
        try:
            results.append(cache.cubin(VARIANT, "sm_90a", quiet=True))
        except Exception as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(log) == 1
    assert all(r == (CUBIN, "_Z14no_such_kernelILi1EEvv") for r in results) and len(results) == 8


def test_concurrent_processes_compile_once(env, tmp_path):
    log = tmp_path / "compiles.log"
    code = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from cutlass_ops import cache, nvrtc
from cutlass_ops.variants import Variant
nvrtc.version = lambda: (13, 0)
nvrtc.headers_version = lambda: "test"
def compile_variant(variant, arch):
    with open({str(log)!r}, "a") as f:
        f.write("compile\\n")
    time.sleep(0.5)
    return b"cubin" * 100000, "name"
nvrtc.compile_variant = compile_variant
code, name = cache.cubin(Variant("device_std.h", "no_such_kernel<1>", ("sm_80",)), "sm_80", quiet=True)
assert code == b"cubin" * 100000 and name == "name", (len(code), name)
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**os.environ}) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert log.read_text().count("compile") == 1


def test_without_fcntl_the_lock_is_windows_and_threads_compile_once(env, tmp_path):
    """Where there is no fcntl (Windows), importing fullfuse works and the entry's lock is msvcrt's (stood in here by
    flock, its first try failing as Windows' gives up after ~10 s): 8 threads, one compile."""
    code = f"""
import fcntl, multiprocessing, subprocess, sys, threading, time, types
import torch   # (what imports itself tests for msvcrt, as subprocess does, before the stand-in is there)
real = fcntl
sys.modules["fcntl"] = None
msvcrt = types.ModuleType("msvcrt")
msvcrt.LK_LOCK, msvcrt.LK_UNLCK, tries = 1, 0, []
def locking(fd, mode, nbytes):
    assert nbytes == 1
    if mode == msvcrt.LK_LOCK and not tries:
        tries.append(1)
        raise OSError(36, "Resource deadlock avoided")
    real.flock(fd, real.LOCK_EX if mode == msvcrt.LK_LOCK else real.LOCK_UN)
msvcrt.locking = locking
sys.modules["msvcrt"] = msvcrt
sys.path.insert(0, {str(ROOT)!r})
import fullfuse
from cutlass_ops import cache, nvrtc
from cutlass_ops.variants import Variant
assert cache.fcntl is None
nvrtc.version = lambda: (13, 0)
nvrtc.headers_version = lambda: "test"
log, got = [], []
def compile_variant(variant, arch):
    log.append(arch)
    time.sleep(0.3)
    return b"cubin" * 1000, "name"
nvrtc.compile_variant = compile_variant
def worker():
    got.append(cache.cubin(Variant("device_std.h", "no_such_kernel<1>", ("sm_80",)), "sm_80", quiet=True))
threads = [threading.Thread(target=worker) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert len(log) == 1 and got == [(b"cubin" * 1000, "name")] * 8 and tries, (log, len(got), tries)
"""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_reader_never_takes_a_partial_file(env, monkeypatch):
    path = cache.entry_path(VARIANT, "sm_80")
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".partial-1-2").write_bytes(CUBIN[:100])   # a killed compile's leftover
    path.with_suffix(".name").write_text("name")                            # the name is published first
    log = []
    fake_compiler(monkeypatch, log, pause=0.0)
    assert cache.cubin(VARIANT, "sm_80", quiet=True) == (CUBIN, "_Z14no_such_kernelILi1EEvv")
    assert len(log) == 1


@pytest.mark.parametrize("damage", ["truncated", "flipped", "old name file", "empty name file"])
def test_a_damaged_entry_is_compiled_again_and_said(env, monkeypatch, capsys, damage):
    """A cubin that does not match the digest beside it (a cache folder copied in part, a disk fault, a name file
    of an earlier format) is compiled again, even when quiet, never handed to the driver."""
    log = []
    fake_compiler(monkeypatch, log, pause=0.0)
    path = cache.entry_path(VARIANT, "sm_80")
    cache.cubin(VARIANT, "sm_80", quiet=True)
    if damage == "truncated":
        path.write_bytes(CUBIN[:1000])
    elif damage == "flipped":
        path.write_bytes(CUBIN[:500] + b"\0" + CUBIN[501:])
    else:
        path.with_suffix(".name").write_text("" if damage == "empty name file" else "_Z14no_such_kernelILi1EEvv")
    capsys.readouterr()
    assert cache.cubin(VARIANT, "sm_80", quiet=True) == (CUBIN, "_Z14no_such_kernelILi1EEvv")
    assert len(log) == 2 and "does not match its digest" in capsys.readouterr().err
    assert cache.cubin(VARIANT, "sm_80", quiet=True)[0] == CUBIN and len(log) == 2   # (repaired: read again)


def test_a_damaged_entry_in_a_read_only_cache_is_a_build_error_saying_so(env, monkeypatch):
    fake_compiler(monkeypatch, [], pause=0.0)
    path = cache.entry_path(VARIANT, "sm_80")
    cache.cubin(VARIANT, "sm_80", quiet=True)
    path.write_bytes(CUBIN[:1000])

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(cache, "open", read_only, raising=False)   # (the lock file cannot be made)
    with pytest.raises(cache.BuildError, match="does not match its digest and cannot write the kernel cache"):
        cache.cubin(VARIANT, "sm_80", quiet=True)


def test_failed_compile_is_a_build_error_and_leaves_no_entry(env, monkeypatch):
    fake_compiler(monkeypatch, [], pause=0.0, fail=True)
    with pytest.raises(cache.BuildError, match="NVRTC failed"):
        cache.cubin(VARIANT, "sm_80", quiet=True)
    assert not cache.entry_path(VARIANT, "sm_80").exists()


def test_no_nvrtc_is_a_build_error_with_the_fix(env, monkeypatch):
    def missing():
        raise nvrtc.CompileError(f"fullfuse: NVRTC is not available (test); {nvrtc.FIX}")
    monkeypatch.setattr(nvrtc, "version", missing)
    with pytest.raises(cache.BuildError, match="pip install cuda-python nvidia-cuda-nvrtc"):
        cache.cubin(VARIANT, "sm_80", quiet=True)


def test_unwritable_cache_is_a_build_error_with_the_fix(env, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(blocker))
    fake_compiler(monkeypatch, [], pause=0.0)
    with pytest.raises(cache.BuildError, match="FULLFUSE_CACHE_DIR"):
        cache.cubin(VARIANT, "sm_80", quiet=True)


_KNOWN = (75, 80, 86, 89, 90, 100, 120)


@pytest.mark.parametrize("archs, says", [
    ([], "names no architecture"),
    (["bogus"], "is no GPU architecture"),
    (["sm_80", "90a"], "is no GPU architecture"),
    (["sm_75"], "predates the kernels, which need sm_80"),
    (["sm_61"], "predates the kernels, which need sm_80"),
    (["sm_90"], "give sm_90a, not sm_90"),
    (["sm_100a"], "give sm_100, not sm_100a"),
    (["sm_86f"], "give sm_86, not sm_86f"),
    (["sm_130"], "cannot target sm_130 (it knows sm_80, sm_86, sm_89, sm_90, sm_100, sm_120)"),
])
def test_build_refuses_architectures_no_gpu_would_load_before_compiling(monkeypatch, archs, says):
    """`fullfuse build --arch ...` checks its list first: one error naming what to give, no job compiled."""
    from cutlass_ops import build
    monkeypatch.setattr(nvrtc, "check_compiler", lambda: None)
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: _KNOWN)
    monkeypatch.setattr(build, "_compile", lambda job: pytest.fail("compiled despite the refused list"))
    with pytest.raises(cache.BuildError, match=re.escape(says)):
        build.build(archs, workers=1)


def test_build_takes_the_architectures_gpus_load(monkeypatch):
    from cutlass_ops import build
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: _KNOWN)
    build.check_archs(["sm_90a", "sm_80", "sm_86", "sm_89", "sm_100", "sm_120"])
    jobs = build.jobs_for(["sm_90a", "sm_86"])
    assert jobs and {arch for _, arch in jobs} == {"sm_90a", "sm_86"}
    assert all(arch == "sm_90a" for v, arch in jobs if v.archs == ("sm_90a",))   # (wgmma kernels: Hopper only)


def test_build_where_nothing_compiles_is_a_build_error_with_the_fix(monkeypatch, capsys):
    """`fullfuse build` on a machine that cannot compile (here: no NVRTC) stops before any job, exit code 1, the fix
    printed (no traceback)."""
    from fullfuse import cli
    monkeypatch.setattr(nvrtc, "check_compiler", lambda: (_ for _ in ()).throw(
        nvrtc.CompileError(f"fullfuse: NVRTC is not available (test); {nvrtc.FIX}")))
    assert cli.main(["build", "--arch", "sm_80"]) == 1
    assert "pip install cuda-python nvidia-cuda-nvrtc" in capsys.readouterr().err


def test_fullfuse_build_error_is_the_cache_one():
    import fullfuse
    assert fullfuse.BuildError is cache.BuildError


@requires_nvrtc
def test_nvrtc_compiles_a_unit_with_the_project_headers(tmp_path):
    """device_std.h and the CUDA fp16 / bf16 headers compile under NVRTC, and a failing unit says where."""
    good = Variant("device_std.h", "ff_probe_kernel<float>", ("sm_80",),
                   checks="#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
                          "template <class T> __global__ void ff_probe_kernel(T* p, uint64_t n) "
                          "{ if (threadIdx.x < n) p[threadIdx.x] = std::is_same_v<T, float> ? "
                          "__bfloat162float(__float2bfloat16(1.f)) : T(0); }\n")
    code, name = nvrtc.compile_variant(good, "sm_80")
    assert code[:4] == b"\x7fELF" and "ff_probe_kernel" in name
    bad = Variant("device_std.h", "ff_probe_kernel<float>", ("sm_80",), checks="this is not C++\n")
    with pytest.raises(nvrtc.CompileError, match="ff_probe_kernel"):
        nvrtc.compile_variant(bad, "sm_80")


def test_package_data_ships_every_kernel_source():
    """`pip install .` copies csrc/ into cutlass_ops/csrc through package-data globs: every header a unit may include
    (subfolders too) must match one."""
    import fnmatch
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["cutlass_ops.csrc"]
    sources = [p.relative_to(ROOT / "csrc").as_posix() for p in (ROOT / "csrc").rglob("*")
               if p.suffix in (".cu", ".cuh", ".h")]
    assert sources and not [s for s in sources if s.endswith(".cu")], "csrc/ holds device headers only"
    missing = [s for s in sources if not any(fnmatch.fnmatchcase(s, pat) and s.count("/") == pat.count("/")
                                             for pat in patterns)]
    assert not missing, f"not shipped by pyproject.toml package-data: {missing}"


def test_every_variant_header_exists_and_labels_are_unique():
    from cutlass_ops.instantiations import all_variants
    seen = set()
    for family, variants in all_variants().items():
        assert variants, family
        for v in variants:
            assert (nvrtc.csrc_dir() / v.header).is_file(), v
            assert v.archs and set(v.archs) <= {"sm_80", "sm_90a"}, v
            assert v.label not in seen, v
            seen.add(v.label)
