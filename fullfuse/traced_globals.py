"""The module-level variables (globals) of the model's own code that a trace can read, and the free variables of its
functions made by a factory (``def make(cfg): class M(nn.Module): def forward(self, x): ... cfg["k"]``).

fx keeps what the forward computes from a global (``if USE_BIAS:``, ``y * SCALE``, ``CFG.k``) as a constant of the
graph. ``ReadingGlobals`` notes, in the trace's thread, the globals that each function of the model's code run by the
trace reads or sets (by its instructions), with their values as that function was first entered; the fused model watches
them as it watches the modules' settings (``module_tree``), and a forward that sets one (``global STEPS; STEPS += 1``)
or changes one in place is not traced (the values are put back). ``sys.monitoring`` tells which functions run (from
Python 3.12, beside a debugger or coverage), before 3.12 the trace hook, where no other tracer holds it (else nothing is
noted and the globals are not watched). The free variables of such a function are noted alike, where it was made before
the trace (not a helper the forward defines: its cells are the call's own). The same instructions tell the private names
that code reads as attributes (``self.config._k``, ``getattr(cfg, "_k")``, a property's ``self._k``): a config object's
private fields among them are watched too (its public ones always are). Torch's, fullfuse's and the standard library's
modules are not the model's. Code the trace's thread runs besides the forward (a garbage-collection callback) would
count as the model's: the trace pauses collection (``trace.trace``).
"""
from __future__ import annotations

import copy
import dis
import functools
import gc
import os
import sys
import sysconfig
import threading
import types
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from .global_state import own_module
from .watched_values import FieldsView, differs, put_back, restorable, snapshot

_MISSING = object()


def _stdlib_names() -> frozenset:
    """The standard library's top-level module names: ``sys.stdlib_module_names`` from Python 3.10; before, those in
    the interpreter's standard-library directories (not site-packages) and its built-in modules.  The standard
    library's globals (``re``'s cache, ``warnings.filters``) change under any code and are never a model's."""
    names = getattr(sys, "stdlib_module_names", None)
    if names is None:
        names = set(sys.builtin_module_names)
        paths, lib = sysconfig.get_paths(), os.path.dirname(os.__file__)   # (a venv's platstdlib is its own)
        for directory in {lib, os.path.join(lib, "lib-dynload"), paths["stdlib"], paths["platstdlib"]}:
            try:
                entries = os.listdir(directory)
            except OSError:
                continue
            for entry in entries:
                stem = entry.partition(".")[0]
                if entry.endswith((".py", ".so", ".pyd")) or os.path.isfile(os.path.join(directory, entry,
                                                                                          "__init__.py")):
                    names.add(stem)
    return frozenset(names) | {"builtins"}


_STDLIB = _stdlib_names()


