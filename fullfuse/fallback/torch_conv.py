"""PyTorch's own cuDNN convolution for the fallbacks, with their precision and determinism passed as arguments.

``F.convNd`` / ``F.conv_transposeNd`` on a CUDA float input reach ``torch.cudnn_convolution(_transpose)`` (aten's
``_convolution`` lays the input out as cuDNN suggests and passes torch's process-wide cuDNN flags); the fallbacks need
their own precision ("tf32" / "ieee") and cuDNN's deterministic algorithms, which through ``F.convNd`` means changing
those process-wide flags under a lock around the call.  Calling the cuDNN op directly with the flags as arguments gives
the same algorithm choice and the same bits (tests/test_torch_conv.py compares them on the GPU), changes nothing global,
holds no lock, and skips ``_convolution``'s dispatch: less host time per call.

Invariants:
- The direct op serves only where ``F.convNd`` would pick cuDNN for the same operands: cuDNN enabled now (read per
  call: a user may switch it) and every image's input and output under 2^31 elements (past that aten runs its own
  64-bit-index kernels).  Elsewhere the call is ``F.convNd`` under ``precision.cudnn_settings``.
- Torch's current benchmark flag and deterministic switches are read per call and passed on, as ``F.convNd`` would;
  ``deterministic`` only ever adds cuDNN's deterministic algorithms.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from ..precision import cudnn_settings
from ..torch_path import CONV, CONV_T

_INT_MAX = 2 ** 31 - 1
_cudnn_enabled = getattr(torch._C, "_get_cudnn_enabled", lambda: torch.backends.cudnn.enabled)
_benchmark = getattr(torch._C, "_get_cudnn_benchmark", lambda: torch.backends.cudnn.benchmark)
_deterministic_cudnn = getattr(torch._C, "_get_cudnn_deterministic", lambda: torch.backends.cudnn.deterministic)
_deterministic_algorithms = getattr(torch._C, "_get_deterministic_algorithms",
                                    torch.are_deterministic_algorithms_enabled)


def _direct_ok(image_in: int, image_out: int) -> bool:
    """Whether cuDNN serves this problem through the direct op at all (its elements per image; see the invariants)."""
    return (image_in <= _INT_MAX and image_out <= _INT_MAX and torch.backends.cudnn.is_available()
            and hasattr(torch, "cudnn_convolution") and hasattr(torch, "cudnn_convolution_transpose"))


def conv(dims: int, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], mode: str,
         deterministic: bool, image_in: int, image_out: int,
         output_padding: Optional[Sequence[int]] = None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(x, weight) -> y``: PyTorch's bias-free cuDNN conv of rank ``dims`` (transposed where ``output_padding`` is
    given) in ``mode`` ("tf32" / "ieee" for float32; 16-bit modes compute in their dtype), with cuDNN's deterministic
    algorithms where ``deterministic``.  ``image_in`` / ``image_out``: elements of one image's input and output (of
    the largest chunk a caller runs)."""
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    transposed = output_padding is not None
    if transposed:
        output_padding = tuple(output_padding)
        torch_fn, torch_args = CONV_T[dims], (stride, padding, output_padding, 1, dilation)
    else:
        torch_fn, torch_args = CONV[dims], (stride, padding, dilation)
    allow_tf32 = mode != "ieee"   # (only float32 reads it: 16-bit inputs compute in their dtype)

    def through_flags(x, weight):
        with cudnn_settings(mode, deterministic):
            return torch_fn(x, weight, None, *torch_args)

    if not _direct_ok(image_in, image_out):
        return through_flags
    cudnn_convolution, cudnn_convolution_transpose = torch.cudnn_convolution, torch.cudnn_convolution_transpose

    def direct(x, weight):
        if not _cudnn_enabled():
            return through_flags(x, weight)
        exact = deterministic or _deterministic_cudnn() or _deterministic_algorithms()
        if transposed:
            return cudnn_convolution_transpose(x, weight, padding, output_padding, stride, dilation, 1, _benchmark(),
                                               exact, allow_tf32)
        return cudnn_convolution(x, weight, padding, stride, dilation, 1, _benchmark(), exact, allow_tf32)
    return direct


def image_elements(shape: Sequence[int]) -> int:
    """Elements of one image of a batched (N, C, ...) shape."""
    return math.prod(shape[1:])
