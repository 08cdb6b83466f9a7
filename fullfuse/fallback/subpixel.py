"""Transposed convolution as s^d stride-1 convolutions, one per output parity (sub-pixel decomposition).

For stride s, output o = s*q + a takes the taps k = k0 + s*j with k0 = (a + p) mod s, reading x[q + c - j] with
c = (a + p - k0) / s.  Reversing the taps turns that into a stride-1 cross-correlation of x (padded by J-1-c on
the left) with the sub-filter w[k0 + s*(J-1-j')].  Each parity's result lands in a strided view of the
interleaved output.  Used for float32 when cuDNN's frontend is not available: PyTorch's own ConvTranspose3d call
picks a 40 ms plan for the seed problem, while cuDNN's forward convolutions are fast.
"""
from __future__ import annotations

import itertools
from typing import List, Tuple

import torch
import torch.nn.functional as F

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _axis_plan(in_len: int, out_len: int, k: int, s: int, p: int, a: int) -> Tuple[slice, int, int, int, int]:
    """(taps slice, left pad, right pad, output count) of parity a along one axis; taps is a slice of the weight."""
    k0 = (a + p) % s
    taps = max(0, -(-(k - k0) // s))                  # J = ceil((k - k0) / s)
    count = max(0, -(-(out_len - a) // s))            # outputs o = a, a + s, ... < out_len
    c = (a + p - k0) // s
    left = taps - 1 - c
    right = count - in_len - left + taps - 1
    return slice(k0, k, s), left, right, count, taps


def conv_transpose(x: torch.Tensor, weight: torch.Tensor, stride, padding, output_padding, out=None) -> torch.Tensor:
    """Same as F.conv_transposeNd(x, weight, None, stride, padding, output_padding) (dilation 1, groups 1),
    written into ``out`` (or a new tensor in x's memory format)."""
    dims = x.dim() - 2
    n, cin = x.shape[:2]
    cout = weight.shape[1]
    out_sizes = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + weight.shape[2 + i] + output_padding[i]
                 for i in range(dims)]
    if out is None:
        fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(dims, torch.contiguous_format)
        out = torch.empty(n, cout, *out_sizes, dtype=x.dtype, device=x.device, memory_format=fmt)
    for parity in itertools.product(*(range(s) for s in stride)):
        plans = [_axis_plan(x.shape[2 + i], out_sizes[i], weight.shape[2 + i], stride[i], padding[i], parity[i])
                 for i in range(dims)]
        target = out[(slice(None), slice(None), *(slice(parity[i], None, stride[i]) for i in range(dims)))]
        if any(pl[3] == 0 for pl in plans):
            continue
        if any(pl[4] == 0 for pl in plans):            # no tap reaches this parity (kernel < stride)
            target.zero_()
            continue
        sub = weight[(slice(None), slice(None), *(pl[0] for pl in plans))]
        sub = sub.flip(list(range(2, 2 + dims))).transpose(0, 1)
        pads: List[int] = []
        for pl in reversed(plans):
            pads += [pl[1], pl[2]]
        xin = F.pad(x, pads) if any(pads) else x
        memory_format = torch.channels_last if dims == 2 else torch.channels_last_3d if dims == 3 else None
        if memory_format is not None:
            sub = sub.contiguous(memory_format=memory_format)
            xin = xin.contiguous(memory_format=memory_format)
        target.copy_(_CONV[dims](xin, sub))
    return out
