"""Family A fused kernel (csrc/fused_conv_act_pool.cu): implicit-GEMM conv whose epilogue adds the bias, applies
the activation and reduces per (image, channel); only (N, C_out) values leave the chip."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import launch, workspace
from ..codes import ACTIVATIONS, POOLS, PRECISIONS, dtype_code
from ..spec import ConvActPoolSpec
from ..weights import as_memory_format, float32_bias

LIB = "fused_conv_act_pool"


def static_unsupported(spec: ConvActPoolSpec) -> Optional[str]:
    """Why the fused kernel can never serve this spec (None if it may, depending on the input)."""
    if spec.groups != 1:
        return "groups != 1"
    if spec.padding_mode != "zeros":
        return f"padding_mode={spec.padding_mode!r}"
    return None


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _kernel_layout(x: torch.Tensor) -> Tuple[bool, int]:
    """(copy x first, channels_last): the layout the kernel reads x in — its own (NCHW / NCDHW or channels_last), else
    a contiguous copy.  A channels_last(_3d) input that only the per-element loader would read — a Conv3d's, or a
    Conv2d's with fewer than 8 channels — is copied to NCHW / NCDHW when its rows suit the TMA / 16-byte loaders there
    (W % 4 fp32, % 8 16-bit): the copy (one read and write of the input, which the call then holds as extra memory)
    costs far less than the per-element loader (benchmarks/NOTES.md runs 28, 29)."""
    if x.is_contiguous():
        return False, 0
    if x.is_contiguous(memory_format=_CHANNELS_LAST[x.dim()]):
        rows_suit = x.shape[-1] % (4 if x.dtype == torch.float32 else 8) == 0
        if rows_suit and (x.dim() == 5 or x.shape[1] < 8):
            return True, 0
        return False, 1
    return True, 0


def _problem(spec, x, mode, deterministic) -> Tuple[bool, tuple]:
    """(copy x first (_kernel_layout), the C API's problem): the Conv2d's (rows, columns) and, for a Conv3d, its depth
    in the last five (D = 0: none), in the layout the kernel reads x in."""
    copy, channels_last = _kernel_layout(x)
    n, c, *space = x.shape
    k, s, p, d = spec.kernel_size, spec.stride, spec.padding, spec.dilation
    depth = (space[0], k[0], s[0], p[0], d[0]) if spec.dims == 3 else (0, 1, 1, 0, 1)
    h, w = space[-2:]
    precision = PRECISIONS.get(mode, 0)
    return copy, (dtype_code(x.dtype), channels_last, n, c, h, w, spec.out_channels, *k[-2:], *s[-2:], *p[-2:], *d[-2:],
                  ACTIVATIONS[spec.activation], POOLS[spec.pool], precision, int(deterministic), *depth)


def unsupported(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool) -> Optional[str]:
    """Why the fused kernel cannot serve this call (None if it can)."""
    reason = static_unsupported(spec)
    if reason:
        return reason
    try:
        why = launch.call(LIB, "ff_fused_conv_act_pool_unsupported", *_problem(spec, x, mode, deterministic)[1],
                          device=x.device)
    except Exception as exc:  # no nvcc and no cached build, or a build failure
        return f"fused kernel unavailable: {str(exc).splitlines()[0]}"
    return None if why is None else why.decode()


def kernel(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool) -> str:
    """Which kernel serves this call, in words (``unsupported`` said one does)."""
    copy, args = _problem(spec, x, mode, deterministic)
    text = launch.call(LIB, "ff_fused_conv_act_pool_kernel", *args, device=x.device)
    return (text.decode() if text else "fused kernel") + (", on a contiguous copy of the input" if copy else "")


def prepare(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool):
    """The call for inputs like ``x`` (dtype, shape, strides, device), everything that depends only on those worked
    out once: returns ``run(x, weight, bias) -> out`` (host time per call)."""
    copy, args = _problem(spec, x, mode, deterministic)
    n, k, dtype, device = x.shape[0], spec.out_channels, x.dtype, x.device
    # the atomic mean accumulates into out; every other mode writes each element once
    atomic = spec.pool == "mean" and not deterministic
    shape = (n, k, *([1] * spec.dims)) if spec.keepdim else (n, k)
    ws_bytes = workspace.nbytes(device, LIB, "ff_fused_conv_act_pool_workspace_bytes", args)

    call = launch.launcher(LIB, "ff_fused_conv_act_pool", device, args, 4)   # x, w, bias, out, args, workspace

    def run(x, weight, bias):
        if copy:
            x = x.contiguous()
        out = torch.zeros(n, k, dtype=torch.float32, device=device) if atomic else launch.new_output(n, k, device=device)
        # every tensor the kernel reads is held by a name until the launch is enqueued
        weight, bias = as_memory_format(weight, torch.contiguous_format), float32_bias(bias)
        ws = workspace.zeroed(device, ws_bytes)
        call(x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
             0 if ws is None else ws.data_ptr())
        return out.to(dtype).view(shape)
    return run