class ReadingGlobals:
    """``with ReadingGlobals(lent, stand_ins) as noted: <trace>``: ``lent`` ({name: object}) stands in for builtins
    in the model's modules meanwhile (those without a global of that name; taken back after, never noted as read),
    and each (real, recorder) pair of ``stand_ins`` for a global of the model's modules that is the real function,
    bound by name before the trace (``from warnings import warn``, ``from torch import is_grad_enabled``), which the
    recorders' patches of the function's own module do not reach; so it does for such a function held by a free
    variable of the model's code, by an attribute of one of ``modules`` (``self.query = torch.is_grad_enabled``) or
    by their classes (``query = staticmethod(torch.is_grad_enabled)``; not torch's or fullfuse's classes). Then
    ``noted.read`` is {module name: names of its globals the traced functions name}, ``noted.closures`` {function:
    the free variables of it they read} (a factory's class or helper: ``def make(cfg): class M(nn.Module): def
    forward(self, x): ... cfg["k"]``), ``noted.set`` the globals (``module.name``) and free variables the trace set
    or changed in place, and ``noted.private`` the private names (not dunders) they read as attributes or name as
    strings."""

    def __init__(self, lent: Optional[Dict[str, object]] = None, stand_ins: Iterable[Tuple[object, object]] = (),
                 modules: Iterable[object] = ()):
        self._lent = lent or {}
        self._stand_ins = {id(real): (real, recorder) for real, recorder in stand_ins}
        self._lent_to: List[Tuple[dict, str, object, object]] = []   # (globals, name, lent object, value before)
        self._cells_lent: List[Tuple[object, object, object]] = []   # (cell, recorder, real)
        self._modules = tuple(modules)
        self._attributes_lent: List[Tuple[object, str, object, object]] = []   # (holder, name, lent, before)

    def __enter__(self) -> "ReadingGlobals":
        # module -> name -> (value, its snapshot, a copy of a container's items to put back)
        self._first: Dict[str, Dict[str, Tuple[object, object, object]]] = {}
        self._codes = set()
        # function -> free variable -> (its cell, value, snapshot, a copy of a container's items to put back)
        self._closure_first: Dict[types.FunctionType, Dict[str, Tuple[object, object, object, object]]] = {}
        self.read: Dict[str, Tuple[str, ...]] = {}
        self.classes = ClassesRead()
        # class -> attribute -> (its value, snapshot, a copy of a container's items to put back)
        self._class_first: Dict[type, Dict[str, Tuple[object, object, object]]] = {}
        self.closures = ClosuresRead()
        self.set: List[str] = []
        self.private: Set[str] = set()
        self.attributes: Set[str] = set()
        self._active = False
        try:
            self._lend_attributes()
            self._stop = _watch_calls(self._entered)
        except BaseException:
            self._take_attributes_back()
            raise
        self._active = self._stop is not None
        return self

    def _entered(self, frame) -> None:
        """A function of this thread entered (each code object once)."""
        code = frame.f_code
        if code in self._codes:
            return
        self._codes.add(code)
        module = frame.f_globals.get("__name__")
        if (not isinstance(module, str) or library_module(module)
                or vars(sys.modules.get(module, sys)) is not frame.f_globals):
            return
        names, private, chains, attributes = _names_read(code)
        self.attributes |= attributes
        first, values = self._first.setdefault(module, {}), frame.f_globals
        for name, obj in self._lent.items():
            if name in names and name not in values:   # (lent to a module whose traced code names it, alone)
                values[name] = obj
                self._lent_to.append((values, name, obj, _MISSING))
        self.private |= private
        for name in names:
            if name not in first and not name.startswith("__") and (name not in self._lent
                                                                          or values.get(name) is not self._lent[name]):
                first[name] = _as_first_seen(values.get(name, _MISSING))
        self._note_attribute_chains(values, chains)
        for name in names:   # (after the snapshot: the global is watched as the real function)
            real, recorder = self._stand_ins.get(id(values.get(name, _MISSING)), (None, None))
            if real is not None and values[name] is real:
                values[name] = recorder
                self._lent_to.append((values, name, recorder, real))
        if code.co_freevars:
            self._note_closure(frame, code)

    def _note_attribute_chains(self, values: dict, chains: Set[Tuple[str, ...]]) -> None:
        """The model's own modules and classes that its code names as globals (``import config`` ...
        ``config.SCALE``, ``config.sub.K``; ``class Consts: EPS = 1e-5`` ... ``Consts.EPS``): each attribute it reads
        of such a module is noted as that module's global, as read (fx holds what the forward computes from it), and
        each it reads of such a class as the class's (as ``getattr`` finds it, through the class's bases); the standard
        library's, torch's and fullfuse's aside, and a module not in ``sys.modules`` under its name (where the fused
        model reads them)."""
        for name, *path in chains:
            value = values.get(name)
            for attribute in path:
                if attribute.startswith("__"):
                    break
                if isinstance(value, type):   # (one missing too: a forward may set it)
                    if library_module(getattr(value, "__module__", None) or ""):
                        break
                    first = self._class_first.setdefault(value, {})
                    if attribute not in first:
                        first[attribute] = _as_first_seen(class_attribute(value, attribute))
                    break
                module = getattr(value, "__name__", None) if isinstance(value, types.ModuleType) else None
                if (not isinstance(module, str) or library_module(module) or sys.modules.get(module) is not value
                        or attribute not in vars(value)):
                    break   # (not in its dict: a module's __getattr__ answers it, a lazy module may set it meanwhile)
                first, value = self._first.setdefault(module, {}), vars(value)[attribute]
                if attribute not in first:
                    first[attribute] = _as_first_seen(value)

    def _note_closure(self, frame, code) -> None:
        """The free variables of the function ``frame`` runs, where it was made before the trace: fx holds what the
        forward computed from them, as from a global.  One made by a function the trace is running (a helper defined
        in forward, a comprehension) has cells of that call's own, made anew in every call: not watched."""
        outer = frame.f_back
        while outer is not None:
            if any(const is code for const in outer.f_code.co_consts):
                return
            outer = outer.f_back
        names = [name for name in code.co_freevars if name != "__class__"]   # (super()'s cell: the class)
        for function in _functions_of(code, frame) if names else ():
            cells = dict(zip(code.co_freevars, function.__closure__))
            first = self._closure_first.setdefault(function, {})
            for name in names:
                if name in first:
                    continue
                value = _contents(cells[name])
                first[name] = (cells[name], *_as_first_seen(value))
                real, recorder = self._stand_ins.get(id(value), (None, None))
                if real is not None and value is real:   # (after the snapshot: watched as the real function)
                    cells[name].cell_contents = recorder
                    self._cells_lent.append((cells[name], recorder, real))
                    if sys.version_info < (3, 11) and frame.f_locals.get(name) is real:
                        # (before 3.11 the trace hook's caller writes the frame's locals dict back into its cells)
                        frame.f_locals[name] = recorder

    def __exit__(self, *exc) -> None:
        if self._active:
            self._stop()
        self._take_attributes_back()
        if self._active:
            self._compare()

    def _take_attributes_back(self) -> None:
        for holder, name, lent, before in reversed(self._attributes_lent):
            if vars(holder).get(name) is lent:
                setattr(holder, name, before) if isinstance(holder, type) else vars(holder).__setitem__(name, before)
        self._attributes_lent.clear()

    def _lend_attributes(self) -> None:
        """The recorders in place of their real functions held by the modules' instance dicts and their classes."""
        classes = dict.fromkeys(cls for m in self._modules for cls in type(m).__mro__
                                if not library_module(getattr(cls, "__module__", None) or ""))
        for holder in (*self._modules, *classes):
            for name, value in list(vars(holder).items()):
                wrapper = type(value) if type(value) in (staticmethod, classmethod) else None
                real, recorder = self._stand_ins.get(id(value.__func__ if wrapper else value), (None, None))
                if real is None or (wrapper is not None and wrapper is not staticmethod):
                    continue
                lent = wrapper(recorder) if wrapper else recorder
                try:
                    if isinstance(holder, type):
                        setattr(holder, name, lent)
                    else:
                        vars(holder)[name] = lent
                except (AttributeError, TypeError):   # (a class whose metaclass refuses it: left as it is)
                    continue
                self._attributes_lent.append((holder, name, lent, value))

    def _compare(self) -> None:
        """Take the lent names back; note the globals the trace read, and those it set (putting them back)."""
        for values, name, obj, before in reversed(self._lent_to):
            if values.get(name) is obj:
                if before is _MISSING:
                    del values[name]
                else:
                    values[name] = before
        for module, first in self._first.items():
            values = vars(sys.modules[module])
            for name, (value, was, items) in first.items():
                now = values.get(name, _MISSING)
                if getattr(value, "__wrapped__", _MISSING) is now:   # (fx's wrapper of a function during the trace:
                    continue                                          # torch.fx.wrap, which fx put back)
                if now is value and (was is None or not differs(was, now)):
                    continue
                self.set.append(f"{module}.{name}")
                if value is _MISSING:
                    values.pop(name, None)
                    continue
                values[name] = value
                if items is not None:
                    put_back(value, items)
            names = tuple(sorted(name for name, (value, *_) in first.items() if value is not _MISSING))
            if names:
                self.read[module] = names
        for cls, first in self._class_first.items():
            for name, (value, was, items) in first.items():
                now = class_attribute(cls, name)
                if now is value and (was is None or not differs(was, now)):
                    continue
                self.set.append(f"{cls.__qualname__}.{name}")
                if value is _MISSING:
                    if name in vars(cls):
                        delattr(cls, name)
                    continue
                if name in vars(cls) or now is _MISSING:
                    setattr(cls, name, value)
                if items is not None:
                    put_back(value, items)
            names = tuple(sorted(name for name, (value, *_) in first.items() if value is not _MISSING))
            if names:
                self.classes[cls] = names
        for cell, recorder, real in reversed(self._cells_lent):
            if _contents(cell) is recorder:
                cell.cell_contents = real
        for function, first in self._closure_first.items():
            for name, (cell, value, was, items) in first.items():
                now = _contents(cell)
                if now is value and (was is None or not differs(was, now)):
                    continue
                self.set.append(f"{function.__qualname__}'s free variable {name}")
                if value is _MISSING:
                    continue   # (a cell cannot be emptied again)
                cell.cell_contents = value
                if items is not None:
                    put_back(value, items)
            names = tuple(sorted(name for name, (_, value, *_) in first.items() if value is not _MISSING))
            if names:
                self.closures[function] = names


