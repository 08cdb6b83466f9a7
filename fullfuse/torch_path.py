"""The torch path: each spec computed with plain PyTorch ops.

It serves CPU inputs, autograd, dtypes and parameters no kernel handles, and it is the float64 reference of the
tests, ``fullfuse check`` and the benchmark (called on float64 copies of the inputs).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from .spec import ConvActPoolSpec, ConvTPoolReduceSpec

CONV = {2: F.conv2d, 3: F.conv3d}                                 # PyTorch's conv of a spec's rank
CONV_T = {2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {2: F.max_pool2d, 3: F.max_pool3d}


_ACTIVATIONS = {"none": None, "relu": F.relu, "gelu_erf": F.gelu,
                "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu}
# the same activations in place, for a signature's calls (``prepared`` given a batch): the conv's output is the call's
# own temporary, and those calls need no autograd (calls.SpecCalls.run), so one buffer fewer per call (host time);
# out of place where a torch build lacks the in-place op
_gelu_ = getattr(torch._C._nn, "gelu_", None)
_silu_ = getattr(torch._C._nn, "silu_", None)
_IN_PLACE = {"none": None, "relu": torch.relu_, "gelu_erf": _gelu_ or F.gelu,
             "gelu_tanh": functools.partial(_gelu_ or F.gelu, approximate="tanh"), "silu": _silu_ or F.silu}
_POOLED_VIEWS = {"none": None, "flatten": functools.partial(torch.flatten, start_dim=1), "squeeze": torch.squeeze}
_CHANNEL_REDUCTIONS = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}


def prepared(spec, batch: Optional[int] = None):
    """``run(x, weight, bias)``: the spec's PyTorch ops with its arguments bound once (host time per call: what auto
    runs for a signature where PyTorch is faster costs no more than the model's own ops).  ``batch``: the batch size of
    every call (one call signature's, which needs no autograd): the activation then runs in place and family A's post
    view is folded into its pool (a buffer and an op less per call); without it the ops are the model's as written,
    whose shapes a trace (torch.jit.trace, torch.export, torch.compile) records for any batch, and autograd can
    differentiate."""
    # (a spec's names are checked when it is made)
    act = (_ACTIVATIONS if batch is None else _IN_PLACE)[spec.activation]
    if isinstance(spec, ConvActPoolSpec):
        return _conv_act_pool(spec, act, batch)
    return _convt_pool_reduce(spec, act)


def _conv_act_pool(spec: ConvActPoolSpec, act, batch: Optional[int]):
    conv, stride, padding, dilation, groups = CONV[spec.dims], spec.stride, spec.padding, spec.dilation, spec.groups
    pad, mode = None, spec.padding_mode
    if mode != "zeros":
        pad = [p for p in reversed(spec.padding) for _ in range(2)]
        padding = (0,) * spec.dims
    spatial, keepdim = tuple(range(2, 2 + spec.dims)), spec.keepdim
    pool = torch.mean if spec.pool == "mean" else torch.amax
    view = _POOLED_VIEWS[spec.post]
    if batch is not None and view is not None:
        # flatten(1) and squeeze() both drop the pooled dims, which the pool then does not keep; squeeze() also drops
        # a batch or channel dim of size 1, which this batch and the spec's channels say
        keepdim = False
        view = torch.squeeze if spec.post == "squeeze" and 1 in (batch, spec.out_channels) else None

    def run(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if pad is not None:
            x = F.pad(x, pad, mode=mode)
        y = conv(x, weight, bias, stride, padding, dilation, groups)
        if act is not None:
            y = act(y)
        y = pool(y, spatial, keepdim)
        return y if view is None else view(y)
    return run


def post_view(spec: ConvActPoolSpec, pooled: torch.Tensor) -> torch.Tensor:
    """The view of the pool's output that the region returns (spec.POSTS), as the model's own op takes it."""
    view = _POOLED_VIEWS[spec.post]
    return pooled if view is None else view(pooled)


def _convt_pool_reduce(spec: ConvTPoolReduceSpec, act):
    conv, stride, padding, output_padding = CONV_T[spec.dims], spec.stride, spec.padding, spec.output_padding
    groups, dilation, window, keepdim = spec.groups, spec.dilation, spec.window, spec.keepdim
    max_pool, reduce = _MAX_POOL[spec.dims], _CHANNEL_REDUCTIONS[spec.reduction]

    def run(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        y = conv(x, weight, bias, stride, padding, output_padding, groups, dilation)
        if act is not None:
            y = act(y)
        return reduce(max_pool(y, window, window), 1, keepdim)
    return run


def run(spec, x, weight, bias):
    """The spec's PyTorch ops on these inputs (``prepared``, for one call)."""
    return prepared(spec)(x, weight, bias)


def float64_reference(spec, x, weight, bias) -> torch.Tensor:
    """The spec evaluated in float64 (on x's device)."""
    return run(spec, x.double(), weight.double(), None if bias is None else bias.double())
