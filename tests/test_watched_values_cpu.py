"""What a fused model watches of the values its traced graph holds as constants (``watched_values``, ``ModuleTree``):
a value the forward reads by attribute — a dict's entry, a config object's field, a function, a list holding a tensor
— changed after ``fused_model`` gives the model's answer; one the forward does not read, or one that compares unlike
plain data (NaN, an array), leaves the fused graph running (CPU: the torch path computes the outputs)."""
import copy
import dataclasses
import math
import pickle
import warnings
from collections import OrderedDict, namedtuple
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullfuse
from fullfuse.seed_models import SMALL_SHAPE, SeedA
from fullfuse.watched_values import Same, differs, plain_objects, snapshot

REPLACED = "runs the model's own forward"


@dataclasses.dataclass
class _Config:
    scale: float = 1.0
    inner: SimpleNamespace = dataclasses.field(default_factory=lambda: SimpleNamespace(bias=0.0))


class _SlottedConfig:
    """A config object with ``__slots__`` (as ``@dataclass(slots=True)`` makes), its fields in no ``__dict__``."""
    __slots__ = ("scale", "inner")

    def __init__(self):
        self.scale, self.inner = 1.0, _SlottedInner()


class _SlottedInner:
    __slots__ = ("bias",)

    def __init__(self):
        self.bias = 0.0


def _unchanged(x):
    return x


class _Reads(nn.Module):
    """Seed A's region, then what ``how`` names, read from the module's attributes."""

    def __init__(self, how: str):
        super().__init__()
        self.body, self.how = SeedA(), how
        self.table, self.ordered = {"k": [1.0]}, OrderedDict(k=1.0)
        self.config = _SlottedConfig() if how == "slots" else _Config()
        self.tensors, self.fn, self.names = [torch.ones(64)], _unchanged, {"scale"}
        self.array = torch.arange(64.0).numpy() if how == "array" else None
        self.unread = {}   # (written by a hook on a child each call, never read by the forward)

    def forward(self, x):
        y = self.body(x)
        if self.how == "dict":
            return y * self.table["k"][0]
        if self.how == "ordered dict":
            return y * self.ordered["k"]
        if self.how in ("dataclass", "slots"):
            return y * self.config.scale + self.config.inner.bias
        if self.how == "tensor in a list":
            return y * self.tensors[0]
        if self.how == "function":
            return self.fn(y)
        if self.how == "set":
            return y * (2.0 if "scale" in self.names else 1.0)
        return y + torch.from_numpy(self.array)


def _change(model: _Reads) -> None:
    how = model.how
    if how == "dict":
        model.table["k"][0] = 3.0   # (inside a list inside the dict)
    elif how == "ordered dict":
        model.ordered["k"] = 3.0
    elif how in ("dataclass", "slots"):
        model.config.inner.bias = 0.5   # (an object in the config)
    elif how == "tensor in a list":
        model.tensors[0] = torch.full((64,), 2.0)
    elif how == "function":
        model.fn = torch.tanh
    elif how == "set":
        model.names.discard("scale")
    else:
        model.array = model.array + 1


@pytest.mark.parametrize("how", ["dict", "ordered dict", "dataclass", "slots", "tensor in a list", "function", "set",
                                 "array"])
def test_a_value_the_forward_reads_changed_after_fusing_gives_the_models_answer(how):
    """Before the change the fused graph runs (no warning); after it the model's own forward, with a warning naming
    what changed; a copy of the fused model made before the change watches its own copy alike."""
    torch.manual_seed(4)
    model = _Reads(how).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    copied = copy.deepcopy(fused)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # (the graph runs: nothing to warn of)
            assert torch.equal(fused(x), model(x)) and torch.equal(copied(x), model(x))
        before = model(x)
        _change(model)
        assert not torch.equal(model(x), before)
        with pytest.warns(UserWarning, match=REPLACED):
            assert torch.equal(fused(x), model(x))
        _change(copied)
        with pytest.warns(UserWarning, match=REPLACED):
            assert torch.equal(copied(x), model(x))


