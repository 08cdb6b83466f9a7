"""Forwards whose Python computes a value that fx would keep as a constant of the traced graph, where the forward
computes it anew in every call: a tensor it makes and changes in place, an answer of torch's global modes and
settings, a draw from a global random generator.  Such a forward is not traced: the model runs its own forward
around its children that trace (CPU: the torch path computes the outputs)."""
import builtins
import collections.abc
import contextlib
import functools
import logging
import operator
import os
import random
import sys
import warnings
from collections.abc import Sequence
from os import environ, getenv
from warnings import warn

import pytest
import torch
import torch.nn.functional as F
from torch import is_grad_enabled, is_tensor, nn

import fullfuse
from fullfuse.seed_models import SMALL_SHAPE, SeedA


def _fused(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fullfuse.fused_model(model)


def _fused_in_its_body(model, refusal: str):
    """``model`` (a ``_RegionThen``) refused as a whole by the trace (``refusal``: the reason's pattern), fused: its
    body's region alone."""
    with pytest.raises(fullfuse.TraceError, match=refusal):
        fullfuse.trace.trace(model)
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
    return fused


class _RegionThen(nn.Module):
    """Seed A's region as ``body``, then what ``how`` names (each subclass's forward)."""

    def __init__(self, how: str):
        super().__init__()
        self.body, self.how = SeedA(), how


class _MakesAndChanges(nn.Module):
    """A forward that makes a tensor and changes it in place from the input (fx would keep the tensor as one
    constant and change it again in every call)."""

    def __init__(self, how: str):
        super().__init__()
        self.conv, self.how = nn.Conv2d(8, 4, 3), how

    def forward(self, x):
        t = torch.zeros(2)
        if self.how == "setitem":
            t[0] = x.mean()
        elif self.how == "iadd":
            t += x.mean()
        elif self.how == "method":
            t.add_(x.mean())
        else:   # (through a view)
            t[:1].mul_(x.mean())
        return F.adaptive_avg_pool2d(F.gelu(self.conv(x)), 1).flatten(1) + t.sum()


@pytest.mark.parametrize("how", ["setitem", "iadd", "method", "view"])
def test_a_forward_changing_a_tensor_it_makes_runs_as_written(how):
    """Such a forward is not traced (the model runs its own forward, with a warning saying why): every call gives the
    model's answer, where the traced graph would carry the change over from call to call."""
    torch.manual_seed(6)
    model = _MakesAndChanges(how).eval()
    with pytest.warns(UserWarning, match="changes in place a tensor it makes"):
        fused = fullfuse.fused_model(model)
    assert not fused.plans
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(fused(x), model(x))


class _AsksTheMode(nn.Module):
    """A forward that asks torch for a global mode and branches on the answer."""

    def __init__(self, query: str):
        super().__init__()
        self.conv, self.query = nn.Conv2d(8, 4, 3), query

    def forward(self, x):
        y = F.adaptive_avg_pool2d(F.gelu(self.conv(x)), 1)
        return y * 2 if getattr(torch, self.query)() else y


class _PartAsks(nn.Module):
    """A region in one child and the mode query in another: the model as a whole does not trace, its first child
    does."""

    def __init__(self):
        super().__init__()
        self.body = SeedA()
        self.tail = _AsksTheMode("is_grad_enabled")
        self.tail.conv = nn.Identity()

    def forward(self, x):
        return self.tail(self.body(x))


@pytest.mark.parametrize("query", ["is_grad_enabled", "is_inference_mode_enabled", "is_autocast_enabled"])
def test_a_forward_asking_torch_for_a_mode_gives_the_models_answer_in_every_mode(query):
    """fx would bake the trace's answer (grad on, no autocast) into the graph: such a forward is not traced (a warning
    says why) and answers as the model in every mode; where a child asks, the other children still fuse."""
    torch.manual_seed(7)
    model = _AsksTheMode(query).eval()
    with pytest.warns(UserWarning, match=f"asks torch for a global mode or setting \\(torch.{query}\\(\\)\\)"):
        fused = fullfuse.fused_model(model)
    assert not fused.plans
    x = torch.randn(SMALL_SHAPE["A"])
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode, lambda: torch.autocast("cpu")):
        with mode():
            assert torch.equal(fused(x), model(x))
    parted = _PartAsks().eval()
    fused = _fused(parted)
    assert len(fused.plans) == 1
    for mode in (torch.enable_grad, torch.no_grad):
        with mode():
            torch.testing.assert_close(fused(x), parted(x))


