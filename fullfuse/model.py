"""fused_model(): trace a model, replace every matched region with a FusedRegion, keep everything else."""
from __future__ import annotations

import functools
import types
import warnings
from typing import List, Optional

import torch
from torch import nn

from . import calls, mode_blocks
from .dispatch import check_path
from .eager_reads import held_by_the_graph
from .errors import TraceError
from .match import counts_dims_from_the_batch, find_matches
from .mode_blocks import AUTOCAST, GRAD_MODE, grad_mode, keep_mode_blocks, node_autocast, one_autocast, region_mode
from .mode_blocks import without_mode_blocks
from .module_hooks import ForwardHooks
from .module_tree import ModuleTree, StaleTree, graph_tensors
from .original_names import OriginalNames
from .original_ops import (GLOBAL_BACKWARD, GLOBAL_BACKWARD_PRE, GLOBAL_FORWARD, GLOBAL_FORWARD_PRE,
                           region_graph, region_modules)
from .plan import Plan, make_plan
from .precision import check_precision
from .region import FusedRegion, fx_tracing, jit_tracing, keep_as_fx_call
from .state_names import NOT_CALLED, StateNames, not_called
from .trace import (ATTRIBUTES_READ, CLASS_ATTRIBUTES_READ, CLASSES_READ, CLOSURES_READ, EAGER_READS, GLOBALS_READ,
                    MISSING_READ, PRIVATE_NAMES_READ, SCRIPTING_ASKED, TRACED_THROUGH, TRAINING_READ, bind_to_model,
                    optional_inputs, trace)