def test_what_the_forward_does_not_read_and_what_compares_oddly_leave_the_graph_running():
    """A dict filled between calls that the forward never reads, a NaN setting (NaN != NaN) and an array (its == gives
    an array) are no change: every call runs the fused graph."""
    torch.manual_seed(5)
    model = _Reads("array").eval()
    model.nan = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(3):
            model.unread[step] = torch.randn(2)
            assert torch.equal(fused(x), model(x))


def test_snapshots_compare_plain_data_by_value_and_everything_else_by_identity():
    t, obj = torch.ones(3), SimpleNamespace(a=1)
    value = {"n": [1, [2.0, "s"]], "t": t, "o": obj, "nan": math.nan, "set": {1, 2}}
    was = snapshot(value)
    assert not was != value   # (the same value: equal, the tensor by identity, NaN by identity)
    value["n"][1][0] = 3.0
    assert was != value   # (a change two containers down)
    value["n"][1][0] = 2.0
    value["t"] = torch.ones(3)   # (an equal tensor, but another one)
    assert was != value
    assert Same(t) == t and Same(t) != torch.ones(3) and not Same(t) != t
    big = list(range(10_000))   # (past the copy limit: kept by identity)
    assert not snapshot(big) != big and snapshot(big) != list(big)
    assert isinstance(snapshot(OrderedDict(a=[1])), OrderedDict)


def test_plain_objects_are_found_in_fields_and_containers_once():
    inner = SimpleNamespace(k=1)
    config = _Config(inner=inner)
    found = dict(plain_objects({"cfgs": [config, config]}, "x", seen=set()))
    assert set(found) == {"x['cfgs'][0]", "x['cfgs'][0].inner"} and found["x['cfgs'][0].inner"] is inner
    assert not list(plain_objects(F.relu, "fn", seen=set())) and not list(plain_objects(nn.ReLU(), "m", seen=set()))


class _Property(nn.Module):
    """A region, then a factor behind a property (its value in a private attribute)."""

    def __init__(self):
        super().__init__()
        self.body, self._factor = SeedA(), 1.0

    @property
    def factor(self) -> float:
        return self._factor

    @factor.setter
    def factor(self, value: float) -> None:
        self._factor = value

    def forward(self, x):
        return self.body(x) * self.factor


def test_a_private_attribute_the_forward_reads_is_watched():
    """``model.factor = 2.0`` through a property changes ``_factor``, which the forward read: the model's answer."""
    torch.manual_seed(6)
    model = _Property().eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
        model.factor = 2.0
        with pytest.warns(UserWarning, match="changed its setting '_factor'"):
            assert torch.equal(fused(x), model(x))


class _Gained(nn.Module):
    """A custom module the trace goes into, reading class-level settings (a number, a list, a config object; two through
    the class itself, which the module's attribute reads do not see) and a method."""

    GAIN = 1.0
    OFFSETS = [0.0]
    SETTINGS = SimpleNamespace(bias=0.0)
    SCALE = 1.0
    LIFT = 0.0

    def forward(self, x):
        x = x * type(self).SCALE + self.__class__.LIFT
        return self.shift(x * self.GAIN + self.OFFSETS[0] + self.SETTINGS.bias)

    def shift(self, x):
        return x + 1


