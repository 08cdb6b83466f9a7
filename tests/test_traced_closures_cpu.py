"""The free variables of the model's functions (a class or helper made by a factory function): fx holds what the
forward computed from them as constants, as from a global.  The fused model watches them as it watches globals: a
change gives the model's answer (its own forward runs, with a warning), a forward that sets one is not traced, and a
helper the forward itself defines (cells of its own call) is neither watched nor refused."""
import copy
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import fullfuse
from fullfuse.seed_models import SMALL_SHAPE, SeedA

# (the trace notes what the model's code reads through Python's trace hook, which coverage or a debugger may hold)
_NOTED = pytest.mark.skipif(sys.gettrace() is not None and not hasattr(sys, "monitoring"),
                            reason="another tracer holds Python's trace hook, and no sys.monitoring (Python < 3.12)")


def _factory():
    """A model class whose forward reads a dict, a list, a config object and a number of the function it was made in,
    and the setters of those variables."""
    table, box, config, scale = {"k": 2.0}, [1.0], SimpleNamespace(shift=0.5), 3.0

    class Made(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = SeedA()

        def forward(self, x):
            return self.body(x) * table["k"] * scale + box[0] + config.shift

    def rebind(value):
        nonlocal scale
        scale = value

    changes = {"dict entry": lambda: table.update(k=5.0), "list item": lambda: box.__setitem__(0, -1.0),
               "config field": lambda: setattr(config, "shift", 2.0), "rebound": lambda: rebind(7.0)}
    return Made, changes


def _fused(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fullfuse.fused_model(model)


@_NOTED
@pytest.mark.parametrize("change", ["dict entry", "list item", "config field", "rebound"])
@pytest.mark.parametrize("copied", ["fused", "deep copy"])
def test_a_free_variable_the_forward_reads_changed_after_fusing_gives_the_models_answer(change, copied):
    torch.manual_seed(21)
    made, changes = _factory()
    model = made().eval()
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    if copied == "deep copy":
        model = copy.deepcopy(model)   # (the copy's class and functions are the model's: the same variables)
        fused = copy.deepcopy(fused)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(fused(x), model(x))
        changes[change]()
        with pytest.warns(UserWarning, match="takes from the function it was made in changed"):
            out = fused(x)
        torch.testing.assert_close(out, model(x))


@_NOTED
def test_two_models_of_one_factory_watch_their_own_variables():
    """A factory called twice makes two classes of one code: each fused model watches its own class's variables."""
    torch.manual_seed(22)
    (made_1, changes_1), (made_2, _) = _factory(), _factory()
    model_1, model_2 = made_1().eval(), made_2().eval()
    fused_1, fused_2 = _fused(model_1), _fused(model_2)
    x = torch.randn(SMALL_SHAPE["A"])
    changes_1["dict entry"]()
    with torch.no_grad():
        with pytest.warns(UserWarning, match="changed"):
            torch.testing.assert_close(fused_1(x), model_1(x))
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # (model 2 unchanged: its kernel path, no warning)
            torch.testing.assert_close(fused_2(x), model_2(x))


@_NOTED
@pytest.mark.parametrize("change", ["dict entry", "rebound"])
def test_a_free_variable_changed_under_torch_compile_gives_the_models_answer(change):
    """Under torch.compile (fullgraph: nothing may break the graph) too: the variables are read by functions closed
    over the same cells, which dynamo traces as it traces the model's own reads of them."""
    torch.manual_seed(25)
    made, changes = _factory()
    model = made().eval()
    compiled = torch.compile(_fused(model), backend="eager", fullgraph=True)
    torch._dynamo.reset()
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        before = compiled(x)
        torch.testing.assert_close(before, model(x))
        changes[change]()
        changed = compiled(x)
        torch.testing.assert_close(changed, model(x))
        assert not torch.allclose(changed, before)


def _counting_factory():
    calls = 0

    class Counts(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = SeedA()

        def forward(self, x):
            nonlocal calls
            calls += 1
            return self.body(x)

    return Counts, lambda: calls


@_NOTED
def test_a_forward_setting_a_free_variable_runs_as_written():
    """The trace would set it once, the graph never: the model is not traced as a whole, the variable is as it was
    after fused_model, and each call sets it as the model's does."""
    made, calls = _counting_factory()
    model = made().eval()
    with pytest.raises(fullfuse.TraceError, match="enclosing function"):
        fullfuse.trace.trace(model)
    assert calls() == 0
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["body.fullfuse_region_0"]
    with torch.no_grad():
        fused(torch.randn(SMALL_SHAPE["A"]))
        fused(torch.randn(SMALL_SHAPE["A"]))
    assert calls() == 2


class _DefinesAHelper(nn.Module):
    """A forward that makes a closure over its own locals (a helper, a comprehension): cells of the call itself."""

    def __init__(self):
        super().__init__()
        self.body = SeedA()

    def forward(self, x):
        gain = 2.0

        def scaled(y):
            return y * gain

        parts = [scaled(self.body(x)) for _ in range(1)]
        gain = 3.0   # (the helper's cell changes within the call: the call's own business)
        return scaled(parts[0])


class _CallsSuper(SeedA):
    """A forward calling ``super()``: its one free variable is the class (``__class__``), nothing to watch."""

    def forward(self, x):
        return super().forward(x) * 2.0


@_NOTED
@pytest.mark.parametrize("make", [_DefinesAHelper, _CallsSuper], ids=["a helper the forward defines", "super()"])
def test_free_variables_of_the_call_itself_are_neither_watched_nor_refused(make):
    torch.manual_seed(23)
    model = make().eval()
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    assert not fused.__dict__["_reads"][-1]
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(fused(x), model(x))
        torch.testing.assert_close(fused(x), model(x))
