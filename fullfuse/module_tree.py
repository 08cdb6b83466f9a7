"""Whether a model's module tree is still the one it was fused from.

A fused model holds the original's modules (the same objects) in a graph of its own, whose paths are not the
model's: a module re-assigned, added or deleted on the model after ``fused_model`` (``model.fc = nn.Linear(...)``,
``model.blocks.append(...)``, which a Sequential's forward would run) would be invisible to it, a silent wrong
answer.  ``ModuleTree`` keeps the children of each module that has any as they were fused; where they differ, the
fused model runs the model's own forward (see ``FusedModel``).  Tensors need no such test: the graph shares the
model's parameter and buffer dicts (``trace.share_tensor_dicts``).

The same holds for the modules the trace went into (the root, a block, a Sequential, a custom activation:
``trace.TRACED_THROUGH``), whose calls the graph does not make: it holds their ops as the trace ran them (their forward
hooks then run from the graph: ``module_hooks``), with the settings they read (``self.scale``, ``self.config.k``) as
constants and their plain tensor attributes as the objects they were; so are the globals of the model's code that the
trace read and the free variables of its functions made by a factory (``traced_globals``). A hook registered on one
since (or one removed, a forward set or deleted, a setting, global or free variable changed, a tensor attribute
re-assigned) would be invisible too; ``ModuleTree`` watches their hook dicts, instance dicts and those variables as
well. The modules the graph calls run their own hooks; those a region replaced are its own change test's
(``original_ops.Changes``).
"""
from __future__ import annotations

import sys
from operator import attrgetter, itemgetter
from types import BuiltinFunctionType, FunctionType, MethodType, SimpleNamespace
from typing import Callable, Collection, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from .calls import compiling
from .original_ops import HOOK_DICTS, SETTING_TYPES
from .traced_globals import ClassAttributes, FreeVariables, class_holding
from .watched_values import Same, SameLayout, differs, fields_of, plain_objects, public_fields, snapshot

_DELETED = object()


