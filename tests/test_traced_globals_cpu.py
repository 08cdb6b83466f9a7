"""Globals of the model's code that the traced forward reads (fx keeps what it computes from them as constants of the
graph): changed after ``fused_model``, the fused model gives the model's answer; a forward that sets one or changes one
in place is not traced, the global put back as it was; a function wrapped with ``torch.fx.wrap`` is fx's to patch
and put back (CPU: the torch path computes the outputs)."""
import gc
import itertools
import logging
import re
import sys
import types
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.fx
from torch import nn

import fullfuse
from fullfuse import traced_globals
from fullfuse.seed_models import SMALL_SHAPE, SeedA

SCALE = 2.0
CONFIG = SimpleNamespace(shift=0.0)
TABLE = {"k": 1.0}
STEPS = 0
HISTORY = []
HERE = sys.modules[__name__]


def _settings_module(name: str) -> types.ModuleType:
    """A module of the model's own (``import settings``), registered as an import makes it, with a submodule."""
    module, sub = types.ModuleType(name), types.ModuleType(f"{name}.sub")
    module.SCALE, module.CALLS, module.sub, sub.K = 2.0, 0, sub, 1.0
    module.scaled = lambda y: y * 3.0
    sys.modules[module.__name__], sys.modules[sub.__name__] = module, sub
    return module


settings = _settings_module("fullfuse_test_settings")


class _BaseConstants:
    SHIFT = 0.5


class _Constants(_BaseConstants):
    """A class as a namespace of settings (``Constants.GAIN``), one inherited, one a classmethod's answer."""
    GAIN = 2.0

    @classmethod
    def offset(cls):
        return 1.0

# (the globals are noted through Python's trace hook, which coverage or a debugger may hold)
_NOTED = pytest.mark.skipif(sys.gettrace() is not None and not hasattr(sys, "monitoring"),
                            reason="another tracer holds Python's trace hook, and no sys.monitoring (Python < 3.12)")


def _times_table(y):
    return y * TABLE["k"]


def _kept_as_a_call(y):
    return y + 1


torch.fx.wrap("_kept_as_a_call")


