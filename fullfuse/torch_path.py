"""The torch path: each spec computed with plain PyTorch ops.

It serves CPU inputs, autograd, dtypes and parameters no kernel handles, and it is the float64 reference of the
tests, ``fullfuse check`` and the benchmark (called on float64 copies of the inputs).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .spec import ConvActPoolSpec, ConvTPoolReduceSpec

CONV = {2: F.conv2d, 3: F.conv3d}                                 # PyTorch's conv of a spec's rank
CONV_T = {2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {2: F.max_pool2d, 3: F.max_pool3d}


def activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "none":
        return y
    if activation == "relu":
        return F.relu(y)
    if activation == "gelu_erf":
        return F.gelu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "silu":
        return F.silu(y)
    raise ValueError(f"fullfuse: unknown activation {activation!r}")


def conv_act_pool(spec: ConvActPoolSpec, x: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor]) -> torch.Tensor:
    padding = spec.padding
    if spec.padding_mode != "zeros":
        pad = [p for p in reversed(spec.padding) for _ in range(2)]
        x, padding = F.pad(x, pad, mode=spec.padding_mode), (0,) * spec.dims
    y = CONV[spec.dims](x, weight, bias, spec.stride, padding, spec.dilation, spec.groups)
    y = activate(y, spec.activation)
    spatial = tuple(range(2, 2 + spec.dims))
    if spec.pool == "mean":
        return post_view(spec, y.mean(dim=spatial, keepdim=spec.keepdim))
    return post_view(spec, y.amax(dim=spatial, keepdim=spec.keepdim))


def post_view(spec: ConvActPoolSpec, pooled: torch.Tensor) -> torch.Tensor:
    """The view of the pool's output that the region returns (spec.POSTS), as the model's own op takes it."""
    if spec.post == "flatten":
        return torch.flatten(pooled, 1)
    if spec.post == "squeeze":
        return pooled.squeeze()
    return pooled


def convt_pool_reduce(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    y = CONV_T[spec.dims](x, weight, bias, spec.stride, spec.padding, spec.output_padding, spec.groups, spec.dilation)
    y = activate(y, spec.activation)
    y = _MAX_POOL[spec.dims](y, spec.window, spec.window)
    if spec.reduction == "sum":
        return y.sum(dim=1, keepdim=spec.keepdim)
    if spec.reduction == "mean":
        return y.mean(dim=1, keepdim=spec.keepdim)
    return y.amax(dim=1, keepdim=spec.keepdim)


def run(spec, x, weight, bias):
    fn = conv_act_pool if isinstance(spec, ConvActPoolSpec) else convt_pool_reduce
    return fn(spec, x, weight, bias)


def float64_reference(spec, x, weight, bias) -> torch.Tensor:
    """The spec evaluated in float64 (on x's device)."""
    return run(spec, x.double(), weight.double(), None if bias is None else bias.double())
