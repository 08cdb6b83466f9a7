"""Values a traced graph depends on, kept as they were so that a later value can be told apart from them.

fx keeps what a forward's Python computed from a module's attributes (``self.scale``, ``self.cfg["k"]``,
``self.config.k``) as constants of the graph; ``module_tree.ModuleTree`` compares those attributes, as they are at each
call, with their ``snapshot``: plain data (numbers, strings, and lists, tuples, dicts and sets of it) by value, nested
containers copied so that a change inside one shows; a tensor by identity and version counter (``SameTensor``: a change
in place shows), unless the graph holds it as a constant (then by identity); a NumPy array by identity and its bytes
(``SameArray``: it has no version counter); anything else (a function, an object) by identity, through ``Same``, which
never asks the object (a tensor's ``==`` compares elements, an array's gives an array).  An object with fields of its
own (a config object, a namespace, a dataclass) is the same object with new fields after ``config.k = 3``:
``plain_objects`` finds such objects in a value, whose public fields are watched in turn.  Comparisons put the snapshot
on the left (``snapshot != value``), so that ``Same`` answers for itself.
"""
from __future__ import annotations

import copy
import sys
import types
from typing import Collection, Iterator, List, Tuple

import torch
from torch import nn

SCALARS = (bool, int, float, complex, str, bytes, type(None))
# elements of plain containers copied per watched value (each call compares them); a container past it is kept by
# identity (a lookup table, id2label: a change inside it is not seen)
LIMIT = 256
_NOT_PLAIN_OBJECTS = (nn.Module, torch.Tensor, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                      types.ModuleType)


class Same:
    """Equal to one object alone (``other is value``), whatever that object's own ``==`` does."""

    __slots__ = ("value",)
    __hash__ = None

    def __init__(self, value):
        self.value = value

    def matches(self, other) -> bool:
        """Whether ``other`` is what this kept (called by name where the snapshot is known to be one: torch 2.11's
        dynamo cannot trace ``!=`` of a user-defined object)."""
        return other is self.value

    def __eq__(self, other) -> bool:
        return self.matches(other)

    def __ne__(self, other) -> bool:
        return not self.matches(other)

    def __repr__(self) -> str:
        return f"Same({type(self.value).__name__} at {id(self.value):#x})"


class SameTensor(Same):
    """Equal to one tensor alone, unchanged in place since (its version counter, which every in-place op bumps): fx
    keeps what the forward computed from a tensor's values at the trace (``self.t.item()``, ``self.t * 2`` of a plain
    tensor attribute or a global) as constants, which a change in place leaves stale."""

    __slots__ = ("version",)

    def __init__(self, value: torch.Tensor):
        super().__init__(value)
        self.version = tensor_version(value)

    def matches(self, other) -> bool:
        if other is not self.value:
            return False
        if torch.compiler.is_compiling():   # (dynamo cannot read a version counter: a graph break there, in every call)
            return _same_version(other, self.version)
        return tensor_version(other) == self.version


class SameLayout:
    """Equal to a tensor of the dtype, device and shape one had (a parameter or buffer the traced code reached as a
    tensor: ``next(self.parameters()).dtype``), and with ``values`` that tensor unchanged in place too
    (``SameTensor``): fx kept what the forward computed from them as constants."""

    __slots__ = ("layout", "same")
    __hash__ = None

    def __init__(self, tensor: torch.Tensor, values: bool):
        self.layout = (tensor.dtype, tensor.device, tensor.shape)
        self.same = SameTensor(tensor) if values else None

    def matches(self, other) -> bool:
        if not isinstance(other, torch.Tensor) or (other.dtype, other.device, other.shape) != self.layout:
            return False
        return self.same is None or self.same.matches(other)


class SameArray(Same):
    """Equal to one NumPy array alone, with the shape, dtype and bytes it had: fx keeps what the forward computed from
    an array's values at the trace (``float(self.w[0])``, ``self.w * 2``) as constants, which a change in place
    (``model.w[0] = 5``) leaves stale.  An array has no version counter: each comparison reads its bytes (~0.3 us for
    a small array; a copy of its size for a large one).  torch.compile cannot trace the comparison: it breaks the
    graph there and compares each call (``fullgraph=True`` refuses a model reading an array, as it did by identity)."""

    __slots__ = ("layout", "data")

    def __init__(self, value):
        super().__init__(value)
        self.layout, self.data = (value.shape, value.dtype), value.tobytes()

    def matches(self, other) -> bool:
        return other is self.value and (other.shape, other.dtype) == self.layout and other.tobytes() == self.data


