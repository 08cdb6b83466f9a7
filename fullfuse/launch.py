"""What every kernel call needs from torch: output buffers, the input's device made current where it is not, its
current stream, and whether that stream is being captured into a CUDA graph.  Kernels themselves are compiled,
loaded and launched by ``runtime``.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

# Tests and `fullfuse check` set this (or FULLFUSE_POISON_OUTPUTS=1): kernel outputs then start as NaN, so an
# element a kernel fails to write cannot pass as a plausible value.
POISON_OUTPUTS = os.environ.get("FULLFUSE_POISON_OUTPUTS", "0") == "1"


def new_output(like: torch.Tensor, shape, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A buffer of ``shape`` on ``like``'s device, in its dtype unless told, for a kernel to write completely
    (host time per call: ``Tensor.new_empty`` is given no keyword where the dtype is ``like``'s, and the sizes go as
    separate ints, which torch parses ~0.5 us faster than one tuple)."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype or like.dtype, device=like.device)
    sizes = shape or size_args(shape)
    return like.new_empty(*sizes) if dtype is None or dtype is like.dtype else like.new_empty(*sizes, dtype=dtype)


def size_args(shape) -> tuple:
    """``shape`` as the positional arguments of torch's calls that take sizes (``torch.zeros``, ``Tensor.view``...):
    its ints, separately (~0.5 us of host time less than one tuple); a 0-d shape as one empty tuple (those calls
    reject no sizes at all: a squeezed (1, 1) output is 0-d)."""
    return tuple(shape) if len(shape) else ((),)


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is being captured into a CUDA graph."""
    return capturing_index(device_index(device))


_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)   # CUDA builds: one C call


def capturing_index(index: int) -> bool:
    """Whether device ``index``'s current stream is being captured."""
    return stream_and_capturing(index)[1]


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # CUDA builds of torch: one C call each
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_fast_getters = None not in (_raw_stream, _is_capturing, _get_device)


def stream_and_capturing(index: int):
    """(cudaStream_t of device ``index``'s current stream, whether it is being captured): what a call's launches and
    its kept buffers depend on, read together (one device check: host time)."""
    if _fast_getters and index == _get_device():
        return _raw_stream(index), _is_capturing()
    with torch.cuda.device(index):   # (the capture query reads the current device's stream)
        return torch.cuda.current_stream(index).cuda_stream, torch.cuda.is_current_stream_capturing()


def _current_device() -> int:
    return torch.cuda.current_device()


# the current device's index: torch's own C getter where it has one (no Python frame: host time per launch)
current_device_index = _get_device if _get_device is not None else _current_device


def device_index(device: torch.device) -> int:
    """``device``'s index ("cuda" without one: the current device)."""
    return device.index if device.index is not None else current_device_index()


def current_stream(device: torch.device) -> int:
    """The cudaStream_t of ``device``'s current stream (host time: torch's own C getter where it has one)."""
    return stream_of(device_index(device))


def stream_of(index: int) -> int:
    """The cudaStream_t of device ``index``'s current stream."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream
