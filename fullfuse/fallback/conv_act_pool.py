"""Family A fallback: cuDNN conv (precision as selected; cuDNN's fastest plan through the cuDNN frontend on
channels_last operands where it beats PyTorch's own call, else PyTorch's call) -> the epilogue kernel of
csrc/fallback_act_pool.cuh, which adds the bias, applies the activation and pools per (image, channel) in one read of
the conv output.  The batch runs in chunks so that the epilogue of one chunk overlaps the convolution of the next
(pipeline.py).

``unavailable()`` says (once per process and device) whether the epilogue kernels can be had here (cached or
compiled with NVRTC); the dispatcher steps down to the torch path under "auto", or raises UnsupportedError for
path="fallback", where they cannot."""
from __future__ import annotations

import math
from typing import Optional

import torch

from cutlass_ops import fallback as kernels

from .. import launch, workspace
from ..codes import ACTIVATIONS, DTYPES, POOLS, dtype_code
from ..errors import UnsupportedError
from ..spec import ConvActPoolSpec
from ..weights import float32_bias
from . import cudnn_conv, epilogue_launch, epilogue_plan, pipeline, torch_conv
from .epilogue_launch import POINTER, PreparedLaunch

CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}
# the instantiation whose availability stands for all of the family's (they differ in template arguments only)
PROBE = kernels.pool_rows(DTYPES["float32"], ACTIVATIONS["gelu_erf"], POOLS["mean"], True)


def unavailable() -> Optional[str]:
    """None if the family-A fallback can run here (its epilogue kernels can be had); else why, in one line."""
    return epilogue_launch.unavailable(PROBE)


def require(reason: Optional[str]) -> None:
    if reason is not None:
        raise UnsupportedError(f"fullfuse: the fallback path cannot serve this call: {reason}")


class _ActPool:
    """The epilogue launch of one conv output (shape, strides, dtype, alignment) of a signature; ``launch`` None where
    the kernels read neither its layout nor its address (its contiguous copy is launched then)."""

    def __init__(self, y: torch.Tensor, spec: ConvActPoolSpec, f16_range: bool, device: int):
        self.launch = None
        channels_last = y.is_contiguous(memory_format=CHANNELS_LAST[spec.dims])
        if not (channels_last or y.is_contiguous()):
            return
        n, k = y.shape[:2]
        dtype = kernels.F16_RANGE if f16_range else dtype_code(y.dtype)
        plan = epilogue_plan.act_pool(n, k, math.prod(y.shape[2:]), channels_last, dtype,
                                      ACTIVATIONS[spec.activation], POOLS[spec.pool], y.data_ptr() % 16 == 0)
        args = (POINTER, POINTER, POINTER, *[ty(v) for ty, v in plan.scalars], POINTER, POINTER)
        self.launch = PreparedLaunch(plan.variant, device, plan.grid, epilogue_plan.THREADS, 0, args)
        self.buffers = ((plan.partials_offset, workspace.ZEROED),
                        (plan.workspace_bytes - plan.partials_offset, workspace.PARTIALS))


class Epilogue:
    """``epilogue(y, bias, out, f16_range=False)``: out[n, k] = pool over space of act(y[n, k, ...] + bias[k]) on the
    current stream of device ``device``, where y, the bias-free conv output, lies (channels_last or contiguous as it
    is, else copied contiguous); bias float32 (float32_bias) or None, out float32 and contiguous, (N, K) or (N, K, 1,
    ...).  f16_range: y is the float32 conv output of an fp16 model, and y + bias gets fp16's overflow (+-inf past
    65504) as PyTorch's fp16 conv.  One per fallback signature: its launches are prepared per conv output (shape,
    strides, dtype, address alignment, f16_range) and found by those alone (host time per call: the spec and device
    are its own)."""

    def __init__(self, spec: ConvActPoolSpec, device: int):
        self.spec, self.device = spec, device
        self._launches = epilogue_launch.Prepared()

    def __call__(self, y: torch.Tensor, bias, out: torch.Tensor, f16_range: bool = False) -> None:
        y_ptr = y.data_ptr()
        key = (y.shape, y.stride(), y.dtype, y_ptr % 16, f16_range)
        op = self._launches.get(key)
        if op is None:
            op = self._launches.keep(key, _ActPool(y, self.spec, f16_range, self.device))
        if op.launch is None:
            return self(y.contiguous(), bias, out, f16_range)
        # the counters in the zeroed buffer (the kernel leaves them zero), the partials in a scratch buffer
        # (workspace.py); held by this name until the launch is enqueued
        stream, kept = workspace.for_launch(self.device, op.buffers)
        op.launch(y_ptr, 0 if bias is None else bias.data_ptr(), out.data_ptr(), *kept.pointers, stream=stream)