class ModuleTree:
    """``ModuleTree(model, traced_through).changed()``: what changed on ``model`` since it was fused (the module text),
    as a sentence naming the module (None: nothing).  A module without children when fused may get some (a
    parametrization registered on a conv adds ``parametrizations``): its class's forward decides what they do, as the
    graph's.  Host time per call: one C-level comparison, ``was != live(holder)`` (each parent's ``_modules``, which
    ``nn.Module.__setattr__``, ``register_module`` and the containers' methods change, the class attributes read, the
    traced-through modules' hooks and forwards), and where more is watched, ``rest_changed`` (both inline in
    ``FusedModel``)."""

    __slots__ = ("instances", "copies", "paths", "watched", "hook_copies", "through_instances",
                 "forwards", "through_paths", "settings", "tensors", "class_lookups", "class_values", "shadows",
                 "shadow_keys", "shadow_names", "missing", "read_tensors", "hooks_only", "holder", "live", "was")

    def __init__(self, model: nn.Module, traced_through: Optional[Sequence[nn.Module]] = None,
                 read: Optional[Dict[str, Sequence[str]]] = None,
                 class_read: Optional[Dict[str, Sequence[str]]] = None,
                 globals_read: Optional[Dict[str, Sequence[str]]] = None, private_read: Sequence[str] = (),
                 missing_read: Optional[Dict[str, Sequence[str]]] = None,
                 closures_read: Optional[Dict[Callable, Sequence[str]]] = None,
                 classes_read: Optional[Dict[type, Sequence[str]]] = None, held: Collection[int] = (),
                 eager: Sequence[Tuple[str, str, str]] = ()):
        """traced_through: the modules (not the root) the trace of ``model`` went into; None where the fused model
        calls ``model`` itself, not a traced graph.  read / class_read: {module path: the attributes the trace read
        on the module / its class} (``trace.ATTRIBUTES_READ``, ``CLASS_ATTRIBUTES_READ``); globals_read: {Python
        module: the globals the trace's code read} (``trace.GLOBALS_READ``); private_read: the private names the
        trace's code reads as attributes (``trace.PRIVATE_NAMES_READ``: ``config._k``), watched on config objects
        too; missing_read: {module path: the names the model's code asked of the module and it did not have}
        (``trace.MISSING_READ``: ``hasattr(self, "extra")``), watched for staying absent; closures_read: {function of
        the model's code: the free variables of it the trace read} (``trace.CLOSURES_READ``); classes_read: {class of
        the model's code: its attributes the trace's code read through a global} (``trace.CLASSES_READ``); held: the
        ids of the tensors the graph holds as constants (``graph_tensors``), whose changes in place reach it; eager:
        where the tensors are that the trace computed with outside the graph (``trace.EAGER_READS``), of which the
        parameters and buffers are watched here."""
        # (not a TorchScript module's: its children live in TorchScript, where Python assignment does not reach; every
        # module inside one is a ScriptModule too)
        parents = [(path, module) for path, module in model.named_modules(remove_duplicate=False)
                   if module._modules and not isinstance(module, torch.jit.ScriptModule)]
        # each parent's instance dict, where its _modules is (Sequential's `del` puts a new one there), and a copy of
        # its children
        self.instances = tuple(vars(module) for _, module in parents)
        self.copies = tuple(dict(module._modules) for _, module in parents)
        self.paths = tuple(path for path, _ in parents)
        # the traced-through modules: copies of their hook dicts as fused (four per module, in ``HOOK_DICTS``' order),
        # their instance dicts and their own forwards (None: none); the per-call comparison (below) and the by-name
        # test (``_traced_change``) both compare with these
        paths = {id(module): path for path, module in model.named_modules(remove_duplicate=False)}
        through = [module for module in traced_through or () if id(module) in paths and module is not model]
        self.hook_copies = tuple(_ordered_copy(getattr(m, name)) for m in through for name in HOOK_DICTS)
        self.through_instances = tuple(vars(m) for m in through)
        self.forwards = tuple(instance.get("forward") for instance in self.through_instances)
        self.through_paths = tuple(paths[id(m)] for m in through)
        # the settings of the root and the traced-through modules, which fx reads as constants: their public plain
        # attributes (numbers, strings, tuples, lists) and any other attribute the trace read (a dict, a config
        # object, a function); the globals the trace's code read; then the public fields of the plain objects among
        # them all (a config object: the same object after ``config.k = 3``), each object once.  Each entry: _entry's
        modules = ([model] if traced_through is not None else []) + through
        # (the modules the graph calls, whose attributes the forward read too: ``self.drop.p``; only those)
        called = [_submodule(model, path) for path in (read or {}) if path not in self.through_paths and path]
        called = [m for m in called if m is not None and id(m) in paths]
        settings, objects, seen = [], [], set()
        places = [(f"the model's {_traced(paths[id(m)])} changed its setting '{{}}'", vars(m),
                   _setting_names(vars(m), (read or {}).get(paths[id(m)], ()))) for m in modules]
        places += [(f"the model's module '{paths[id(m)]}' changed its setting '{{}}'", vars(m),
                    tuple(n for n in read[paths[id(m)]] if n in vars(m) and not isinstance(vars(m)[n], torch.Tensor)))
                   for m in called]
        places += [(f"the global '{{}}' of module {name!r} (the traced code reads it) changed", vars(sys.modules[name]),
                    tuple(n for n in names if n in vars(sys.modules[name])))
                   for name, names in (globals_read or {}).items() if name in sys.modules]
        places += [(f"the variable '{{}}' that {function.__qualname__} (traced) takes from the function it was made in "
                    f"changed", free, tuple(n for n in names if n in free))
                   for function, names in (closures_read or {}).items() for free in [FreeVariables(function)]]
        places += [(f"the attribute '{{}}' of class {cls.__qualname__} (the traced code reads it) changed",
                    attributes, tuple(n for n in names if n in attributes))
                   for cls, names in (classes_read or {}).items() for attributes in [ClassAttributes(cls)]]
        for sentence, values, names in places:
            if names:
                settings.append(_entry(sentence, "", values, names, held))
            for name in names:
                for where, obj in plain_objects(values[name], name, seen=seen, also=private_read):
                    fields = public_fields(obj, also=private_read)
                    if fields:
                        objects.append(_entry(sentence, f"{where}.", fields_of(obj), fields, held))
        # their plain tensor attributes (not parameters or buffers: fx keeps the tensor object itself in the graph, or
        # what the forward computed from its values), compared by identity, and by version where the forward read it
        # and the graph does not hold it (``.item()``, ``self.t * 2`` at the trace): (path, instance dict, name, a
        # Same or SameTensor of the tensor as fused)
        self.tensors = tuple((paths[id(m)], vars(m), name,
                              snapshot(value, held=held) if name in (read or {}).get(paths[id(m)], ()) else Same(value))
                             for m in modules for name, value in vars(m).items() if isinstance(value, torch.Tensor))
        # what the trace read on the classes of the root and the traced-through modules (their ``forward``, methods,
        # class-level settings), in the per-call comparison (below).  The root's are looked up on the root itself, so
        # that one set on it (``model.forward = f``, ``model.GAIN = 3.0``) shows; the others' on their classes, and a
        # name set on one of those modules is ``shadows``' (below).  Kept as ``_kept`` keeps them: a class-level list
        # or dict changed in place shows too.
        root = [model] if traced_through is not None else []
        lookups = _class_attributes(root, through + called, paths, class_read or {})
        # (holder, name, what the class held as fused): the by-name test (``_class_change``) looks on the classes alone
        self.class_lookups = tuple((holder, name, getattr(holder if isinstance(holder, type) else type(holder), name))
                                   for holder, name, _ in lookups)
        self.class_values = tuple(_kept(value, held) for _, _, value in lookups)
        # the names read on the classes of the traced-through and called modules, which one set on such a module
        # would hide: (instance dict, the names, path) each; ``traced_parts_changed`` tests them.  Not ``forward``: one
        # set on a traced-through module is ``forwards``' test, and a module the graph calls runs its own
        read_on = {}
        for holder, name, _ in lookups:
            if isinstance(holder, type) and name != "forward":
                for m in through + called:
                    if type(m) is holder:
                        read_on.setdefault(id(m), (vars(m), set(), paths[id(m)]))[1].add(name)
        self.shadows = tuple((instance, tuple(sorted(names)), path) for instance, names, path in read_on.values())
        self.shadow_keys = tuple(instance.keys() for instance, _, _ in self.shadows)   # (live views)
        self.shadow_names = tuple(frozenset(names) for _, names, _ in self.shadows)
        # class-level config objects: their fields, as the modules' (above)
        for holder, name, value in lookups:
            for where, obj in plain_objects(value, name, seen=seen, also=private_read):
                fields = public_fields(obj, also=private_read)
                if fields:
                    kind = f"class {holder.__qualname__}" if isinstance(holder, type) else "root module"
                    objects.append(_entry(f"the model's {kind} changed its setting '{{}}'", f"{where}.", fields_of(obj),
                                          fields, held))
        self.settings = tuple(settings + objects)
        # the names the model's code found missing on a module (the graph holds the branch for their absence): (path,
        # its instance, parameter, buffer and module dicts, their keys, its class, the names), each to stay absent
        self.missing = tuple((path, dicts, tuple(d.keys() for d in dicts), type(m), frozenset(names))
                             for path, names in (missing_read or {}).items()
                             for m in [_submodule(model, path)] if m is not None and id(m) in paths
                             for dicts in [(vars(m), m._parameters, m._buffers, m._modules)])
        # the parameters and buffers the trace reached as tensors (``next(self.parameters()).dtype``): their dtype,
        # device and shape, and their values where it read them, as fx kept them (parameter / buffer dict, name, kind,
        # path, a SameLayout of the tensor as fused)
        self.read_tensors = tuple(
            (tensors, name, kind.partition(" ")[0], f"{place}.{name}" if place else name,
             SameLayout(tensors[name], values=not kind.endswith(" layout")))
            for kind, place, name in eager if kind.startswith(("parameter", "buffer"))
            for module in [_submodule(model, place) if place else model] if module is not None
            for tensors in [module._parameters if kind.startswith("parameter") else module._buffers]
            if tensors.get(name) is not None)
        self.hooks_only = not (self.settings or self.tensors or self.shadows or self.missing or self.read_tensors)
        self.watched = bool(through) or not self.hooks_only
        # the per-call test, one C-level tuple comparison ``was != live(holder)`` (inline in FusedModel): ``live`` an
        # attrgetter of dotted names on a namespace holding views of the parents' instance dicts (``p<i>._modules``:
        # dicts, compared by content, their values by identity first), the holders of the class attributes read
        # (``h<i>.<name>``) and views of the traced-through modules' instance dicts (their four hook dicts,
        # OrderedDicts compared in order, and their own ``forward``, None where they have none); ``was`` what they
        # gave as fused (copies of the dicts).  Two names at least, so that the getter gives a tuple.
        holders = list(dict.fromkeys(h for h, _, _ in lookups))
        index = {id(holder): i for i, holder in enumerate(holders)}
        spaces = {f"p{i}": _InstanceView.of(instance) for i, instance in enumerate(self.instances)}
        spaces.update({f"h{i}": holder for i, holder in enumerate(holders)})
        spaces.update({f"t{i}": _InstanceView.of(instance) for i, instance in enumerate(self.through_instances)})
        dotted = [f"p{i}._modules" for i in range(len(parents))]
        dotted += [f"h{index[id(holder)]}.{name}" for holder, name, _ in lookups]
        was = self.copies + self.class_values
        for i, forward in enumerate(self.forwards):
            dotted += [f"t{i}.{name}" for name in HOOK_DICTS + ("forward",)]
            was += self.hook_copies[4 * i:4 * i + 4] + (forward,)
        if len(dotted) == 1:
            dotted, was = dotted * 2, was * 2
        self.holder = SimpleNamespace(**spaces)
        self.live, self.was = (attrgetter(*dotted), was) if dotted else (_NOTHING, ())

    def traced_parts_changed(self) -> bool:
        """Whether the parents' children, the class attributes read, or a traced-through module's hooks or forward
        changed since the model was fused, or the root or a traced-through module got another setting or plain
        tensor.  Outside torch.compile (``unchanged``; inline in ``FusedModel.__call__``)."""
        return self.was != self.live(self.holder) or (not self.hooks_only and self.rest_changed())

    def rest_changed(self) -> bool:
        """``traced_parts_changed``'s tests beyond the per-call comparison: settings, plain tensor attributes, tensors
        read, shadowed class attributes, names found missing."""
        try:
            for _, _, values, _, get, was in self.settings:
                if was != get(values):
                    return True
        except Exception:   # (a setting deleted: KeyError; a comparison that raises)
            return True
        for _, instance, name, kept in self.tensors:
            if not kept.matches(instance.get(name)):
                return True
        for tensors, name, _, _, kept in self.read_tensors:
            if not kept.matches(tensors.get(name)):
                return True
        if not all(map(KEYS_DISJOINT, self.shadow_keys, self.shadow_names)):
            return True
        return any(not keys.isdisjoint(names) or any(hasattr(cls, name) for name in names)
                   for _, _, views, cls, names in self.missing for keys in views)

    def unchanged(self) -> bool:
        if compiling():   # (torch.compile cannot trace an itemgetter or methodcaller: the same tests, by name)
            return (tuple(instance["_modules"] for instance in self.instances) == self.copies
                    and self._class_change() is None and (not self.watched or self._traced_change() is None))
        return not self.traced_parts_changed()

    def changed(self) -> Optional[str]:
        """What changed since the model was fused, as a sentence about the model's module (None: nothing)."""
        if self.unchanged():
            return None
        for instance, was, path in zip(self.instances, self.copies, self.paths):
            modules = instance["_modules"]
            for name in list(was) + [name for name in modules if name not in was]:
                if modules.get(name) is not was.get(name):
                    where = f"{path}.{name}" if path else name
                    return f"the model's module '{where}' was re-assigned, added or deleted"
        return self._class_change() or self._traced_change()

    def _class_change(self) -> Optional[str]:
        """``class_values != class_get(class_holder)`` by name, as torch.compile can trace it (no bound method made):
        the first difference as a sentence (None: none)."""
        for (holder, name, raw), value in zip(self.class_lookups, self.class_values):
            cls = holder if isinstance(holder, type) else type(holder)
            if cls is not holder and name in vars(holder):
                return f"the model has its own '{name}' (set on it), where the trace read its class's"
            now = getattr(cls, name, _DELETED)
            if now is not raw or (isinstance(value, (list, tuple, dict, set)) and differs(value, now)):
                return (f"the model's class {cls.__qualname__} has another '{name}' (a patch of the class, or a change "
                        "inside a value it holds)")
        return None

    def _traced_change(self) -> Optional[str]:
        """``traced_parts_changed``'s tests one by one, by name: the first difference as a sentence (None: none)."""
        for i, (instance, path) in enumerate(zip(self.through_instances, self.through_paths)):
            # (the hook dicts the module has now: one may have been replaced)
            hooks = zip((instance.get(name) for name in HOOK_DICTS), self.hook_copies[4 * i:4 * i + 4])
            if (instance.get("forward") is not self.forwards[i]
                    or any(not isinstance(d, dict) or tuple(d.items()) != tuple(was.items()) for d, was in hooks)):
                return f"the model's {_traced(path)} got other hooks or another forward"
        for sentence, where, values, names, _, was in self.settings:
            for name, value in zip(names, was):
                if differs(value, values.get(name, _DELETED)):   # (identity first, as the tuple test: NaN)
                    return sentence.format(where + name)
        for path, instance, name, kept in self.tensors:
            if instance.get(name) is not kept.value:
                return f"the model's {_traced(path)} has another tensor as its attribute '{name}'"
            if not kept.matches(instance.get(name)):
                return (f"the model's {_traced(path)} changed its tensor attribute '{name}' in place (the graph may "
                        f"hold what the forward computed from its values: a buffer, register_buffer, is read as it is)")
        for tensors, name, kind, where, kept in self.read_tensors:
            if not kept.matches(tensors.get(name)):
                values = ", or its values" if kept.same is not None else ""
                return (f"the model's {kind} '{where}' has another dtype, device or shape{values} than the trace read "
                        f"(the graph holds what the forward computed from them: convert the model, then fuse it)")
        for instance, names, path in self.shadows:
            for name in names:
                if name in instance:
                    return (f"the model's module '{path}' has its own '{name}' (set on it), where the trace read its "
                            "class's")
        for path, dicts, _, cls, names in self.missing:
            for name in sorted(names):
                if any(name in d for d in dicts) or hasattr(cls, name):
                    where = f"module '{path}'" if path else "root module"
                    return f"the model's {where} has '{name}' now, which the traced forward asked for and found missing"
        return None


