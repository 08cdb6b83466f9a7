"""Whether a model's module tree is still the one it was fused from.

A fused model holds the original's modules (the same objects) in a graph of its own, whose paths are not the
model's: a module re-assigned on the model after ``fused_model`` (``model.fc = nn.Linear(...)``,
``model.layer1 = ...``) would be invisible to it, a silent wrong answer.  ``ModuleTree`` keeps each parent -> child
edge of the model's tree as it was fused; where one has changed, the fused model runs the model's own forward (see
``FusedModel``).  Tensors need no such test: the graph shares the model's parameter and buffer dicts
(``trace.share_tensor_dicts``).
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from .calls import compiling


class ModuleTree:
    """``ModuleTree(model).replaced()``: the path of the first module of ``model`` re-assigned or deleted since
    (None: none).  Host time per call: one C-level pass over the edges (dict.get of each parent's ``_modules``, which
    ``nn.Module.__setattr__`` and ``register_module`` change in place); plain loops under torch.compile, which traces
    them (and guards on the modules)."""

    __slots__ = ("dicts", "names", "children", "paths")

    def __init__(self, model: nn.Module):
        edges = [(module._modules, name, child, f"{path}.{name}" if path else name)
                 for path, module in model.named_modules(remove_duplicate=False)
                 for name, child in module._modules.items()]
        # (each parent's _modules, the child's name there, the child, its path)
        self.dicts, self.names, self.children, self.paths = (tuple(column) for column in zip(*edges)) \
            if edges else ((), (), (), ())

    def replaced(self) -> Optional[str]:
        if compiling():
            return self._first_replaced()
        return self.replaced_eagerly()

    def replaced_eagerly(self) -> Optional[str]:
        """``replaced()`` where torch.compile is known not to be tracing the call."""
        if tuple(map(dict.get, self.dicts, self.names)) == self.children:   # (identity first: modules compare so)
            return None
        return self._first_replaced()

    def _first_replaced(self) -> Optional[str]:
        for modules, name, child, path in zip(self.dicts, self.names, self.children, self.paths):
            if modules.get(name) is not child:
                return path
        return None