# (each query named in full in the forward's code: dynamo traces these calls, where an ``operator.attrgetter`` breaks
# its graph, and torch 2.4's dynamo then answers the query differently in the model's and in the fused model's frames)
_TRACER_QUERIES = {
    "torch.fx._symbolic_trace.is_fx_tracing": lambda: torch.fx._symbolic_trace.is_fx_tracing(),
    "torch.compiler.is_compiling": lambda: torch.compiler.is_compiling(),
    "torch.compiler.is_dynamo_compiling": lambda: torch.compiler.is_dynamo_compiling(),
    "torch.compiler.is_exporting": lambda: torch.compiler.is_exporting(),
    "torch.jit.is_tracing": lambda: torch.jit.is_tracing(),
    "torch.onnx.is_in_onnx_export": lambda: torch.onnx.is_in_onnx_export(),
}


class _AsksTheTracer(_RegionThen):
    """A region in a child, then a branch on whether a tracer or compiler runs the code (``how``: the query)."""

    def forward(self, x):
        y = self.body(x)
        return y * 2 if _TRACER_QUERIES[self.how]() else y


@pytest.mark.parametrize("query", ["torch.fx._symbolic_trace.is_fx_tracing", "torch.compiler.is_compiling",
                                   "torch.compiler.is_dynamo_compiling", "torch.compiler.is_exporting"])
def test_a_forward_asking_whether_fx_or_dynamo_traces_answers_as_the_model(query):
    """fx would keep the trace's answer (fx tracing: yes; dynamo compiling: no), wrong in every call, or under a
    torch.compile of the fused model: such a forward is not traced (the region in its child still fuses) and answers
    as the model, eager and compiled."""
    try:
        operator.attrgetter(query[len("torch."):])(torch)
    except AttributeError:
        pytest.skip(f"torch {torch.__version__} has no {query}")
    if query.startswith("torch.compiler") and torch.__version__ < "2.5":   # (TorchVersion compares as a version)
        pytest.skip("torch 2.4's dynamo calls a fused model as one module (a call_module node), its forward running "
                    "as in eager, where is_compiling() is False")
    torch.manual_seed(8)
    model = _AsksTheTracer(query).eval()
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]   # (not the root's graph's region)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(torch.compile(fused, backend="eager")(x),
                                       torch.compile(model, backend="eager")(x))
    torch._dynamo.reset()


@pytest.mark.parametrize("query", ["torch.jit.is_tracing", "torch.onnx.is_in_onnx_export"])
def test_a_forward_asking_whether_it_is_recorded_answers_as_the_model_when_recorded(query):
    """TorchScript's and ONNX's queries answer no in every eager call, as at the trace, so the model traces and fuses;
    under torch.jit.trace (ONNX's exporter too), which records PyTorch's ops, the fused model runs the model's own
    forward, which asks for itself (the graph kept the trace's no)."""
    torch.manual_seed(10)
    model = _AsksTheTracer(query).eval()
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(fused(x), model(x))
        if query == "torch.jit.is_tracing":
            want = torch.jit.trace(model, x, check_trace=False)(x)
            assert not torch.equal(want, model(x))   # (the recorded branch differs)
            assert torch.equal(torch.jit.trace(fused, x, check_trace=False)(x), want)
        else:   # (ONNX export runs the model under a TorchScript trace, where this query answers yes)
            plain = model(x)
            with mock_onnx_export():
                want = torch.jit.trace(model, x, check_trace=False)(x)
                assert not torch.equal(want, plain)
                assert torch.equal(torch.jit.trace(fused, x, check_trace=False)(x), want)


