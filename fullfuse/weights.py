"""Cache of re-laid-out weight copies that kernels need (e.g. channels_last filters).

A copy is keyed by the source tensor's storage and geometry and is rebuilt when the source's version counter
moves, so an in-place update of the parameter (``load_state_dict``, an optimizer step) is always seen.  An entry
only serves the very tensor object it was made from (held by a weak reference), so a new tensor that happens
to reuse a freed address never gets a stale copy.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Callable, Hashable

import torch

_MAX_ENTRIES = 64
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()


def relayout(tensor: torch.Tensor, tag: Hashable, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device, tag)
    version = tensor._version
    hit = _cache.get(key)
    if hit is not None and hit[0]() is tensor and hit[1] == version:
        _cache.move_to_end(key)
        return hit[2]
    result = make(tensor)
    _cache[key] = (weakref.ref(tensor), version, result)
    _cache.move_to_end(key)
    while len(_cache) > _MAX_ENTRIES:
        _cache.popitem(last=False)
    return result


def as_memory_format(tensor: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    if tensor.is_contiguous(memory_format=memory_format):
        return tensor
    return relayout(tensor, memory_format, lambda t: t.contiguous(memory_format=memory_format))


def float32_bias(bias):
    if bias is None or bias.dtype == torch.float32 and bias.is_contiguous():
        return bias
    return relayout(bias, "float32", lambda t: t.float().contiguous())
