"""Functional entry points, registered with ``torch.library`` as ``torch.ops.fullfuse.*`` so that
``torch.compile(..., fullgraph=True)`` sees one opaque op per region (with a fake implementation for shapes).

    conv_act_pool(x, weight, bias, stride, padding, dilation, activation="gelu_erf", pool="mean", keepdim=True)
    convt_pool_reduce(x, weight, bias, stride, padding, output_padding, dilation, window, activation="none",
                      reduction="sum", keepdim=True)

Both take ``path`` ("auto" | "fused" | "fallback" | "torch"), ``precision`` ("auto" | "tf32" | "ieee") and
``deterministic``.  Under torch.compile the wrappers call the registered ops; in eager mode they call the
dispatcher directly (same code, less host time per call), which runs inputs that need gradients on the torch path
(this is an inference library), with a one-time warning.  The registered ops called directly take an unbatched
input as the wrappers do and compute in their inputs' dtypes (autocast does not apply to custom ops).
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from . import calls, torch_path
from .spec import ConvActPoolSpec, ConvTPoolReduceSpec, same_padding


def _tuple(value, dims: int, name: str):
    try:
        if isinstance(value, str):   # (its characters would pass for ints: "12" as (1, 2))
            raise TypeError
        values = tuple(int(v) for v in ((value,) * dims if isinstance(value, int) else value))
    except (TypeError, ValueError):
        raise ValueError(f"fullfuse: {name} must be an int or {dims} ints, got {value!r}") from None
    if len(values) == 1 and dims > 1:
        values = values * dims
    if len(values) != dims:
        raise ValueError(f"fullfuse: {name} needs {dims} values, got {value}")
    return values


def _dims(weight, op: str, convs: str) -> int:
    """The spatial rank of a conv's weight (4-d: 2, 5-d: 3), or ValueError naming what ``op`` takes."""
    if weight.dim() not in (4, 5):
        raise ValueError(f"fullfuse: {op} takes the weight of a {convs}, 4-d or 5-d; got {weight.dim()}-d "
                         f"{tuple(weight.shape)}")
    return weight.dim() - 2


def _padding(padding, dims: int, kernel, stride, dilation):
    """``padding`` as F.convNd takes it (ints, "valid", "same") as one padding per spatial dim."""
    if not isinstance(padding, str):
        return _tuple(padding, dims, "padding")
    if padding == "valid":
        return (0,) * dims
    same = same_padding(kernel, stride, dilation) if padding == "same" else None
    if same is None:
        raise ValueError(f"fullfuse: padding must be ints, 'valid' or 'same' (stride 1, dilation * (kernel - 1) even "
                         f"in every dim: PyTorch pads one side more otherwise; pad the input with F.pad and give 0), "
                         f"got {padding!r}")
    return same


@lru_cache(maxsize=256)
def spec_a(dims, in_channels, out_channels, kernel, stride, padding, dilation, has_bias, activation, pool, keepdim,
           post="none"):
    return ConvActPoolSpec(dims, in_channels, out_channels, kernel, stride, padding, dilation, has_bias,
                           activation, pool, keepdim, post=post)


@lru_cache(maxsize=256)
def spec_b(dims, in_channels, out_channels, kernel, stride, padding, output_padding, dilation, has_bias, window,
           activation, reduction, keepdim):
    return ConvTPoolReduceSpec(dims, in_channels, out_channels, kernel, stride, padding, output_padding, dilation,
                               has_bias, window, activation, reduction, keepdim)


def _spec_a_from(weight, bias, stride, padding, dilation, activation, pool, keepdim, post="none"):
    dims = _dims(weight, "conv_act_pool", "Conv2d or Conv3d")
    kernel = tuple(int(s) for s in weight.shape[2:])
    stride, dilation = _tuple(stride, dims, "stride"), _tuple(dilation, dims, "dilation")
    return spec_a(dims, int(weight.shape[1]), int(weight.shape[0]), kernel, stride,
                  _padding(padding, dims, kernel, stride, dilation), dilation, bias is not None, activation, pool,
                  keepdim, post)


def _spec_b_from(weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim):
    dims = _dims(weight, "convt_pool_reduce", "ConvTranspose2d or ConvTranspose3d")
    return spec_b(dims, int(weight.shape[0]), int(weight.shape[1]), tuple(int(s) for s in weight.shape[2:]),
                  _tuple(stride, dims, "stride"), _tuple(padding, dims, "padding"),
                  _tuple(output_padding, dims, "output_padding"), _tuple(dilation, dims, "dilation"),
                  bias is not None, _tuple(window, dims, "window"), activation, reduction, keepdim)