class _WithGained(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.gained = SeedA(), _Gained()

    def forward(self, x):
        return self.post(self.gained(self.body(x)))

    def post(self, y):
        return y


@pytest.mark.parametrize("patch", ["forward", "method", "class setting", "root forward", "setting by type(self)",
                                   "setting by self.__class__"])
def test_a_class_patched_after_fusing_gives_the_models_answer(patch):
    """The graph holds what the classes' forward and methods did at the trace: a class patched since (a forward or
    method set on it, a class-level setting) runs the model's own forward, with a warning, until it is as it was."""
    torch.manual_seed(7)
    model = _WithGained().eval()
    fused = fullfuse.fused_model(model)
    cls, name = {"forward": (_Gained, "forward"), "method": (_Gained, "shift"), "class setting": (_Gained, "GAIN"),
                 "root forward": (_WithGained, "forward"), "setting by type(self)": (_Gained, "SCALE"),
                 "setting by self.__class__": (_Gained, "LIFT")}[patch]
    was = cls.__dict__[name]
    new = {"forward": lambda self, x: x * 3, "method": lambda self, x: x - 1, "class setting": 2.0,
           "root forward": lambda self, x: self.body(x) * 5, "setting by type(self)": 2.0,
           "setting by self.__class__": 1.0}[patch]
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            assert torch.equal(fused(x), model(x))
            setattr(cls, name, new)
            with pytest.warns(UserWarning, match=f"class {cls.__qualname__} has another '{name}'"):
                got = fused(x)
            assert torch.equal(got, model(x))
    finally:
        setattr(cls, name, was)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(fused(x), model(x))


def test_what_torch_and_fx_read_on_the_models_classes_is_not_watched():
    """The names watched on the model's classes are those its code read and ``forward`` (nn.Module's call reads it):
    not what fx's tracer and torch read of them meanwhile (``named_modules``, ``named_children``), which the model does
    not define and a fused call would test for nothing (host time per call).  Where only hooks and forwards are to be
    tested on the traced-through modules, their test stops there (``hooks_only``)."""
    fused = fullfuse.fused_model(_WithGained().eval())
    tree = fused.__dict__["_tree"]
    read = {(getattr(holder, "__name__", type(holder).__name__), name) for holder, name, _ in tree.class_lookups}
    assert read == {("_WithGained", "forward"), ("_WithGained", "post"), ("SeedA", "forward"),
                    ("_Gained", "forward"), ("_Gained", "shift"), ("_Gained", "GAIN"), ("_Gained", "OFFSETS"),
                    ("_Gained", "SETTINGS"), ("_Gained", "SCALE"), ("_Gained", "LIFT")}, read
    plain = fullfuse.fused_model(nn.Sequential(SeedA(), nn.Linear(64, 10)).eval())
    tree = plain.__dict__["_tree"]
    assert {name for _, name, _ in tree.class_lookups} == {"forward"} and tree.hooks_only and not tree.shadows

    class OwnNamedModules(nn.Sequential):   # (a method of the model's code that torch's code calls: watched)
        def named_modules(self, *args, **kwargs):
            return super().named_modules(*args, **kwargs)

    own = fullfuse.fused_model(OwnNamedModules(SeedA(), nn.Linear(64, 10)).eval())
    assert {name for _, name, _ in own.__dict__["_tree"].class_lookups} == {"forward", "named_modules"}


def _put_back_gained():
    _Gained.OFFSETS[:] = [0.0]
    _Gained.SETTINGS.bias = 0.0


@pytest.mark.parametrize("change", ["module's setting", "module's method", "root's forward", "root's method",
                                    "class list in place", "class config field"])
def test_a_name_read_on_a_class_set_on_the_module_or_changed_inside_gives_the_models_answer(change):
    """What the trace read on a class can change without a patch of the class: a setting or method set on the module
    itself hides the class's (``model.gained.GAIN = 2.0``, ``model.forward = f``), a class-level list or config object
    changes inside.  Each runs the model's own forward, with a warning naming it, until undone."""
    torch.manual_seed(9)
    model = _WithGained().eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    target, name, value, message = {
        "module's setting": (model.gained, "GAIN", 2.0, "module 'gained' has its own 'GAIN'"),
        "module's method": (model.gained, "shift", lambda y: y - 1, "module 'gained' has its own 'shift'"),
        "root's forward": (model, "forward", lambda y: model.body(y) * 5, "model has its own 'forward'"),
        "root's method": (model, "post", lambda y: y * 3, "model has its own 'post'"),
        "class list in place": (None, None, None, "class _Gained has another 'OFFSETS'"),
        "class config field": (None, None, None, "class _Gained changed its setting 'SETTINGS.bias'")}[change]
    try:
        with torch.no_grad():
            assert torch.equal(fused(x), model(x))
            if target is not None:
                setattr(target, name, value)
            elif change == "class list in place":
                _Gained.OFFSETS[0] = 0.5
            else:
                _Gained.SETTINGS.bias = 0.5
            want = model(x)
            assert not torch.equal(want, fused.graph_module(x))   # (the change changes the answer)
            with pytest.warns(UserWarning, match=message):
                assert torch.equal(fused(x), want)
    finally:
        _put_back_gained()
        if target is not None:
            delattr(target, name)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(fused(x), model(x))


class _PrivateFields(nn.Module):
    """A region, then factors from config objects' private fields: behind a property, read directly, through getattr;
    and a private cache of a config that the forward never reads."""

    class Config:
        def __init__(self):
            self._k, self._memo = 1.0, {}

        @property
        def k(self) -> float:
            return self._k

    def __init__(self, how: str):
        super().__init__()
        self.body, self.how = SeedA(), how
        self.config, self.ns = self.Config(), SimpleNamespace(_p=1.0, _q=1.0)

    def forward(self, x):
        y = self.body(x)
        if self.how == "property":
            return y * self.config.k
        if self.how == "direct":
            return y * self.ns._p
        return y * getattr(self.ns, "_q")


@pytest.mark.parametrize("how", ["property", "direct", "getattr"])
def test_a_config_objects_private_field_the_code_reads_is_watched(how):
    """A private field of a config object that the model's code reads (``self._k`` in its property, ``ns._p``,
    ``getattr(ns, "_q")``) changed gives the model's answer; a private cache the code never reads, filled between
    calls, leaves the graph running."""
    torch.manual_seed(10)
    model = _PrivateFields(how).eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for step in range(2):
                model.config._memo[step] = step
                assert torch.equal(fused(x), model(x))
        target, name = {"property": (model.config, "_k"), "direct": (model.ns, "_p"),
                        "getattr": (model.ns, "_q")}[how]
        setattr(target, name, 3.0)
        with pytest.warns(UserWarning, match=f"changed its setting '[a-z]+.{name}'"):
            assert torch.equal(fused(x), model(x))


class _ReadsALeaf(nn.Module):
    """The forward reads a setting and the training flag of modules the graph calls (fx's leaves)."""

    def __init__(self):
        super().__init__()
        self.body, self.drop, self.norm = SeedA(), nn.Dropout(0.25), nn.BatchNorm1d(64)

    def forward(self, x):
        y = self.body(x) * (1 - self.drop.p)
        return y * 2 if self.norm.training else y


@pytest.mark.parametrize("change", ["setting", "training flag"])
def test_what_the_forward_reads_of_a_called_module_is_watched(change):
    """``self.drop.p`` and ``self.norm.training`` were constants of the graph: a module the graph calls changed since
    (its setting, its flag alone) gives the model's answer."""
    torch.manual_seed(8)
    model = _ReadsALeaf().eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
        if change == "setting":
            model.drop.p = 0.5
        else:
            model.norm.train()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(fused(x), model(x))


class _AsksForWhatIsMissing(nn.Module):
    """A region, then branches on attributes the module does not have when fused (``getattr(..., None)``,
    ``hasattr``), on itself and on a module the graph calls."""

    def __init__(self):
        super().__init__()
        self.body, self.drop = SeedA(), nn.Dropout(0.0)

    def forward(self, x):
        y = self.body(x)
        if getattr(self, "extra", None) is not None:
            y = y + self.extra
        if hasattr(self, "flag"):
            y = y * 2
        if hasattr(self.drop, "gain"):
            y = y * 3
        return self.drop(y)


@pytest.mark.parametrize("change", ["buffer", "parameter", "attribute", "class attribute", "called module's"])
def test_an_attribute_the_forward_found_missing_added_after_fusing_gives_the_models_answer(change):
    """The graph holds the branch for an attribute's absence: one added since (a buffer, a parameter, a plain
    attribute, a class attribute, one on a module the graph calls) runs the model's own forward, with a warning naming
    it, until it is gone again."""
    torch.manual_seed(11)
    model = _AsksForWhatIsMissing().eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    target, name, message = {"buffer": (model, "extra", "root module has 'extra'"),
                             "parameter": (model, "extra", "root module has 'extra'"),
                             "attribute": (model, "flag", "root module has 'flag'"),
                             "class attribute": (_AsksForWhatIsMissing, "flag", "root module has 'flag'"),
                             "called module's": (model.drop, "gain", "module 'drop' has 'gain'")}[change]
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
        try:
            if change == "buffer":
                model.register_buffer("extra", torch.ones(64))
            elif change == "parameter":
                model.extra = nn.Parameter(torch.ones(64))
            else:
                setattr(target, name, True)
            want = model(x)
            assert not torch.equal(want, fused.graph_module(x))   # (the change changes the answer)
            with pytest.warns(UserWarning, match=message):
                assert torch.equal(fused(x), want)
        finally:
            delattr(target, name)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(fused(x), model(x))


COUNT = torch.tensor(2.0)   # (a global tensor the forward reads as a number)


class _ReadsTensorValues(nn.Module):
    """A region, then numbers read from plain tensors (not buffers) at the trace: an attribute's ``.item()``, a
    global's ``float()``; and a plain tensor the graph holds as it is (a traced op takes it)."""

    def __init__(self):
        super().__init__()
        self.body, self.t, self.held = SeedA(), torch.tensor(1.0), torch.zeros(64)

    def forward(self, x):
        return (self.body(x) + self.held) * self.t.item() * float(COUNT)


@pytest.mark.parametrize("change", ["attribute's value", "global's value", "held tensor"])
def test_a_tensor_whose_value_the_trace_read_changed_in_place_gives_the_models_answer(change):
    """fx keeps ``self.t.item()`` and ``float(COUNT)`` as numbers: such a tensor changed in place runs the model's own
    forward, with a warning, until fused again; a tensor the graph holds as it is sees the change itself (no
    warning).  Under torch.compile of the fused model as well: its version counter is read in every call there (a
    graph break, as the model's own ``.item()`` makes one)."""
    torch.manual_seed(12)
    model = _ReadsTensorValues().eval()
    fused = fullfuse.fused_model(model)
    compiled = torch.compile(fused, backend="eager")
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            assert torch.equal(fused(x), model(x)) and torch.equal(compiled(x), model(x))
            {"attribute's value": model.t, "global's value": COUNT, "held tensor": model.held}[change].add_(1.0)
            want = model(x)
            if change == "held tensor":
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    assert torch.equal(fused(x), want)
            else:
                assert not torch.equal(want, fused.graph_module(x))   # (the change changes the answer)
                with pytest.warns(UserWarning, match="in place|changed"):
                    assert torch.equal(fused(x), want)
            assert torch.equal(compiled(x), want)
    finally:
        COUNT.fill_(2.0)


HELD_AND_READ = torch.tensor(1.0)   # (a global tensor a traced op takes and the forward also reads as a number)


class _HoldsAndReads(nn.Module):
    """A region, then a plain tensor that a traced op takes (the graph holds it) and that the forward also reads as a
    number (fx keeps that number)."""

    def __init__(self, where: str):
        super().__init__()
        self.body, self.where, self.t = SeedA(), where, torch.tensor(1.0)

    def forward(self, x):
        t = self.t if self.where == "attribute" else HELD_AND_READ
        return self.body(x) * t + t.item()


@pytest.mark.parametrize("where", ["attribute", "global", "attribute, in a copy"])
def test_a_tensor_the_graph_holds_and_the_trace_read_changed_in_place_gives_the_models_answer(where):
    """The graph's op sees the change, the number fx kept does not: such a tensor is compared by version counter too
    (it was by identity alone: a silent wrong answer), in a deep copy of the fused model as well (its own tensor).
    Unchanged, the graph runs."""
    torch.manual_seed(15)
    model = _HoldsAndReads(where.split(",")[0]).eval()
    fused = _quiet_fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    if where.endswith("copy"):
        fused = copy.deepcopy(fused)
        model = fused._original
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            _answers_quietly(fused, model, x)
            (HELD_AND_READ if where == "global" else model.t).add_(1.0)
            want = model(x)
            assert not torch.equal(want, fused.graph_module(x))   # (the kept number is stale)
            with pytest.warns(UserWarning, match="in place|changed"):
                assert torch.equal(fused(x), want)
    finally:
        HELD_AND_READ.fill_(1.0)


class _CountsCalls(nn.Module):
    """A region; the forward counts its calls in a plain tensor attribute, in place."""

    def __init__(self):
        super().__init__()
        self.body, self.calls = SeedA(), torch.zeros(1)

    def forward(self, x):
        self.calls.add_(1)
        return self.body(x)


def test_a_forward_changing_a_tensor_attribute_in_place_counts_every_call():
    """``self.calls.add_(1)`` ran once, at the trace, and the graph never: such a forward is not traced (its child
    still fuses), the trace's change is put back, and each call counts."""
    model = _CountsCalls().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"] and model.calls.item() == 0
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        fused(x)
        fused(x)
    assert model.calls.item() == 2


GAINS = np.array([2.0, 3.0], dtype=np.float32)   # (a global array the forward reads as numbers)


class _ReadsArrayValues(nn.Module):
    """A region, then numbers read from NumPy arrays at the trace (fx keeps them as constants): an attribute's, one in
    a list attribute, a global's."""

    def __init__(self):
        super().__init__()
        self.body, self.w, self.ws = SeedA(), np.array([1.5, 0.5]), [np.array([0.25])]

    def forward(self, x):
        return self.body(x) * float(self.w[0]) + float(self.ws[0][0]) + float(GAINS[1])


@pytest.mark.parametrize("change", ["attribute", "in a list", "global", "resized"])
def test_an_array_whose_values_the_trace_read_changed_in_place_gives_the_models_answer(change):
    """A NumPy array has no version counter: its bytes, shape and dtype are compared in each call.  Unchanged, the
    graph runs (no warning); changed in place, the model's own forward, with a warning."""
    torch.manual_seed(13)
    model = _ReadsArrayValues().eval()
    fused = _quiet_fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            _answers_quietly(fused, model, x)
            if change == "attribute":
                model.w[0] = 4.0
            elif change == "in a list":
                model.ws[0][0] = 1.0
            elif change == "global":
                GAINS[1] = 7.0
            else:
                model.w.resize(3, refcheck=False)
                model.w[:] = [1.5, 0.5, 0.0]   # (the same first values, a new shape)
            want = model(x)
            if change != "resized":
                assert not torch.equal(want, fused.graph_module(x))   # (the change changes the answer)
            with pytest.warns(UserWarning, match="changed"):
                assert torch.equal(fused(x), want)
    finally:
        GAINS[:] = [2.0, 3.0]


def test_under_torch_compile_an_array_changed_in_place_gives_the_models_answer():
    """torch.compile breaks the graph at the array's comparison, which then runs in every call."""
    torch.manual_seed(14)
    model = _ReadsArrayValues().eval()
    compiled = torch.compile(_quiet_fused(model), backend="eager")
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(compiled(x), model(x))
        model.w[0] = 4.0
        assert torch.equal(compiled(x), model(x))
    torch._dynamo.reset()


class _ChangesAnArray(nn.Module):
    """A region; the forward changes a NumPy array in place (an attribute's or a global's)."""

    def __init__(self, where: str):
        super().__init__()
        self.body, self.where, self.seen = SeedA(), where, np.zeros(1)

    def forward(self, x):
        (self.seen if self.where == "attribute" else SEEN)[0] += 1
        return self.body(x)


SEEN = np.zeros(1)


@pytest.mark.parametrize("where", ["attribute", "global"])
def test_a_forward_changing_an_array_in_place_changes_it_in_every_call(where):
    """fx would run the change once, at the trace, and the graph never: the forward is not traced (its child still
    fuses), the trace's change is put back, and each call makes it."""
    model = _ChangesAnArray(where).eval()
    seen = model.seen if where == "attribute" else SEEN
    seen[0] = 0
    fused = _quiet_fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"] and seen[0] == 0
    with torch.no_grad():
        fused(torch.randn(SMALL_SHAPE["A"]))
        fused(torch.randn(SMALL_SHAPE["A"]))
    assert seen[0] == 2


def _answers_quietly(fused, model, x) -> None:
    """Two calls of ``fused`` give the model's answer with no warning (the fused graph runs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(fused(x), model(x)) and torch.equal(fused(x), model(x))


def _quiet_fused(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fullfuse.fused_model(model)


_T, _NAN = torch.ones(3), float("nan")
_Pair = namedtuple("_Pair", "a b")


@pytest.mark.parametrize("value, later", [
    ([1, _NAN, "a"], None), ([1, _NAN, "a"], [1, _NAN, "b"]), ([1, _NAN], (1, _NAN)), ((1, 2), _Pair(1, 2)),
    ((1, 2), _Pair(1, 3)), ({"t": _T, "f": math.sqrt, "n": _NAN}, None), ({"t": _T, "f": math.sqrt}, {"t": _T}),
    ({"t": _T}, {"t": torch.ones(3)}), ({"t": _T}, {"u": _T}), ([[_T, 2], {"k": (3, _T)}], None),
    ([[_T, 2], {"k": (3, _T)}], [[_T, 2], {"k": (3, torch.ones(3))}]), (OrderedDict(a=1, b=2), OrderedDict(b=2, a=1)),
    ((), ()), ([], ()), (_NAN, None), (2.0, 2), (_T, None), (_T, torch.ones(3)), (frozenset({1}), frozenset({1})),
    ({1, 2}, {2, 1}), ({1, 2}, {1}), ([1, 2], [1, 2, 3]),
], ids=lambda v: type(v).__name__)
def test_differs_answers_as_the_snapshots_comparison(value, later):
    """``differs`` (what the fused model's compiled path asks, item by item) answers as ``snapshot != later`` (its
    eager path): nested containers, ``Same`` items, NaN, a namedtuple against a tuple, a list against a tuple.  later
    None: the value itself."""
    was, now = snapshot(value), value if later is None else later
    assert differs(was, now) == (was is not now and was != now), (was, now)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_fused_model_under_torch_compile_sees_a_tensor_changed_in_place(how):
    """A copy's snapshots of the plain tensors the trace read keep their version and read it under torch.compile as
    the original's do (a graph break, the comparison made outside torch.compile's graph)."""
    torch.manual_seed(13)
    model = _ReadsTensorValues().eval()
    fused = _quiet_fused(model)
    copied = copy.deepcopy(fused) if how == "deepcopy" else pickle.loads(pickle.dumps(fused))
    original = copied.__dict__["_original"]
    compiled = torch.compile(copied, backend="eager")
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(compiled(x), original(x))
        original.t.add_(1.0)
        want = original(x)
        assert not torch.equal(want, copied.graph_module(x))
        assert torch.equal(compiled(x), want)


class _ReadsItsParameters(nn.Module):
    """A forward that reaches its parameters as tensors, not through fx's proxies: fx keeps what it computes from
    their dtype (``how`` "dtype": the input cast to the first parameter's dtype, as ``ModelMixin.dtype`` gives it) or
    their values ("values": a bias entry read as a number)."""

    def __init__(self, how: str):
        super().__init__()
        self.body, self.how = SeedA(), how

    def forward(self, x):
        if self.how == "dtype":
            return self.body(x.to(next(self.parameters()).dtype))
        return self.body(x) * float(dict(self.named_parameters())["body.conv.bias"][0])


@pytest.mark.parametrize("change", ["double() of the model", "double() of the fused model", "bfloat16",
                                    "bias updated in place", "bias replaced"])
def test_a_parameter_the_trace_reached_as_a_tensor_changed_gives_the_models_answer(change):
    """fx keeps ``next(self.parameters()).dtype`` (the input's cast) or a value read from a parameter as constants: a
    conversion of the model after fused_model (which the model's own cast follows), an update in place or a
    replacement runs the model's own forward, with a warning naming the parameter; the model as fused runs the graph
    quietly."""
    torch.manual_seed(14)
    how = "dtype" if change in ("double() of the model", "double() of the fused model", "bfloat16") else "values"
    model = _ReadsItsParameters(how).eval()
    fused = _quiet_fused(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        _answers_quietly(fused, model, x)
        if change == "double() of the model":
            model.double()
        elif change == "double() of the fused model":
            fused.double()
        elif change == "bfloat16":
            model.to(torch.bfloat16)
        elif change == "bias updated in place":
            model.body.conv.bias.add_(1.0)
        else:
            model.body.conv.bias = nn.Parameter(model.body.conv.bias + 1.0)
        want = model(x)
        with pytest.warns(UserWarning, match="parameter 'body.conv.(weight|bias)' has another"):
            got = fused(x)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_parameters_layout_read_alone_is_not_watched_for_its_values():
    """Reading a parameter's dtype alone: an update of its values in place (a training step) reaches the graph,
    which reads the parameter as it is, and changes nothing of what the fused model watches."""
    torch.manual_seed(15)
    model = _ReadsItsParameters("dtype").eval()
    fused = _quiet_fused(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.5)
        _answers_quietly(fused, model, x)
