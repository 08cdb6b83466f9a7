"""Scratch buffers of the fused kernels and the fallback epilogue, kept across calls: one zeroed buffer per (device,
stream), and scratch buffers per (thread, device, stream, purpose).

Invariants that make the reuse safe:
- ZEROED holds only what a kernel sets back to zero before it exits: counters and window maxima (the last block of each
  image (A) or part (B) re-zeroes those it used: csrc/fused_conv_act_pool/wgmma_reduce.cuh, mma_sync_kernel.cuh,
  csrc/fused_convt_pool_reduce/channel_reduce.cuh, csrc/fallback_act_pool.cuh).  Never partials or outputs: different
  problems place their counters at different offsets, so any byte one kernel leaves non-zero would be another's
  counter.  A fresh buffer is zeroed once.
- Launches on one stream run in order, so two calls sharing a stream's zeroed buffer never overlap; two streams never
  share one.
- A scratch buffer (PARTIALS: per-block sums a launch writes before it reads them; PACKED: family B's packed weights,
  written by one launch and read by the next) has undefined contents.  It is per thread as well: two threads' calls on
  one stream interleave their launches.
- Kept buffers come from the driver's stream-ordered allocator, not torch's (runtime.DeviceBuffer): made and freed on
  their stream, so a buffer replaced by a larger one (or dropped with its thread) is reused only in that stream's
  order, and none is ever taken from a CUDA-graph pool that torch routes allocations to.
- Under CUDA-graph capture a call gets a fresh buffer, zeroed inside the graph where ZEROED: a graph's replays must not
  share a buffer with eager calls, and nothing a graph reads may be freed while the graph lives.
"""
from __future__ import annotations

import itertools
import threading
from typing import Dict, Tuple

import torch

from . import launch, runtime

ZEROED, PARTIALS, PACKED = "zeroed", "partials", "packed"   # purposes (see above)

_zeroed: Dict[Tuple[int, int], torch.Tensor] = {}   # (device, stream) -> buffer
_scratch = threading.local()                         # .buffers: (purpose, device, stream) -> buffer, this thread's


def _fresh(index: int, size: int, zero: bool) -> torch.Tensor:
    """A buffer for one call under capture: torch's, so it belongs to the graph's memory pool."""
    buf = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", index))
    if zero:
        runtime.memset_zero(buf.data_ptr(), size, index)
    return buf


def _kept(index: int, size: int, zero: bool, stream: int) -> runtime.DeviceBuffer:
    """A buffer kept across calls: the driver's, never torch's (runtime.DeviceBuffer says why)."""
    buf = runtime.DeviceBuffer(index, size, stream)
    if zero:
        runtime.memset_zero(buf.data_ptr(), size, index)
    return buf


def buffer(index: int, size: int, purpose: str = ZEROED):
    """At least ``size`` bytes on device ``index`` for the launches of its current stream (None when ``size`` is 0):
    zero at the call's start for ZEROED (the caller's kernels must leave it zero), contents undefined otherwise."""
    return buffers(index, ((size, purpose),))[0]


def buffers(index: int, wanted) -> list:
    """``buffer`` for each (size, purpose) of ``wanted``.  Each is a torch tensor or a runtime.DeviceBuffer
    (``data_ptr()`` and ``numel()`` in bytes), or None for size 0."""
    return for_launch(index, wanted)[1]


class Buffers(list):
    """``for_launch``'s buffers (each a torch tensor, a runtime.DeviceBuffer or None), with ``pointers``: their
    addresses (0 for None), read once: a caller that keeps the tuple it last set in a launch's parameters compares it
    with this one (the same tuple while the answer is reused) and holds no buffer alive."""

    def __init__(self, buffers):
        super().__init__(buffers)
        self.pointers = tuple(0 if buf is None else buf.data_ptr() for buf in buffers)


def for_launch(index: int, wanted) -> Tuple[int, Buffers]:
    """(the current stream of device ``index``, ``buffers(index, wanted)`` for it): the stream and capture state read
    once (host time), and the caller launches on that same stream, the one its buffers belong to.  Host time per call:
    this thread's last answer for (device, stream, wanted) is kept with the generation of the kept buffers it names,
    and serves while no kept buffer was replaced or released since (``_generation``)."""
    if index < 0:   # a CPU tensor's device (the launch arithmetic, tested without a GPU)
        return 0, Buffers([torch.zeros(size, dtype=torch.uint8) if size else None for size, _ in wanted])
    stream, capturing = launch.stream_and_capturing(index)
    if capturing:
        return stream, Buffers([_fresh(index, size, purpose == ZEROED) if size else None for size, purpose in wanted])
    memo = getattr(_scratch, "memo", None)
    if memo is None:
        memo = _scratch.memo = {}
    key = (index, stream, wanted)
    got = memo.get(key)
    if got is not None and got[0] == _generation:
        return stream, got[1]
    generation = _generation   # (read first: a replacement from here on makes this answer stale, never current)
    buffers = Buffers(_kept_buffers(index, stream, wanted))
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = (generation, buffers)
    return stream, buffers


MEMO_LIMIT = 64   # answers kept per thread (a program cycling through ever new streams does not grow without limit)
# a new value after a kept buffer is replaced (a larger one wanted) or released, set once that is done: the threads'
# answers are stale then.  Each value is drawn once (next() of a count is atomic): racing bumps may leave an earlier
# one last, which only makes current answers stale, never a stale one current
_bumps = itertools.count(1)
_generation = 0


def _bump() -> None:
    global _generation
    _generation = next(_bumps)


def _kept_buffers(index: int, stream: int, wanted) -> list:
    got = []
    for size, purpose in wanted:
        if not size:
            got.append(None)
            continue
        if purpose == ZEROED:
            kept, key = _zeroed, (index, stream)
        else:
            kept, key = getattr(_scratch, "buffers", None), (purpose, index, stream)
            if kept is None:
                kept = _scratch.buffers = {}
        buf = kept.get(key)
        if buf is None or buf.numel() < size:
            buf = kept[key] = _kept(index, size, purpose == ZEROED, stream)
            _bump()
        got.append(buf)
    return got


def kept_bytes() -> int:
    """Bytes of the buffers kept across calls: every stream's zeroed buffer and this thread's scratch buffers (device
    memory outside torch's allocator, which torch.cuda.memory_allocated does not count)."""
    scratch = getattr(_scratch, "buffers", {})
    return sum(buf.numel() for buf in list(_zeroed.values()) + list(scratch.values()))


def release() -> None:
    """Free the buffers kept across calls: every stream's zeroed buffer and this thread's scratch buffers (other
    threads' go with them).  Public as ``fullfuse.empty_cache()``, for memory between phases of a program; the next
    call makes its buffers again.  Safe while calls are in flight: a buffer a call still holds is freed when that call
    drops it, on its stream, after the work enqueued there."""
    _zeroed.clear()
    getattr(_scratch, "buffers", {}).clear()
    getattr(_scratch, "memo", {}).clear()
    _bump()   # (other threads' answers name the released buffers, held until their next call: stale now)
