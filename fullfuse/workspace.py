"""Scratch buffers of the fused kernels (counters, partials, window maxima): a zeroed buffer per call.

A kernel that needs one says how many bytes for a problem (its planner, asked once per call signature).  The buffer
is allocated and zeroed on the caller's current stream in every call, so it is ordered with the launch that uses it,
shared by no other stream or thread, and under CUDA-graph capture both the zeroing and the buffer belong to the
graph (no buffer kept across calls can sit in a graph's memory pool).  The zeroing is one memset of at most ~1 MB.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import runtime


def zeroed(device: torch.device, size: int) -> Optional[torch.Tensor]:
    """A zeroed workspace of ``size`` bytes on the current stream of ``device``, or None when the kernel needs none.
    The zeroing is one driver memset on that stream (a fraction of torch.zeros's host time; captured into a CUDA
    graph like any memset)."""
    if not size:
        return None
    buf = torch.empty(size, dtype=torch.uint8, device=device)
    if buf.is_cuda:
        runtime.memset_zero(buf.data_ptr(), size, buf.device.index)
    else:
        buf.zero_()
    return buf