class ClosuresRead(dict):
    """{function of the model's code: the free variables of it the trace read}.  A deepcopy holds the same functions
    (as a deepcopy shares every function); a pickled one holds none (a factory's function pickles by a name that does
    not resolve): its copy does not watch them."""

    def __deepcopy__(self, memo) -> "ClosuresRead":
        return ClosuresRead(self)

    def __reduce__(self):
        return ClosuresRead, ()


class ClassesRead(dict):
    """{class of the model's code: the attributes of it the trace read through a global}.  A deepcopy holds the same
    classes; a pickled one those a name finds again (a class made in a function does not pickle)."""

    def __deepcopy__(self, memo) -> "ClassesRead":
        return ClassesRead(self)

    def __reduce__(self):
        return ClassesRead, (), None, None, iter([(cls, names) for cls, names in self.items() if _by_name(cls)])


def _by_name(cls: type) -> bool:
    """Whether pickle finds ``cls`` again by its module and qualified name."""
    value = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        value = getattr(value, part, None)
    return value is cls


def class_holding(cls: type, name: str) -> Optional[type]:
    """The class or the first of its bases whose own dict holds ``name`` (None: none does), as lookup finds it."""
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def class_attribute(cls: type, name: str):
    """``name`` as the class or the first of its bases holding it holds it (a classmethod as the classmethod: getattr
    would make a new bound method each time); _MISSING where none does."""
    holder = class_holding(cls, name)
    return _MISSING if holder is None else vars(holder)[name]


