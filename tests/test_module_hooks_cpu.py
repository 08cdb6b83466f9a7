"""Hooks registered before ``fused_model`` on the modules a trace goes into (a block, a Sequential, a custom module:
the graph holds their ops, not their calls) run in every call of the fused model, as the model's calls run them: a
forward hook keeping a feature, counting calls or changing the output; a pre-hook; a backward hook (CPU: the torch
path computes the outputs)."""
import copy
import pickle
import warnings
from typing import Tuple

import pytest
import torch
from torch import nn

import fullfuse
from fullfuse.seed_models import SMALL_SHAPE, SeedA


class _Block(nn.Module):
    """A custom module after the region: fx traces into it."""

    def __init__(self, pair: bool = False):
        super().__init__()
        self.fc, self.pair = nn.Linear(64, 5), pair

    def forward(self, x):
        y = self.fc(x)
        return (y, y.sum(1)) if self.pair else y


class _Model(nn.Module):
    def __init__(self, pair: bool = False):
        super().__init__()
        self.body = nn.Sequential(SeedA(), nn.Identity())
        self.block = _Block(pair)

    def forward(self, x):
        if self.block.pair:
            y, total = self.block(self.body(x))
            return y + total[:, None]
        return self.block(self.body(x))


FEATURES = {}


def _keep(module, args, out):   # (module-level: the models pickle)
    FEATURES[type(module).__name__] = out[0] if isinstance(out, tuple) else out


def _scaled(module, args, kwargs, out):
    return (out[0] * 2, out[1]) if isinstance(out, tuple) else out * 2


def _fused(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fullfuse.fused_model(model)


def _features(call, x):
    FEATURES.clear()
    out = call(x)
    return out, dict(FEATURES)


@pytest.mark.parametrize("pair", [False, True])
def test_forward_hooks_on_traced_modules_run_in_every_call(pair):
    """A hook keeping each call's feature (on the Sequential holding the region and on the block after it) and one
    changing the block's output, registered with_kwargs: every fused call keeps its own call's features and answers
    as the model; the region is still fused in the graph."""
    torch.manual_seed(1)
    model = _Model(pair).eval()
    model.body.register_forward_hook(_keep)
    model.block.register_forward_hook(_keep)
    model.block.register_forward_hook(_scaled, with_kwargs=True)
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(SMALL_SHAPE["A"])
            (want, kept), (got, seen) = _features(model, x), _features(fused, x)
            assert torch.equal(got, want) and kept.keys() == seen.keys() == {"Sequential", "_Block"}
            assert all(torch.equal(seen[k], kept[k]) for k in kept)
    for copied in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        x = torch.randn(SMALL_SHAPE["A"])
        with torch.no_grad():
            (want, kept), (got, seen) = _features(model, x), _features(copied, x)
        assert torch.equal(got, want) and all(torch.equal(seen[k], kept[k]) for k in kept)


def test_a_pre_hook_and_a_backward_hook_run_with_the_modules_own_call():
    """A module with a pre-hook (which may change its inputs) or a backward hook is kept as one call in the graph:
    both run in every call, the region before it still fused."""
    torch.manual_seed(2)
    model = _Model()
    calls = []
    model.block.register_forward_pre_hook(lambda module, args: (args[0] + 1,))
    model.block.register_full_backward_hook(lambda module, grad_in, grad_out: calls.append(grad_out[0].shape))
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    want = model(x).sum()
    want.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    fused(x).sum().backward()
    assert len(calls) == 2 and all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))


def test_a_hook_counting_calls_counts_every_call():
    model, count = _Model().eval(), []
    model.block.register_forward_hook(lambda module, args, out: count.append(1))
    fused = _fused(model)
    assert not count   # (tracing ran no hook)
    with torch.no_grad():
        for _ in range(3):
            fused(torch.randn(SMALL_SHAPE["A"]))
    assert len(count) == 3


def test_what_a_hook_writes_on_the_model_is_no_change_of_it():
    """A hook storing each call's feature in a dict of the model (which the forward never reads) leaves the fused
    graph running: the trace runs no hook, so the dict is not among what the graph depends on."""
    torch.manual_seed(3)
    model = _Model().eval()
    model.kept = {}
    model.block.register_forward_hook(lambda module, args, out: model.kept.update(out=out))
    fused = _fused(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")   # (the model's own forward would run with a warning)
        for _ in range(3):
            x = torch.randn(SMALL_SHAPE["A"])
            got = fused(x)
            assert torch.equal(got, model(x)) and torch.equal(model.kept["out"], got)


def _doubled(module: nn.Module, inputs: Tuple[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
    return output * 2   # (typed: TorchScript compiles it as the block's forward hook)


def test_torch_jit_script_gets_the_model_with_its_hooks():
    """TorchScript runs a module's hooks with its call, which the graph does not make: scripting the fused model
    scripts the model itself (with the warning that scripting gives the model's own ops)."""
    torch.manual_seed(4)
    model = nn.Sequential(SeedA(), nn.Sequential(nn.Linear(64, 5))).eval()   # (TorchScript compiles its forward)
    model[1].register_forward_hook(_doubled)
    fused = _fused(model)
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    with pytest.warns(UserWarning, match="TorchScript"):
        scripted = torch.jit.script(fused)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(scripted(x), model(x)) and torch.equal(fused(x), model(x))


def test_a_global_module_hook_sees_every_module_call_of_the_model():
    """A global module hook (a module tracker, a profiler) fires for every module call in the model, the blocks the
    trace went into too: under one the fused model runs the model's own forward, and the hook sees the model's calls in
    the model's order (the fused model standing for the root); without one, the fused graph again."""
    torch.manual_seed(5)
    model = _Model().eval()
    fused = _fused(model)
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: seen.append(module))
    x = torch.randn(SMALL_SHAPE["A"])
    try:
        with torch.no_grad():
            want = model(x)
            by_model, seen[:] = list(seen), []
            got = fused(x)
    finally:
        handle.remove()
    assert torch.equal(got, want)
    assert seen[:-1] == by_model[:-1] and by_model[-1] is model and seen[-1] is fused
    assert "own forward" in fused.plans[0].last_reason
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    assert "own forward" not in fused.plans[0].last_reason