@contextlib.contextmanager
def mock_onnx_export():
    """``torch.onnx.is_in_onnx_export()`` answering yes, as inside ``torch.onnx.export`` (which needs the onnx
    package)."""
    real = torch.onnx.is_in_onnx_export
    torch.onnx.is_in_onnx_export = lambda: True
    try:
        yield
    finally:
        torch.onnx.is_in_onnx_export = real


def _times_two_if(flag) -> float:
    return 2.0 if flag else 1.0


# (what the forward reads, how a call changes it and back, and the match of the refusal's reason)
SETTINGS = {
    "default dtype": (lambda: torch.get_default_dtype() == torch.float64,
                      lambda on: torch.set_default_dtype(torch.float64 if on else torch.float32),
                      r"torch.get_default_dtype\(\)"),
    "deterministic": (lambda: torch.are_deterministic_algorithms_enabled(),
                      lambda on: torch.use_deterministic_algorithms(on), r"torch.are_deterministic_algorithms_enabled"),
    "cudnn flag": (lambda: not torch.backends.cudnn.allow_tf32,
                   lambda on: setattr(torch.backends.cudnn, "allow_tf32", not on), r"torch.backends.cudnn.allow_tf32"),
    "cudnn module flag": (lambda: not torch.backends.cudnn.enabled,
                          lambda on: setattr(torch.backends.cudnn, "enabled", not on), r"torch.backends.cudnn.enabled"),
    "matmul flag": (lambda: torch.backends.cuda.matmul.allow_tf32,
                    lambda on: setattr(torch.backends.cuda.matmul, "allow_tf32", on),
                    r"torch.backends.cuda.matmul.allow_tf32"),
    "matmul precision": (lambda: torch.get_float32_matmul_precision() == "high",
                         lambda on: torch.set_float32_matmul_precision("high" if on else "highest"),
                         r"torch.get_float32_matmul_precision"),
    "threads": (lambda: torch.get_num_threads() == 1,
                lambda on, n=torch.get_num_threads(): torch.set_num_threads(1 if on else n), r"torch.get_num_threads"),
}


