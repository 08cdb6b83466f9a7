"""Family A's kernels compile through NVRTC without a GPU (cutlass_ops.nvrtc): one wgmma build for sm_90a and one
mma.sync build for sm_80, each with its ABI checks (static_asserts that the ctypes mirrors in
cutlass_ops/conv_act_pool.py match the C++ parameter structs and constants); a mirror that drifts fails the compile.
Skips where NVRTC is not installed (pip install cuda-python nvidia-cuda-nvrtc nvidia-cuda-runtime)."""
import ctypes
import dataclasses

import pytest
from nvrtc_available import nvrtc_missing

from cutlass_ops import conv_act_pool as abi
from cutlass_ops import nvrtc


@pytest.fixture(scope="module", autouse=True)
def _nvrtc():
    missing = nvrtc_missing()
    if missing:
        pytest.skip(missing)


SEED_WGMMA = abi.wg_variant(abi.F32, False, abi.WG_LM_TNCHW, abi.WG_OPS3X3, 3, False)   # the seed's TF32 NCHW kernel
BF16_MMA = abi.mma_variant(abi.BF16, False, True)


@pytest.mark.parametrize("variant, arch", [(SEED_WGMMA, "sm_90a"), (BF16_MMA, "sm_80")], ids=["wgmma", "mma.sync"])
def test_variant_compiles(variant, arch):
    assert variant in abi.VARIANTS and arch in variant.archs
    if nvrtc.version() < variant.min_nvrtc:   # (an NVRTC this old crashes on the unit: refused, with the fix)
        with pytest.raises(nvrtc.CompileError, match="cannot compile .* pip install -U 'nvidia-cuda-nvrtc"):
            nvrtc.compile_variant(variant, arch)
        return
    code, name = nvrtc.compile_variant(variant, arch)
    assert code[:4] == b"\x7fELF"
    name = name.decode() if isinstance(name, bytes) else name
    assert variant.kernel.split("<")[0] in name


def test_drifted_mirror_fails_the_compile():
    size = ctypes.sizeof(abi.FAParams)
    broken = dataclasses.replace(BF16_MMA, checks=BF16_MMA.checks.replace(f"sizeof(FAParams) == {size}",
                                                                          f"sizeof(FAParams) == {size + 8}"))
    assert broken.checks != BF16_MMA.checks
    with pytest.raises(nvrtc.CompileError, match="FAParams: size differs"):
        nvrtc.compile_variant(broken, "sm_80")


def test_an_nvrtc_that_crashes_on_the_wgmma_kernels_is_never_handed_one(monkeypatch):
    """NVRTC 12.1 (torch 2.4's wheels) dies with a segmentation fault on every fa_wgmma_kernel: those units are
    refused before NVRTC sees them (a CompileError naming the NVRTC that compiles them), the others go on."""
    options = nvrtc._program_api()[1]
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 1))
    refuse = lambda *args, **kwargs: pytest.fail("handed to NVRTC")   # noqa: E731
    monkeypatch.setattr(nvrtc, "_program_api", lambda: (refuse, options))
    assert all(v.min_nvrtc == (12, 2) for v in abi.VARIANTS if v.kernel.startswith("fa_wgmma_kernel"))
    with pytest.raises(nvrtc.CompileError, match=r"NVRTC 12\.1 cannot compile fa_wgmma_kernel.*NVRTC >= 12\.2"):
        nvrtc.compile_variant(SEED_WGMMA, "sm_90a")
    assert BF16_MMA.min_nvrtc <= (12, 1)
