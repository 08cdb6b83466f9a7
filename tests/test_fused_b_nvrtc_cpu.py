"""CPU: family B's device code compiles through NVRTC (no GPU, no nvcc): one fused kernel variant for sm_90a and the
weight-packing kernel for every architecture it is built for, each unit with the static_asserts that the ctypes
mirrors (cutlass_ops/convt_pool_reduce.py) match the C++ parameter structs."""
import pytest
from nvrtc_available import nvrtc_missing

from cutlass_ops import convt_pool_reduce as abi
from cutlass_ops import nvrtc


@pytest.fixture(scope="module", autouse=True)
def _needs_nvrtc():
    missing = nvrtc_missing()
    if missing:
        pytest.skip(missing)


def test_variant_table():
    """Every instantiation the planner can pick, once: activation on / off x (k steps, kernel variant), + packing."""
    kernels = [v.kernel for v in abi.VARIANTS]
    assert len(kernels) == len(set(kernels)) == 2 * 13 + 1
    assert all(v.archs == ("sm_90a",) for v in abi.VARIANTS if v is not abi.PACK)
    assert abi.PACK.archs == ("sm_80", "sm_90a")


def test_fused_variant_compiles():
    variant = abi.fused_variant(False, 1, abi.KV_BF16)   # the quickest unit (about a second)
    assert "static_assert(FF_OFFSETOF(FBParams, inv_k) == 976" in variant.checks
    code, name = nvrtc.compile_variant(variant, "sm_90a")
    assert code[:4] == b"\x7fELF" and "fb_kernel" in name and "8FBParams" in name


@pytest.mark.parametrize("arch", abi.PACK.archs)
def test_pack_kernel_compiles(arch):
    assert "fb_pack::Geometry, ws) == 48" in abi.PACK.checks
    code, name = nvrtc.compile_variant(abi.PACK, arch)
    assert code[:4] == b"\x7fELF" and "pack_kernel" in name