def _setting_names(instance: dict, read: Sequence[str]) -> Tuple[str, ...]:
    """A module's attributes that are settings: its public plain ones (numbers, strings, tuples, lists: fx reads them
    as constants wherever the forward uses them) and those in ``read`` (private ones too); not ``training`` (the fused
    model follows it) or a plain tensor (compared by identity: ``tensors``)."""
    return tuple(sorted(name for name, value in instance.items()
                        if name != "training" and not isinstance(value, torch.Tensor)
                        and ((not name.startswith("_") and isinstance(value, SETTING_TYPES)) or name in read)))


def _class_attributes(root: Sequence[nn.Module], modules: Sequence[nn.Module], paths: Dict[int, str],
                      class_read: Dict[str, Sequence[str]]) -> Tuple[Tuple[object, str, object], ...]:
    """(holder, name, value as fused) for each name the trace read on the class of the ``root`` (none or the model)
    or of one of ``modules`` (each class once): looked up on the root itself, where it finds the same object each time
    (a function or a data value; a bound method, which compares by its function and instance), else on the class,
    through the bases as the instances look it up; names whose every lookup makes a new object (a property's value, a
    classmethod's bound method on a class) are left out."""
    lookups, done = [], set()
    for module in list(root) + list(modules):
        on_root = any(module is r for r in root)
        if not on_root:
            if type(module) in done:
                continue
            done.add(type(module))
        for name in sorted(class_read.get(paths[id(module)], ())):
            for holder in ((module, type(module)) if on_root else (type(module),)):
                if holder is module and _data_descriptor(type(module), name):
                    continue   # (its value, which the trace read; the descriptor itself is the class's)
                try:
                    first, again = getattr(holder, name), getattr(holder, name)
                except Exception:   # (gone, or a descriptor that raises)
                    continue
                if first is again or (type(first) is MethodType and first == again):
                    lookups.append((holder, name, first))
                    break
    return tuple(lookups)