class _ReadsGlobals(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = SeedA()

    def forward(self, x):
        y = _kept_as_a_call(_times_table(self.body(x) * SCALE + CONFIG.shift))
        y = settings.scaled(y * settings.SCALE + settings.sub.K)
        return y * _Constants.GAIN + _Constants.SHIFT + _Constants.offset()


# (the change, a setter and a getter of the value changed)
CHANGES = {"number": (3.0, lambda v: setattr(HERE, "SCALE", v), lambda: SCALE),
           "config field": (1.0, lambda v: setattr(CONFIG, "shift", v), lambda: CONFIG.shift),
           "dict entry": (5.0, lambda v: TABLE.__setitem__("k", v), lambda: TABLE["k"]),
           "function": (lambda y: y * 7, lambda v: setattr(HERE, "_times_table", v), lambda: _times_table),
           # an attribute of a module of the model's own: ``import settings`` ... ``settings.SCALE``
           "module's attribute": (5.0, lambda v: setattr(settings, "SCALE", v), lambda: settings.SCALE),
           "submodule's attribute": (-1.0, lambda v: setattr(settings.sub, "K", v), lambda: settings.sub.K),
           "module's function": (lambda y: y * 7.0, lambda v: setattr(settings, "scaled", v), lambda: settings.scaled),
           # an attribute of a class of the model's code: ``Constants.GAIN``, through its base, a classmethod
           "class's attribute": (3.0, lambda v: setattr(_Constants, "GAIN", v), lambda: vars(_Constants)["GAIN"]),
           "base class's attribute": (2.0, lambda v: setattr(_BaseConstants, "SHIFT", v),
                                      lambda: vars(_BaseConstants)["SHIFT"]),
           "class's classmethod": (classmethod(lambda cls: 4.0), lambda v: setattr(_Constants, "offset", v),
                                   lambda: vars(_Constants)["offset"])}


@_NOTED
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_global_the_forward_reads_changed_after_fusing_gives_the_models_answer(change):
    torch.manual_seed(11)
    model = _ReadsGlobals().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    assert HERE._kept_as_a_call is _kept_as_a_call   # (fx's wrapper was put back by fx, and left so)
    value, set_, get = CHANGES[change]
    before = get()
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert torch.equal(fused(x), model(x))
            set_(value)
            want = model(x)
            assert not torch.equal(want, fused.graph_module(x))   # (the change changes the answer)
            with pytest.warns(UserWarning, match="of (module|class) .* changed"):
                assert torch.equal(fused(x), want)
    finally:
        set_(before)


class _SetsAGlobal(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.body, self.how = SeedA(), how

    def forward(self, x):
        global STEPS
        y = self.body(x)
        if self.how == "set":
            STEPS += 1
        else:
            HISTORY.append(y)
        return y


@_NOTED
@pytest.mark.parametrize("how", ["set", "append"])
def test_a_forward_setting_a_global_runs_as_written(how):
    """The trace would set it once (``HISTORY`` would hold a proxy), the graph never: the model is not traced as a
    whole, the global is as it was after fused_model, and each call sets it as the model's does."""
    global STEPS
    STEPS, HISTORY[:] = 0, []
    model = _SetsAGlobal(how).eval()
    with pytest.raises(fullfuse.TraceError, match="sets global variables"):
        fullfuse.trace.trace(model)
    assert STEPS == 0 and HISTORY == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
    with torch.no_grad():
        fused(torch.randn(SMALL_SHAPE["A"]))
    assert (STEPS, len(HISTORY)) == ((1, 0) if how == "set" else (0, 1))
    assert all(isinstance(y, torch.Tensor) for y in HISTORY)


@pytest.mark.parametrize("monitoring", ["free", "taken"])
def test_another_tracer_keeps_its_hook_and_globals_are_noted_beside_it_from_python_3_12(monitoring):
    """Under a debugger or coverage (sys.settrace taken) the tracer stays in place, and the trace notes the globals
    through sys.monitoring (from Python 3.12, with a tool id of its own); where no such id is free, or before 3.12, it
    notes none (the trace hook is the other tracer's)."""
    def tracer(frame, event, arg):
        return None
    taken = []
    if monitoring == "taken":
        if not hasattr(sys, "monitoring"):
            pytest.skip("sys.monitoring is Python 3.12's")
        taken = [i for i in range(6) if sys.monitoring.get_tool(i) is None]
        for i in taken:
            sys.monitoring.use_tool_id(i, "another tool")
    sys.settrace(tracer)
    try:
        gm = fullfuse.trace.trace(_ReadsGlobals())
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
        for i in taken:
            sys.monitoring.free_tool_id(i)
    noted = gm.__dict__[fullfuse.trace.GLOBALS_READ]
    if hasattr(sys, "monitoring") and monitoring == "free":
        assert "SCALE" in noted.get(__name__, ())
    else:
        assert noted == {}


body = None   # (a global named as the model's attribute: ``self.body`` does not read it)


@_NOTED
def test_a_global_named_as_an_attribute_the_forward_reads_is_not_watched():
    """A notebook's globals share names with attributes (``model``, ``body``): only what the code reads as a global
    counts, so setting such a global changes nothing."""
    global body
    model = _ReadsGlobals().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    assert "body" not in fused.__dict__["_reads"][2].get(__name__, ())
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        body = SeedA()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(fused(x), model(x))
    finally:
        body = None


GC_RUNS = 0   # (set by a gc callback, as hypothesis's sets its timing globals)
_GC_LOGGER = logging.getLogger("fullfuse_test_gc")


def _count_collections(phase, info):
    global GC_RUNS
    GC_RUNS += 1


def _log_collections(phase, info):
    _GC_LOGGER.warning("collection %s", phase)


@_NOTED
@pytest.mark.parametrize("callback", ["sets a global", "logs"])
def test_a_gc_callback_during_the_trace_is_not_the_forwards(callback):
    """gc.callbacks run in whichever thread allocates: one that sets a global of its module (hypothesis's does) or
    logs during the trace was taken for the forward doing so, and the trace refused.  No automatic collection runs
    while the trace is watched."""
    threshold, hook = gc.get_threshold(), {"sets a global": _count_collections, "logs": _log_collections}[callback]
    gc.callbacks.append(hook)
    gc.set_threshold(1)   # (a collection at nearly every allocation)
    try:
        gm = fullfuse.trace.trace(_ReadsGlobals())
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(hook)
    assert "SCALE" in gm.__dict__[fullfuse.trace.GLOBALS_READ].get(__name__, ())
    assert gc.isenabled()


class _UsesTheStandardLibrary(nn.Module):
    """A forward that calls into the standard library, whose own globals change under any caller (``re``'s cache of
    compiled patterns, ``warnings``' registry)."""

    def __init__(self):
        super().__init__()
        self.body = SeedA()

    def forward(self, x):
        re.compile(f"fullfuse-test-{next(_PATTERNS)}")   # (a new pattern: re's cache grows)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="fullfuse-test")
        return self.body(x)


_PATTERNS = itertools.count()


@_NOTED
@pytest.mark.parametrize("names", ["sys.stdlib_module_names", "the standard library's directories"])
def test_the_standard_librarys_globals_are_never_the_models(names, monkeypatch):
    """The standard library's modules are not the model's code: a forward calling ``re.compile`` fuses.  Before
    Python 3.10 (no ``sys.stdlib_module_names``) their names come from the interpreter's standard-library directories
    and built-in modules; with none, ``re``'s cache was taken for a global the forward sets, and the seed B model did
    not trace on Python 3.9."""
    if names != "sys.stdlib_module_names":
        monkeypatch.delattr(sys, "stdlib_module_names", raising=False)
        monkeypatch.setattr(traced_globals, "_STDLIB", traced_globals._stdlib_names())
    elif not hasattr(sys, "stdlib_module_names"):
        pytest.skip("sys.stdlib_module_names is Python 3.10's")
    stdlib = traced_globals._STDLIB
    assert {"re", "warnings", "json", "math", "collections", "functools", "os", "sys", "typing", "builtins"} <= stdlib
    assert not {"torch", "fullfuse", "pytest", "numpy", "hypothesis", "site-packages"} & stdlib
    model = _UsesTheStandardLibrary().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # (no "could not trace" warning)
        fused = fullfuse.fused_model(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]   # (the whole forward traced)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x))




class _ReadsAModule(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.body, self.how = SeedA(), how

    def forward(self, x):
        y = self.body(x)
        if self.how == "attribute":
            return y * settings.SCALE
        settings.CALLS += 1
        return y


@_NOTED
def test_a_forward_setting_an_attribute_of_the_models_own_module_runs_as_written():
    settings.CALLS = 0
    model = _ReadsAModule("sets").eval()
    with pytest.raises(fullfuse.TraceError, match="sets global variables"):
        fullfuse.trace.trace(model)
    assert settings.CALLS == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    with torch.no_grad():
        fused(torch.randn(SMALL_SHAPE["A"]))
        fused(torch.randn(SMALL_SHAPE["A"]))
    assert settings.CALLS == 2


@_NOTED
def test_the_attributes_watched_of_a_module_are_those_read_of_it():
    """Of a module the forward names, only the attributes its code reads of that module are watched (those of every
    branch, as of the globals it names): ``self.body`` is not the module's ``body``."""
    settings.body = None
    model = _ReadsAModule("attribute").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    assert fused.__dict__["_reads"][2].get(settings.__name__) == ("CALLS", "SCALE")
    settings.body = SeedA()
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(fused(x), model(x))
    finally:
        del settings.body


class _SetsAClassAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = SeedA()

    def forward(self, x):
        _Constants.CALLS = getattr(_Constants, "CALLS", 0) + 1
        return self.body(x) * _Constants.GAIN


@_NOTED
def test_a_forward_setting_an_attribute_of_a_class_runs_as_written():
    """The trace would set it once, the graph never: not traced as a whole, the class as it was after fused_model."""
    model = _SetsAClassAttribute().eval()
    try:
        with pytest.raises(fullfuse.TraceError, match="sets global variables .*_Constants.CALLS"):
            fullfuse.trace.trace(model)
        assert "CALLS" not in vars(_Constants)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = fullfuse.fused_model(model)
        with torch.no_grad():
            fused(torch.randn(SMALL_SHAPE["A"]))
        assert _Constants.CALLS == 1
    finally:
        if "CALLS" in vars(_Constants):
            del _Constants.CALLS


@_NOTED
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_watches_the_class_attributes_the_trace_read(how):
    import copy
    import pickle
    model = _ReadsGlobals().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fullfuse.fused_model(model)
    copied = copy.deepcopy(fused) if how == "deepcopy" else pickle.loads(pickle.dumps(fused))
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            _Constants.GAIN = 5.0
            with pytest.warns(UserWarning, match="attribute 'GAIN' of class _Constants"):
                assert torch.equal(copied(x), copied.__dict__["_original"](x))
    finally:
        _Constants.GAIN = 2.0