class FusedModel(nn.Module):
    """The traced model with its regions replaced (or, for a model fx cannot trace as a whole, a copy of it whose
    children hold the fused parts: ``_fused_parts``); ``plans`` lists each region's family, spec, path and reason.
    Its state dict uses the original model's names (``StateNames``): original checkpoints load into it, and its own
    into the original model — also where either is a submodule of a larger model."""

    _fullfuse_leaf = True   # (trace.trace keeps it as a module call inside a larger model)
    _mode_blocks = False
    GRAPH_LIMIT = 32   # graphs traced for calls giving optional inputs (``_graph_for``)

    def __init__(self, graph_module: nn.Module, plans: List[Plan], original: nn.Module,
                 grad_mode: Optional[str] = None, blocks: bool = False, root_hooks: bool = True):
        super().__init__()
        self.training = original.training   # (the model's mode, as train() / eval() would report it)
        self.graph_module = graph_module
        self.plans = plans
        # "no_grad" / "inference_mode" where the traced forward set that mode for all its ops (mode_blocks.grad_mode):
        # the graph runs in it, as the forward would
        self._grad_mode = grad_mode
        # whether a graph changes grad mode or autocast for a block of the forward (mode_blocks): forward restores the
        # caller's modes where an op of the block raises
        self._mode_blocks = blocks
        # graph_module is the original module itself (no region) or a copy of it (fused parts in its children), called
        # as the user would (its hooks run), not a traced graph
        self._as_module = graph_module is original or not isinstance(graph_module, torch.fx.GraphModule)
        # the forward parameters the graph was traced with as their defaults (None, a bool: trace.optional_inputs),
        # and, where there are any, the original module, whose own forward runs a call that gives another value
        self._optional = {} if self._as_module else optional_inputs(original)
        # the modules whose training flag the traced forward read (fx baked it into the graph: trace.TRAINING_READ),
        # each with the flag it read: a call where one differs runs a graph traced for the flags as they are
        # (``_graph_for``); the root's flag is this model's own (a fused part's: its copy's, ``_fused_parts``)
        read = {} if self._as_module else graph_module.__dict__.get(TRAINING_READ, {})
        self.__dict__["_training_of"] = [self if path == "" else original.get_submodule(path) for path in read]
        self.__dict__["_training_root"] = self if "" in read else None
        self.__dict__["_traced_training"] = tuple(read.values())
        if self._optional or read:   # (a copy without the root's hooks, which its forward does not run: nothing to
            self.__dict__["_model"] = _copy_of(original, hooks=False)   # pickle)
        # the original root's own hooks (its hook dicts: also hooks added to it later) run around the graph, through a
        # copy of it whose forward is the graph's (the hooks get a module of the model's class and attributes); none
        # where graph_module is called as a module, which runs them itself, or where a copy calling this model's
        # forward runs them (root_hooks False: _fused_parts); a pickled or copied fused model has none (__getstate__)
        hooked = None if self._as_module or not root_hooks else _copy_of(original, forward=self._graph_forward)
        self.__dict__["_hooked"] = hooked
        self.__dict__["_root_hooks"] = () if hooked is None else (
            hooked._forward_pre_hooks, hooked._forward_hooks, hooked._backward_pre_hooks, hooked._backward_hooks)
        # the graphs of calls that give optional inputs another value (``_graph_for``): the names given -> the graph
        # traced so, its regions fused (None: the model's own forward serves them); their plans follow the first
        # ``_plans_of_the_graph`` of ``plans``
        self.__dict__["_graphs"], self._plans_of_the_graph = {}, len(plans)
        # the graph forward whose shape _lone_name describes (None: not yet looked at), and the name of the region the
        # graph consists of where it is nothing else (lone_region)
        self._lone_checked, self._lone_name = None, None
        # the model (outside _modules: its modules are the graph's, its state dict this one's) and its module tree as
        # fused: where a module of it is re-assigned since (or one the trace went into changed), its own forward runs
        # (``_replaced``), as under a torch.compile that cannot trace the graph's autocast blocks; a pickled or copied
        # fused model makes its own tree (__setstate__)
        self.__dict__["_original"] = None if graph_module is original else original
        # (the modules the trace went into and the attributes it read, kept here: a GraphModule's copy drops what fx
        # does not know of its dict)
        self.__dict__["_traced_through"] = None if self._as_module else graph_module.__dict__.get(TRACED_THROUGH, ())
        traced = {} if self._as_module else graph_module.__dict__
        self.__dict__["_reads"] = (traced.get(ATTRIBUTES_READ, {}), traced.get(CLASS_ATTRIBUTES_READ, {}),
                                   traced.get(GLOBALS_READ, {}), traced.get(PRIVATE_NAMES_READ, ()),
                                   traced.get(MISSING_READ, {}), traced.get(CLOSURES_READ, {}),
                                   traced.get(CLASSES_READ, {}))
        self.__dict__["_eager_reads"] = traced.get(EAGER_READS, ())
        self.__dict__["_asks_scripting"] = traced.get(SCRIPTING_ASKED, False)
        self.__dict__["_tree"] = None if graph_module is original else self._module_tree(graph_module, original)
        self.__dict__["_warned_replaced"] = None
        # whether a call is the graph's forward and nothing else: a traced graph without optional inputs, training
        # flags, a grad mode of its own or mode blocks (_graph_forward)
        self.__dict__["_plain"] = not (self._as_module or self._optional or read or grad_mode or blocks)
        if not self._as_module:   # (a traced graph holds only what the forward reaches: the rest joins it, and the
            # graph's children are placed in the model's order, which a larger model holding this one lists them in)
            for i, module in enumerate(not_called(original, self)):
                graph_module.add_module(f"{NOT_CALLED}{i}", module)
            _in_model_order(graph_module, original)
        names = StateNames(original, self)
        names.register(self)
        self.__dict__["_original_names"] = OriginalNames(self, graph_module, original, names.modules)
        keep_as_fx_call(self)

    def __getattr__(self, name: str):
        """The original model's attribute names reach the same objects here (``original_names``); its other public
        attributes (a setting, ``num_classes``, a config, a method) are the model's own."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            names = self.__dict__.get("_original_names")
            if names is None:
                raise
            if self.__dict__.get("_as_module"):   # (what the model's own forward set on its copy, ``fused.features``)
                return getattr(self._modules["graph_module"], name)
            try:
                return names.get(self, name)
            except AttributeError:
                original = self.__dict__.get("_original")
                if original is None or name.startswith("_"):
                    raise
                return getattr(original, name)

    def __setattr__(self, name: str, value) -> None:
        """A module or tensor by one of the original's names goes where the graph reads it (``original_names``); a
        plain attribute the original model has (``fused.scale = 3.0``, a plain tensor) is set on the model, whose
        forward reads it (the model's module tree sees the change); anything else is the fused model's own."""
        d = self.__dict__
        names = d.get("_original_names")
        if names is None or name in d or not names.set(self, name, value):
            # (the module this one calls as it is, where it has no traced graph: ``__getattr__`` reads it there too)
            model = d["_modules"]["graph_module"] if d.get("_as_module") else d.get("_original")
            if (names is not None and model is not None and name not in d and not name.startswith("_")
                    and name in vars(model) and not isinstance(value, nn.Module)):
                setattr(model, name, value)
                return
            super().__setattr__(name, value)

    def __call__(self, *args, **kwargs):
        """``forward`` without nn.Module.__call__ where that would only add host time (~1 us per call): no hooks on this
        module, no global module hooks, no ``Module.compile()``, no forward set on it, and no tracing (fx, TorchScript)
        or torch.compile, which all see the module call as usual.  A graph that is one region called on the one input
        runs that region's forward directly (the generated forward's frame and the region's own checks, ~1 us more; the
        checks here are the region's)."""
        d = self.__dict__   # (nn.Module keeps these in the instance dict; read there: host time per call)
        if (d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
                or GLOBAL_FORWARD or GLOBAL_FORWARD_PRE or GLOBAL_BACKWARD or GLOBAL_BACKWARD_PRE
                or d.get("_compiled_call_impl") is not None or "forward" in d or jit_tracing() or fx_tracing()
                or calls.compiling()):
            return super().__call__(*args, **kwargs)
        tree = d["_tree"]   # (ModuleTree.traced_parts_changed, inline: host time)
        if tree is not None and (tree.was != tree.live(tree.holder) or (not tree.hooks_only and tree.rest_changed())):
            return self.forward(*args, **kwargs)   # (which says what changed)
        if any(d["_root_hooks"]):
            return self._tree_forward(*args, **kwargs)
        gm = d["_modules"]["graph_module"]
        if len(args) == 1 and not kwargs:
            # (fx sets a graph's forward on its own class; a TorchScript module's class has a descriptor there that
            # raises AttributeError: None, and lone_region says None for it)
            forward = getattr(type(gm), "forward", None)
            if forward is not d["_lone_checked"]:   # a graph not yet looked at (built, recompiled, copied)
                d["_lone_name"] = None if d["_grad_mode"] is not None or d["_training_of"] else lone_region(gm)
                d["_lone_checked"] = forward
            if d["_lone_name"] is not None:
                region = gm._modules.get(d["_lone_name"])
                if type(region) is FusedRegion and "forward" not in region.__dict__:
                    return region.run(args[0])
        if d["_plain"]:   # (_tree_forward's common case, inline: no global forward hooks, tested above)
            return gm.forward(*args, **kwargs)
        return self._graph_forward(*args, **kwargs)

    def __getstate__(self):
        """Pickling and deepcopy: without the generated forward looked at last (a function fx made, which pickle cannot
        name); the copy looks at its own graph again."""
        state = dict(super().__getstate__())
        state["_lone_checked"] = state["_lone_name"] = None
        state["_hooked"], state["_root_hooks"] = None, ()   # (the original model's hooks stay with it)
        # (the copy's model: the original without the root's hooks, its modules the copied graph's; the copy watches
        # it from its own tree, made when it is restored: __setstate__.  Where the model had changed since it was
        # fused, the copied graph no longer describes it, and the copy runs its model's own forward: _stale)
        original, tree = state["_original"], state["_tree"]
        state["_original"], state["_tree"] = None if original is None else _copy_of(original, hooks=False), None
        state["_stale"] = state.get("_stale") or (None if tree is None else tree.changed())
        # (the graphs for given optional inputs are traced again where needed, their plans added again)
        state["_graphs"], state["plans"] = {}, state["plans"][:state["_plans_of_the_graph"]]
        return state

    def __setstate__(self, state):
        """A copy (deepcopy, pickle): a GraphModule is rebuilt from its code and attributes, which registers the
        plain tensors it reads as buffers again and gives fx's holders dicts of their own: the graph gets the
        model's dicts and plain tensors again, as ``trace.trace`` gave them, and the copy its own module tree."""
        super().__setstate__(state)
        original = self.__dict__.get("_original")
        if original is None:
            return
        graph = self._modules["graph_module"]
        if not self._as_module:
            bind_to_model(graph, original)
        stale = self.__dict__.get("_stale")
        d = self.__dict__
        d["_tree"] = StaleTree(stale) if stale else self._module_tree(graph, original)

    def _module_tree(self, graph: nn.Module, original: nn.Module) -> ModuleTree:
        """The tree of ``original`` as ``graph`` was traced from it: what the trace went into and read, and the
        tensors the graph holds as they are (less those the trace also computed with eagerly)."""
        d = self.__dict__
        eager = d.get("_eager_reads", ())
        held = held_by_the_graph(graph_tensors(graph), original, eager)
        return ModuleTree(original, d["_traced_through"], *d.get("_reads", ()), held=held, eager=eager)

    def _apply(self, fn, recurse=True):
        """Conversions (``to``, ``cuda``, ``half``...) reach the original module too where a call can run its own
        forward (``_optional``): a module only the branch for a given input calls is not in the traced graph."""
        super()._apply(fn, recurse)
        model = self.__dict__.get("_model")
        if model is not None and recurse:
            model._apply(fn, recurse)
        return self

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """nn.Module's, in the original model's order, as ``state_dict`` is: an optimizer built on ``parameters()``
        (and a checkpoint of its state), ``parameters_to_vector`` or a zip with the original's parameters pair them
        as the original's would (the graph holds its modules in the order the forward calls them).  The names are
        the fused model's own paths."""
        return _in_original_order(super().named_parameters(prefix, recurse, remove_duplicate),
                                  self.__dict__.get("_original"), "parameters")

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """nn.Module's, in the original model's order (``named_parameters``)."""
        return _in_original_order(super().named_buffers(prefix, recurse, remove_duplicate),
                                  self.__dict__.get("_original"), "buffers")

    def train(self, mode: bool = True):
        super().train(mode)
        for name in ("_model", "_hooked"):
            model = self.__dict__.get(name)
            if model is not None:
                model.train(mode)
        return self

    def __prepare_scriptable__(self) -> nn.Module:
        """torch.jit.script (which calls this first): TorchScript cannot launch fullfuse's kernels, so it gets the
        model's own ops — the traced graph with each region's own ops in its place, over the same modules — with a
        warning; a model with no region is the original module itself, a copy with fused parts (``_fused_parts``) is
        scripted with each part's own forward back (``_own_ops``)."""
        gm = self._modules["graph_module"]
        if self._as_module:
            ops = _own_ops(gm)
            if ops is not gm:
                _warn_scripted_ops()
            return ops
        if self.__dict__.get("_asks_scripting") or any(isinstance(module, ForwardHooks) for module in gm.children()):
            # (the graph holds the branch of ``torch.jit.is_scripting()`` that eager calls take, a script the other;
            # the hooks of a module the graph holds the ops of: TorchScript runs a module's hooks with its call; so
            # it gets the model itself, as a user scripting the model would)
            _warn_scripted_ops()
            return self.__dict__["_original"]
        # (shares gm's modules; without mode_blocks' calls, which TorchScript cannot compile)
        ops = torch.fx.GraphModule(gm, without_mode_blocks(gm.graph), class_name=type(gm).__name__)
        for name, region in gm.named_children():
            if isinstance(region, FusedRegion):
                original = region.__dict__["_original"]
                if original is None:
                    raise RuntimeError(f"fullfuse: torch.jit.script cannot script {name}: its ops read values of the "
                                       f"model outside the region; script the original model instead (the fused "
                                       f"model shares its parameters), or use torch.jit.trace / torch.compile")
                setattr(ops, name, original)
        _warn_scripted_ops(self._mode_blocks)
        return ops

    def extra_repr(self) -> str:
        """Where the regions live in copies of the model's modules (``_fused_parts``), which print as the originals:
        each region's path and plan."""
        if not (self._as_module and self.plans):
            return ""
        return "fused parts:\n" + "\n".join(f"  {plan}" for plan in self.plans)

    def forward(self, *args, **kwargs):
        if self.__dict__["_original"] is not None and (jit_tracing() or calls.exporting()):
            return self._recorded(args, kwargs)
        tree = self.__dict__["_tree"]
        changed = None if tree is None else tree.changed()
        if changed is not None:
            return self._replaced(changed, args, kwargs)
        return self._tree_forward(*args, **kwargs)

    def _tree_forward(self, *args, **kwargs):
        """``forward`` where the model's module tree is as fused: the original root's hooks around the graph, else the
        graph; a graph that needs nothing else (``_plain``) called straight away (host time per call)."""
        d = self.__dict__
        if any(d["_root_hooks"]):   # (the original root's hooks: __init__)
            return d["_hooked"](*args, **kwargs)
        if d["_plain"] and not (GLOBAL_FORWARD or GLOBAL_FORWARD_PRE):
            return d["_modules"]["graph_module"].forward(*args, **kwargs)   # no second Module.__call__ (host time)
        return self._graph_forward(*args, **kwargs)

    def _graph_forward(self, *args, **kwargs):
        if self._as_module:
            return self._modules["graph_module"](*args, **kwargs)
        if GLOBAL_FORWARD or GLOBAL_FORWARD_PRE:
            return self._model_forward(args, kwargs)
        graph = self._modules["graph_module"]
        training = self.__dict__["_training_of"]
        flags = tuple(module.training for module in training) if training else ()
        given = self._optional and (kwargs or len(args) > 1)
        if given or flags != self.__dict__["_traced_training"]:
            call = _graph_arguments(self._optional, args, kwargs) if given else (frozenset(), args, kwargs)
            graph = None if call is None else self._graph_for(call[0], flags)
            if graph is None:   # (the model's own forward: see _graph_for)
                for plan in self.plans:
                    plan.calls.last = ("torch", "an optional input given or a training flag changed: the model's own "
                                                "forward runs")
                return self.__dict__["_model"].forward(*args, **kwargs)
            _, args, kwargs = call
        if self._mode_blocks:
            if calls.compiling():
                if mode_blocks.compile_cannot_trace(graph):   # (the forward's own `with` blocks trace)
                    return self.__dict__["_original"].forward(*args, **kwargs)
            else:   # (the caller's modes back where an op of a block raises)
                depth = mode_blocks.open_contexts()
                try:
                    with _grad_context(self._grad_mode):
                        return graph.forward(*args, **kwargs)
                except BaseException:
                    mode_blocks.exit_contexts(depth)
                    raise
        if self._grad_mode is not None:
            with _grad_context(self._grad_mode):
                return graph.forward(*args, **kwargs)
        return graph.forward(*args, **kwargs)   # no second Module.__call__ (host time)

    def _replaced(self, what: str, args, kwargs):
        """A call after ``what`` (``ModuleTree.changed``: a module of the model re-assigned, added or deleted, or one
        the trace went into given other hooks or another forward): the fused graph still holds the modules and ops as
        they were, so the model's own forward runs, with every region's ops as written (warned once per change; fusing
        again fuses the model as it is now)."""
        if self.__dict__["_warned_replaced"] != what and not calls.compiling():   # (dynamo cannot trace a warning)
            self.__dict__["_warned_replaced"] = what
            warnings.warn(f"fullfuse: {what} after fused_model; the fused model runs the model's own forward (no "
                          f"kernel) until it is as it was: call fused_model(model) again to fuse the model as it is",
                          stacklevel=3)
        for plan in self.plans:
            plan.calls.last = ("torch", f"{what} after fused_model: the model's own forward runs")
        return self._run_model(args, kwargs, call=True)

    def _recorded(self, args, kwargs):
        """A call under a TorchScript trace (torch.jit.trace, ONNX export) or torch.export, which record PyTorch's ops
        (the regions would run theirs too): the model's own call, whose code answers for itself what fx kept of the
        trace's answers (``torch.jit.is_tracing()``, ``torch.onnx.is_in_onnx_export()``: False in the graph)."""
        for plan in self.plans:
            plan.calls.last = ("torch", "a TorchScript trace or torch.export records the model's own forward")
        return self._run_model(args, kwargs, call=True)

    def _model_forward(self, args, kwargs):
        """A call while a global module hook is registered (``register_module_forward_hook``: a module tracker, a
        profiler): in the model every module call fires it, where the graph holds the ops of the modules the trace
        went into, not their calls, so the model's own forward runs (this fused model stands for its root, whose call
        fired the hooks already)."""
        for plan in self.plans:
            plan.calls.last = ("torch", "a global module hook is registered: the model's own forward runs, so that "
                                        "every module call fires it")
        return self._run_model(args, kwargs, call=False)

    def _run_model(self, args, kwargs, call: bool):
        """The model's own call (``call``: its hooks too) or forward, with this fused model's training flag (the
        root's flag is this model's: train())."""
        original = self.__dict__["_original"]
        was, original.training = original.training, self.training
        try:
            return original(*args, **kwargs) if call else type(original).forward(original, *args, **kwargs)
        finally:
            original.training = was

    def use_training_of(self, root: nn.Module) -> None:
        """Read the root's training flag from ``root`` (a fused part's copy, which its model's train() reaches)."""
        training = self.__dict__["_training_of"]
        training[:] = [root if module is self else module for module in training]
        self.__dict__["_training_root"] = root

    def _graph_for(self, given: frozenset, flags: tuple = ()):
        """The graph of calls giving the optional inputs named in ``given`` another value than their default, with the
        training flags the forward reads as ``flags`` (the fused model's own for none and those it was traced with),
        traced and fused on the first such call, its plans added to ``plans``; None where
        fx cannot trace the model so or no region matches there (the model's own forward runs those calls), under
        torch.compile where it is not made yet (dynamo does not trace fx's tracing), and past ``GRAPH_LIMIT`` graphs
        (a flag given ever new ints)."""
        traced = flags == self.__dict__["_traced_training"]
        if not given and traced:
            return self._modules["graph_module"]
        graphs, key = self.__dict__["_graphs"], given if traced else (given, flags)
        if key not in graphs:
            if calls.compiling() or len(graphs) >= self.GRAPH_LIMIT:
                return None
            model, first = self.__dict__["_model"], self.plans[0]
            root = self.__dict__["_training_root"]
            if root is not None:   # (the copy's own flag: the root's as it is; its modules' are theirs)
                model.training = root.training
            try:
                gm = trace(model, given)
            except TraceError:
                gm = None
            if gm is not None and tuple(gm.__dict__.get(TRAINING_READ, {}).values()) != flags:
                gm = None   # (the copy's forward read other flags: the model's own forward serves)
            plans = [] if gm is None else _fuse_regions(gm, first.requested, first.calls.precision,
                                                        first.calls.deterministic)
            if plans and keep_mode_blocks(gm):
                self._mode_blocks = True
                self.__dict__["_plain"] = False
            named = sorted(item if isinstance(item, str) else f"{item[0]}={item[1]!r}" for item in given)
            label = ", ".join(named) + " given" if named else ""
            if not traced:
                label += ("; " if label else "") + ", ".join(f"training={flag}" for flag in flags)
            for plan in plans:
                plan.name = f"{plan.name} ({label})"
            self.plans.extend(plans)
            graphs[key] = gm if plans else None
        return graphs[key]


def fused_model(model: nn.Module, *, path: str = "auto", precision: str = "auto",
                deterministic: bool = True) -> FusedModel:
    """Return a module computing the same outputs as ``model``, with every conv pipeline of family A
    (conv -> activation -> global pool) and B (conv-transpose -> max-pool chain -> channel reduction) fused.

    path: "auto" (fused where available, else the fallback, else torch), "fused" (raise UnsupportedError where
    the fused kernel cannot serve), "fallback", "torch".  precision: "auto" (PyTorch's own setting for cuDNN
    convs), "tf32" or "ieee" for float32 inputs.  deterministic: fixed reduction order (same bits every run).
    The parameters stay shared with ``model``.  Where fx cannot trace ``model`` as a whole (data-dependent control
    flow...), its submodules that trace are fused and its own forward runs around them.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fullfuse: fused_model takes a torch.nn.Module, got {type(model).__name__} (a function's "
                        f"ops can be called through fullfuse.ops)")
    check_path(path)
    check_precision(precision)
    if isinstance(model, FusedModel):
        raise ValueError("fullfuse: this model is fused already (a FusedModel); call fused_model on the original "
                         "model for other arguments (the fused model shares its parameters)")
    try:
        gm = trace(model)
    except TraceError as error:   # fx cannot follow the model's forward: its children are fused where they trace
        parts = _fused_parts(model, path, precision, deterministic)
        if parts is None:
            warnings.warn(f"{error}\nNone of its submodules that trace holds a fusable conv pipeline: the fused "
                          f"model runs {type(model).__name__}'s own forward unchanged", stacklevel=2)
            return FusedModel(model, [], model)
        return FusedModel(*parts, model)
    fused = _fused_graph(model, gm, path, precision, deterministic)
    if fused is None:   # nothing to fuse: the original module runs as it is (no re-traced graph, no host time added)
        warnings.warn(f"fullfuse: no fusable conv pipeline found in {type(model).__name__}; the fused model runs its "
                      f"own forward unchanged", stacklevel=2)
        return FusedModel(model, [], model)
    return fused


def _fused_graph(model: nn.Module, gm: torch.fx.GraphModule, path: str, precision: str, deterministic: bool,
                 root_hooks: bool = True) -> Optional[FusedModel]:
    """``model`` traced as ``gm``, its matched regions replaced (in ``gm``); None where nothing matched."""
    mode = grad_mode(gm)   # (before the regions replace traced nodes)
    plans = _fuse_regions(gm, path, precision, deterministic)
    if not plans:
        return None
    blocks = keep_mode_blocks(gm)
    return FusedModel(gm, plans, model, mode, blocks, root_hooks)


def _fuse_regions(gm: torch.fx.GraphModule, path: str, precision: str, deterministic: bool) -> List[Plan]:
    """Replace each region matched in ``gm`` by a FusedRegion (``gm`` recompiled); their plans (none: ``gm`` as it
    was)."""
    # (a match across an autocast block's edge is left to PyTorch's ops: its ops compute in two precisions)
    matches = [match for match in find_matches(gm) if one_autocast(match.nodes)]
    if not matches:
        return []
    plans = []
    for index, match in enumerate(matches):
        name = f"fullfuse_region_{index}"
        plan = make_plan(name, match.spec, match.description, path)
        conv = gm.get_submodule(match.conv_module) if match.conv_module else None
        args = (match.input_node,) if conv is not None else (match.input_node, match.weight, match.bias)
        original = region_graph(gm, match.nodes, args)
        gm.add_submodule(name, FusedRegion(plan, conv, precision, deterministic, original,
                                           region_modules(gm, match.nodes), counts_dims_from_the_batch(match.nodes)))
        with gm.graph.inserting_before(match.output_node):
            new_node = gm.graph.call_module(name, args)
        new_node.meta.update({GRAD_MODE: region_mode(match.nodes), AUTOCAST: node_autocast(match.output_node)})
        match.output_node.replace_all_uses_with(new_node)
        for node in reversed(match.nodes):
            gm.graph.erase_node(node)
        plans.append(plan)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    _bind_called_submodules(gm)
    return plans


def _fused_parts(module: nn.Module, path: str, precision: str, deterministic: bool):
    """For a module fx cannot trace: (a copy of it whose children holding a fusable pipeline are fused, the plans of
    their regions, named by the child's path), or None where no child holds one.  A child that traces becomes a copy
    of itself whose forward is its fused model's; one that does not becomes such a copy of its own children in turn.
    Copies (``_copy_of``) keep the class, attributes and hooks of their original (the model's own forward finds what
    it looks for there, its hooks fire) and state-dict names (their children are the original ones), and change
    nothing of the user's model."""
    replaced, plans = {}, []
    for name, child in module.named_children():
        if child is None or isinstance(child, FusedModel):
            continue
        try:
            gm = trace(child)
        except TraceError:
            part = _fused_parts(child, path, precision, deterministic)
        else:   # (no region in a child that traces: none in its children either)
            fused = _fused_graph(child, gm, path, precision, deterministic, root_hooks=False)   # (the copy runs them)
            part = None if fused is None else (_copy_of(child, forward=fused.forward), fused.plans)
            if part is not None and fused.__dict__["_training_root"] is not None:   # (the copy is in the model's tree:
                fused.use_training_of(part[0])                                        # train() and eval() reach it)
        if part is None:
            continue
        replaced[name] = part[0]
        for plan in part[1]:
            plan.name = f"{name}.{plan.name}"
            plans.append(plan)
    return (_copy_of(module, children=replaced), plans) if replaced else None


def _copy_of(module: nn.Module, children: Optional[dict] = None, forward=None, hooks: bool = True) -> nn.Module:
    """A shallow copy of ``module`` (as DataParallel's replicas: the same attributes, hook dicts, or empty ones where
    not ``hooks``, and parameter and buffer dicts: ``trace.share_tensor_dicts``) with its own dict of children
    (``children`` replacing some), and ``forward`` set on the instance where given (nn.Module.__call__ runs the copy's
    hooks around it)."""
    copy = type(module).__new__(type(module))
    copy.__dict__ = dict(module.__dict__)
    copy.__dict__["_modules"] = {**module._modules, **(children or {})}
    own = module.__dict__.get("forward")
    if forward is None and own is not None:   # (an instance's forward bound to it runs on the copy instead)
        if isinstance(own, types.MethodType) and own.__self__ is module:
            copy.__dict__["forward"] = types.MethodType(own.__func__, copy)
        elif isinstance(own, functools.partial) and own.args and own.args[0] is module:
            copy.__dict__["forward"] = functools.partial(own.func, copy, *own.args[1:], **own.keywords)
    if not hooks:
        copy.__dict__.update({name: type(value)() for name, value in module.__dict__.items()
                              if "_hooks" in name and isinstance(value, dict)})
    if forward is not None:
        copy.__dict__["forward"] = forward
    return copy


_CONSTANTS = (bool, int, str)   # values of a None-default input a graph is traced for (``_graph_arguments``)


def _graph_arguments(optional: dict, args: tuple, kwargs: dict):
    """(what a call gives ``optional``'s inputs other than their default — a name where the graph takes the value as
    an input, (name, value) for a None-default input given a bool, int or str, which the graph is traced for, as a
    flag (``return_dict=True``, ``mode="features"``: a branch on it traces) — and its arguments for the graph traced
    so: ``trace.trace(model, given)``, where fx renamed the parameters it took as values, so those passed by name are
    dropped), or None where a bool input is given a value that is no bool (the model's own forward)."""
    given = []
    for name, (position, default) in optional.items():
        by_name = name in kwargs
        if by_name:
            value = kwargs[name]
        elif position is not None and position < len(args):
            value = args[position]
        else:
            continue
        constant = value is default or isinstance(default, bool)
        if value is not default:
            if isinstance(default, bool) and type(value) is not bool:
                return None
            constant = constant or type(value) in _CONSTANTS
            given.append((name, value) if constant and not isinstance(default, bool) else name)
        if by_name and constant:
            kwargs = {k: v for k, v in kwargs.items() if k != name}
    return frozenset(given), args, kwargs


def _grad_context(mode: Optional[str]):
    """The grad mode a graph runs in: the forward's own where it set one for all its ops, else the caller's (a
    context that sets it back on the way out)."""
    if mode == "inference_mode":
        return torch.inference_mode()
    return torch.no_grad() if mode == "no_grad" else torch.set_grad_enabled(torch.is_grad_enabled())


def _warn_scripted_ops(blocks: bool = False) -> None:
    dropped = ("; the forward's grad-mode and autocast blocks run in the caller's modes there (script the original "
               "model to keep them)") if blocks else ""
    warnings.warn("fullfuse: torch.jit.script scripts the model's own ops (TorchScript cannot launch fullfuse's "
                  f"kernels); torch.compile keeps them{dropped}", stacklevel=4)


def _own_ops(module: nn.Module) -> nn.Module:
    """``module`` with every fused part below it (``_fused_parts``' copies) running its own forward again, as copies
    (TorchScript compiles the class's forward); ``module`` itself where it holds none."""
    changed = {}
    for name, child in module._modules.items():
        own = None if child is None else _own_ops(child)
        if own is not child:
            changed[name] = own
    fused_forward = isinstance(getattr(module.__dict__.get("forward"), "__self__", None), FusedModel)
    if not changed and not fused_forward:
        return module
    copy = _copy_of(module, changed)
    copy.__dict__.pop("forward", None)
    return copy


def lone_region(gm: nn.Module) -> Optional[str]:
    """The name of the FusedRegion that traced graph ``gm`` consists of, where it is nothing else — one input (no
    default), that region called on it alone, its result returned, as for a model that is one fused pipeline — else
    None (any other module, graph or signature)."""
    if not isinstance(gm, torch.fx.GraphModule):   # (a user's model: none of its attributes read)
        return None
    nodes = list(gm.graph.nodes)
    if len(nodes) != 3:
        return None
    x, call, out = nodes
    if not (x.op == "placeholder" and not x.args and call.op == "call_module" and call.args == (x,)
            and not call.kwargs and out.op == "output" and out.args == (call,)):
        return None
    return call.target if type(gm._modules.get(call.target)) is FusedRegion else None


def _in_model_order(gm: nn.Module, model: nn.Module) -> None:
    """The children of ``gm``, and of the plain containers fx made in it, reordered as ``model`` holds the modules they
    hold (fx adds them in the order the forward calls them, the regions last): a larger model holding the fused one
    lists their parameters and buffers in the model's order, as ``FusedModel.named_parameters`` does (the modules the
    traced forward does not reach among them: ``state_names.not_called``).  A child holding none of the model's
    modules keeps its place; the model's own modules are never reordered."""
    index, owner = {}, {}   # the model's modules, and the tensors they hold, -> the module's place in modules()
    for i, module in enumerate(model.modules()):
        index[id(module)] = i
        for tensor in _tensors_of(module):
            owner.setdefault(id(tensor), i)

    def first(child):   # (fx's holder of a traced-through module's tensors holds the tensors alone)
        found = [] if child is None else [place for m in child.modules()
                                          for place in (index.get(id(m)), *(owner.get(id(t)) for t in _tensors_of(m)))
                                          if place is not None]
        return min(found) if found else None

    def reorder(holder):
        children = list(holder._modules.items())
        keys = [first(child) for _, child in children]
        slots = [i for i, key in enumerate(keys) if key is not None]
        ordered = list(children)
        for slot, source in zip(slots, sorted(slots, key=keys.__getitem__)):
            ordered[slot] = children[source]
        holder._modules.clear()
        holder._modules.update(ordered)
        for _, child in ordered:
            if type(child) is nn.Module and id(child) not in index:   # (a container fx made)
                reorder(child)
    reorder(gm)


def _tensors_of(module: nn.Module):
    return [t for t in (*module._parameters.values(), *module._buffers.values()) if t is not None]


def _bind_called_submodules(gm: nn.Module) -> None:
    """Host time per call: fx's generated forward fetches every called submodule by attribute, through
    nn.Module.__getattr__ (~1 us per path step, paid in every call; the original model's own forward often fetches
    them faster, e.g. nn.Sequential's loop).  The GraphModule and the plain nn.Module containers fx made for nested
    paths are fullfuse's own: each called module is also put in its holder's instance dict there, where attribute
    lookup finds it first.  The user's modules are never touched.  nn.Module.__setattr__ drops such an entry when a
    submodule is re-assigned, so the two never disagree."""
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        holder = gm
        for name in node.target.split("."):
            child = holder._modules.get(name)
            if child is None:
                break
            if holder is gm or type(holder) is nn.Module:
                holder.__dict__[name] = child
            holder = child


def _in_original_order(items, original: Optional[nn.Module], kind: str):
    """(name, tensor) pairs sorted by the tensor's place in ``original``'s parameters() / buffers() (those it does not
    hold after them, as they came); as they came where there is no original."""
    if original is None:
        return items
    rank = {id(t): i for i, t in enumerate(getattr(original, kind)())}
    return iter(sorted(items, key=lambda item: rank.get(id(item[1]), len(rank))))