class _ReadsASetting(nn.Module):
    """A region, then a factor that a global setting chooses."""

    def __init__(self, reads):
        super().__init__()
        self.body, self.reads = SeedA(), reads

    def forward(self, x):
        return self.body(x) * _times_two_if(self.reads())


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_forward_reading_a_global_setting_answers_as_the_model_when_it_changes(name):
    """fx would keep the trace's answer (the setting as it was at fused_model): the model as a whole is not traced
    (its region still fuses, in its child), and a call after the setting changed gives the model's answer."""
    reads, change, says = SETTINGS[name]
    torch.manual_seed(8)
    model = _ReadsASetting(reads).eval()
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
    with pytest.raises(fullfuse.TraceError, match=says):
        fullfuse.trace.trace(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
        change(True)
        try:
            want = model(x)
            assert torch.equal(fused(x), want) and not torch.equal(want, model.body(x))
        finally:
            change(False)
        assert torch.equal(fused(x), model(x))


class _Draws(_RegionThen):
    """A region plus a draw from a global generator that no traced value reaches (fx would run it once, at the
    trace)."""

    def forward(self, x):
        y = self.body(x)
        if self.how == "torch.randn":
            return y + torch.randn(64)
        if self.how == "torch.rand branch":
            return y * 2 if torch.rand(1).item() < 0.5 else y
        if self.how == "random":
            return y * random.random()
        return y * float(sys.modules["numpy"].random.rand())


@pytest.mark.parametrize("how", ["torch.randn", "torch.rand branch", "random", "numpy"])
def test_a_forward_drawing_random_numbers_outside_its_ops_draws_anew_in_every_call(how):
    """The trace's draw would be the same in every call of the traced graph: the model as a whole is not traced, and
    every call draws as the model's does (the same generator state gives the same answer)."""
    numpy = pytest.importorskip("numpy")
    model = _Draws(how).eval()
    fused = _fused_in_its_body(model, "draws random numbers outside the traced ops")
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for seed in range(4):
            answers = []
            for call in (model, fused):
                torch.manual_seed(seed), random.seed(seed), numpy.random.seed(seed)
                answers.append(call(x))
            assert torch.equal(*answers)


_VARIABLE = "FULLFUSE_TEST_SCALE"


class _ReadsTheEnvironment(_RegionThen):
    """A region, then a scale read from an environment variable (fx would keep the value read at the trace)."""

    def forward(self, x):
        y = self.body(x)
        if self.how == "os.environ.get":
            return y * float(os.environ.get(_VARIABLE, "1"))
        if self.how == "os.environ[]":
            return y * float(os.environ[_VARIABLE]) if _VARIABLE in os.environ else y
        if self.how == "getenv by name":
            return y * float(getenv(_VARIABLE, "1"))
        if self.how == "environ by name":
            return y * float(environ.get(_VARIABLE, "1"))
        return y * len([name for name in os.environ if name == _VARIABLE])   # (iterated)


@pytest.mark.parametrize("how", ["os.environ.get", "os.environ[]", "getenv by name", "environ by name", "iterated"])
def test_a_forward_reading_an_environment_variable_reads_it_in_every_call(how, monkeypatch):
    """The trace's value would be the graph's in every call: the model as a whole is not traced (its region is
    fused), and a variable set later gives the model's answer."""
    monkeypatch.setenv(_VARIABLE, "2")
    model = _ReadsTheEnvironment(how).eval()
    fused = _fused_in_its_body(model, "reads environment variables \\(os.environ")
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for value in ("2", "3", None):
            if value is None:
                monkeypatch.delenv(_VARIABLE)
            else:
                monkeypatch.setenv(_VARIABLE, value)
            assert torch.equal(fused(x), model(x))


def test_torchs_own_environment_reads_during_a_trace_do_not_count():
    """torch reading its own variables while fx traces (here through a wrapped function of torch's) is no reason to
    refuse the trace, and os.environ's class is as it was after it."""
    before = dict(vars(type(os.environ)))
    namespace = {"__name__": "torch.fullfuse_test_reader", "os": os}
    exec("def reads(): return os.environ.get('FULLFUSE_TEST_UNSET') is None", namespace)
    fullfuse.trace.trace(_ReadsASetting(namespace["reads"]))
    assert dict(vars(type(os.environ))) == before


def _rand_of_shape(y):
    return torch.rand(y.shape, device=y.device)


def _fx_traces(function) -> bool:
    try:
        torch.fx.symbolic_trace(function)
        return True
    except Exception:
        return False


# (a factory op given a traced shape: fx from torch 2.5; torch 2.4's argument parser refuses fx's Attribute for a size)
_RAND_OF_SHAPE = _rand_of_shape if _fx_traces(_rand_of_shape) else torch.rand_like


class _DrawsInItsOps(nn.Module):
    """Random ops that take a traced value (the graph records them: each call draws) and mode-free torch queries."""

    def __init__(self):
        super().__init__()
        self.body = SeedA()

    def forward(self, x):
        y = self.body(x)
        noise = torch.randn_like(y) + _RAND_OF_SHAPE(y)
        if not torch.jit.is_scripting() and not torch.jit.is_tracing():
            y = y + 0.0
        return F.dropout(y + noise, 0.5, training=self.training)


def test_random_ops_the_graph_records_and_constant_queries_leave_the_model_traced():
    """No false refusal: ops on traced values draw in every call of the graph, and torch.jit.is_scripting() /
    is_tracing() (torchvision's forwards ask them) trace; the model is fused as a whole."""
    model = _DrawsInItsOps()
    fullfuse.trace.trace(model)
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for mode in ("train", "eval"):
            getattr(model, mode)(), getattr(fused, mode)()
            answers = []
            for call in (model, fused):
                torch.manual_seed(3)
                answers.append(call(x))
            assert torch.equal(*answers)


def test_a_library_s_forward_counts_as_the_model_s():
    """A module whose name starts with "torch" but is not torch's (torchvision, torchaudio) is a model's code: its
    queries count."""
    namespace = {"__name__": "torchvision.models.fake", "torch": torch}
    exec("def reads(): return torch.is_grad_enabled()", namespace)
    with pytest.raises(fullfuse.TraceError, match=r"torch.is_grad_enabled\(\)"):
        fullfuse.trace.trace(_ReadsASetting(namespace["reads"]))


def test_the_queries_and_flags_are_torch_s_own_again_after_a_trace():
    """The trace's wrappers are gone after it, also where it failed; other threads' reads went through meanwhile."""
    before = (torch.is_grad_enabled, torch.get_default_dtype, type(torch.backends.cudnn).__dict__["allow_tf32"],
              type(torch.backends.cuda.matmul).__dict__["__getattr__"])
    for model in (_ReadsASetting(lambda: torch.get_default_dtype() == torch.float64), SeedA()):
        try:
            fullfuse.trace.trace(model)
        except fullfuse.TraceError:
            pass
        after = (torch.is_grad_enabled, torch.get_default_dtype, type(torch.backends.cudnn).__dict__["allow_tf32"],
                 type(torch.backends.cuda.matmul).__dict__["__getattr__"])
        assert after == before


class _Keeps(nn.Module):
    """A region, then the forward keeps something in a container of its own (in place: no attribute set)."""

    def __init__(self, how: str):
        super().__init__()
        self.body, self.how, self.history, self._cache, self.seen = SeedA(), how, [], {}, set()

    def forward(self, x):
        y = self.body(x)
        if self.how == "append":
            self.history.append(y.mean())
        elif self.how == "cache":
            self._cache["last"] = y
        else:
            self.seen.add(len(self.seen))
        return y * 2


@pytest.mark.parametrize("how", ["append", "cache", "set"])
def test_a_forward_changing_its_containers_in_place_runs_as_written(how):
    """fx would run the change once, at the trace (leaving a proxy in the model), and the graph never: the model as a
    whole is not traced, its containers are as they were after fused_model, and every call changes them as the
    model's does."""
    torch.manual_seed(9)
    model = _Keeps(how).eval()
    with pytest.raises(fullfuse.TraceError, match="changes them in place"):
        fullfuse.trace.trace(model)
    assert not model.history and not model._cache and not model.seen
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    kept = {"append": model.history, "cache": model._cache, "set": model.seen}[how]
    assert len(kept) == (1 if how == "cache" else 2)   # (the fused call's change and the model's)
    values = kept.values() if how == "cache" else kept if how == "append" else ()
    assert all(isinstance(v, torch.Tensor) for v in values)   # (no proxy of the trace left behind)


class _FakeCudaGenerator:
    """A CUDA generator's state as torch gives it: (seed, offset), 8 bytes each."""

    def __init__(self, offset: int = 0):
        self.offset = offset

    def get_state(self) -> torch.Tensor:
        return torch.tensor([7, self.offset], dtype=torch.int64).view(torch.uint8)


@pytest.mark.parametrize("case", ["drawn", "not drawn", "context made and drawn", "context made", "capturing"])
def test_cuda_generators_are_compared_where_torch_lets_them_be_read(monkeypatch, case):
    """The CUDA generators of contexts that exist are compared before and after (not while this thread's stream is
    captured, where torch refuses to read them); a context made during the trace counts as drawn from where its
    offset moved on."""
    from fullfuse import global_state
    generators = (_FakeCudaGenerator(),)
    initialized = [not case.startswith("context made")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized[0])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: case == "capturing")
    monkeypatch.setattr(torch.cuda, "default_generators", generators, raising=False)
    with global_state.ReadingGlobalState() as state:
        initialized[0] = True
        if case in ("drawn", "context made and drawn", "capturing"):
            generators[0].offset += 4
    assert state.drawn == (["torch.cuda.default_generators[0]"] if case in ("drawn", "context made and drawn") else [])