class ClassAttributes(FieldsView):
    """A class's attributes by name, as the class or its bases hold them (``class_attribute``), as a module's globals
    are in its dict."""

    __slots__ = ("cls",)

    def __init__(self, cls: type):
        self.cls = cls

    def __getitem__(self, name: str):
        found = class_attribute(self.cls, name)
        if found is _MISSING:
            raise KeyError(name)
        return found


class FreeVariables(FieldsView):
    """A function's free variables by name, as a module's globals are in its dict: ``values[name]`` is the contents
    of its closure cell (an empty cell: KeyError).  Each is read by a function of its own closed over the same cell
    (torch.compile traces that as it traces the model's own read; it cannot trace a cell object handled as a value)."""

    __slots__ = ("getters",)

    def __init__(self, function: types.FunctionType):
        self.getters = {name: types.FunctionType(_READ_CELL, globals(), name, None, (cell,))
                        for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ())}

    def __getitem__(self, name: str):
        try:
            return self.getters[name]()
        except NameError:   # (an empty cell)
            raise KeyError(name) from None

    def __contains__(self, name: str) -> bool:
        return name in self.getters and _contents(self.getters[name].__closure__[0]) is not _MISSING

    def reader(self, names: Tuple[str, ...]) -> Callable[[object], tuple]:
        """``read(_)``: the tuple of the variables ``names`` (two at least; a name may come twice), in one call
        (host time per call of the fused model's change test: one Python frame for them all; an empty cell raises)."""
        unique = list(dict.fromkeys(names))
        return types.FunctionType(_tuple_reader(tuple(map(unique.index, names)), len(unique)), globals(), "read", None,
                                  tuple(self.getters[name].__closure__[0] for name in unique))


def _cell_reader():
    value = None

    def read():
        return value
    return read


_READ_CELL = _cell_reader().__code__   # (returns its one free variable: the cell a FreeVariables gives it)


@functools.lru_cache(maxsize=None)
def _tuple_reader(order: Tuple[int, ...], count: int) -> types.CodeType:
    """The code of ``read(_)`` returning its ``count`` free variables in ``order`` (indices, one possibly twice)."""
    names = [f"v{i}" for i in range(count)]
    source = (f"def outer():\n    {', '.join(names)} = {', '.join(['None'] * count)}\n"
              f"    def read(_):\n        return ({', '.join(names[i] for i in order)},)\n    return read\n")
    namespace: Dict[str, object] = {}
    exec(source, namespace)   # (names of its own: no input reaches the source)
    return namespace["outer"]().__code__


