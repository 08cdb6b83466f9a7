"""Family B fallback: the transposed conv through cuDNN, then the epilogue kernel of csrc/fallback_window_reduce.cuh,
which takes the composed max window over only the needed region, adds the bias after the max and reduces over
channels, in one read.  The transposed conv is cuDNN's best plan through the cuDNN frontend where available; else,
for float32, sub-pixel forward convolutions (subpixel.py); else PyTorch's own call.  The batch runs in overlapping
chunks.

``unavailable()`` says (once per process and device) whether the epilogue kernels can be had here (cached or
compiled with NVRTC); the dispatcher steps down to the torch path under "auto", or raises UnsupportedError for
path="fallback", where they cannot."""
from __future__ import annotations

import math
from typing import Optional

import torch

from cutlass_ops import fallback as kernels

from .. import launch
from ..codes import ACTIVATIONS, DTYPES, REDUCTIONS, dtype_code
from ..precision import cudnn_settings
from ..spec import ConvTPoolReduceSpec
from ..weights import float32_bias
from . import cudnn_conv, epilogue_launch, epilogue_plan, pipeline, subpixel, torch_conv
from .conv_act_pool import CHANNELS_LAST, require
from .epilogue_launch import POINTER, PreparedLaunch

# the instantiation whose availability stands for all of the family's (they differ in template arguments only)
PROBE = kernels.window_reduce(DTYPES["float32"], ACTIVATIONS["none"], REDUCTIONS["sum"], True)


def unavailable() -> Optional[str]:
    """None if the family-B fallback can run here (its epilogue kernels can be had); else why, in one line."""
    return epilogue_launch.unavailable(PROBE)


def transposed_conv(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, mode: str,
                    deterministic: bool = True, calls=None, rows=None) -> torch.Tensor:
    """The bias-free transposed conv output, channels_last(_3d) where cuDNN gives it so: cuDNN's best plan; PyTorch's
    own call (torch_conv.conv) on the operands as given where that costs no more per call (far less host time, no
    layout copies); without a plan, sub-pixel forward convs for float32 (PyTorch's call picks a 40 ms plan at seed
    B), else PyTorch's call, both on channels_last(_3d) operands.  ``calls``: ``_Calls`` of the signature (made here
    where not given); ``rows``: which rows of the signature's input ``x`` is (default: all)."""
    calls = calls or _Calls(spec, x, mode, deterministic)
    y = None if calls.convs is None else calls.convs(x, weight, rows or (0, x.shape[0]))
    if y is cudnn_conv.TORCH_CALL:
        return calls.torch_call(x, weight)
    if y is not None:
        return y
    memory_format = CHANNELS_LAST[spec.dims]
    x, weight = x.contiguous(memory_format=memory_format), weight.contiguous(memory_format=memory_format)
    if x.dtype == torch.float32 and all(d == 1 for d in spec.dilation):
        with cudnn_settings(mode, deterministic):
            return subpixel.conv_transpose(x, weight, spec.stride, spec.padding, spec.output_padding)
    return calls.torch_call(x, weight)


class _Calls:
    """The transposed convs of a signature (inputs like ``x``): PyTorch's own call (torch_conv.conv) and the frontend's
    (cudnn_conv.transpose_convs; None where it never serves)."""

    def __init__(self, spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool):
        out = (spec.out_channels, *spec.conv_output_spatial(tuple(x.shape[2:])))
        self.torch_call = torch_conv.conv(spec.dims, spec.stride, spec.padding, spec.dilation, mode, deterministic,
                                          torch_conv.image_elements(x.shape), math.prod(out), spec.output_padding)
        self.convs = cudnn_conv.transpose_convs(spec, x.dtype, mode, deterministic, self.torch_call,
                                                lambda rows: (rows, *out))


def _as_5d(shape, strides):
    """A 2-D problem's (N, K, H, W) as depth 1, with the strides unsqueeze(2) would give."""
    if len(shape) == 5:
        return tuple(shape), tuple(strides)
    n, k, h, w = shape
    return (n, k, 1, h, w), (strides[0], strides[1], strides[2] * h, strides[2], strides[3])