def is_array(value) -> bool:
    """Whether ``value`` is a NumPy array (NumPy not imported: none is)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


# torch.compile's caller runs _same_version as Python (a graph break: ``fullgraph=True`` refuses it, as it does a
# NumPy array's comparison).  torch._disable_dynamo is torch.compiler.disable made on the first call (under
# torch.compile, where torch._dynamo is loaded already): torch.compiler.disable itself imports torch._dynamo (1.5-5 s),
# which importing fullfuse should not cost
_disable_dynamo = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable


@_disable_dynamo
def _same_version(tensor: torch.Tensor, version) -> bool:
    """Whether the tensor's version counter is ``version`` (outside torch.compile's graphs)."""
    return tensor_version(tensor) == version


def tensor_version(tensor: torch.Tensor):
    """The tensor's version counter; None for one without (an inference tensor)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def snapshot(value, budget: List[int] = None, held: Collection[int] = ()):
    """``value`` as it is now, for ``snapshot(value) != later`` to tell whether ``later`` differs (see the module).
    held: the ids of the tensors the graph reads as they are (its constants: a change in place reaches it), compared
    by identity alone."""
    budget = [LIMIT] if budget is None else budget
    if type(value) in SCALARS:
        return value
    if isinstance(value, (list, tuple, dict, set)):
        budget[0] -= len(value)
        if budget[0] < 0:
            return Same(value)
        if isinstance(value, set):
            return copy.copy(value)   # (elements are hashable: compared by hash and ==, as the set does)
        if isinstance(value, dict):
            items = {k: snapshot(v, budget, held) for k, v in value.items()}
            return items if type(value) is dict else _same_kind(value, items)
        items = [snapshot(v, budget, held) for v in value]
        if isinstance(value, tuple):
            return tuple(items)   # (a namedtuple or torch.Size compares equal to it, element by element)
        return items if type(value) is list else _same_kind(value, items)
    if isinstance(value, frozenset):
        return value
    if isinstance(value, torch.Tensor):
        return SameTensor(value) if id(value) not in held else Same(value)
    return SameArray(value) if is_array(value) else Same(value)


def differs(was, now) -> bool:
    """Whether ``now`` is not what ``was`` (a ``snapshot``) kept, as ``was != now`` answers with identity first (NaN is
    itself), a comparison that raises counting as a difference.  A plain list, tuple or dict is compared item by item
    here (its ``Same`` items by ``matches``): torch 2.11's dynamo cannot trace ``is`` between two lists, and sends
    ``Same(t) != t`` inside a container's comparison to the tensor's ``!=``."""
    if isinstance(was, Same):
        return not was.matches(now)
    kind = type(was)
    if kind is list or kind is dict or kind is tuple:
        tuple_like = kind is tuple and isinstance(now, tuple) and type(now).__eq__ is tuple.__eq__   # (a namedtuple)
        if type(now) is not kind and not tuple_like:
            return _compared(was, now)
        if len(was) != len(now):
            return True
        if kind is dict:
            for key, value in was.items():
                if key not in now or differs(value, now[key]):
                    return True
            return False
        for value, item in zip(was, now):
            if differs(value, item):
                return True
        return False
    return was is not now and _compared(was, now)


def _compared(was, now) -> bool:
    try:
        return was != now
    except Exception:
        return True


def restorable(value) -> bool:
    """Whether ``put_back`` can give ``value`` its items again: a list, dict, set or NumPy array (what a forward can
    change in place without setting an attribute)."""
    return isinstance(value, (list, dict, set)) or is_array(value)


def put_back(container, items) -> None:
    """Give a list, dict, set or NumPy array the ``items`` it held (a copy of it taken before), in place (an array
    since resized in place is left as it is)."""
    if is_array(container):
        if container.shape == items.shape:
            container[...] = items
    elif isinstance(container, list):
        container[:] = items
    else:
        container.clear()
        container.update(items)


