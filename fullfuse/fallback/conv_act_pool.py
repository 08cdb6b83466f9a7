"""Family A fallback: cuDNN conv (channels_last, precision as selected) -> csrc/fallback_act_pool.cu, which adds
the bias, applies the activation and pools per (image, channel) in one read of the conv output."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import launch
from ..codes import ACTIVATIONS, POOLS, dtype_code
from ..precision import cudnn_conv_precision
from ..spec import ConvActPoolSpec
from ..weights import as_memory_format, float32_bias

LIB = "fallback_act_pool"
_CONV = {2: F.conv2d, 3: F.conv3d}
CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}


def layout_of(y: torch.Tensor, dims: int):
    """Return (tensor, channels_last flag) with y in a layout the epilogue kernels read directly."""
    if y.is_contiguous(memory_format=CHANNELS_LAST[dims]):
        return y, 1
    return y.contiguous(), 0


def run(spec: ConvActPoolSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str) -> torch.Tensor:
    memory_format = CHANNELS_LAST[spec.dims]
    with cudnn_conv_precision(mode):
        y = _CONV[spec.dims](x.contiguous(memory_format=memory_format), as_memory_format(weight, memory_format),
                             None, spec.stride, spec.padding, spec.dilation)
    y, channels_last = layout_of(y, spec.dims)
    n, k = y.shape[:2]
    s = math.prod(y.shape[2:])
    out = launch.new_output(n, k, device=x.device)
    ws_bytes = launch.call(LIB, "ff_act_pool_workspace_bytes", n, k, s, channels_last)
    workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=x.device) if ws_bytes else None
    launch.launch(LIB, "ff_act_pool", y, dtype_code(y.dtype), float32_bias(bias), out, n, k, s, channels_last,
                  ACTIVATIONS[spec.activation], POOLS[spec.pool], workspace, device=x.device)
    out = out.to(x.dtype)
    return out.view(n, k, *([1] * spec.dims)) if spec.keepdim else out