# ---------------------------------------------------------------- registered ops
# the schemas spelled out: torch 2.4's custom_op cannot read them from string annotations (this module's, under
# ``from __future__ import annotations``), which later torch resolves
_CONV_ACT_POOL_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
                         "str activation, str pool, bool keepdim, str post, str path, str precision, "
                         "bool deterministic) -> Tensor")
_CONVT_POOL_REDUCE_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
                             "int[] output_padding, int[] dilation, int[] window, str activation, str reduction, "
                             "bool keepdim, str path, str precision, bool deterministic) -> Tensor")


@torch.library.custom_op("fullfuse::conv_act_pool", mutates_args=(), schema=_CONV_ACT_POOL_SCHEMA)
def _conv_act_pool_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                      dilation: List[int], activation: str, pool: str, keepdim: bool, post: str, path: str,
                      precision: str, deterministic: bool) -> Tensor:
    spec = _spec_a_from(weight, bias, stride, padding, dilation, activation, pool, keepdim, post)
    return calls.calls_for(spec, path, precision, deterministic).run_op(x, weight, bias)


@_conv_act_pool_op.register_fake
def _(x, weight, bias, stride, padding, dilation, activation, pool, keepdim, post, path, precision, deterministic):
    spec = _spec_a_from(weight, bias, stride, padding, dilation, activation, pool, keepdim, post)
    if x.dim() == spec.dims + 1:   # unbatched: a batch of one, the post view taken after (as calls.SpecCalls)
        pooled = dataclasses.replace(spec, post="none").output_shape(1)[1:]
        return torch_path.post_view(spec, x.new_empty(pooled))
    return x.new_empty(spec.output_shape(x.shape[0]))


@torch.library.custom_op("fullfuse::convt_pool_reduce", mutates_args=(), schema=_CONVT_POOL_REDUCE_SCHEMA)
def _convt_pool_reduce_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                          output_padding: List[int], dilation: List[int], window: List[int], activation: str,
                          reduction: str, keepdim: bool, path: str, precision: str, deterministic: bool) -> Tensor:
    spec = _spec_b_from(weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim)
    return calls.calls_for(spec, path, precision, deterministic).run_op(x, weight, bias)


@_convt_pool_reduce_op.register_fake
def _(x, weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim, path,
      precision, deterministic):
    dims = weight.dim() - 2
    batch = x.dim() == dims + 2   # (unbatched: a batch of one, its batch dim dropped, as calls.SpecCalls)
    pooled = []
    for i in range(dims):
        size = ((x.shape[x.dim() - dims + i] - 1) * stride[i] - 2 * padding[i]
                + dilation[i] * (weight.shape[2 + i] - 1) + output_padding[i] + 1)
        pooled.append(size // window[i])
    return x.new_empty((*x.shape[:1 if batch else 0], *([1] if keepdim else []), *pooled))


# ---------------------------------------------------------------- public wrappers
def run_spec(spec, x, weight, bias, path="auto", precision="auto", deterministic=True) -> Tensor:
    """Run a spec with PyTorch's semantics (calls.py: autocast, autograd, unbatched input, torch.compile)."""
    return calls.calls_for(spec, path, precision, deterministic)(x, weight, bias)


def conv_act_pool(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Sequence[int] = 1,
                  padding: Sequence[int] = 0, dilation: Sequence[int] = 1, activation: str = "gelu_erf",
                  pool: str = "mean", keepdim: bool = True, *, path: str = "auto", precision: str = "auto",
                  deterministic: bool = True) -> Tensor:
    """pool(activation(convNd(x, weight, bias))) over all spatial dims; convNd = conv2d or conv3d by weight rank."""
    spec = _spec_a_from(weight, bias, stride, padding, dilation, activation, pool, keepdim)
    return run_spec(spec, x, weight, bias, path, precision, deterministic)


def convt_pool_reduce(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Sequence[int] = 1,
                      padding: Sequence[int] = 0, output_padding: Sequence[int] = 0, dilation: Sequence[int] = 1,
                      window: Sequence[int] = 2, activation: str = "none", reduction: str = "sum",
                      keepdim: bool = True, *, path: str = "auto", precision: str = "auto",
                      deterministic: bool = True) -> Tensor:
    """reduction over dim 1 of max_poolNd(activation(conv_transposeNd(x, weight, bias)), window, window)."""
    spec = _spec_b_from(weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim)
    return run_spec(spec, x, weight, bias, path, precision, deterministic)
