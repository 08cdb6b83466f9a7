"""Whether a model's module tree is still the one it was fused from.

A fused model holds the original's modules (the same objects) in a graph of its own, whose paths are not the
model's: a module re-assigned, added or deleted on the model after ``fused_model`` (``model.fc = nn.Linear(...)``,
``model.blocks.append(...)``, which a Sequential's forward would run) would be invisible to it, a silent wrong
answer.  ``ModuleTree`` keeps the children of each module that has any as they were fused; where they differ, the
fused model runs the model's own forward (see ``FusedModel``).  Tensors need no such test: the graph shares the
model's parameter and buffer dicts (``trace.share_tensor_dicts``).
"""
from __future__ import annotations

from operator import itemgetter
from typing import Optional

import torch
from torch import nn

from .calls import compiling


class ModuleTree:
    """``ModuleTree(model).changed()``: the path of the first module of ``model`` re-assigned, added or deleted since
    (None: none).  A module without children when fused may get some (a parametrization registered on a conv adds
    ``parametrizations``): its class's forward decides what they do, as the graph's.  Host time per call: one C-level
    comparison of each parent's ``_modules`` (which ``nn.Module.__setattr__``, ``register_module`` and the
    containers' methods change) with its copy (``unchanged``, inline in ``FusedModel``)."""

    __slots__ = ("instances", "copies", "paths")

    def __init__(self, model: nn.Module):
        # (not a TorchScript module's: its children live in TorchScript, where Python assignment does not reach; every
        # module inside one is a ScriptModule too)
        parents = [(path, module) for path, module in model.named_modules(remove_duplicate=False)
                   if module._modules and not isinstance(module, torch.jit.ScriptModule)]
        # each parent's instance dict, where its _modules is (Sequential's `del` puts a new one there), and a copy of
        # its children
        self.instances = tuple(vars(module) for _, module in parents)
        self.copies = tuple(dict(module._modules) for _, module in parents)
        self.paths = tuple(path for path, _ in parents)

    def unchanged(self) -> bool:
        if compiling():   # (torch.compile cannot trace an itemgetter: the same test, by name)
            return tuple(instance["_modules"] for instance in self.instances) == self.copies
        # (dicts compare their values by identity first: modules compare so)
        return tuple(map(CHILDREN, self.instances)) == self.copies

    def changed(self) -> Optional[str]:
        if self.unchanged():
            return None
        for instance, was, path in zip(self.instances, self.copies, self.paths):
            modules = instance["_modules"]
            for name in list(was) + [name for name in modules if name not in was]:
                if modules.get(name) is not was.get(name):
                    return f"{path}.{name}" if path else name
        return None


CHILDREN = itemgetter("_modules")