class _Once(type):
    """A metaclass making one instance per class, through ``type.__call__``."""

    def __call__(cls, *args, **kwargs):
        if "instance" not in vars(cls):
            cls.instance = type.__call__(cls, *args, **kwargs)
        return cls.instance


class _AsksForATensor(_RegionThen):
    """A region, then a branch on whether its result is a tensor (fx's proxy of it is not)."""

    def forward(self, x):
        y = self.body(x)
        if self.how == "isinstance":
            return y * 2 if isinstance(y, torch.Tensor) else y
        if self.how == "tuple of classes":
            return y * 2 if isinstance(y, (int, torch.Tensor)) else y
        if self.how == "is_tensor":
            return y * 2 if torch.is_tensor(y) else y
        if self.how == "type is":
            return y * 2 if type(y) is torch.Tensor else y
        if self.how == "type's name":
            return y * 2 if type(y).__name__ == "Tensor" else y
        if self.how == "__class__":
            return y * 2 if y.__class__ is torch.Tensor else y
        if self.how == "dispatch on the class":
            return _scaled(y)
        if self.how == "abstract classes":   # (isinstance of an ABC reads __class__ too: answered as for a tensor)
            return y * 2 if isinstance(y, collections.abc.Iterable) and not isinstance(y, Sequence) else y
        if self.how == "type of others":   # (type of a module, isinstance of a class, classes made: traced)
            class Meta(type):   # (a metaclass made meanwhile: its base is type)
                pass
            made, once = Meta("Made", (), {"k": 2.0}), _Once("Once", (), {"k": 1.0})
            k = made.k * once().k if isinstance(made, type) and issubclass(type(made), type) else 1.0
            k = k if type(made) is Meta and type.__new__(Meta, "New", (), {}).__name__ == "New" else 1.0
            # (a class's type is type, as is type's; both are classes and types)
            k = k if type(_Once) is type and type(type(self)) is type and type(type) is type else 1.0
            k = k if issubclass(type(type(self)), type) and isinstance(type(type(self)), type) else 1.0
            return y * k if type(self).__name__ == "_AsksForATensor" and type.__name__ == "type" else y
        return torch.stack(y) if isinstance(y, (list, tuple)) else y * 2   # (not a tensor test: traced)


