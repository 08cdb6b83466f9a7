"""``requires_nvrtc``: skip a CPU test where NVRTC or the CUDA headers are not installed (CI installs them: the
[nvrtc] extra)."""
import pytest

from cutlass_ops import nvrtc


def _have_nvrtc() -> bool:
    try:
        nvrtc.version()
        nvrtc.header_dirs()
        return True
    except Exception:
        return False


requires_nvrtc = pytest.mark.skipif(not _have_nvrtc(), reason="NVRTC or the CUDA headers are not installed")
