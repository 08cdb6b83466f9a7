"""`fullfuse info`: the GPU, versions and kernel cache this machine would use."""
from __future__ import annotations

import torch

import cutlass_ops

from .fallback import cudnn_conv
from .measure import environment


def main() -> int:
    env = environment()
    from . import __version__

    print(f"fullfuse {__version__}")
    if torch.cuda.is_available():
        print(f"GPU            {env['gpu']} (compute capability {env['compute_capability']}, {env['sms']} SMs), driver {env['driver']}")
    else:
        print("GPU            none visible to torch: kernels cannot run here; the torch path serves every model")
    print(f"torch          {env['torch']} (CUDA {env['cuda']}, cuDNN {env['cudnn']})")
    print(f"nvcc           {env['nvcc'] or 'not found (set CUDA_HOME): only cached kernels can be used'}")
    print(f"cuDNN frontend {env['cudnn_frontend'] or 'not installed'} ({'importable' if cudnn_conv.available() else 'not importable'})")
    print(f"commit         {env['commit']}")
    cache = cutlass_ops.cache_dir()
    print(f"kernel cache   {cache}")
    for name in cutlass_ops.LIBRARIES:
        try:
            path = cutlass_ops.library_path(name)
            state = "built" if path.exists() else "not built yet (compiled on first use or by `fullfuse build`)"
        except Exception as exc:
            state = f"unavailable: {exc}"
        print(f"  {name:24} {state}")
    return 0