@functools.singledispatch
def _scaled(y):
    return y


@_scaled.register
def _(y: torch.Tensor):
    return y * 2


@pytest.mark.parametrize("how", ["isinstance", "tuple of classes", "is_tensor", "type is", "type's name", "__class__",
                                 "dispatch on the class", "list or tuple", "type of others", "abstract classes"])
def test_a_forward_asking_whether_a_traced_value_is_a_tensor_answers_as_the_model(how):
    """fx answers such a test no for its proxy, where the value is a tensor (``type(y)`` is fx's Proxy class): such a
    forward is not traced (its child still fuses); a test for other classes (a list or tuple: no, as for a tensor) and
    ``type`` of other objects trace, ``type`` being itself meanwhile."""
    torch.manual_seed(12)
    model = _AsksForATensor(how).eval()
    fused = _fused(model)
    traced = how in ("list or tuple", "type of others", "abstract classes")
    assert [plan.name for plan in fused.plans] == (["fullfuse_region_0"] if traced else ["body.fullfuse_region_0"])
    assert "type" not in globals()   # (lent to the model's module for the trace only)
    if not traced:
        with pytest.raises(fullfuse.TraceError, match="asks whether a traced value is a tensor"):
            fullfuse.trace.trace(model)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    assert builtins.isinstance.__module__ == "builtins" and torch.is_tensor.__module__ == "torch"   # (put back)


_LOGGER = logging.getLogger("fullfuse_test_model")


class _Writes(_RegionThen):
    """A region, then its result's shape printed or logged (at info; or at debug, which the logger drops)."""

    def forward(self, x):
        y = self.body(x)
        if self.how == "print":
            print("pooled", y.shape)
        elif self.how == "log":
            _LOGGER.info("pooled %s", y.shape)
        elif self.how == "warn":
            warnings.warn(f"pooled {y.shape}", stacklevel=2)
        else:
            _LOGGER.debug("pooled %s", y.shape)
        return y