def _same_kind(value, items):
    """A copy of ``value`` (a dict or list of a subclass: OrderedDict, defaultdict...) holding ``items``, so that its
    own comparison, which takes precedence over a plain dict's or list's, compares it; a plain one where it cannot be
    made."""
    try:
        made = copy.copy(value)
        made.clear()
        made.update(items) if isinstance(items, dict) else made.extend(items)
        return made
    except Exception:   # (a subclass that copies or fills otherwise)
        return items


def is_plain_object(value) -> bool:
    """Whether ``value`` is an object with fields of its own (a config, a namespace, a dataclass, also one with
    ``__slots__``): not data, a module, a tensor, a class, a function, a Python module, a built-in type's object, or an
    object of torch's or fullfuse's (an fx proxy, a handle)."""
    if isinstance(value, _NOT_PLAIN_OBJECTS):
        return False
    if not isinstance(getattr(value, "__dict__", None), dict) and not _slot_names(type(value)):
        return False
    home = type(value).__module__ or ""
    return not (home in ("torch", "fullfuse", "builtins") or home.startswith(("torch.", "fullfuse.")))


def _slot_names(cls: type) -> Tuple[str, ...]:
    """The fields ``__slots__`` declare on ``cls`` and its bases (not ``__dict__`` / ``__weakref__``)."""
    names = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return tuple(names)


class FieldsView:
    """Named values held elsewhere than in a dict (an object's slots, a class's attributes through its bases, a
    function's free variables), read as a dict's: ``values[name]`` (KeyError where absent), ``values.get(name,
    default)``, ``name in values``; a subclass gives ``__getitem__`` and ``reader(names)``, which the fused model's
    change test calls per call (``module_tree._entry``)."""

    __slots__ = ()

    def get(self, name: str, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: str) -> bool:
        return self.get(name, _UNSET) is not _UNSET

    def reader(self, names: Tuple[str, ...]):
        """``read(_)``: the tuple of the values ``names``, in one call (one missing: KeyError)."""
        return lambda _: tuple(map(self.__getitem__, names))


class SlotFields(FieldsView):
    """An object's ``__slots__`` fields by name, as an object's ``__dict__`` holds its others; iteration gives the
    fields set."""

    __slots__ = ("obj", "names")

    def __init__(self, obj):
        self.obj, self.names = obj, _slot_names(type(obj))

    def __getitem__(self, name: str):
        if name not in self.names:
            raise KeyError(name)
        try:
            return getattr(self.obj, name)
        except AttributeError:   # (a slot not set)
            raise KeyError(name) from None

    def __iter__(self):
        return iter([name for name in self.names if name in self])


_UNSET = object()


def fields_of(obj):
    """Where a plain object's fields are: its ``__dict__``, or for an object without one its ``SlotFields``."""
    fields = getattr(obj, "__dict__", None)
    return fields if isinstance(fields, dict) else SlotFields(obj)


def public_fields(obj, also: Collection[str] = ()) -> Tuple[str, ...]:
    """An object's public fields, and its private ones named in ``also`` (those the model's code reads:
    ``traced_globals.ReadingGlobals.private``)."""
    return tuple(sorted(name for name in fields_of(obj) if not name.startswith("_") or name in also))


def plain_objects(value, where: str, seen: set, depth: int = 3, limit: int = 64,
                  also: Collection[str] = ()) -> Iterator[Tuple[str, object]]:
    """(where, object) for the plain objects in ``value`` (itself, in its containers' elements and in those objects'
    ``public_fields``, ``depth`` levels down) not in ``seen`` (ids, which it adds to), while ``seen`` has fewer than
    ``limit``; ``where`` names the place (``config.vision``, ``cfgs[0]``)."""
    todo = [(where, value, depth)]
    while todo and len(seen) < limit:
        where, value, depth = todo.pop(0)
        if type(value) in SCALARS or depth < 0:
            continue
        if isinstance(value, dict):
            todo += [(f"{where}[{k!r}]", v, depth - 1) for k, v in list(value.items())[:limit]]
        elif isinstance(value, (list, tuple)):
            todo += [(f"{where}[{i}]", v, depth - 1) for i, v in enumerate(value[:limit])]
        elif is_plain_object(value) and id(value) not in seen:
            seen.add(id(value))
            yield where, value
            todo += [(f"{where}.{name}", fields_of(value)[name], depth - 1) for name in public_fields(value, also)]
