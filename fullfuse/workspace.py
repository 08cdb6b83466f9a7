"""Scratch buffers of the fused kernels (counters, partials, window maxima), zeroed once.

A kernel that needs one says how many bytes for a problem (its ``*_workspace_bytes`` C function) and leaves the
parts that must start at zero at zero when it finishes, so a buffer kept per (stream, problem) serves every later
call of that problem on that stream in stream order.  Per problem, because the layout depends on it.  While a CUDA
graph is being captured a fresh buffer is made (the graph keeps it).
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Optional

import torch

from . import launch

_buffers: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()   # (device, stream, library, problem) -> buffer, LRU
_MAX_BUFFERS = 16


@functools.lru_cache(maxsize=4096)
def nbytes(lib: str, bytes_fn: str, args: tuple) -> int:
    """Workspace bytes of one problem (the host plan runs once per problem, not per call)."""
    return launch.call(lib, bytes_fn, *args)


def get(device: torch.device, lib: str, bytes_fn: str, args: tuple, stream: Optional[int] = None) -> Optional[torch.Tensor]:
    """The zeroed workspace of this problem on the current stream (``stream``: its cudaStream_t, if the caller has it
    already), or None when the kernel needs none."""
    size = nbytes(lib, bytes_fn, args)
    if not size:
        return None
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(size, dtype=torch.uint8, device=device)
    key = (device.index, launch.current_stream(device) if stream is None else stream, lib, args)
    buf = _buffers.get(key)
    if buf is None:
        buf = _buffers[key] = torch.zeros(size, dtype=torch.uint8, device=device)
        if len(_buffers) > _MAX_BUFFERS:
            _buffers.popitem(last=False)
    else:
        _buffers.move_to_end(key)
    return buf
