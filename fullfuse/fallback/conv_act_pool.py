"""Family A fallback: cuDNN conv (channels_last, precision as selected; cuDNN's fastest plan through the cuDNN
frontend where available, else PyTorch's call) -> csrc/fallback_act_pool.cu, which adds
the bias, applies the activation and pools per (image, channel) in one read of the conv output.  The batch runs
in chunks so that the epilogue of one chunk overlaps the convolution of the next (pipeline.py).

``unavailable()`` says (once per process) whether the epilogue library can be loaded here; the dispatcher steps
down to the torch path under "auto", or raises UnsupportedError for path="fallback", where it cannot."""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from .. import launch
from ..codes import ACTIVATIONS, POOLS, dtype_code
from ..errors import UnsupportedError
from ..precision import cudnn_settings
from ..spec import ConvActPoolSpec
from ..weights import as_memory_format, float32_bias
from . import cudnn_conv, pipeline

LIB = "fallback_act_pool"
_CONV = {2: F.conv2d, 3: F.conv3d}
CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}
_reasons: Dict[str, Optional[str]] = {}   # library -> why it cannot be loaded (None: it loads)


def library_unavailable(lib: str) -> Optional[str]:
    """None if the kernel library ``lib`` loads (compiled first where nvcc is present) and exports its API; else the
    reason in one line, with the fix.  Decided once per process (a missing compiler is not looked for again on every
    call); never raises."""
    if lib not in _reasons:
        try:
            for name in launch.SIGNATURES[lib]:
                launch.function(lib, name)
            reason = None
        except Exception as exc:  # BuildError (no nvcc, unwritable cache, failed compile, no load), missing symbol
            first = str(exc).strip().splitlines()
            reason = f"fallback kernel library {lib} unavailable: {first[0] if first else type(exc).__name__}"
        _reasons.setdefault(lib, reason)   # two threads may both try; the first answer stays
    return _reasons[lib]


def unavailable() -> Optional[str]:
    """None if the family-A fallback can run here (its epilogue library loads); else why, in one line."""
    return library_unavailable(LIB)


def require(reason: Optional[str]) -> None:
    if reason is not None:
        raise UnsupportedError(f"fullfuse: the fallback path cannot serve this call: {reason}")


def layout_of(y: torch.Tensor, dims: int):
    """Return (tensor, channels_last flag) with y in a layout the epilogue kernels read directly."""
    if y.is_contiguous(memory_format=CHANNELS_LAST[dims]):
        return y, 1
    return y.contiguous(), 0


def epilogue(spec: ConvActPoolSpec, y: torch.Tensor, bias, out: torch.Tensor) -> None:
    """out[n, k] = pool over space of act(y[n, k, ...] + bias[k]); y is the bias-free conv output."""
    y, channels_last = layout_of(y, spec.dims)
    n, k = y.shape[:2]
    s = math.prod(y.shape[2:])
    ws_bytes = launch.call(LIB, "ff_act_pool_workspace_bytes", n, k, s, channels_last)
    workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=y.device) if ws_bytes else None
    launch.launch(LIB, "ff_act_pool", y, dtype_code(y.dtype), float32_bias(bias), out, n, k, s, channels_last,
                  ACTIVATIONS[spec.activation], POOLS[spec.pool], workspace, device=y.device)


def run(spec: ConvActPoolSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str,
        deterministic: bool = True) -> torch.Tensor:
    require(unavailable())
    memory_format = CHANNELS_LAST[spec.dims]
    w = as_memory_format(weight, memory_format)
    bias = float32_bias(bias)   # made here, on the current stream, not on the pipeline's side stream
    n, k = x.shape[0], spec.out_channels
    out = launch.new_output(n, k, device=x.device)

    def conv(n0, n1):
        xi = x[n0:n1].contiguous(memory_format=memory_format)
        y = cudnn_conv.conv_forward(spec, xi, w, mode, deterministic)   # cuDNN's fastest plan, timed once
        if y is None:
            with cudnn_settings(mode, deterministic):
                y = _CONV[spec.dims](xi, w, None, spec.stride, spec.padding, spec.dilation)
        return y

    per_image = k * math.prod(spec.output_spatial(tuple(x.shape[2:]))) * x.element_size()
    key = (spec, tuple(x.shape), x.dtype, x.device, x.is_contiguous(), mode, deterministic)
    pipeline.run(x.device, key, n, per_image, conv, lambda y, n0, n1: epilogue(spec, y, bias, out[n0:n1]))
    out = out.to(x.dtype)
    return out.view(n, k, *([1] * spec.dims)) if spec.keepdim else out
