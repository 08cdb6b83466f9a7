"""The original model's attribute names on its fused model: ``fused.fc``, ``fused.scale``, ``fused.conv.weight``.

A fused model holds the original's modules and tensors at other paths (under ``graph_module``, a fused conv inside
its region), as its state dict's names are translated back (``state_names``).  Attribute access by the original's
names reaches the same objects, so code written for the model works on the fused one — in particular
``torch.func.functional_call(fused, state_dict, x)``, which swaps tensors in by the state dict's names: a root-level
name it sets as an attribute, which without this would land on the fused model unseen by its graph (a silent wrong
answer).  Tensors are one entry for the original, the graph and its copies (``trace.share_tensor_dicts``), so a tensor
set here reaches every graph.  A module is set only where the graph calls it by that path (a module a region took in
is part of the fused kernel: setting it raises, saying to fuse again).
"""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from .state_names import NOT_CALLED


class OriginalNames:
    """First components of the original model's module paths and state-dict keys -> the fused model's path to the
    same object (a region's module: ``taken`` holds those names), or the original's module itself (``objects``)
    where the fused model holds none at that path, only modules below it (a module whose every child a region took
    in: the children are the region's, and its own tensors are the graph's, ``trace.share_tensor_dicts``)."""

    def __init__(self, fused: nn.Module, graph: nn.Module, original: nn.Module, modules: Dict[str, str]):
        self.paths: Dict[str, str] = {}
        self.objects: Dict[str, nn.Module] = {}
        self.taken = set()
        state = original.state_dict(keep_vars=True)
        firsts = [key.split(".")[0] for key in state] + [name for name, _ in original.named_children()]
        inner_of = {}
        for inner, outer in modules.items():   # (the fused model's module paths of the original's modules)
            inner_of.setdefault(outer, inner)
        for first in dict.fromkeys(firsts):
            if hasattr(type(fused), first) or any(first in d for d in (fused.__dict__, fused._modules,
                                                                       fused._parameters, fused._buffers)):
                continue   # (the fused model's own attribute of that name wins)
            # (a TorchScript module's _modules has no .get)
            mine = graph._modules[first] if first in graph._modules else None
            theirs = original._modules[first] if first in original._modules else None
            if type(mine) is nn.Module and theirs is not None and theirs is not mine:
                # (a holder fx made for the tensors the graph reads of a module it traced through: the module itself is
                # the original's, which the graph does not call)
                self.objects[first] = theirs
                self.taken.add(first)
            elif first in graph._modules or first in graph._parameters or first in graph._buffers:
                self.paths[first] = f"graph_module.{first}"
            elif first in inner_of:
                self.paths[first] = inner_of[first]
                self.taken.add(first)
            elif isinstance(original._modules.get(first), nn.Module):
                self.objects[first] = original._modules[first]
                self.taken.add(first)

    def get(self, fused: nn.Module, name: str):
        """The object the original model has under ``name``, as the fused model holds it (AttributeError: none)."""
        if name in self.objects:
            return self.objects[name]
        path = self.paths.get(name)
        if path is None:
            raise AttributeError(f"'{type(fused).__name__}' object has no attribute '{name}'")
        target = fused
        for part in path.split("."):
            target = getattr(target, part)
        return target

    def set(self, fused: nn.Module, name: str, value) -> bool:
        """Set ``name`` where the fused model's graph reads it; False where ``name`` is none of the original's."""
        path = self.paths.get(name)
        if (path is None and name not in self.objects) or not (value is None or isinstance(value, (torch.Tensor,
                                                                                                   nn.Module))):
            return False
        if path is not None and path.startswith(f"graph_module.{NOT_CALLED}"):
            raise AttributeError(f"fullfuse: {name} is a module the traced forward does not reach (held for the state "
                                 f"dict, parameters() and train()); set it on the original model (the fused model "
                                 f"then runs the model's own forward, saying so) and call fused_model again")
        if name in self.taken or (isinstance(value, nn.Module) and fused.__dict__.get("_optional")):
            raise AttributeError(f"fullfuse: {name} is part of a fused region (or of the graphs traced for optional "
                                 f"inputs); set it on the original model and call fused_model again")
        holder_path, _, attr = path.rpartition(".")
        holder = fused.get_submodule(holder_path)
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and attr in holder._parameters:
            holder._parameters[attr] = value   # (as torch.func.functional_call swaps a tensor in)
        else:
            setattr(holder, attr, value)
        return True