@pytest.mark.parametrize("how", ["print", "log", "log below the level"])
def test_a_forward_that_prints_or_logs_writes_in_every_call(how, capsys, caplog):
    """fx would write once, at the trace, with its proxies (``pooled Proxy(...)``), and the graph never again: such a
    forward is not traced (its child still fuses) and writes the real values in every call; the trace writes
    nothing.  A log call the logger's level drops writes nothing, at the trace or after: the forward traces."""
    caplog.set_level(logging.INFO, logger=_LOGGER.name)
    torch.manual_seed(13)
    model = _Writes(how).eval()
    fused = _fused(model)
    traced = how == "log below the level"
    assert [plan.name for plan in fused.plans] == (["fullfuse_region_0"] if traced else ["body.fullfuse_region_0"])
    assert capsys.readouterr().out == "" and not caplog.records
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(fused(x), model(x))
    line = f"pooled {torch.Size((SMALL_SHAPE['A'][0], 64))}"   # (SeedA squeezes its pooled result)
    printed, logged = capsys.readouterr().out, [record.getMessage() for record in caplog.records]
    assert (printed, logged) == {"print": (f"{line}\n" * 4, []), "log": ("", [line] * 4),
                                 "log below the level": ("", [])}[how]


def test_a_forward_that_warns_warns_in_every_call():
    """As a print: fx would warn once, at the trace (``pooled Proxy(...)``), and the graph never again; such a forward
    is not traced (its child still fuses), the trace warns nothing, and each call warns of its values, as the model
    does."""
    torch.manual_seed(14)
    model = _Writes("warn").eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = fullfuse.fused_model(model)
        assert not [w for w in caught if "pooled" in str(w.message)]
        assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
        x = torch.randn(SMALL_SHAPE["A"])
        with torch.no_grad():
            fused(x)
            model(x)
    line = f"pooled {torch.Size((SMALL_SHAPE['A'][0], 64))}"
    pooled = [w for w in caught if "pooled" in str(w.message)]
    assert [str(w.message) for w in pooled] == [line] * 2


def test_torchs_own_warnings_during_a_trace_pass_and_name_the_code_that_warned():
    from fullfuse.trace_outputs import RecordingOutputs
    own = {"__name__": "torch._fullfuse_test", "warnings": warnings}
    exec(compile("def warn_once():\n    warnings.warn('from torch')\n", "torch_fullfuse_test.py", "exec"), own)
    with warnings.catch_warnings(record=True) as caught, RecordingOutputs() as outputs:
        warnings.simplefilter("always")
        own["warn_once"]()
    assert not outputs.written
    assert [(str(w.message), w.filename) for w in caught] == [("from torch", "torch_fullfuse_test.py")]


