"""Weight and bias re-layouts that kernels need (a contiguous filter or bias, a float32 bias), derived on every call.
(The fused kernels read most filters as they lie: family A a Conv2d's through its strides, fused/conv_act_pool.py
Launches.blocks_for; family B's packing through its strides.  A Conv3d's filter for family A is made contiguous.)

Nothing derived from a parameter is cached: a copy made in the call, on the caller's current stream, is ordered
after every earlier write to the parameter on that stream and sees every way a parameter changes (in-place ops,
``p.data`` writes that bypass the version counter, ``p.data = other`` at the same address), needs no version
counter (parameters made under ``torch.inference_mode()`` have none), and under CUDA-graph capture becomes part of
the graph, so each replay re-derives from the parameter's current values.  The copies are small next to the
kernels' inputs (a filter, a bias); a parameter already in the needed layout is used as it is.
"""
from __future__ import annotations

import torch


def contiguous(tensor):
    """A weight or bias (or None) as the fused kernels read it: in its own dtype (the input's, dispatch checks),
    contiguous (the tensor itself where it is; host time per call: no keyword arguments)."""
    if tensor is None or tensor.is_contiguous():
        return tensor
    return tensor.contiguous()


def float32_bias(bias):
    if bias is None or bias.dtype == torch.float32 and bias.is_contiguous():
        return bias
    return bias.float().contiguous()
