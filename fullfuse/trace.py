"""Tracing a model with torch.fx for fullfuse: the graph ``match`` looks for regions in, and what fx alone would lose.

``trace`` is fx's symbolic trace with fullfuse's own modules kept as calls, plus what a traced graph must keep to give
the model's answer: each node's grad mode and autocast contexts (``mode_blocks``), the training flags the forward
reads (fx bakes them in: ``TRAINING_READ``), the forward's optional inputs taken as their defaults or given values
(``optional_inputs``), the model left as it was (a forward that sets module attributes cannot be traced:
``_ModuleState``), the model's tensors shared with the graph (``share_tensor_dicts``), the forward hooks of the modules
it goes into run by the graph (``module_hooks``), and what the graph holds as constants noted for the fused model to
watch: the attributes the trace read on the modules and their classes (``ATTRIBUTES_READ``,
``CLASS_ATTRIBUTES_READ``) and the globals of the model's code (``traced_globals``).  A forward whose Python computes
what the graph would keep but the forward computes anew per call is not traced: one that reads torch's global modes
and settings or draws from a global random generator (``global_state``), sets a global, or changes in place a tensor
it makes (``_constants_changed_in_place``).
"""
from __future__ import annotations

import builtins
import contextlib
import copy
import dis
import functools
import gc
import inspect
import operator
import re
import sys
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import torch
import torch.fx
import torch.nn as nn

from .eager_reads import RecordingEagerReads, where_read
from .errors import TraceError
from .global_state import ReadingGlobalState, own_code, own_module
from .mode_blocks import AUTOCAST, GRAD_MODE, patch_lock as _patch_lock, recording_autocast
from .mode_blocks import CALLS as MODE_BLOCK_CALLS
from .module_hooks import ForwardHooks, has_call_hooks
from .trace_outputs import RecordingOutputs
from .traced_globals import ReadingGlobals, class_holding, library_module
from .watched_values import differs, put_back, restorable, snapshot, tensor_version

Node = torch.fx.Node
_MISSING = object()


class _Tracer(torch.fx.Tracer):
    """fx's symbolic tracer, with fullfuse's own modules inside the model (a fused model or region: a class with
    ``_fullfuse_leaf``) kept as module calls: a model holding a part fused before is traced as it runs.  Each node
    notes the grad mode it was traced in and the autocast contexts it was traced inside (``AUTOCAST``, from
    ``autocast``: ``mode_blocks.recording_autocast``'s list): fx records no mode change, so a forward under
    ``@torch.no_grad()`` / ``@torch.inference_mode()`` would lose it (``mode_blocks.grad_mode``), and so would a
    block in it
    (``mode_blocks``, whose calls it records as calls: the re-trace of a pickled graph)."""

    autocast: tuple = ()
    traced_through: Dict[int, nn.Module]   # the modules whose forward the trace went into (not kept as calls), by id
    # a buffer the forward reads is a traced value, as a parameter is: an in-place op on it (``self.steps += 1``) is
    # recorded, not run on the user's buffer during the trace
    proxy_buffer_attributes = True

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("autowrap_functions", MODE_BLOCK_CALLS)
        super().__init__(*args, **kwargs)
        self.traced_through = {}
        self.hooked: List[nn.Module] = []   # traced-through modules with forward hooks, by _forward_hooks' first arg
        self.thread = threading.get_ident()
        self.class_read: List[str] = []   # the model's code read a traced value's __class__ (_Proxy)

    def proxy(self, node: Node) -> torch.fx.Proxy:
        return _Proxy(node, self)

    def call_module(self, m: nn.Module, forward, args, kwargs):
        # (fx patches nn.Module.__call__ for every thread while it traces: another thread's module calls, a model
        # served meanwhile, are theirs, not the trace's)
        if threading.get_ident() != self.thread:
            return forward(*args, **kwargs)
        try:
            through = not self.is_leaf_module(m, self.path_of_module(m))
        except NameError:   # (a module outside the root: fx's own call below says so)
            through = False
        if not through:
            return super().call_module(m, forward, args, kwargs)
        self.traced_through[id(m)] = m
        if not m._forward_hooks:
            return super().call_module(m, forward, args, kwargs)
        # its ops without its hooks, then a node that runs them in every call (module_hooks; with_hooks_run)
        result = super().call_module(m, m.forward, args, kwargs)
        hooked = self.create_proxy("call_function", _forward_hooks, (len(self.hooked), args, kwargs, result), {})
        self.hooked.append(m)
        if type(result) in (tuple, list):   # (so that the caller can unpack it, as it could the call's result)
            return type(result)(hooked[i] for i in range(len(result)))
        return hooked

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: Dict[str, Any]):
        # (fx patches nn.Module.__getattr__ for every thread too: another thread reading a parameter of the traced
        # model, which it may be serving, gets the parameter, not the trace's proxy of it)
        if threading.get_ident() != self.thread:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_arg(self, a: Any):
        if type(a) is _TrainingFlag:   # (a training flag passed to an op: a constant, which the graph depends on)
            return a.seen()
        return super().create_arg(a)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        # (a TorchScript submodule: one call of it, which fx cannot trace into; a module whose hooks only its call runs)
        return (getattr(type(m), "_fullfuse_leaf", False) or isinstance(m, torch.jit.ScriptModule)
                or has_call_hooks(m) or super().is_leaf_module(m, module_qualified_name))

    def create_node(self, *args, **kwargs) -> Node:
        node = super().create_node(*args, **kwargs)
        node.meta[GRAD_MODE] = ("inference_mode" if torch.is_inference_mode_enabled()
                                else "grad" if torch.is_grad_enabled() else "no_grad")
        node.meta[AUTOCAST] = tuple(self.autocast)
        return node


