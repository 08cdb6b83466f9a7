"""Scratch buffers of the fused kernels (counters, partials, window maxima, family B's packed weights): one buffer
per (device, stream) and purpose, kept across calls.

Invariants that make the reuse safe:
- A kernel that takes a zeroed workspace leaves it zero: the last block of each image (A) or part (B) re-zeroes the
  counters and maxima it used; partials are written before they are read (csrc/fused_conv_act_pool/wgmma_reduce.cuh,
  mma_sync_kernel.cuh, csrc/fused_convt_pool_reduce/channel_reduce.cuh).  A fresh buffer is zeroed once.
- Launches on one stream run in order, so two calls sharing a stream's zeroed buffer never overlap; two streams never
  share one.  A scratch buffer is written by one launch of a call and read by the next, so it is also per thread:
  two threads' calls on one stream interleave their launches.  A buffer replaced by a larger one (or dropped with its
  thread) is freed to torch's caching allocator on the stream it was made on, which reuses it only in that stream's
  order.
- Under CUDA-graph capture a call gets a fresh buffer, zeroed inside the graph: a graph's replays must not share a
  buffer with eager calls, and nothing a graph reads may be freed while the graph lives.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

from . import launch, runtime

ZEROED, SCRATCH = "zeroed", "scratch"   # purposes: a workspace the kernels keep zero; bytes each call overwrites

_zeroed: Dict[Tuple[int, int], torch.Tensor] = {}   # (device, stream) -> buffer
_scratch = threading.local()                         # .buffers: (device, stream) -> buffer, this thread's


def _fresh(index: int, size: int, zero: bool) -> torch.Tensor:
    buf = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", index))
    if zero:
        runtime.memset_zero(buf.data_ptr(), size, index)
    return buf


def buffer(index: int, size: int, purpose: str = ZEROED) -> Optional[torch.Tensor]:
    """At least ``size`` bytes on device ``index`` for the launches of its current stream (None when ``size`` is 0):
    zero at the call's start for ZEROED (the caller's kernel must leave it zero), contents undefined for SCRATCH."""
    if not size:
        return None
    if index < 0:   # a CPU tensor's device (the launch arithmetic, tested without a GPU)
        return torch.zeros(size, dtype=torch.uint8)
    if launch.capturing_index(index):
        return _fresh(index, size, purpose == ZEROED)
    key = (index, launch.stream_of(index))
    if purpose == ZEROED:
        kept = _zeroed
    else:
        kept = getattr(_scratch, "buffers", None)
        if kept is None:
            kept = _scratch.buffers = {}
    buf = kept.get(key)
    if buf is None or buf.numel() < size:
        buf = kept[key] = _fresh(index, size, purpose == ZEROED)   # (torch allocates on that stream)
    return buf


def release() -> None:
    """Drop the kept buffers (this thread's scratch, every stream's zeroed ones): memory back to torch's allocator."""
    _zeroed.clear()
    getattr(_scratch, "buffers", {}).clear()
