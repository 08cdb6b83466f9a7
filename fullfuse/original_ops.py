"""A matched region's own ops, as the model wrote them: what its FusedRegion runs where the kernels' plan no longer
describes the model — a forward hook (or pre-hook) registered since on one of the region's modules or a forward set
on one, a backward hook there while autograd is on, torch's global module hooks, or a setting of one of them changed
(the conv's stride, GELU's approximation, a pool's size).  The ops run with the model's live modules, so every hook
fires and every attribute counts, as in the original model."""
from __future__ import annotations

from operator import itemgetter
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


def settings_of(modules: Sequence[nn.Module]) -> Tuple[Tuple[Tuple[str, ...], tuple], ...]:
    """Each module's settings as it is now — its public plain instance attributes other than ``training`` (a conv's
    stride, padding...; GELU's ``approximate``; a pool's sizes) — then its hook dicts (``HOOK_DICTS``, the dict objects
    themselves): per module, their names and values (lists copied).  What the region's plan was made from; kept with
    the region from the match on (a copy or pickle keeps it too)."""
    out = []
    for m in modules:
        names = tuple(k for k, v in vars(m).items()
                      if not k.startswith("_") and k != "training" and isinstance(v, SETTING_TYPES))
        names += HOOK_DICTS
        out.append((names, tuple(list(v) if isinstance(v, list) else v for v in (vars(m)[k] for k in names))))
    return tuple(out)


SETTING_TYPES = (int, float, str, tuple, list, type(None))
_DELETED = object()
# a module's hook dicts, which torch registers hooks into (in place) and runs them from
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


class Changes:
    """``changes.since_match(compiling)``: whether a region's modules now do more than its plan — a forward hook or
    pre-hook on one of them or a forward set on one (as accelerate's hooks do), a backward hook where autograd is on, a
    global module hook, or one of their settings (``settings_of``) set to another value since they were matched (before
    the first call too; an equal value re-assigned changes nothing).  Host time per call: the modules' hook dicts of
    the match are tested for hooks (torch registers hooks into those dicts in place), and the settings and hook dicts
    the modules have now are compared with the match's by one itemgetter per module (a hook dict put in place of the
    module's own compares by content); plain attribute reads, which torch.compile traces."""

    __slots__ = ("_forward", "_backward", "_modules", "_named")

    def __init__(self, modules: Sequence[nn.Module], settings: Tuple[Tuple[Tuple[str, ...], tuple], ...]):
        # the hook dicts of the match (``settings_of``: its last four) and torch's global ones: one C-level test each
        self._forward = (GLOBAL_FORWARD, GLOBAL_FORWARD_PRE) + tuple(d for _, was in settings for d in was[-4:-2])
        self._backward = (GLOBAL_BACKWARD, GLOBAL_BACKWARD_PRE) + tuple(d for _, was in settings for d in was[-2:])
        # per module: its instance dict (where a forward set on it lands, and its settings), an itemgetter of its
        # setting and hook dict names and their values at the match (several names: the itemgetter gives a tuple)
        self._modules = tuple((vars(m), itemgetter(*names), was) for m, (names, was) in zip(modules, settings))
        self._named = tuple((vars(m), names, was) for m, (names, was) in zip(modules, settings))

    def since_match(self, compiling: bool) -> bool:
        """(``compiling``: whether torch.compile is tracing the call.)"""
        if any(self._forward) or (_grad_enabled() and any(self._backward)):
            return True
        if compiling:   # (torch.compile cannot trace an itemgetter: the same tests by name)
            return any("forward" in attributes or any(attributes.get(name, _DELETED) != value
                                                      for name, value in zip(names, was))
                       for attributes, names, was in self._named)
        try:
            for attributes, settings, was in self._modules:
                if "forward" in attributes or settings(attributes) != was:
                    return True
        except KeyError:   # (a setting deleted)
            return True
        return False
