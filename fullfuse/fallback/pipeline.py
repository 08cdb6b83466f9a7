"""Batch chunking for the fallbacks: conv of a chunk of images, then the epilogue kernel of that chunk.

Two ways to gain over one conv + one epilogue: small chunks (tens of MB of conv output) keep the intermediate in
L2 between the conv and the epilogue, and re-use the same buffer so it need never reach HBM; larger chunks on two
streams let the epilogue of chunk i overlap the conv of chunk i+1.  Which wins depends on the GPU and the problem,
so the first call for a problem times a few schedules once and keeps the fastest.  Smaller chunks also cut the
peak extra memory.

Invariants:
- Memory: a schedule holds at most one chunk's conv output at a time, two with overlap (chunk i+2's conv waits,
  on the GPU, for chunk i's epilogue, and chunk i's output is freed only after that wait: stream-ordered, so the
  allocator re-uses it at once instead of waiting on the host's view of the side stream).  The first call times
  the candidates in increasing order of that memory, frees each one's buffers before the next, skips those that
  hold more than the default schedule or would not fit in the device's free memory, and among the near-fastest
  keeps the one needing least: its peak is the largest timed candidate's, at most the default schedule's.
- No timing under CUDA-graph capture (events are synchronised on the host): the default schedule runs instead and
  nothing is recorded.  Nothing here synchronises the host outside the timing.
- The first call's result is the chosen schedule's (it runs once more where another one ran last), so every call
  gives the same bits.
- Side streams belong to one (thread, device): two threads (one possibly capturing) never share one.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch

from .. import launch

CHUNK_BYTES = 256 << 20     # default schedule: chunks of this much conv output ...
OVERLAP = True              # ... with the epilogue on a side stream
AUTOTUNE = True
CANDIDATES = ((24 << 20, False), (48 << 20, False), (96 << 20, True), (256 << 20, True), (1 << 62, False))
NEAR_FASTEST = 1.02         # a schedule this close to the fastest and needing less memory is preferred
FREE_MEMORY_SHARE = 0.8     # of the device's free memory a timed candidate's conv outputs may take (the rest:
                            # convolution workspaces, input copies, other users of the GPU)

_local = threading.local()  # .side_streams: device index -> this thread's side stream
_chosen: Dict[Hashable, Tuple[int, bool, float]] = {}
_tune_lock = threading.Lock()   # one autotune at a time: concurrent timings would skew each other and add memory


def chunks(n: int, bytes_per_image: int, chunk_bytes: Optional[int] = None) -> List[Tuple[int, int]]:
    """Even split of range(n) into chunks of at most ~chunk_bytes of conv output (at least one image each)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    count = max(1, min(n, -(-n * bytes_per_image // chunk_bytes)))
    bounds = [round(i * n / count) for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(count) if bounds[i + 1] > bounds[i]]


_spans: Dict[Tuple[int, int, int], Tuple[Tuple[int, int], ...]] = {}


def _chunks_kept(n: int, bytes_per_image: int, chunk_bytes: int) -> Tuple[Tuple[int, int], ...]:
    """``chunks``, worked out once per arguments (host time per call; bounded)."""
    key = (n, bytes_per_image, chunk_bytes)
    spans = _spans.get(key)
    if spans is None:
        if len(_spans) > 1024:
            _spans.clear()
        spans = _spans[key] = tuple(chunks(n, bytes_per_image, chunk_bytes))
    return spans


def rows(t: torch.Tensor, n0: int, n1: int) -> torch.Tensor:
    """Images [n0, n1) of ``t``: ``t`` itself for the whole batch (the one-chunk case: no view op, host time)."""
    return t if n0 == 0 and n1 == t.shape[0] else t[n0:n1]


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    streams = getattr(_local, "side_streams", None)
    if streams is None:
        streams = _local.side_streams = {}
    index = launch.device_index(device)
    if index not in streams:
        streams[index] = torch.cuda.Stream(device=index)
    return streams[index]


def peak_bytes(spans: List[Tuple[int, int]], overlap: bool, bytes_per_image: int) -> int:
    """Conv output a schedule holds at once: one chunk, or two where the epilogue overlaps the next conv."""
    largest = max(n1 - n0 for n0, n1 in spans) * bytes_per_image
    return largest * (2 if overlap and len(spans) > 1 else 1)


def _execute(device, spans, overlap, produce, consume) -> None:
    if len(spans) == 1 or not overlap:
        for n0, n1 in spans:
            consume(produce(n0, n1), n0, n1)
        return
    main, side = torch.cuda.current_stream(device), _side_stream(device)
    pending = []                                    # (conv output, event after its epilogue), oldest first
    try:
        for n0, n1 in spans:
            y = produce(n0, n1)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                consume(y, n0, n1)
            pending.append((y, side.record_event()))
            del y
            if len(pending) == 2:
                # The next conv (on main) waits for the older epilogue; after that wait its buffer may be freed into
                # main's pool and re-used by that very conv, in stream order (no record_stream, no host wait).
                main.wait_event(pending.pop(0)[1])
    finally:                                        # also on an error: no buffer is freed while an epilogue reads it
        main.wait_stream(side)
        pending.clear()


def _time(device, fn) -> float:
    stream = torch.cuda.current_stream(device)
    fn()                                            # warm-up: cuDNN plan choice for this chunk size happens here
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(2):
        start.record(stream)
        fn()
        end.record(stream)                          # after main waited for the side stream: covers both
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def _free_bytes(device) -> int:
    """Memory the timing may use: the device's free memory plus what torch's allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _autotune(device, n, bytes_per_image, produce, consume) -> Tuple[int, bool, float]:
    """Time the candidates (see the module's invariants); returns the chosen (chunk bytes, overlap, ms), whose
    schedule has computed the result last."""
    schedules = {}
    for chunk_bytes, overlap in CANDIDATES:
        spans = chunks(n, bytes_per_image, chunk_bytes)
        overlap = overlap and len(spans) > 1
        schedules.setdefault((tuple(spans), overlap), (peak_bytes(spans, overlap, bytes_per_image), chunk_bytes))
    order = sorted(schedules.items(), key=lambda item: item[1][0])
    # no candidate holds more than the default schedule (the one calls under capture run): the first call's peak,
    # and every later call's, stay within what chunking needs anyway
    default_spans = chunks(n, bytes_per_image, CHUNK_BYTES)
    default_peak = peak_bytes(default_spans, OVERLAP and len(default_spans) > 1, bytes_per_image)
    order = [item for item in order if item[1][0] <= default_peak]
    budget = FREE_MEMORY_SHARE * _free_bytes(device)
    timed, last_complete = [], None                 # last_complete: the schedule whose result ``out`` holds
    for (spans, overlap), (need, chunk_bytes) in order:
        if timed and need > budget:
            break                                   # and every larger one
        try:
            # one chunk of each size alone first: the conv's one-time work for a new chunk shape (cuDNN's plan
            # timing writes a whole output of its own) then never runs while other chunks' outputs are held
            for size in sorted({n1 - n0 for n0, n1 in spans}):
                n0 = next(a for a, b in spans if b - a == size)
                consume(produce(n0, n0 + size), n0, n0 + size)
            ms = _time(device, lambda: _execute(device, list(spans), overlap, produce, consume))  # noqa: B023
        except torch.cuda.OutOfMemoryError:
            if not timed:
                raise                               # the smallest schedule does not fit: neither would a later call
            last_complete = None                    # it may have written part of the result
            break
        timed.append((ms, need, chunk_bytes, overlap, spans))
        last_complete = (spans, overlap)
    fastest = min(t[0] for t in timed)
    ms, need, chunk_bytes, overlap, spans = min((t for t in timed if t[0] <= NEAR_FASTEST * fastest),
                                                key=lambda t: (t[1], t[0]))
    if (spans, overlap) != last_complete:
        _execute(device, list(spans), overlap, produce, consume)   # the result of the schedule later calls use
    return chunk_bytes, overlap, ms


def run(device: torch.device, key: Hashable, n: int, bytes_per_image: int,
        produce: Callable[[int, int], torch.Tensor], consume: Callable[[torch.Tensor, int, int], None]) -> None:
    """For each chunk [n0, n1): y = produce(n0, n1), then consume(y, n0, n1), on the schedule chosen for key."""
    chosen = _chosen.get(key)
    if chosen is None and AUTOTUNE and n > 1 and not launch.capturing(device):
        with _tune_lock:
            chosen = _chosen.get(key)
            if chosen is None:
                _chosen[key] = _autotune(device, n, bytes_per_image, produce, consume)
                return                              # the chosen schedule computed the full result
    chunk_bytes, overlap = (chosen[0], chosen[1]) if chosen is not None else (CHUNK_BYTES, OVERLAP)
    _execute(device, _chunks_kept(n, bytes_per_image, chunk_bytes), overlap, produce, consume)


class Schedule:
    """``run`` for one problem (key, batch n, conv output bytes per image), and whether its calls run the batch as one
    chunk (``whole``): a batch of one, or a chosen schedule of one chunk.  A whole-batch call needs none of this
    module (its caller runs the conv and the epilogue of the batch itself: host time per call); ``whole`` turns true
    once the problem's first call has chosen such a schedule."""

    __slots__ = ("device", "key", "n", "bytes_per_image", "whole")

    def __init__(self, device: torch.device, key: Hashable, n: int, bytes_per_image: int):
        self.device, self.key, self.n, self.bytes_per_image = device, key, n, bytes_per_image
        self.whole = n == 1

    def run(self, produce: Callable[[int, int], torch.Tensor],
            consume: Callable[[torch.Tensor, int, int], None]) -> None:
        run(self.device, self.key, self.n, self.bytes_per_image, produce, consume)
        chosen = _chosen.get(self.key)
        if chosen is not None:
            self.whole = len(_chunks_kept(self.n, self.bytes_per_image, chosen[0])) == 1


def describe() -> list:
    """(problem key, chunk bytes, overlap, ms) of every schedule chosen so far."""
    return [(key, c, o, ms) for key, (c, o, ms) in list(_chosen.items())]
