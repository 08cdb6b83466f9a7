"""Batch chunking with overlap: the convolution of chunk i+1 (cuDNN, arithmetic-bound) runs on the caller's stream
while the epilogue kernel of chunk i (memory-bound) runs on a side stream.  Each chunk's conv output is a few
hundred MB instead of the whole intermediate, so the peak extra memory drops too."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

CHUNK_BYTES = 256 << 20     # conv output per chunk
OVERLAP = True              # epilogue on a side stream; False: both on the caller's stream, one after the other
_side_streams: Dict[int, torch.cuda.Stream] = {}


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


def run_chunked(device: torch.device, spans: List[Tuple[int, int]],
                produce: Callable[[int, int], torch.Tensor], consume: Callable[[torch.Tensor, int, int], None]) -> None:
    """For each span: y = produce(n0, n1) on the current stream, then consume(y, n0, n1) on a side stream."""
    if len(spans) == 1 or not OVERLAP:
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