class _WindowReduce:
    """The epilogue launch of one conv output (shape, strides, dtype, alignment) of a signature."""

    def __init__(self, spec: ConvTPoolReduceSpec, y: torch.Tensor, device: int):
        shape, strides = _as_5d(y.shape, y.stride())
        window = (1,) * (3 - len(spec.window)) + tuple(spec.window)
        plan = epilogue_plan.window_reduce(shape, strides, window, dtype_code(y.dtype), ACTIVATIONS[spec.activation],
                                           REDUCTIONS[spec.reduction], y.data_ptr() % 16 == 0)
        self.launch = None
        if plan.blocks:
            geo = kernels.Geo(**plan.geo)
            self.launch = PreparedLaunch(plan.variant, device, plan.blocks, epilogue_plan.THREADS, plan.smem,
                                         (POINTER, POINTER, POINTER, geo))


class Epilogue:
    """``epilogue(y, bias, out)``: out[n, (d,) h, w] = reduce over k of max over the window of y (+ bias, activation
    as ``spec`` says), on the current stream of device ``device``, where y lies; bias float32 (float32_bias) or None,
    out float32 and contiguous.  One per fallback signature: its launches are prepared per conv output (shape,
    strides, dtype, address alignment) and found by those alone (host time per call: the spec and device are its
    own)."""

    def __init__(self, spec: ConvTPoolReduceSpec, device: int):
        self.spec, self.device = spec, device
        self._launches = epilogue_launch.Prepared()

    def __call__(self, y: torch.Tensor, bias, out: torch.Tensor) -> None:
        y_ptr = y.data_ptr()
        key = (y.shape, y.stride(), y.dtype, y_ptr % 16)
        op = self._launches.get(key)
        if op is None:
            op = self._launches.keep(key, _WindowReduce(self.spec, y, self.device))
        if op.launch is not None:                                # else the output is empty
            op.launch(y_ptr, 0 if bias is None else bias.data_ptr(), out.data_ptr())


def prepare(spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool = True):
    """The fallback's call for inputs like ``x`` (dtype, shape, strides, device), what depends only on those worked out
    once (host time per call): returns ``run(x, weight, bias) -> out``.  Raises UnsupportedError where the epilogue
    kernels cannot be had here."""
    require(unavailable())
    n, dtype, device = x.shape[0], x.dtype, x.device
    conv_out = spec.conv_output_spatial(tuple(x.shape[2:]))
    pooled = spec.pooled_spatial(tuple(x.shape[2:]))
    made = (n, 1, *pooled) if spec.keepdim else (n, *pooled)
    per_image = spec.out_channels * math.prod(conv_out) * x.element_size()
    schedule = pipeline.Schedule(device, (spec, tuple(x.shape), dtype, device, x.is_contiguous(), mode,
                                          deterministic), n, per_image)
    calls = _Calls(spec, x, mode, deterministic)
    epilogue = Epilogue(spec, launch.device_index(device))
    whole = (0, n)

    def run(x, weight, bias):
        # the weight as the caller has it: transposed_conv lays it out where its conv needs that (per chunk)
        bias = float32_bias(bias)   # made here, on the current stream, not on the pipeline's side stream
        # float32, as the epilogue writes it (the reduction's channel dim where kept: no view per call)
        out = launch.new_output(x, made, torch.float32)
        if schedule.whole:
            epilogue(transposed_conv(spec, x, weight, mode, deterministic, calls, whole), bias, out)
        else:
            schedule.run(lambda n0, n1: transposed_conv(spec, pipeline.rows(x, n0, n1), weight, mode, deterministic,
                                                        calls, (n0, n1)),
                         lambda y, n0, n1: epilogue(y, bias, pipeline.rows(out, n0, n1)))
        if dtype != torch.float32:
            out = out.to(dtype)
        return out
    return run


def run(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, bias, mode: str,
        deterministic: bool = True) -> torch.Tensor:
    """One call (``prepare``'s run for this input)."""
    return prepare(spec, x, mode, deterministic)(x, weight, bias)
