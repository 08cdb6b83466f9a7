"""Batch chunking for the fallbacks: conv of a chunk of images, then the epilogue kernel of that chunk.

Two ways to gain over one conv + one epilogue: small chunks (tens of MB of conv output) keep the intermediate in
L2 between the conv and the epilogue, and re-use the same buffer so it need never reach HBM; larger chunks on two
streams let the epilogue of chunk i overlap the conv of chunk i+1.  Which wins depends on the GPU and the problem,
so the first call for a problem times a few schedules once and keeps the fastest (not under CUDA-graph capture,
where the default is used).  Smaller chunks also cut the peak extra memory.
"""
from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch

CHUNK_BYTES = 256 << 20     # default schedule: chunks of this much conv output ...
OVERLAP = True              # ... with the epilogue on a side stream
AUTOTUNE = True
CANDIDATES = ((24 << 20, False), (48 << 20, False), (96 << 20, True), (256 << 20, True), (1 << 62, False))

_side_streams: Dict[int, torch.cuda.Stream] = {}
_chosen: Dict[Hashable, Tuple[int, bool, float]] = {}


def chunks(n: int, bytes_per_image: int, chunk_bytes: Optional[int] = None) -> List[Tuple[int, int]]:
    """Even split of range(n) into chunks of at most ~chunk_bytes of conv output (at least one image each)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    count = max(1, min(n, -(-n * bytes_per_image // chunk_bytes)))
    bounds = [round(i * n / count) for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(count) if bounds[i + 1] > bounds[i]]


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side_streams:
        _side_streams[index] = torch.cuda.Stream(device=index)
    return _side_streams[index]


def _execute(device, spans, overlap, produce, consume) -> None:
    if len(spans) == 1 or not overlap:
        for n0, n1 in spans:
            consume(produce(n0, n1), n0, n1)
        return
    main, side = torch.cuda.current_stream(device), _side_stream(device)
    for n0, n1 in spans:
        y = produce(n0, n1)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            consume(y, n0, n1)
        y.record_stream(side)
    main.wait_stream(side)


def _time(fn) -> float:
    fn()                                            # warm-up: cuDNN plan choice for this chunk size happens here
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(2):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def run(device: torch.device, key: Hashable, n: int, bytes_per_image: int,
        produce: Callable[[int, int], torch.Tensor], consume: Callable[[torch.Tensor, int, int], None]) -> None:
    """For each chunk [n0, n1): y = produce(n0, n1), then consume(y, n0, n1), on the schedule chosen for key."""
    if key in _chosen:
        chunk_bytes, overlap, _ = _chosen[key]
    elif AUTOTUNE and n > 1 and not torch.cuda.is_current_stream_capturing():
        timed = []
        for chunk_bytes, overlap in CANDIDATES:
            spans = chunks(n, bytes_per_image, chunk_bytes)
            ms = _time(lambda: _execute(device, spans, overlap, produce, consume))  # noqa: B023
            timed.append((ms, chunk_bytes, overlap))
        ms, chunk_bytes, overlap = min(timed)
        _chosen[key] = (chunk_bytes, overlap, ms)
        return                                      # every candidate computed the full result
    else:
        chunk_bytes, overlap = CHUNK_BYTES, OVERLAP
    _execute(device, chunks(n, bytes_per_image, chunk_bytes), overlap, produce, consume)


def describe() -> list:
    """(problem key, chunk bytes, overlap, ms) of every schedule chosen so far."""
    return [(key, c, o, ms) for key, (c, o, ms) in _chosen.items()]