def prepare(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool = True):
    """The fallback's call for inputs like ``x`` (dtype, shape, strides, device), what depends only on those worked out
    once (host time per call): returns ``run(x, weight, bias) -> out``.  Raises UnsupportedError where the epilogue
    kernels cannot be had here."""
    require(unavailable())
    n, k, dtype, device = x.shape[0], spec.out_channels, x.dtype, x.device
    # fp16: cuDNN writes the conv output in float32, and the epilogue gives it fp16's overflow.  Some of cuDNN's
    # fp16-output engines write finite values where the sum overflows fp16 (PyTorch's own NCHW call gives +-inf).
    f16 = dtype == torch.float16
    conv_dtype = torch.float32 if f16 else None
    spatial = spec.output_spatial(tuple(x.shape[2:]))
    per_image = k * math.prod(spatial) * (4 if f16 else x.element_size())
    schedule = pipeline.Schedule(device, (spec, tuple(x.shape), dtype, device, x.is_contiguous(), mode,
                                          deterministic), n, per_image)
    shape = spec.output_shape(n)
    # out is made in the returned shape where that is (N, K, 1, ...): the same bytes as (N, K), and no view per call
    made = shape if tuple(shape[:2]) == (n, k) else (n, k)
    reshape = made != shape
    view_sizes = launch.size_args(shape)
    # cuDNN's fastest plan (channels_last operands), timed once per problem; else PyTorch's own call on the operands as
    # the caller has them (where it costs no more per call, or without the frontend)
    torch_call = torch_conv.conv(spec.dims, spec.stride, spec.padding, spec.dilation, mode, deterministic,
                                 torch_conv.image_elements(x.shape), k * math.prod(spatial))
    convs = cudnn_conv.forward_convs(spec, mode, deterministic, conv_dtype, torch_call,
                                     lambda rows: (rows, k, *spatial))
    epilogue = Epilogue(spec, launch.device_index(device))
    whole = (0, n)

    def conv(x, weight, rows):
        y = None if convs is None else convs(x, weight, rows)
        return torch_call(x, weight) if y is None or y is cudnn_conv.TORCH_CALL else y

    def run(x, weight, bias):
        bias = float32_bias(bias)   # made here, on the current stream, not on the pipeline's side stream
        out = launch.new_output(x, made, torch.float32)   # (the epilogue writes float32)
        if schedule.whole:
            y = conv(x, weight, whole)
            epilogue(y, bias, out, f16 and y.dtype == torch.float32)
        else:
            def finish(y, n0, n1):
                epilogue(y, bias, pipeline.rows(out, n0, n1), f16 and y.dtype == torch.float32)
            schedule.run(lambda n0, n1: conv(pipeline.rows(x, n0, n1), weight, (n0, n1)), finish)
        if dtype != torch.float32:
            out = out.to(dtype)
        return out.view(*view_sizes) if reshape else out
    return run


def run(spec: ConvActPoolSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str,
        deterministic: bool = True) -> torch.Tensor:
    """One call (``prepare``'s run for this input)."""
    return prepare(spec, x, mode, deterministic)(x, weight, bias)
