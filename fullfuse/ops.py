"""Functional entry points, registered with ``torch.library`` as ``torch.ops.fullfuse.*`` so that
``torch.compile(..., fullgraph=True)`` sees one opaque op per region (with a fake implementation for shapes).

    conv_act_pool(x, weight, bias, stride, padding, dilation, activation="gelu_erf", pool="mean", keepdim=True)
    convt_pool_reduce(x, weight, bias, stride, padding, output_padding, dilation, window, activation="none",
                      reduction="sum", keepdim=True)

Both take ``path`` ("auto" | "fused" | "fallback" | "torch"), ``precision`` ("auto" | "tf32" | "ieee") and
``deterministic``.  Under torch.compile the wrappers call the registered ops; in eager mode they call the
dispatcher directly (same code, less host time per call).  Inputs that need gradients run the torch path (this is an
inference library), with a one-time warning.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from functools import lru_cache
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from . import dispatch, torch_path
from .spec import ConvActPoolSpec, ConvTPoolReduceSpec


def _tuple(value, dims: int, name: str):
    values = tuple(int(v) for v in ((value,) * dims if isinstance(value, int) else value))
    if len(values) == 1 and dims > 1:
        values = values * dims
    if len(values) != dims:
        raise ValueError(f"fullfuse: {name} needs {dims} values, got {value}")
    return values


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
    dims = weight.dim() - 2
    return spec_a(dims, int(weight.shape[1]), int(weight.shape[0]), tuple(int(s) for s in weight.shape[2:]),
                  _tuple(stride, dims, "stride"), _tuple(padding, dims, "padding"), _tuple(dilation, dims, "dilation"),
                  bias is not None, activation, pool, keepdim, post)


def _spec_b_from(weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim):
    dims = weight.dim() - 2
    return spec_b(dims, int(weight.shape[0]), int(weight.shape[1]), tuple(int(s) for s in weight.shape[2:]),
                  _tuple(stride, dims, "stride"), _tuple(padding, dims, "padding"),
                  _tuple(output_padding, dims, "output_padding"), _tuple(dilation, dims, "dilation"),
                  bias is not None, _tuple(window, dims, "window"), activation, reduction, keepdim)


# ---------------------------------------------------------------- registered ops
@torch.library.custom_op("fullfuse::conv_act_pool", mutates_args=())
def _conv_act_pool_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                      dilation: List[int], activation: str, pool: str, keepdim: bool, post: str, path: str,
                      precision: str, deterministic: bool) -> Tensor:
    spec = _spec_a_from(weight, bias, stride, padding, dilation, activation, pool, keepdim, post)
    return dispatch.run(spec, x, weight, bias, path, precision, deterministic)


@_conv_act_pool_op.register_fake
def _(x, weight, bias, stride, padding, dilation, activation, pool, keepdim, post, path, precision, deterministic):
    spec = _spec_a_from(weight, bias, stride, padding, dilation, activation, pool, keepdim, post)
    return x.new_empty(spec.output_shape(x.shape[0]))


@torch.library.custom_op("fullfuse::convt_pool_reduce", mutates_args=())
def _convt_pool_reduce_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                          output_padding: List[int], dilation: List[int], window: List[int], activation: str,
                          reduction: str, keepdim: bool, path: str, precision: str, deterministic: bool) -> Tensor:
    spec = _spec_b_from(weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim)
    return dispatch.run(spec, x, weight, bias, path, precision, deterministic)


@_convt_pool_reduce_op.register_fake
def _(x, weight, bias, stride, padding, output_padding, dilation, window, activation, reduction, keepdim, path,
      precision, deterministic):
    dims = weight.dim() - 2
    pooled = []
    for i in range(dims):
        size = ((x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1)
                + output_padding[i] + 1)
        pooled.append(size // window[i])
    return x.new_empty((x.shape[0], *([1] if keepdim else []), *pooled))


# ---------------------------------------------------------------- public wrappers
_warned_grad = False


def _needs_grad(x, weight, bias) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                        (bias is not None and bias.requires_grad))


def _warn_grad_once():
    global _warned_grad
    if not _warned_grad:
        _warned_grad = True
        warnings.warn("fullfuse: an input or weight requires grad; running the torch path so autograd works "
                      "(fullfuse's kernels are inference-only)", stacklevel=3)


# whether torch.compile is tracing the call (torch.compiler.is_compiling; never on torch builds without it)
compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

_AUTOCAST_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def _autocast_query():
    """Whether autocast is on for CUDA, as one C call (host time per call): torch's getter bound to "cuda", or its
    older spelling without a device."""
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:                                     # torch < 2.4's spelling
        return torch.is_autocast_enabled
    return functools.partial(torch.is_autocast_enabled, "cuda")


_cuda_autocast_on = _autocast_query()


def _autocast_dtype(x: Tensor) -> Optional[torch.dtype]:
    """The dtype autocast would run this region's convolution in (None: autocast is off or leaves x as it is).
    Convolutions are on autocast's lower-precision list: float tensors on an autocast-enabled device are cast."""
    if not x.is_cuda or x.dtype not in _AUTOCAST_INPUTS or not _cuda_autocast_on():
        return None
    get = getattr(torch, "get_autocast_dtype", None)
    return get("cuda") if get is not None else torch.get_autocast_gpu_dtype()


