"""A matched region's own ops, as the model wrote them: what its FusedRegion runs where the kernels' plan no longer
describes the model — a forward hook (or pre-hook) registered since on one of the region's modules or a forward set
on one, a backward hook there while autograd is on, torch's global module hooks, or the conv module's
hyperparameters re-assigned.  The ops run with the model's live modules, so every hook fires and every attribute
counts, as in the original model."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node
from torch.nn.modules import module as _module

# torch's global module hooks (dicts that registration and removal change in place)
GLOBAL_FORWARD, GLOBAL_FORWARD_PRE, GLOBAL_BACKWARD, GLOBAL_BACKWARD_PRE = (
    getattr(_module, name, {}) for name in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                            "_global_backward_hooks", "_global_backward_pre_hooks"))
_grad_enabled = torch.is_grad_enabled
# the attributes of a conv module that its forward reads besides its parameters (ConvNd / ConvTransposeNd)
CONV_ATTRIBUTES = ("stride", "padding", "dilation", "groups", "padding_mode", "output_padding")


def region_graph(gm: GraphModule, nodes: Sequence[Node], inputs: Sequence[Optional[Node]]) -> Optional[GraphModule]:
    """The region's ``nodes`` (in graph order, the last one its result) as a GraphModule of ``gm``'s modules, taking
    the values of ``inputs`` (the input tensor's node, then the weight's and the bias's where the region gets them as
    arguments; None: absent) as its arguments, in that order; None where a node reads another value of the graph."""
    graph = Graph()
    env = {}
    for i, node in enumerate(inputs):
        placeholder = graph.placeholder(f"arg{i}")
        if node is not None:
            env[node] = placeholder
    try:
        for node in nodes:
            env[node] = graph.node_copy(node, env.__getitem__)   # (KeyError: a value from outside the region)
    except KeyError:
        return None
    graph.output(env[nodes[-1]])
    return GraphModule(gm, graph, class_name="OriginalOps")


def region_modules(gm: GraphModule, nodes: Sequence[Node]) -> Tuple[nn.Module, ...]:
    """The modules the region's nodes call (the conv, an activation or pooling module...)."""
    return tuple(gm.get_submodule(str(node.target)) for node in nodes if node.op == "call_module")


class Changes:
    """``changes.since_match(conv)``: whether a region's modules now do more than its plan — a forward hook or
    pre-hook on one of them or a forward set on one (as accelerate's hooks do), a backward hook where autograd is on,
    a global module hook, or one of the conv module's CONV_ATTRIBUTES re-assigned since it was matched (compared by
    identity: any re-assignment counts).  Host time per call: the modules' hook dicts and instance dicts are read as
    they were when matched (torch registers hooks into those dicts in place); plain attribute reads, which
    torch.compile traces."""

    __slots__ = ("_forward", "_backward", "_instances", "_was")

    def __init__(self, modules: Sequence[nn.Module], conv: Optional[nn.Module]):
        # (torch's global hook dicts among them: one C-level test for all)
        self._forward = (GLOBAL_FORWARD, GLOBAL_FORWARD_PRE) + tuple(
            d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks))
        self._backward = (GLOBAL_BACKWARD, GLOBAL_BACKWARD_PRE) + tuple(
            d for m in modules for d in (m._backward_hooks, m._backward_pre_hooks))
        self._instances = tuple(vars(m) for m in modules)   # (a forward set on an instance lands there)
        self._was = None if conv is None else tuple(vars(conv).get(name) for name in CONV_ATTRIBUTES)

    def since_match(self, conv: Optional[nn.Module]) -> bool:
        if any(self._forward) or (_grad_enabled() and any(self._backward)):
            return True
        for attributes in self._instances:
            if "forward" in attributes:
                return True
        was = self._was   # (CONV_ATTRIBUTES, in that order)
        if was is None or conv is None:
            return False
        now = conv.__dict__
        return (now["stride"] is not was[0] or now["padding"] is not was[1] or now["dilation"] is not was[2]
                or now["groups"] is not was[3] or now["padding_mode"] is not was[4]
                or now["output_padding"] is not was[5])
