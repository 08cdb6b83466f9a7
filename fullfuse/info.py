"""`fullfuse info`: the GPU, versions and kernel cache this machine would use."""
from __future__ import annotations

import torch

from cutlass_ops import cache, nvrtc

from . import runtime
from .fallback import cudnn_conv
from .measure import environment


def main() -> int:
    env = environment()
    from . import __version__

    print(f"fullfuse {__version__}")
    if torch.cuda.is_available():
        print(f"GPU            {env['gpu']} (compute capability {env['compute_capability']}, {env['sms']} SMs), "
              f"driver {env['driver']}")
        try:
            print(f"kernels        built for {runtime.arch_of(torch.cuda.current_device())} on this GPU")
        except Exception as exc:   # a GPU older than the kernels, no NVRTC
            print(f"kernels        none on this GPU: {str(exc).splitlines()[0]}")
    else:
        print("GPU            none visible to torch: kernels cannot run here; the torch path serves every model")
    print(f"torch          {env['torch']} (CUDA {env['cuda']}, cuDNN {env['cudnn']})")
    print(f"compiler       {nvrtc.describe()}")
    state = "importable" if cudnn_conv.available() else "not importable"
    print(f"cuDNN frontend {env['cudnn_frontend'] or 'not installed (the [cudnn] extra)'} ({state})")
    print(f"commit         {env['commit']}")
    print(f"kernel cache   {cache.cache_dir()}")
    try:
        from cutlass_ops.build import jobs_for
        jobs = jobs_for()
        have = sum(1 for v, arch in jobs if cache.entry_path(v, arch).is_file())
        print(f"  {have} of {len(jobs)} kernel variants compiled (the rest on first use, or `fullfuse build`)")
    except Exception as exc:
        print(f"  kernel variants: unavailable ({str(exc).splitlines()[0]})")
    return 0