class _Proxy(torch.fx.Proxy):
    """fx's proxy of a traced value, noting (in its tracer's ``class_read``) the model's code reading its
    ``__class__`` as an attribute: ``y.__class__ is torch.Tensor``, ``functools.singledispatch`` on it — fx's proxy
    class, where the value is a tensor, so the graph would hold the branch for a non-tensor.  Reads by C code
    (``isinstance``, which ``_RecordingTensorTests`` watches itself; torch's argument parsing) are no such
    instruction.  (A parameter's proxy, fx's ParameterProxy, and an attribute's, ``y.shape``, note nothing.)"""

    @property
    def __class__(self):
        tracer, frame = self.tracer, sys._getframe(1)
        if threading.get_ident() == getattr(tracer, "thread", None) and not own_code(frame) and \
                _reads_attribute(frame, "__class__") and not tracer.class_read:
            tracer.class_read.append("reading .__class__")
        return type(self)


def _reads_attribute(frame, name: str) -> bool:
    """Whether ``frame`` is running an instruction that reads attribute ``name`` (``obj.name``)."""
    return _attribute_reads(frame.f_code).get(frame.f_lasti) == name


@functools.lru_cache(maxsize=256)
def _attribute_reads(code) -> Dict[int, str]:
    """{offset: attribute name} of ``code``'s attribute reads (one disassembly per code object)."""
    return {ins.offset: ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_ATTR", "LOAD_METHOD")}


def optional_inputs(model: nn.Module) -> Dict[str, Tuple[Optional[int], Any]]:
    """The parameters of ``model.forward`` after its first whose default is None or a bool: name -> (position, None
    where keyword-only; the default).  ``trace`` takes each as its default: fx would trace a proxy for it, for which
    ``arg is None`` is False (the graph would hold the branch for a given value, which a call without one would then
    run) and ``if flag:`` fails.  Empty for a forward taking ``*args``."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return {}
    return {p.name: (i if p.kind is not inspect.Parameter.KEYWORD_ONLY else None, p.default)
            for i, p in enumerate(params) if i > 0 and (p.default is None or isinstance(p.default, bool))
            and p.kind is not inspect.Parameter.VAR_KEYWORD}


def trace(model: nn.Module, given: frozenset = frozenset()) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace(model)`` (fullfuse's own modules kept as calls; the parameters of
    ``optional_inputs`` taken as their defaults, but those named in ``given``, which a call gives another value: a
    proxy for a None default, the other bool for a bool one, the value of a (name, value) item): a new GraphModule
    sharing ``model``'s parameters.

    A GraphModule is traced again too (callers rewrite the result in place; the caller's graph stays untouched).
    Raises ``fullfuse.errors.TraceError`` (a ``RuntimeError``) naming the model class and fx's reason, also for a
    model with a forward of its own instance (accelerate's hooks, a patched method), which fx would pass over for its
    class's.
    """
    if isinstance(model, torch.jit.ScriptModule):
        raise TraceError(f"fullfuse: torch.fx could not trace {type(model).__name__}: it is a TorchScript module "
                         f"(torch.jit.script / torch.jit.trace), whose forward fx cannot follow; call fused_model on "
                         f"the Python module it was made from to fuse its conv pipelines")
    if "forward" in vars(model):
        raise TraceError(f"fullfuse: torch.fx could not trace {type(model).__name__}: its forward is set on the "
                         f"instance, and fx traces the class's forward")
    kinds = {p.kind for p in inspect.signature(model.forward).parameters.values()}
    if inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.KEYWORD_ONLY in kinds:
        raise TraceError(f"fullfuse: torch.fx could not trace {type(model).__name__} as it is called: its forward has "
                         f"*args and keyword-only parameters, which fx's graph would take positionally before *args")
    state = _ModuleState(model)
    try:
        tracer = _Tracer()
        constants = dict(item for item in given if isinstance(item, tuple))
        concrete = {name: constants[name] if name in constants else (not default if name in given else default)
                    for name, (_, default) in optional_inputs(model).items()
                    if name not in given or isinstance(default, bool) or name in constants}
        # (the modes a forward sets itself: grad_mode, mode_blocks)
        with _collection_paused(), torch.inference_mode(False), torch.enable_grad(), \
                recording_autocast() as tracer.autocast, \
                _RecordingModuleReads(model, tracer) as reads, ReadingGlobalState() as outside, \
                _RecordingTensorTests() as tensor_tests, RecordingOutputs() as outputs, \
                ReadingGlobals(lent={**tensor_tests.lent, **outputs.lent},
                               stand_ins=outside.stand_ins + tensor_tests.stand_ins + outputs.stand_ins,
                               modules=model.modules()) as module_globals, \
                RecordingEagerReads() as eager:
            graph = tracer.trace(model, concrete_args=concrete or None)
        _drop_specialization_guards(graph)
        gm = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
        with_hooks_run(gm, tracer.hooked)
        gm.__dict__[TRAINING_READ] = reads.read
        gm.__dict__[TRACED_THROUGH] = tuple(tracer.traced_through.values())
        gm.__dict__[ATTRIBUTES_READ] = {path: tuple(sorted(names)) for path, names in reads.attributes.items()}
        reads.class_attributes.setdefault("", set()).add("forward")   # (fx traced the root's class forward)
        _class_reads_by_name(reads, (model, *tracer.traced_through.values()), module_globals.attributes)
        gm.__dict__[CLASS_ATTRIBUTES_READ] = {path: tuple(sorted(names))
                                              for path, names in reads.class_attributes.items()}
        gm.__dict__[MISSING_READ] = {path: tuple(sorted(names)) for path, names in reads.missing.items()}
        gm.__dict__[GLOBALS_READ] = module_globals.read
        gm.__dict__[CLOSURES_READ] = module_globals.closures
        gm.__dict__[CLASSES_READ] = module_globals.classes
        gm.__dict__[PRIVATE_NAMES_READ] = tuple(sorted(module_globals.private))
        gm.__dict__[EAGER_READS] = where_read(model, eager.ids, module_globals.read, eager.values)
        gm.__dict__[SCRIPTING_ASKED] = bool(outside.scripting)
    except Exception as e:  # fx raises TraceError, TypeError, AttributeError, ... depending on the construct
        state.restore()
        name = type(model).__name__
        reason = f"{type(e).__name__}: {e}".strip()
        raise TraceError(
            f"fullfuse: torch.fx could not trace {name}: {reason}\n"
            f"{name}.forward probably contains data-dependent Python control flow (an `if`/`for` on tensor values) "
            f"or another construct symbolic tracing cannot follow (fused_model then fuses its submodules that trace); "
            f"to fuse a conv pipeline that {name}.forward itself calls, make that part of forward traceable "
            f"(torch.fx.wrap the offending function, or move the pipeline into a submodule)."
        ) from e
    # (fx itself puts each tensor the forward makes as a constant, ``torch.tensor(0.5)``, on the root as
    # _tensor_constant<i>, from where the GraphModule copied it)
    changed = [name for name in state.restore() if not _FX_CONSTANT.fullmatch(name)]
    why = _refusal(gm, changed, module_globals.set, tensor_tests.asked + tracer.class_read, outside, outputs.written)
    if why:
        raise TraceError(f"fullfuse: torch.fx could not trace {type(model).__name__}: its forward {why}")
    bind_to_model(gm, model)
    return gm


def _refusal(gm: torch.fx.GraphModule, changed: List[str], globals_set: List[str], tensor_tests: List[str],
             outside, written: List[str]) -> Optional[str]:
    """Why the graph ``gm`` a trace made cannot stand for the forward (the first reason, completing "its forward
    ..."), from what the trace's recorders saw and the graph itself; None where nothing is wrong."""
    if changed:
        return (f"sets module attributes or changes them in place ({', '.join(changed[:3])}), which a traced graph "
                f"would not do")
    if globals_set:
        return (f"sets global variables (or an enclosing function's) or changes them in place "
                f"({', '.join(globals_set[:3])}), which a traced graph would not do")
    if tensor_tests:
        return (f"asks whether a traced value is a tensor ({tensor_tests[0]}), which torch.fx answers no for its "
                f"proxy of the value, so the graph would hold the branch for a non-tensor")
    if outside.read:
        return (f"asks torch for a global mode or setting ({', '.join(outside.read)}), whose answer a traced graph "
                f"would hold as it was during the trace, where the forward asks in every call")
    if outside.environment:
        return (f"reads environment variables ({', '.join(outside.environment[:3])}), whose values a traced graph "
                f"would hold as they were during the trace, where the forward reads them in every call")
    if outside.drawn:
        return (f"draws random numbers outside the traced ops (from {', '.join(outside.drawn)}: e.g. torch.rand(1) "
                f"or torch.randn(64), with no traced value among its arguments, or random.random()), which a traced "
                f"graph would hold as the trace drew them, where the forward draws anew in every call")
    if written:
        return (f"writes out ({written[0]}), which a traced graph would not do: only the trace would write, once, "
                f"with torch.fx's proxies for the values")
    if _constants_changed_in_place(gm):
        return ("changes in place a tensor it makes (torch.zeros(...), then t[i] = ... or t += ...), which a traced "
                "graph makes once, at the trace, and would change again in every call")
    return None


def _class_reads_by_name(reads: "_RecordingModuleReads", modules: Iterable[nn.Module], names: Set[str]) -> None:
    """The class attributes the traced code reads other than through its module (``type(self).GAIN``,
    ``self.__class__.GAIN``), which the module's ``__getattribute__`` does not see: of the names the code reads as
    attributes, those the class of the root or of a module the trace went into holds (a class of the model's code, not
    torch's or the standard library's) and the module itself does not, noted as read on that class."""
    for module in modules:
        path = reads.paths.get(id(module))
        if path is None:
            continue
        for name in names:
            if name[:2] == "__" or name in vars(module):
                continue
            holder = class_holding(type(module), name)
            if holder is not None and not library_module(getattr(holder, "__module__", None) or "builtins"):
                reads.class_attributes.setdefault(path, set()).add(name)


def _forward_hooks(index: int, args: tuple, kwargs: dict, result):
    """Where the trace of a module with forward hooks leaves its result: ``with_hooks_run`` makes each such node a
    call of a ``module_hooks.ForwardHooks`` of the module (``_Tracer.hooked[index]``)."""
    raise RuntimeError("fullfuse: a traced graph's hook node was not bound to its module")


def with_hooks_run(gm: torch.fx.GraphModule, hooked: List[nn.Module]) -> None:
    """The ``_forward_hooks`` nodes of ``gm`` as calls of a ``ForwardHooks`` of their module each
    (``fullfuse_forward_hooks_<i>``): the graph runs the hooks of the modules it holds the ops of in every call."""
    nodes = [node for node in gm.graph.nodes if node.op == "call_function" and node.target is _forward_hooks]
    for node in nodes:
        index, *args = node.args
        name = f"fullfuse_forward_hooks_{index}"
        gm.add_submodule(name, ForwardHooks(hooked[index]))
        node.op, node.target, node.args = "call_module", name, tuple(args)
    if nodes:
        gm.recompile()


def bind_to_model(gm: torch.fx.GraphModule, model: nn.Module) -> None:
    """What makes a traced graph ``model``'s: the plain tensors it reads as plain attributes, as in the model, and the
    model's parameter and buffer dicts in fx's holders (after a trace, and again after a GraphModule is rebuilt by
    deepcopy or pickle, which undoes both)."""
    plain_tensor_attributes(gm, model)
    share_tensor_dicts(gm, model)


_FX_CONSTANT = re.compile(r"_tensor_constant\d+")
_IN_PLACE_FUNCTIONS = frozenset((operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                 operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                                 operator.ixor, operator.ilshift, operator.irshift, operator.imatmul))


def _constants_changed_in_place(gm: torch.fx.GraphModule) -> bool:
    """Whether an op the graph records may change, in place, a tensor the forward made (fx keeps it as a constant,
    ``_tensor_constant<i>``: the graph would change that one object in every call, where the forward makes a fresh
    one).  Conservative: any in-place op on the constant or on any value computed from it (a view would alias it)."""
    todo = [node for node in gm.graph.nodes if node.op == "get_attr" and _FX_CONSTANT.fullmatch(node.target)]
    seen = set(todo)
    while todo:
        node = todo.pop()
        for user in node.users:
            if _in_place(gm, user):
                return True
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return False


def _in_place(gm: torch.fx.GraphModule, node: Node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op in ("call_method", "call_function") and isinstance(name, str) and (
            (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__", "__iadd__", "__isub__",
                                                                         "__imul__", "__itruediv__")):
        return True
    if node.op == "call_function" and node.target in _IN_PLACE_FUNCTIONS:
        return True
    if "out" in node.kwargs or node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_module":
        try:
            return getattr(gm.get_submodule(node.target), "inplace", False) is True
        except AttributeError:
            return True
    return False


def plain_tensor_attributes(gm: torch.fx.GraphModule, model: nn.Module) -> None:
    """The tensors the graph reads that are no parameter or buffer of ``model`` (a plain tensor attribute,
    ``self.mean = torch.tensor(...)``; a constant the forward makes) as plain attributes of their holder in ``gm``, as
    they are in the model: fx registers each as a buffer, which would put it in the fused model's state dict (a strict
    ``load_state_dict`` of the model's checkpoint would miss it) and let ``to()`` / ``double()`` convert it where the
    model's stays as it is."""
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        prefix, _, name = node.target.rpartition(".")
        try:
            holder = gm.get_submodule(prefix)
        except AttributeError:
            continue
        if name not in holder._buffers:
            continue
        try:
            source = model.get_submodule(prefix)
        except AttributeError:
            source = None
        if source is None or name not in source._buffers:
            tensor = holder._buffers.pop(name)
            holder._non_persistent_buffers_set.discard(name)
            holder.__dict__[name] = tensor


TRAINING_READ = "_fullfuse_training_read"   # a traced graph's: {module path: its training flag} its forward read
# a traced graph's: the modules (not the root) whose forward the trace went into, their ops in the graph as they were
# with the hooks and instance forward they had (module_tree.ModuleTree watches them)
TRACED_THROUGH = "_fullfuse_traced_through"
# a traced graph's: {module path: the names of the instance attributes the trace read}, for the root and the
# modules traced through (their values baked into the graph as they were: module_tree.ModuleTree watches them)
ATTRIBUTES_READ = "_fullfuse_attributes_read"
# a traced graph's: {module path: the names the trace read on its class} (a method, ``forward``, a class-level setting)
CLASS_ATTRIBUTES_READ = "_fullfuse_class_attributes_read"
# a traced graph's: {module name: the names of its globals the model's code read during the trace} (traced_globals)
GLOBALS_READ = "_fullfuse_globals_read"
CLASSES_READ = "_fullfuse_classes_read"   # (the attributes of the model's classes its code read through a global)
CLOSURES_READ = "_fullfuse_closures_read"   # (the free variables of the model's functions the trace read)
# where the model's plain tensors are that the forward also computed with eagerly (eager_reads.where_read)
EAGER_READS = "_fullfuse_eager_reads"
MISSING_READ = "_fullfuse_missing_read"   # (names the model's code asked of a module that it did not have: hasattr)
PRIVATE_NAMES_READ = "_fullfuse_private_names_read"   # (the private names the model's code read as attributes)
# whether the forward asked torch.jit.is_scripting(): the graph holds its eager branch, a script of the model the other
SCRIPTING_ASKED = "_fullfuse_scripting_asked"


class _TrainingFlag(int):
    """A module's training flag while it is traced: the bool it is (an int: fx takes it as a constant), noting the
    module's path in ``read`` where the traced code tests it (``if self.training:``) or passes it to an op
    (``F.dropout(x, p, self.training)``: ``_Tracer.create_arg``)."""

    def __new__(cls, flag: bool, path: str, read: Dict[str, bool]):
        self = super().__new__(cls, bool(flag))
        self.path, self.read = path, read
        return self

    def seen(self) -> bool:
        self.read.setdefault(self.path, bool(int(self)))
        return bool(int(self))

    def __bool__(self) -> bool:
        return self.seen()

    def __repr__(self) -> str:
        return repr(bool(int(self)))


class _TrainingAttribute:
    """``training`` of a module class while a model of it is traced: the tracing thread gets a traced module's flag as a
    ``_TrainingFlag``; every other read, and every write, is the instance dict's bool, as without it (other threads
    may run the same modules meanwhile)."""

    def __init__(self, recording: "_RecordingModuleReads"):
        self.recording = recording

    def __get__(self, module, owner=None):
        if module is None:
            return self
        try:
            flag = module.__dict__["training"]
        except KeyError:
            raise AttributeError("training") from None
        recording = self.recording
        if threading.get_ident() == recording.thread and id(module) in recording.paths and type(flag) is bool:
            return _TrainingFlag(flag, recording.paths[id(module)], recording.read)
        return flag

    def __set__(self, module, flag) -> None:
        module.__dict__["training"] = flag


def _torchs(cls: type, name: str) -> bool:
    """Whether ``cls`` finds ``name`` on one of torch's (or fullfuse's) classes: not one of the model's code."""
    holder = class_holding(cls, name)
    return holder is not None and own_module(holder.__module__)


class _RecordingModuleReads:
    """For the duration of a trace in this thread: the modules whose ``training`` flag the traced code reads
    (``self.training`` in a forward fx traces through), as {path: value} in ``read``.  fx bakes the value into the
    graph, so a graph that read one holds only while the flag is as it was (``FusedModel``).  The classes of the
    model's modules get a ``_TrainingAttribute`` meanwhile (fx's leaves, torch.nn's modules, read their own flag when
    the graph runs; the forward may read it too).  Likewise the instance attributes of those modules that the trace
    reads (``self.scale``, ``self.config``, ``self._scale`` behind a property: fx keeps what the forward computes from
    them), as {path: names} in ``attributes``, the names it reads on their classes (``forward``, a method, a
    class-level setting) in ``class_attributes``, and those the model's code asked for and the module did not have
    (``hasattr(self, "extra")``, ``getattr(self, "extra", None)``: the graph holds the branch for their absence) in
    ``missing``, through a ``__getattribute__`` on their classes meanwhile (module_tree.ModuleTree watches them)."""

    def __init__(self, model: nn.Module, tracer: torch.fx.Tracer):
        self.paths: Dict[int, str] = {}
        self.classes = []
        # (fx's leaves too: the forward may read their flag or a setting, ``self.bn.training``, ``self.drop.p``; not
        # fullfuse's own modules or TorchScript's, whose classes are not the model's)
        for path, module in model.named_modules():
            if (id(module) in self.paths or getattr(type(module), "_fullfuse_leaf", False)
                    or isinstance(module, torch.jit.ScriptModule)):
                continue
            self.paths[id(module)] = path
            if type(module) not in self.classes:
                self.classes.append(type(module))
        self.read: Dict[str, bool] = {}
        self.attributes: Dict[str, set] = {}
        self.class_attributes: Dict[str, set] = {}
        self.missing: Dict[str, set] = {}

    def __enter__(self) -> "_RecordingModuleReads":
        _patch_lock.acquire()
        self.thread = threading.get_ident()
        self.saved = [(cls, cls.__dict__.get("training", _MISSING), cls.__dict__.get("__getattribute__", _MISSING))
                      for cls in self.classes]
        for cls in self.classes:
            cls.training = _TrainingAttribute(self)
            cls.__getattribute__ = self._reading(cls.__getattribute__)
        return self

    def _reading(self, inherited):
        """A ``__getattribute__`` noting the traced modules' instance attributes this thread reads: public ones, and
        private ones the model's own code reads (``self._scale`` behind a property), not nn.Module's own dicts."""
        thread, paths, attributes, class_attributes = self.thread, self.paths, self.attributes, self.class_attributes
        missing = self.missing

        def getattribute(module, name):
            if name != "training" and id(module) in paths and threading.get_ident() == thread and (
                    name[0] != "_" or name not in _MODULE_OWN and name[:2] != "__" and not own_code(sys._getframe(1))):
                if name in object.__getattribute__(module, "__dict__"):
                    attributes.setdefault(paths[id(module)], set()).add(name)
                elif hasattr(type(module), name):   # (a method, a class-level setting)
                    # (the model's code's reads, ``forward``, which nn.Module's call reads, and what torch's code reads
                    # of the model's own classes: fx's and torch's reads of torch's own methods, ``named_modules()``,
                    # ask nothing of the model, and each would cost host time per call)
                    if name == "forward" or not own_code(sys._getframe(1)) or not _torchs(type(module), name):
                        class_attributes.setdefault(paths[id(module)], set()).add(name)
                elif not any(name in object.__getattribute__(module, d) for d in _TENSOR_AND_MODULE_DICTS) and \
                        not own_code(sys._getframe(1)):   # (model code asking for what is not there: hasattr)
                    missing.setdefault(paths[id(module)], set()).add(name)
            return inherited(module, name)
        return getattribute

    def __exit__(self, *exc) -> None:
        for cls, training, getattribute in reversed(self.saved):
            for name, attribute in (("training", training), ("__getattribute__", getattribute)):
                if attribute is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, attribute)
        _patch_lock.release()


class _RecordingTensorTests:
    """For the duration of a trace in this thread: whether the model's code asked if a traced value is a tensor
    (``isinstance(y, torch.Tensor)``, ``torch.is_tensor(y)``, ``type(y) is torch.Tensor``), which fx answers for its
    proxy — no — where the value the graph computes is a tensor: the graph would hold the branch for a non-tensor.
    ``isinstance`` and ``torch.is_tensor`` are wrapped meanwhile (other threads' calls, torch's and fullfuse's own
    pass through); ``type`` is lent to the model's modules alone (``lent``, for ``ReadingGlobals``): an object that is
    ``type`` in every use but a call of it on a traced value, which it notes."""

    def __init__(self):
        self.asked: List[str] = []
        self.lent: Dict[str, object] = {}
        self.stand_ins: List[Tuple[object, object]] = []   # (torch.is_tensor, its wrapper), for ReadingGlobals

    def __enter__(self) -> "_RecordingTensorTests":
        _patch_lock.acquire()
        thread, asked, real = threading.get_ident(), self.asked, builtins.isinstance
        self.saved = real, torch.is_tensor

        def isinstance_(obj, cls):
            if real(obj, torch.fx.Proxy) and threading.get_ident() == thread and _names_a_tensor(cls) and \
                    not own_code(sys._getframe(1)):
                asked.append("isinstance(..., torch.Tensor)")
            return real(obj, cls)

        def is_tensor(obj):
            if real(obj, torch.fx.Proxy) and threading.get_ident() == thread and not own_code(sys._getframe(1)):
                asked.append("torch.is_tensor(...)")
            return real(obj, torch.Tensor)

        def type_of(obj):
            if real(obj, torch.fx.Proxy) and threading.get_ident() == thread:
                asked.append("type(...)")
        self.lent["type"] = _LentType(type_of)
        builtins.isinstance, torch.is_tensor = isinstance_, is_tensor
        self.stand_ins.append((self.saved[1], is_tensor))
        return self

    def __exit__(self, *exc) -> None:
        builtins.isinstance, torch.is_tensor = self.saved
        _patch_lock.release()


@contextlib.contextmanager
def _collection_paused():
    """No automatic garbage collection while the recorders watch the trace's thread: gc.callbacks (hypothesis's, a
    profiler's) run in whichever thread allocates, and what they set, draw or log would be taken for the forward's."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class _LentType:
    """A stand-in for the builtin ``type`` in the model's modules during a trace, answering every use as ``type``:
    ``type(obj)`` (which first tells ``called_with(obj)``), ``type(name, bases, namespace)``, ``isinstance(x, type)``,
    ``issubclass(c, type)``, ``class Meta(type)`` (through ``__mro_entries__``: a metaclass, whose base is ``type``),
    and its attributes (``type.__new__(mcs, ...)``, ``type.__call__(cls, ...)``, ``type.__name__``: type's own).  Where
    ``type(obj)`` is ``type`` (a class's, ``type(type)``) it answers itself, so that ``type(c) is type`` holds in those
    modules too (``type(c) is builtins.type`` does not, meanwhile)."""

    __slots__ = ("called_with",)

    def __init__(self, called_with: Callable[[object], None]):
        object.__setattr__(self, "called_with", called_with)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs:
            obj = args[0]
            object.__getattribute__(self, "called_with")(obj)
            return self if obj is self or type(obj) is type else type(obj)
        return type(*args, **kwargs)

    def __instancecheck__(self, obj) -> bool:
        return obj is self or isinstance(obj, type)

    def __subclasscheck__(self, sub) -> bool:
        return sub is self or issubclass(sub, type)

    def __mro_entries__(self, bases) -> tuple:
        return (type,)

    def __getattribute__(self, name):
        if name == "__mro_entries__":   # (class statements look it up as an attribute)
            return object.__getattribute__(self, name)
        return getattr(type, name)

    def __repr__(self) -> str:
        return repr(type)


def _names_a_tensor(cls) -> bool:
    """Whether an isinstance class spec (a class, a tuple of them, a union) includes torch.Tensor or a subclass."""
    if type(cls) is tuple:
        return any(map(_names_a_tensor, cls))
    if not hasattr(cls, "__mro__"):   # (a union, ``int | torch.Tensor``)
        return any(map(_names_a_tensor, getattr(cls, "__args__", ())))
    return torch.Tensor in cls.__mro__


class _ModuleState:
    """What a forward can set on ``model``'s modules — their attributes, parameters, buffers and children, and the
    contents of their list, dict and set attributes — as it was before a trace, to put back after it: a forward that
    sets them (``self.features = y``, ``self.steps += 1``, ``self.history.append(y)``, ``self.cache[k] = y``) would
    leave fx's traced values on the user's model, and the traced graph would never set them."""

    def __init__(self, model: nn.Module):
        # (TorchScript modules aside: their state lives in TorchScript, which a trace does not run)
        self.saved = [(path, module, dict(module.__dict__), dict(module._parameters), dict(module._buffers),
                       dict(module._modules)) for path, module in model.named_modules()
                      if not isinstance(module, torch.jit.ScriptModule)]
        # the containers and NumPy arrays among the attributes (not nn.Module's own dicts): (path, name, the container,
        # its snapshot, a copy of its items to put back)
        self.contents = [(path, name, value, snapshot(value), copy.copy(value))
                         for path, module, attributes, *_ in self.saved for name, value in attributes.items()
                         if restorable(value) and name not in _MODULE_OWN]
        # the plain tensor attributes (not parameters or buffers, which fx reads as graph inputs): a forward changing
        # one in place with no traced value involved (``self.calls.add_(1)``) does so at the trace alone.  (path,
        # name, the tensor, its version, a copy to put back: up to _COPIED elements)
        self.tensors = [(path, name, value, tensor_version(value),
                         value.detach().clone() if value.numel() <= _COPIED else None)
                        for path, module, attributes, *_ in self.saved for name, value in attributes.items()
                        if isinstance(value, torch.Tensor) and tensor_version(value) is not None]

    def restore(self) -> List[str]:
        """Put every module back as it was; returns the names that had changed ("path.attribute")."""
        changed = []
        for path, module, attributes, parameters, buffers, children in self.saved:
            # (the instance dict first: putting it back puts back the three dicts below as objects)
            for now, then in ((module.__dict__, attributes), (module._parameters, parameters),
                              (module._buffers, buffers), (module._modules, children)):
                names = [k for k in now.keys() | then.keys() if now.get(k, _MISSING) is not then.get(k, _MISSING)]
                if names:   # (identity only: a tensor's == is elementwise)
                    changed.extend(f"{path}.{k}" if path else k for k in names)
                    now.clear()
                    now.update(then)
        for path, name, value, was, items in self.contents:
            if differs(was, value):
                changed.append(f"{path}.{name}" if path else name)
                put_back(value, items)
        for path, name, value, version, copied in self.tensors:
            if tensor_version(value) != version:
                changed.append(f"{path}.{name}" if path else name)
                if copied is not None:
                    with torch.no_grad():
                        value.copy_(copied)
        return changed


_TENSOR_AND_MODULE_DICTS = ("_parameters", "_buffers", "_modules")
_COPIED = 1 << 20   # (elements of a plain tensor attribute copied before a trace, to be put back if it changes)
_MODULE_OWN = frozenset(vars(nn.Module()))   # (nn.Module's own instance attributes: its dicts of hooks and tensors)


def share_tensor_dicts(copy: nn.Module, model: nn.Module) -> None:
    """Give the graph (or a copy of ``model``) and each attribute holder fx made in it (a plain nn.Module at a path of
    ``model``) the parameter and buffer dicts of ``model``'s module at that path, where it holds nothing else: a
    tensor the forward reads by attribute (``self.scale``) is then one entry for the model, the fused graph, the
    graphs traced for optional inputs and the copies of untraceable models — a Parameter assigned later, or one
    ``torch.func.functional_call`` swaps in under either model's name, reaches all of them."""
    for path, module in copy.named_modules():
        try:
            source = model.get_submodule(path) if path else model
        except AttributeError:
            continue
        if source is module or (path and type(module) is not nn.Module):
            continue
        pairs = ((module._parameters, source._parameters), (module._buffers, source._buffers))
        if all(theirs.get(k, _MISSING) is v for mine, theirs in pairs for k, v in mine.items()):
            module.__dict__.update(_parameters=source._parameters, _buffers=source._buffers,
                                   _non_persistent_buffers_set=source._non_persistent_buffers_set)


def _drop_specialization_guards(graph: torch.fx.Graph) -> None:
    """fx guards each argument traced as a given value (``_assert_is_none``, ``torch._assert`` of an equality); the
    fused model checks those arguments itself before the graph runs (``model._graph_arguments``), and a GraphModule
    whose code names fx's ``_assert_is_none`` breaks every later symbolic trace in the process once it is unpickled
    (fx registers that dotted name as a wrapped function it then cannot find: KeyError, torch 2.13)."""
    is_none = getattr(torch.fx._symbolic_trace, "_assert_is_none", None)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        guard = node.target is is_none or (node.target is torch._assert and len(node.args) > 1
                                           and "has been specialized" in str(node.args[1]))
        if guard and not node.users:
            tested = node.args[0]
            graph.erase_node(node)
            if isinstance(tested, Node) and tested.op == "call_function" and not tested.users:
                graph.erase_node(tested)
