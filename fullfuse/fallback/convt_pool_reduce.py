"""Family B fallback: the transposed conv through cuDNN (its best plan via the cuDNN frontend where available,
else PyTorch's call) -> csrc/fallback_window_reduce.cu, which takes the composed max window over only the needed
region, adds the bias after the max and reduces over channels, in one read."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import launch
from ..codes import ACTIVATIONS, REDUCTIONS, dtype_code
from ..precision import cudnn_conv_precision
from ..spec import ConvTPoolReduceSpec
from ..weights import as_memory_format, float32_bias
from . import cudnn_dgrad
from .conv_act_pool import CHANNELS_LAST

LIB = "fallback_window_reduce"
_CONV_T = {2: F.conv_transpose2d, 3: F.conv_transpose3d}


def transposed_conv(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, mode: str) -> torch.Tensor:
    memory_format = CHANNELS_LAST[spec.dims]
    x = x.contiguous(memory_format=memory_format)
    weight = as_memory_format(weight, memory_format)
    y = cudnn_dgrad.conv_transpose(spec, x, weight, mode)
    if y is None:
        with cudnn_conv_precision(mode):
            y = _CONV_T[spec.dims](x, weight, None, spec.stride, spec.padding, spec.output_padding, 1, spec.dilation)
    return y


def run(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str) -> torch.Tensor:
    y = transposed_conv(spec, x, weight, mode)
    if spec.dims == 2:
        y = y.unsqueeze(2)                                   # (N, K, 1, H, W): 2-D as depth 1
    window = (1,) * (3 - spec.dims) + tuple(spec.window)
    n, k, d, h, w = y.shape
    pooled = [d // window[0], h // window[1], w // window[2]]
    out = launch.new_output(n, *pooled, device=x.device)
    launch.launch(LIB, "ff_window_reduce", y, dtype_code(y.dtype), float32_bias(bias), out, n, k, d, h, w,
                  *y.stride(), *window, ACTIVATIONS[spec.activation], REDUCTIONS[spec.reduction], device=x.device)
    out = out.to(x.dtype)
    if spec.dims == 2:
        out = out.squeeze(1)
    return out.unsqueeze(1) if spec.keepdim else out
