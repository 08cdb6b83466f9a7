"""Family B fallback: the transposed conv through cuDNN, then csrc/fallback_window_reduce.cu, which takes the
composed max window over only the needed region, adds the bias after the max and reduces over channels, in one
read.  The transposed conv is cuDNN's best plan through the cuDNN frontend where available; else, for float32,
sub-pixel forward convolutions (subpixel.py); else PyTorch's own call.  The batch runs in overlapping chunks.

``unavailable()`` says (once per process) whether the epilogue library can be loaded here; the dispatcher steps
down to the torch path under "auto", or raises UnsupportedError for path="fallback", where it cannot."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from .. import launch
from ..codes import ACTIVATIONS, REDUCTIONS, dtype_code
from ..precision import cudnn_settings
from ..spec import ConvTPoolReduceSpec
from ..weights import as_memory_format, float32_bias
from . import cudnn_conv, pipeline, subpixel
from .conv_act_pool import CHANNELS_LAST, library_unavailable, require

LIB = "fallback_window_reduce"
_CONV_T = {2: F.conv_transpose2d, 3: F.conv_transpose3d}


def unavailable() -> Optional[str]:
    """None if the family-B fallback can run here (its epilogue library loads); else why, in one line."""
    return library_unavailable(LIB)


def transposed_conv(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, mode: str,
                    deterministic: bool = True) -> torch.Tensor:
    """The bias-free transposed conv output, channels_last(_3d) where cuDNN gives it so."""
    memory_format = CHANNELS_LAST[spec.dims]
    x = x.contiguous(memory_format=memory_format)
    y = cudnn_conv.conv_transpose(spec, x, weight, mode, deterministic)
    if y is not None:
        return y
    with cudnn_settings(mode, deterministic):
        if x.dtype == torch.float32 and all(d == 1 for d in spec.dilation):
            return subpixel.conv_transpose(x, weight, spec.stride, spec.padding, spec.output_padding)
        return _CONV_T[spec.dims](x, weight, None, spec.stride, spec.padding, spec.output_padding, 1, spec.dilation)


def epilogue(spec: ConvTPoolReduceSpec, y: torch.Tensor, bias, out: torch.Tensor) -> None:
    """out[n, (d,) h, w] = reduce over k of max over the window of y (+ bias, activation as the spec says)."""
    if spec.dims == 2:
        y, out = y.unsqueeze(2), out.unsqueeze(1)            # 2-D as depth 1
    window = (1,) * (3 - spec.dims) + tuple(spec.window)
    n, k, d, h, w = y.shape
    launch.launch(LIB, "ff_window_reduce", y, dtype_code(y.dtype), float32_bias(bias), out, n, k, d, h, w,
                  *y.stride(), *window, ACTIVATIONS[spec.activation], REDUCTIONS[spec.reduction], device=y.device)


def run(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str,
        deterministic: bool = True) -> torch.Tensor:
    require(unavailable())
    weight = as_memory_format(weight, CHANNELS_LAST[spec.dims])
    bias = float32_bias(bias)   # made here, on the current stream, not on the pipeline's side stream
    n = x.shape[0]
    conv_out = spec.conv_output_spatial(tuple(x.shape[2:]))
    pooled = spec.pooled_spatial(tuple(x.shape[2:]))
    out = launch.new_output(n, *pooled, device=x.device)
    per_image = spec.out_channels * math.prod(conv_out) * x.element_size()
    key = (spec, tuple(x.shape), x.dtype, x.device, x.is_contiguous(), mode, deterministic)
    pipeline.run(x.device, key, n, per_image,
                 lambda n0, n1: transposed_conv(spec, x[n0:n1], weight, mode, deterministic),
                 lambda y, n0, n1: epilogue(spec, y, bias, out[n0:n1]))
    out = out.to(x.dtype)
    return out.unsqueeze(1) if spec.keepdim else out
