"""Grad-mode blocks inside a traced forward: ``with torch.no_grad():`` (or ``torch.inference_mode()``) around part of
it, as a model with a frozen part writes.  fx records no grad-mode change, so the traced graph would run that part in
the caller's mode: with grad on, the frozen part's parameters would get gradients, its outputs require grad and its
activations be kept, and its regions run PyTorch's ops with autograd (unfused).

``keep_grad_blocks`` puts the change into the graph: a call turning grad off before each run of nodes traced with it
off (``match.GRAD_MODE``) and one restoring the caller's mode after it.  An ``inference_mode`` block runs with grad
off (the same values and autograd; its outputs are no inference tensors).  A forward wholly under such a mode is the
fused model's own case (``match.grad_mode``), where the graph keeps the exact mode.

Invariants: every run of grad-off nodes ends in a restore before the graph's output (the fused model restores the
caller's mode also where an op of the block raises: ``FusedModel.forward``); a region runs in one mode
(``region_mode``).
"""
from __future__ import annotations

from copy import deepcopy
from typing import Optional

import torch
import torch.fx

GRAD_MODE = "fullfuse_grad_mode"   # a traced node's meta entry: "grad", "no_grad" or "inference_mode"
_OFF = ("no_grad", "inference_mode")
_COMPUTE = ("call_function", "call_method", "call_module")


def grad_off(dependency) -> bool:
    """Turn grad off; returns whether it was on.  ``dependency``: a value of the graph, so that fx's re-trace of a
    pickled graph records this call (it records a wrapped function only where an argument is traced)."""
    enabled = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    return enabled


def grad_restore(enabled: bool) -> None:
    """Set grad mode back to what ``grad_off`` found."""
    torch._C._set_grad_enabled(enabled)


CALLS = (grad_off, grad_restore)   # (match's tracer wraps them: a re-traced graph keeps them as calls)
_side_effects = getattr(torch.fx.node, "_side_effectful_functions", None)
if isinstance(_side_effects, set):   # (fx's dead-code elimination keeps them, as torch's own _set_grad_enabled)
    _side_effects.update(CALLS)


def node_mode(node: torch.fx.Node) -> Optional[str]:
    """The grad mode ``node`` was traced in (None: a node fullfuse made, or one not traced by ``match.trace``)."""
    return node.meta.get(GRAD_MODE)


def region_mode(nodes) -> Optional[str]:
    """The mode a region of these traced nodes runs in: grad off where any of them was traced with it off (a region
    across a block's edge: its output is made from values without grad either way, and its intermediates are not
    seen), else theirs."""
    modes = [node_mode(node) for node in nodes]
    return next((mode for mode in modes if mode in _OFF), modes[-1])


def keep_grad_blocks(gm: torch.fx.GraphModule) -> bool:
    """Put ``grad_off`` / ``grad_restore`` calls around each run of ``gm``'s nodes traced with grad off, where other
    nodes were traced with it on (a forward wholly in one mode: nothing; see ``match.grad_mode``).  Returns whether
    it put any (``gm`` recompiled then).  A graph without inputs has no value to make the calls depend on: unchanged."""
    graph = gm.graph
    nodes = list(graph.nodes)
    modes = {node_mode(node) for node in nodes if node.op in _COMPUTE} - {None}
    placeholders = [node for node in nodes if node.op == "placeholder"]
    if not (modes & set(_OFF)) or "grad" not in modes or not placeholders:
        return False
    enabled = None   # the grad_off node of the run being walked (None: in the caller's mode)
    for node in nodes:
        mode = node_mode(node) if node.op in _COMPUTE else None
        ends = node.op == "output" or mode == "grad"
        if enabled is None and mode in _OFF:
            with graph.inserting_before(node):
                enabled = graph.call_function(grad_off, (placeholders[0],))
        elif enabled is not None and ends:
            with graph.inserting_before(node):
                graph.call_function(grad_restore, (enabled,))
            enabled = None
    graph.lint()
    gm.recompile()
    return True


def without_grad_blocks(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` without the calls ``keep_grad_blocks`` put in (TorchScript cannot compile them: its blocks
    then run in the caller's mode)."""
    copy = deepcopy(graph)   # (its code generator too: the forward's signature)
    for node in reversed(list(copy.nodes)):   # (a restore, which uses its grad_off, comes first)
        if node.op == "call_function" and node.target in CALLS:
            copy.erase_node(node)
    return copy
