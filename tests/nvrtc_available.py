"""``requires_nvrtc`` / ``nvrtc_missing()``: skip a CPU test where no kernel can be compiled here: NVRTC or the CUDA
headers not installed (CI installs them: the [nvrtc] extra), or a cuda-core that needs the CUDA driver to compile
(0.4, on Python 3.9) on a machine without one."""
from functools import lru_cache
from typing import Optional

import pytest

from cutlass_ops import nvrtc


@lru_cache(maxsize=None)
def nvrtc_missing() -> Optional[str]:
    """Why no unit compiles here (its first line), or None.  Probed once per process (check_compiler caches only
    success)."""
    try:
        nvrtc.check_compiler()
        return None
    except Exception as exc:
        return str(exc).splitlines()[0]


requires_nvrtc = pytest.mark.skipif(nvrtc_missing() is not None, reason=str(nvrtc_missing()))
