"""How fullfuse's kernels come to exist: the table of kernel instantiations (one compile unit each), NVRTC through
cuda-python, the on-disk cubin cache, and ``fullfuse build``.  Device code lives in csrc/; loading and launching in
``fullfuse.runtime``."""
from .cache import BuildError, cache_dir, cubin
from .nvrtc import CompileError, csrc_dir
from .variants import HOPPER, PORTABLE, Variant

__all__ = ["BuildError", "CompileError", "HOPPER", "PORTABLE", "Variant", "cache_dir", "csrc_dir", "cubin"]