def _data_descriptor(cls: type, name: str) -> bool:
    holder = class_holding(cls, name)
    if holder is None:
        return False
    kind = type(vars(holder)[name])
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


def _kept(value, held: Collection[int]):
    """A class attribute's value to compare later ones with (on the left): functions, bound methods, classes and
    scalars as they are (their ``==`` is C-level: identity, or a bound method's function and instance); anything else
    as ``snapshot`` keeps it (a list or dict by value, an object by identity)."""
    if type(value) in (FunctionType, MethodType, BuiltinFunctionType) or isinstance(value, type):
        return value
    return snapshot(value, held=held)


def _entry(sentence: str, where: str, values: dict, names: Tuple[str, ...], held: Collection[int]) -> tuple:
    """(the sentence saying that one of them changed, with a {} for its name; where in the place they are, the dict
    holding them, their names, an itemgetter of them (a reader of free variables) giving a tuple — one name twice —,
    their snapshots in that order)"""
    was = tuple(snapshot(values[name], held=held) for name in names)
    read = names * 2 if len(names) == 1 else names
    get = values.reader(read) if hasattr(values, "reader") else itemgetter(*read)
    return sentence, where, values, names, get, was * 2 if len(names) == 1 else was


def graph_tensors(graph: nn.Module) -> frozenset:
    """The ids of the tensors a traced graph reads as they are (its ``get_attr`` constants: a plain tensor attribute,
    a global tensor a traced op took)."""
    held = set()
    for node in getattr(getattr(graph, "graph", None), "nodes", ()):
        if node.op == "get_attr":
            value = graph
            for part in node.target.split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor):
                held.add(id(value))
    return frozenset(held)