def library_module(name: str) -> bool:
    """Whether the Python module ``name`` is the standard library's, torch's or fullfuse's: not the model's code (nor
    its classes: ``object``, ``nn.Module``, ``nn.Conv2d``)."""
    return name.partition(".")[0] in _STDLIB or own_module(name)


def _as_first_seen(value) -> Tuple[object, object, object]:
    """(``value``, its snapshot (None: missing), a copy of a container's items to put back (None: none)): what the
    trace notes of a global, a module's or class's attribute or a free variable when first read, to tell after it
    whether the forward set or changed it and to put it back."""
    return (value, None if value is _MISSING else snapshot(value), copy.copy(value) if restorable(value) else None)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # (an empty cell: the variable is not bound yet, or was deleted)
        return _MISSING


def _functions_of(code, frame) -> List[types.FunctionType]:
    """The functions of ``code`` with a closure (gc's referrers of the code); where there are several (a factory
    called twice), those whose cells hold what ``frame`` sees in its free variables."""
    found = [f for f in gc.get_referrers(code)
             if type(f) is types.FunctionType and f.__code__ is code and f.__closure__]
    if len(found) > 1:
        seen = frame.f_locals
        same = [f for f in found if all(_contents(cell) is seen.get(name, _MISSING)
                                        for name, cell in zip(code.co_freevars, f.__closure__))]
        found = same or found
    return found


def _watch_calls(entered: Callable[[object], None]) -> Optional[Callable[[], None]]:
    """Call ``entered(frame)`` as each Python function starts in this thread, until the returned stop function is
    called; None where no hook is free.  Python 3.12's ``sys.monitoring`` (a tool id of its own, beside a debugger's
    or coverage's), else the trace hook, where no other tracer holds it."""
    thread = threading.get_ident()
    monitoring = getattr(sys, "monitoring", None)
    tool = next((i for i in _TOOL_IDS if monitoring is not None and monitoring.get_tool(i) is None), None)
    if tool is not None:
        start = monitoring.events.PY_START

        def started(code, offset):
            if threading.get_ident() == thread:
                entered(sys._getframe(1))

        def stop():
            monitoring.set_events(tool, 0)
            monitoring.register_callback(tool, start, None)
            monitoring.free_tool_id(tool)
        monitoring.use_tool_id(tool, "fullfuse")
        monitoring.register_callback(tool, start, started)
        monitoring.set_events(tool, start)
        return stop
    if sys.gettrace() is not None:
        return None

    def traced(frame, event, arg):
        entered(frame)   # (a call event: no line events for the function)

    sys.settrace(traced)
    return lambda: sys.settrace(None)


_TOOL_IDS = (3, 4)   # (sys.monitoring's ids no tool is given: 0 debugger, 1 coverage, 2 profiler, 5 optimizer)
_GLOBAL_OPS = frozenset(("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"))
_ATTRIBUTE_OPS = frozenset(("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "LOAD_CONST"))
_CHAIN_OPS = frozenset(("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"))


def _names_read(code) -> Tuple[Tuple[str, ...], Set[str], Set[Tuple[str, ...]], Set[str]]:
    """(the globals ``code`` reads or sets, the private names it reads as attributes or holds as string constants:
    ``getattr(obj, "_k")``, the attribute chains it reads or sets of a global: ``cfg.sub.K`` as ("cfg", "sub", "K"),
    every name it reads as an attribute or holds as a string constant), from one pass over its instructions (not
    ``co_names``, which holds attribute names too: a notebook's global ``model`` is not what ``self.model`` reads)."""
    instructions = list(dis.get_instructions(code))
    names = tuple(dict.fromkeys(ins.argval for ins in instructions if ins.opname in _GLOBAL_OPS))
    attributes = {ins.argval for ins in instructions if ins.opname in _ATTRIBUTE_OPS and type(ins.argval) is str}
    private = {name for name in attributes if name[:1] == "_" and name[:2] != "__"}
    chains, chain = set(), None
    for ins in instructions + [None]:
        if chain is not None and ins is not None and ins.opname in ("COPY", "DUP_TOP"):   # (``cfg.K += 1``)
            continue
        if chain is not None and ins is not None and ins.opname in _CHAIN_OPS and type(ins.argval) is str:
            chain = (*chain, ins.argval)
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                continue
        if chain is not None and len(chain) > 1:
            chains.add(chain)
        chain = (ins.argval,) if ins is not None and ins.opname == "LOAD_GLOBAL" else None
    return names, private, chains, attributes
