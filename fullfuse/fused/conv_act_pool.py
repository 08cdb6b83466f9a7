"""Family A fused kernel (csrc/fused_conv_act_pool.cu): implicit-GEMM conv whose epilogue adds the bias, applies
the activation and reduces per (image, channel); only (N, C_out) values leave the chip."""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Optional

import torch

from .. import launch
from ..codes import ACTIVATIONS, POOLS, PRECISIONS, dtype_code
from ..spec import ConvActPoolSpec
from ..weights import float32_bias

LIB = "fused_conv_act_pool"


def static_unsupported(spec: ConvActPoolSpec) -> Optional[str]:
    """Why the fused kernel can never serve this spec (None if it may, depending on the input)."""
    if spec.dims != 2:
        return "the fused kernel covers Conv2d only; Conv3d runs the fallback"
    if spec.groups != 1:
        return "groups != 1"
    if spec.padding_mode != "zeros":
        return f"padding_mode={spec.padding_mode!r}"
    return None


def _layout(x: torch.Tensor):
    if x.is_contiguous():
        return x, 0
    if x.is_contiguous(memory_format=torch.channels_last):
        return x, 1
    return x.contiguous(), 0


def _shape_args(spec, x, channels_last, mode, deterministic):
    n, c, h, w = x.shape
    precision = PRECISIONS.get(mode, 0)
    return (dtype_code(x.dtype), channels_last, n, c, h, w, spec.out_channels, *spec.kernel_size, *spec.stride,
            *spec.padding, *spec.dilation, ACTIVATIONS[spec.activation], POOLS[spec.pool], precision, int(deterministic))


def unsupported(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool) -> Optional[str]:
    """Why the fused kernel cannot serve this call (None if it can)."""
    reason = static_unsupported(spec)
    if reason:
        return reason
    try:
        why = launch.call(LIB, "ff_fused_conv_act_pool_unsupported", *_shape_args(spec, x, _layout(x)[1], mode, deterministic))
    except Exception as exc:  # no nvcc and no cached build, or a build failure
        return f"fused kernel unavailable: {str(exc).splitlines()[0]}"
    return None if why is None else why.decode()


_workspaces: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()   # (device, stream, problem) -> workspace, LRU
_MAX_WORKSPACES = 16


@functools.lru_cache(maxsize=4096)
def _workspace_bytes(args: tuple) -> int:
    """Workspace bytes of one problem (the host plan runs once per problem, not per call)."""
    return launch.call(LIB, "ff_fused_conv_act_pool_workspace_bytes", *args)


def _workspace(device: torch.device, args: tuple, nbytes: int) -> Optional[torch.Tensor]:
    """The kernel's counters / partials buffer, zeroed once.  The kernels leave the parts that must start at zero
    (per-image counters, max slots) at zero when they finish, so a buffer kept per (stream, problem) serves every
    later call of that problem on that stream in stream order.  Per problem, because the layout (where counters end
    and partials begin) depends on it.  While a CUDA graph is being captured a fresh buffer is made (the graph keeps
    it)."""
    if not nbytes:
        return None
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream, args)
    buf = _workspaces.get(key)
    if buf is None:
        buf = _workspaces[key] = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        if len(_workspaces) > _MAX_WORKSPACES:
            _workspaces.popitem(last=False)
    else:
        _workspaces.move_to_end(key)
    return buf


def run(spec: ConvActPoolSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str, deterministic: bool) -> torch.Tensor:
    x, channels_last = _layout(x)
    args = _shape_args(spec, x, channels_last, mode, deterministic)
    n, k = x.shape[0], spec.out_channels
    # the atomic mean accumulates into out; every other mode writes each element once
    atomic = spec.pool == "mean" and not deterministic
    out = torch.zeros(n, k, dtype=torch.float32, device=x.device) if atomic else launch.new_output(n, k, device=x.device)
    launch.launch(LIB, "ff_fused_conv_act_pool", x, weight.contiguous(), float32_bias(bias), out, *args,
                  _workspace(x.device, args, _workspace_bytes(args)), device=x.device)
    out = out.to(x.dtype)
    return out.view(n, k, 1, 1) if spec.keepdim else out