def _submodule(model: nn.Module, path: str) -> Optional[nn.Module]:
    try:
        return model.get_submodule(path)
    except AttributeError:   # (no longer there: the module tree's own test says so)
        return None


def _traced(path: str) -> str:
    return f"module '{path}' (traced through: the fused graph holds its ops, not its call)" if path else "root module"


class StaleTree:
    """The tree of a fused model's copy (deepcopy, pickle) made after its model had changed (``what``): the copied graph
    holds the model as it was fused, the copy's model as it was copied, so the copy runs its model's own forward."""

    __slots__ = ("what",)
    instances = copies = class_values = shadows = shadow_keys = shadow_names = missing = ()
    # (the per-call comparison says changed: FusedModel then asks ``changed``)
    holder, was, live = None, 0, staticmethod(lambda holder: 1)
    watched = hooks_only = True

    def __init__(self, what: str):
        self.what = what

    def traced_parts_changed(self) -> bool:
        return True

    def unchanged(self) -> bool:
        return False

    def changed(self) -> str:
        return f"{self.what} (before this copy of the fused model was made)"


class _InstanceView:
    """An object whose attributes are a module's instance dict (``of``: that dict is its ``__dict__``, shared): reading
    one is a dict lookup, without nn.Module's attribute hook (``__getattr__``), which makes every attribute read of a
    module slower (host time per call); ``forward`` is None where the module has none of its own."""

    forward = None

    @classmethod
    def of(cls, instance: dict) -> "_InstanceView":
        view = cls()
        view.__dict__ = instance
        return view


def _ordered_copy(hooks: dict) -> dict:
    """A copy of a hook dict as it is, which compares with the live one as torch runs hooks: in order where that is an
    OrderedDict (torch's), by content otherwise."""
    return type(hooks)(hooks)


_NOTHING = (lambda holder: ())
KEYS_DISJOINT = type({}.keys()).isdisjoint   # (an instance dict's keys and the names read on its class)
