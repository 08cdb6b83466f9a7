"""The model's tensors a forward computes with eagerly while torch.fx traces it.

fx keeps what the forward's Python computed from a real tensor as a constant of the graph (``self.t.item()``,
``float(t)``, ``t > 1`` in a branch), while a traced op that takes the tensor (``y * self.t``) reads it as it is in
every call.  A plain tensor the graph holds is therefore compared by identity alone (its changes in place reach the
graph: ``watched_values``), unless the trace also computed with it eagerly: then a change in place leaves those
constants stale, and the fused model compares it by version counter too.  ``RecordingEagerReads`` notes, in the
trace's thread (a torch function mode is per thread), the tensors passed to torch functions with no fx proxy among the
arguments; ``where_read`` names those that are the model's plain tensor attributes or the globals the trace read, so
that a copy of the fused model finds its own (``held_by_the_graph``).  It names too the parameters and buffers the
trace reached as tensors, not through fx's proxies (``next(self.parameters()).dtype``, ``self.state_dict()[k]``):
their dtype, device and shape as the trace read them are constants of the graph, and their values where read too.
"""
from __future__ import annotations

import sys
from typing import Collection, Dict, Iterable, Sequence, Set, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

# ("attribute", module path, name), ("global", Python module, name), or ("parameter" / "buffer", module path, name)
# with " layout" where the trace read its dtype, device or shape alone
Where = Tuple[str, str, str]
# what a read of these tells of a tensor: its layout, not its values (property getters by name, methods by name)
_LAYOUT_PROPERTIES = frozenset(("dtype", "device", "shape", "is_cuda", "layout", "ndim", "is_sparse", "is_quantized",
                                "is_meta", "is_mps", "is_xpu", "itemsize", "nbytes"))
_LAYOUT_METHODS = frozenset(("size", "dim", "ndimension", "numel", "nelement", "element_size", "get_device",
                             "is_floating_point", "is_complex", "stride", "is_contiguous"))


def _reads_layout_alone(func) -> bool:
    name = getattr(func, "__name__", None)
    if name == "__get__":   # (a property: the descriptor's name)
        return getattr(getattr(func, "__self__", None), "__name__", None) in _LAYOUT_PROPERTIES
    return name in _LAYOUT_METHODS


class RecordingEagerReads(TorchFunctionMode):
    """``with RecordingEagerReads() as eager: <trace>``: then ``eager.ids`` holds the ids of the tensors the traced code
    computed with outside the graph, ``eager.values`` those of them whose values it read (more may be noted than the
    model's: what ``where_read`` does not find is dropped)."""

    def __init__(self):
        super().__init__()
        self.ids: Set[int] = set()
        self.values: Set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        if not any(isinstance(leaf, torch.fx.Proxy) for leaf in leaves):
            ids = [id(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor)]
            self.ids.update(ids)
            if not _reads_layout_alone(func):
                self.values.update(ids)
        return func(*args, **kwargs)


def where_read(model: nn.Module, ids: Collection[int], globals_read: Dict[str, Sequence[str]],
               values: Collection[int] = ()) -> Tuple[Where, ...]:
    """Where the tensors of ``ids`` are in the model's plain attributes, its parameters and buffers, and the globals
    the trace read (``values``: the ids of those whose values it read, not their layout alone)."""
    found = [("attribute", path, name) for path, module in model.named_modules()
             for name, value in vars(module).items() if isinstance(value, torch.Tensor) and id(value) in ids]
    found += [(kind if id(value) in values else f"{kind} layout", path, name)
              for path, module in model.named_modules()
              for kind, tensors in (("parameter", module._parameters), ("buffer", module._buffers))
              for name, value in tensors.items() if value is not None and id(value) in ids]
    for module_name, names in globals_read.items():
        values = vars(sys.modules[module_name]) if module_name in sys.modules else {}
        found += [("global", module_name, name) for name in names
                  if isinstance(values.get(name), torch.Tensor) and id(values[name]) in ids]
    return tuple(found)


def held_by_the_graph(held: Iterable[int], model: nn.Module, eager: Sequence[Where]) -> frozenset:
    """``held`` (the ids of the tensors the graph reads as they are) without those of ``model`` the trace also
    computed with eagerly (``eager``, as ``where_read`` names them)."""
    read = set()
    for kind, place, name in eager:
        if kind not in ("global", "attribute"):
            continue
        if kind == "global":
            value = vars(sys.modules[place]).get(name) if place in sys.modules else None
        else:
            try:
                value = vars(model.get_submodule(place) if place else model).get(name)
            except AttributeError:
                value = None
        if isinstance(value, torch.Tensor):
            read.add(id(value))
    return frozenset(held) - read