def test_what_code_bound_during_a_trace_writes_after_it(capsys):
    """A module imported during a trace may bind the recorders (``from warnings import warn``, print lent as its
    global): after the trace they write as the real ones."""
    from fullfuse.trace_outputs import RecordingOutputs
    with RecordingOutputs() as outputs:
        bound_warn, bound_print = warnings.warn, outputs.lent["print"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bound_warn("after the trace")
        bound_print("printed after the trace")
    assert [str(w.message) for w in caught] == ["after the trace"] and not outputs.written
    assert capsys.readouterr().out == "printed after the trace\n"


def test_torchs_own_log_records_during_a_trace_name_the_code_that_logged():
    """A record of torch's own code during the trace passes through (it is no write of the model's), naming the
    function that logged as its source, not fullfuse's recorder."""
    from fullfuse.trace_outputs import RecordingOutputs
    own = {"__name__": "torch._fullfuse_test", "logging": logging}
    exec(compile("def warn_once():\n    logging.getLogger('torch._fullfuse_test').warning('from torch')\n",
                 "torch_fullfuse_test.py", "exec"), own)
    records = []
    kept = logging.Handler(logging.WARNING)
    kept.emit = records.append
    # The handler sits on the logger itself: once torch's logging is set up (any earlier torch.compile), the
    # "torch" logger stops propagating, so pytest's handler on the root logger would see nothing.
    logger = logging.getLogger("torch._fullfuse_test")
    logger.addHandler(kept)
    try:
        with RecordingOutputs() as outputs:
            own["warn_once"]()
    finally:
        logger.removeHandler(kept)
    assert not outputs.written
    assert [(r.getMessage(), r.filename, r.funcName) for r in records] == [
        ("from torch", "torch_fullfuse_test.py", "warn_once")]


class _CallsByName(_RegionThen):
    """A region, then a function this module imported by name before any trace: a warning, a mode query, a tensor
    test (the recorders patch the functions' own modules, which such a name does not go through)."""

    def forward(self, x):
        y = self.body(x)
        if self.how == "warn":
            warn(f"pooled {y.shape}")
            return y
        if self.how == "is_grad_enabled":
            return y * 2 if is_grad_enabled() else y
        return y * 2 if is_tensor(y) else y


@pytest.mark.parametrize("how", ["warn", "is_grad_enabled", "is_tensor"])
def test_a_function_imported_by_name_is_recorded_as_its_module_s(how):
    """``from warnings import warn`` / ``from torch import is_grad_enabled, is_tensor``: the trace would warn once
    with fx's proxies / hold the trace's answer; such a forward is not traced (its child fuses), answers and warns
    as the model in every call, and the module's names are the real functions again after the trace."""
    torch.manual_seed(15)
    model = _CallsByName(how).eval()
    with pytest.raises(fullfuse.TraceError, match={"warn": r"writes out \(warnings.warn", "is_grad_enabled":
                                                   r"torch.is_grad_enabled\(\)", "is_tensor": "torch.is_tensor"}[how]):
        fullfuse.trace.trace(model)
    assert (warn, is_grad_enabled, is_tensor) == (warnings.warn, torch.is_grad_enabled, torch.is_tensor)
    assert warn.__module__ in ("warnings", "_warnings") and is_tensor.__module__ == "torch"   # (not recorders)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = fullfuse.fused_model(model)
        assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
        assert not [w for w in caught if "pooled" in str(w.message)]
        x = torch.randn(SMALL_SHAPE["A"])
        for mode in (torch.no_grad, torch.enable_grad):
            with mode():
                torch.testing.assert_close(fused(x), model(x))
    pooled = [str(w.message) for w in caught if "pooled" in str(w.message)]
    assert pooled == ([f"pooled {torch.Size((SMALL_SHAPE['A'][0], 64))}"] * 4 if how == "warn" else [])


def _held_in_a_closure(query):
    class InAClosure(_RegionThen):
        def forward(self, x):
            y = self.body(x)
            return y * 2 if query() else y
    return InAClosure


class _InTheClass(_RegionThen):
    query = staticmethod(torch.is_grad_enabled)

    def forward(self, x):
        y = self.body(x)
        return y * 2 if self.query() else y


class _OnTheInstance(_RegionThen):
    def __init__(self, how):
        super().__init__(how)
        self.query = torch.is_grad_enabled

    def forward(self, x):
        y = self.body(x)
        return y * 2 if self.query() else y


HOLDERS = {"a free variable": _held_in_a_closure(torch.is_grad_enabled), "a class attribute": _InTheClass,
           "an instance attribute": _OnTheInstance}


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_a_query_held_by_the_models_objects_is_recorded(holder):
    """``torch.is_grad_enabled`` held by a variable of the function that made the model's class, by the class, or by
    the instance: the trace would hold its answer, so the forward is not traced (its child fuses) and answers as the
    model in every mode; the holders hold the real function again after the trace."""
    torch.manual_seed(16)
    model = HOLDERS[holder]("query").eval()
    with pytest.raises(fullfuse.TraceError, match=r"torch.is_grad_enabled\(\)"):
        fullfuse.trace.trace(model)
    if holder == "a free variable":
        held = dict(zip(type(model).forward.__code__.co_freevars, type(model).forward.__closure__))["query"]
        held = held.cell_contents
    else:
        held = vars(type(model))["query"].__func__ if holder == "a class attribute" else vars(model)["query"]
    assert held is torch.is_grad_enabled
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
    x = torch.randn(SMALL_SHAPE["A"])
    for mode in (torch.no_grad, torch.enable_grad):
        with mode():
            torch.testing.assert_close(fused(x), model(x))
