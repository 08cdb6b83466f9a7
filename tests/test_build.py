"""The kernel build system: cache keys, ninja files, and a real nvcc compile of every library (no GPU needed).

CI runs `fullfuse build` before the tests, so `test_every_library_compiles_and_exports_its_api` finds the
libraries cached; on a machine without nvcc it skips.
"""
import ctypes

import pytest

import cutlass_ops
from cutlass_ops import builder as build_mod
from fullfuse import launch


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(tmp_path / "c"))
    assert cutlass_ops.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FULLFUSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cutlass_ops.cache_dir() == tmp_path / "x" / "fullfuse"


def test_cache_key_follows_sources_and_flags(monkeypatch, tmp_path):
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "k.cu").write_text("// v1\n")
    (src / "h.cuh").write_text("// header\n")
    monkeypatch.setattr(build_mod, "csrc_dir", lambda: src)
    lib = cutlass_ops.KernelLibrary("k", "k.cu", cutlass_ops.libraries.PORTABLE)
    key = build_mod.cache_key(lib)
    assert key == build_mod.cache_key(lib)
    (src / "h.cuh").write_text("// header changed\n")
    assert build_mod.cache_key(lib) != key
    other = cutlass_ops.KernelLibrary("k", "k.cu", cutlass_ops.libraries.HOPPER_AND_AMPERE)
    assert build_mod.cache_key(other) != build_mod.cache_key(lib)


def test_compile_command_targets_hopper_with_sm90a():
    cmd = build_mod.compile_command(cutlass_ops.LIBRARIES["fused_conv_act_pool"], cutlass_ops.csrc_dir() / "x.cu", "o.so")
    assert "-gencode=arch=compute_90a,code=sm_90a" in cmd and "-shared" in cmd
    assert any(flag.startswith("-I") and flag.endswith("include") for flag in cmd)
    ninja = build_mod._ninja_file(cutlass_ops.LIBRARIES["fallback_act_pool"], cutlass_ops.library_path("fallback_act_pool"))
    assert "rule nvcc" in ninja and "compute_80" in ninja


def test_every_exported_function_has_a_signature():
    assert set(launch.SIGNATURES) == set(cutlass_ops.LIBRARIES)
    for functions in launch.SIGNATURES.values():
        for name, (restype, argtypes) in functions.items():
            assert name.startswith("ff_") and isinstance(argtypes, list)


@pytest.mark.skipif(cutlass_ops.find_nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("library", sorted(cutlass_ops.LIBRARIES))
def test_every_library_compiles_and_exports_its_api(library):
    path = cutlass_ops.build(library)
    lib = ctypes.CDLL(str(path))
    for fn in launch.SIGNATURES[library]:
        assert hasattr(lib, fn), f"{library} does not export {fn}"


def test_package_data_ships_every_kernel_source():
    """`pip install .` copies csrc/ into cutlass_ops/csrc through package-data globs: every source and header the
    builder may compile (the library .cu files and everything they include, subfolders too) must match one."""
    import fnmatch
    from pathlib import Path
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["cutlass_ops.csrc"]
    sources = [p.relative_to(root / "csrc").as_posix() for p in (root / "csrc").rglob("*")
               if p.suffix in (".cu", ".cuh", ".h")]
    assert sources
    missing = [s for s in sources if not any(fnmatch.fnmatchcase(s, pat) and s.count("/") == pat.count("/")
                                             for pat in patterns)]
    assert not missing, f"not shipped by pyproject.toml package-data: {missing}"
