"""State-dict names of a fused model: the original model's names, so checkpoints move between the two unchanged.

fused_model() traces the model into a GraphModule that holds the original submodules (the same objects) at new paths:
under ``graph_module.``, and a fused conv under ``graph_module.fullfuse_region_<i>.conv``.  Without a translation,
``fused.state_dict()`` (and the state dict of any model holding a fused submodule, the README's
``model.head = fused_model(model.head)``) would name every tensor differently from the original, and an original
checkpoint would not load.  ``StateNames`` maps each internal key to the original one (through the module that holds
it, else through the tensor itself), and its hooks rename keys on save, on load, and in a load's missing keys.
"""
from __future__ import annotations

from functools import partial
from typing import Dict, List, Optional

import torch
from torch import nn


def _holder_names(model: nn.Module) -> Dict[int, str]:
    """id(module) -> its first qualified name in ``model`` ("" for model itself)."""
    names: Dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), name)
    return names


NOT_CALLED = "fullfuse_not_called_"   # (the graph's names of those modules: fullfuse_not_called_<i>)


def not_called(original: nn.Module, fused: nn.Module) -> List[nn.Module]:
    """The original model's modules (and root tensors) that ``fused`` does not hold, in the original's order: what its
    traced forward does not reach — a head used only in training, a module behind a branch not taken, a tensor nothing
    reads.  The fused model's graph holds them too (``FusedModel``), so that its state dict, ``parameters()``,
    ``to()`` / ``double()`` and ``train()`` cover the whole model, as the original's do.  They are the original's
    module objects (the root's own tensors: a module sharing the root's parameter and buffer dicts); ``StateNames``
    gives their entries the original names."""
    held = {id(value) for value in fused.state_dict(keep_vars=True).values()}
    paths: Dict[str, None] = {}   # (ordered: the original's order)
    for key, value in original.state_dict(keep_vars=True).items():
        if id(value) not in held:
            paths.setdefault(key.rpartition(".")[0], None)
    modules = []
    for path in paths:
        if path:
            modules.append(original.get_submodule(path))
        else:   # the root's own tensors
            module = nn.Module()
            module.__dict__.update(_parameters=original._parameters, _buffers=original._buffers,
                                   _non_persistent_buffers_set=original._non_persistent_buffers_set)
            modules.append(module)
    return modules


def _join(path: str, leaf: str) -> str:
    return f"{path}.{leaf}" if path else leaf


class StateNames:
    """Internal key (relative to the fused model) -> the original model's key, for every entry of the fused model's
    state dict that has one; entries it cannot place (none after fused_model, unless added later) keep their name."""

    def __init__(self, original: nn.Module, fused: nn.Module):
        holders = _holder_names(original)
        original_state = original.state_dict(keep_vars=True)
        tensors = {id(t): k for k, t in reversed(list(original_state.items()))}
        self.keys: Dict[str, str] = {}
        self.modules: Dict[str, str] = {}   # internal module path -> original module path (for state-dict metadata)
        for path, module in fused.named_modules(remove_duplicate=False):
            if id(module) in holders:
                self.modules[path] = holders[id(module)]
        for key, value in fused.state_dict(keep_vars=True).items():
            path, _, leaf = key.rpartition(".")
            if path in self.modules:
                self.keys[key] = _join(self.modules[path], leaf)
            elif isinstance(value, torch.Tensor) and id(value) in tensors:   # a get_attr tensor fx copied to the root
                self.keys[key] = tensors[id(value)]
        rank = {k: i for i, k in enumerate(original_state)}
        self.rank = {inner: rank.get(outer, len(rank)) for inner, outer in self.keys.items()}
        self.back: Dict[str, List[str]] = {}   # a module used twice has two internal keys per original one
        for inner, outer in self.keys.items():
            self.back.setdefault(outer, []).append(inner)

    def register(self, fused: nn.Module) -> None:
        """Install the three hooks on ``fused`` (public hook APIs where this torch has them)."""
        # (partials: torch marks a public hook with an attribute, which a bound method cannot take; and unlike
        # lambdas they pickle with the module)
        post = getattr(fused, "register_state_dict_post_hook", None)
        (post or fused._register_state_dict_hook)(partial(StateNames._on_save, self))
        fused._register_load_state_dict_pre_hook(partial(StateNames._on_load, self), with_module=True)
        fused.register_load_state_dict_post_hook(partial(StateNames._on_loaded, self))

    # state_dict(): rename this module's entries (and their metadata) in place, in the original model's order, where
    # the first of them stood (a module's entries are contiguous: they are written by one recursion)
    def _on_save(self, module, state_dict, prefix, local_metadata) -> None:
        items = list(state_dict.items())
        ours = [(k[len(prefix):], v) for k, v in items if k.startswith(prefix)]
        ours.sort(key=lambda kv: self.rank.get(kv[0], len(self.rank)))   # (stable: unplaced entries keep their order)
        state_dict.clear()
        placed = False
        for key, value in items:
            if not key.startswith(prefix):
                state_dict[key] = value
            elif not placed:
                placed = True
                for inner, v in ours:
                    state_dict[prefix + self.keys.get(inner, inner)] = v
        metadata: Optional[dict] = getattr(state_dict, "_metadata", None)
        if metadata is not None:   # keyed by module path without the trailing dot
            for inner, outer in self.modules.items():
                if prefix + inner in metadata:
                    metadata.setdefault(_join(prefix[:-1], outer), metadata.pop(prefix + inner))

    # load_state_dict(): before this module's children load, original names -> internal ones (the dict is the load's
    # own copy; its children's dicts are taken from it after this hook)
    def _on_load(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        for outer, inners in self.back.items():
            if prefix + outer in state_dict and all(prefix + k not in state_dict for k in inners):
                value = state_dict.pop(prefix + outer)
                for inner in inners:
                    state_dict[prefix + inner] = value

    # a load's missing keys under their original names (keys arrive with the whole load's prefix)
    def _on_loaded(self, module, incompatible_keys) -> None:
        missing = incompatible_keys.missing_keys
        for i, key in enumerate(missing):
            for inner, outer in self.keys.items():
                if key == inner or key.endswith("." + inner):
                    missing[i] = key[: len(key) - len(inner)] + outer
                    break