def _autocast_float32(spec) -> bool:
    """Whether autocast runs the region's last op in float32: ``sum`` is on its float32 list; mean / amax / the
    adaptive pools are not (they keep their input's dtype)."""
    return isinstance(spec, ConvTPoolReduceSpec) and spec.reduction == "sum"


@lru_cache(maxsize=256)
def _pooled_only(spec):
    """The spec without its post view (family A; B has none): what a batched call of an unbatched input runs (one
    object per spec: the dispatcher keys its prepared calls by the spec's identity)."""
    return dataclasses.replace(spec, post="none") if getattr(spec, "post", "none") != "none" else spec


def run_spec(spec, x, weight, bias, path="auto", precision="auto", deterministic=True) -> Tensor:
    """Run a spec through the registered op (or the torch path when autograd needs it), with PyTorch's autocast
    semantics: under autocast the region computes in the autocast dtype, as the original would.  An unbatched input
    (as torch convs accept it) runs as a batch of one; the region's view of the pool (spec.post) then applies to the
    unbatched pool output, as the model's own op would."""
    if path not in dispatch.PATH_CHOICES:
        dispatch.check_path(path)   # raises
    if x.dim() == spec.dims + 1:
        pooled = _pooled_only(spec)
        out = run_spec(pooled, x.unsqueeze(0), weight, bias, path, precision, deterministic).squeeze(0)
        if pooled is not spec:
            dispatch.last_decision[spec] = dispatch.last_decision.get(pooled)
            out = torch_path.post_view(spec, out)
        return out
    if _needs_grad(x, weight, bias):
        _warn_grad_once()
        dispatch.last_decision[spec] = ("torch", "an input or weight requires grad (autograd runs PyTorch's ops)")
        return torch_path.run(spec, x, weight, bias)
    cast = _autocast_dtype(x)
    if cast is not None:
        if path == "torch":                               # PyTorch's own ops under the caller's autocast
            dispatch.last_decision[spec] = ("torch", "requested")
            return torch_path.run(spec, x, weight, bias)
        with torch.autocast("cuda", enabled=False):
            out = run_spec(spec, x.to(cast), weight.to(cast), None if bias is None else bias.to(cast), path,
                           precision, deterministic)
        return out.float() if _autocast_float32(spec) else out
    if not compiling() or spec.groups != 1 or getattr(spec, "padding_mode", "zeros") != "zeros":
        # eager: straight to the dispatcher (the registered op's wrapper costs host time the kernels don't need)
        return dispatch.run(spec, x, weight, bias, path, precision, deterministic)
    if isinstance(spec, ConvActPoolSpec):
        return torch.ops.fullfuse.conv_act_pool(x, weight, bias, list(spec.stride), list(spec.padding),
                                                list(spec.dilation), spec.activation, spec.pool, spec.keepdim,
                                                spec.post, path, precision, deterministic)
    return torch.ops.fullfuse.convt_pool_reduce(x, weight, bias, list(spec.stride), list(spec.padding),
                                                list(spec.output_padding), list(spec.dilation), list(spec.window),
                                                spec.activation, spec.reduction, spec.keepdim, path, precision,
                                                deterministic)


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
