"""A fused model's state dict uses the original model's names: checkpoints move between the original and the fused
model unchanged, also where either sits inside a larger model (CPU: the torch path computes the outputs)."""
import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullfuse
from fullfuse.seed_models import SMALL_SHAPE, SeedA, SeedB


class Wrapper(nn.Module):
    """Layers with parameters and buffers around a family-A region (the README's model.head =
    fused_model(model.head))."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.head = SeedA()
        self.fc = nn.Linear(64, 3)

    def forward(self, x):
        return self.fc(self.head(self.bn(self.stem(x))))


class Functional(nn.Module):
    """F.conv2d on the module's own parameter and bias, and a buffer: fx copies them to the traced root."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8, 3, 3))
        self.bias = nn.Parameter(torch.randn(16))
        self.register_buffer("scale", torch.full((1,), 0.5))

    def forward(self, x):
        return F.adaptive_avg_pool2d(F.gelu(F.conv2d(x * self.scale, self.weight, self.bias)), 1)


class TwoRegionsOneConv(nn.Module):
    """One conv module in two fused regions: two internal keys per original key."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(self.conv(x)) + self.pool(self.conv(2.0 * x))


class NotCalledParts(nn.Module):
    """A head only training calls, a module nothing calls and a root parameter and buffer nothing reads: the traced
    (eval) forward reaches none of them, and the state dict still holds them."""

    def __init__(self):
        super().__init__()
        self.body = SeedA()
        self.aux = nn.Linear(64, 4)
        self.spare = nn.Sequential(nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))
        self.temperature = nn.Parameter(torch.ones(1))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        y = self.body(x)
        return (y, self.aux(y)) if self.training else y


class UnreachedFirst(nn.Module):
    """Modules the traced (eval) forward does not reach registered before, between and after those it reaches, and a
    root parameter nothing reads: the fused model and a larger model holding it list them all in this order."""

    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(1))
        self.aux = nn.Linear(64, 4)
        self.stem = nn.Conv2d(8, 8, 1)
        self.spare = nn.BatchNorm2d(8)
        self.body = SeedA()
        self.tail = nn.Linear(4, 4)

    def forward(self, x):
        y = self.body(self.stem(x))
        return (y, self.aux(y)) if self.training else y


class _LayerScale(nn.Module):
    """A custom module fx traces through: a parameter it multiplies by, a plain tensor attribute (no buffer) it adds
    and a plain setting."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((16,), 0.5))
        self.offset = torch.full((16,), 0.25)
        self.by = 2.0

    def forward(self, x):
        return x.flatten(1) * self.gamma * self.by + self.offset


class PlainTensors(nn.Module):
    """A plain tensor attribute on the root (normalisation constants kept as an attribute, not a buffer), a constant
    the forward makes (``torch.tensor``), and a traced-through module with a parameter and a plain tensor: in the
    model none of the plain tensors is in the state dict, and ``to()`` / ``double()`` leave them as they are."""

    def __init__(self):
        super().__init__()
        self.mean = torch.full((1, 8, 1, 1), 0.5)
        self.conv = nn.Conv2d(8, 16, 3)
        self.scale = _LayerScale()

    def forward(self, x):
        return self.scale(F.adaptive_avg_pool2d(F.gelu(self.conv((x - self.mean) * torch.tensor(0.5))), 1))


class PlainAttributes(PlainTensors):
    """PlainTensors without the constant: the plain tensor attributes alone."""

    def forward(self, x):
        return self.scale(F.adaptive_avg_pool2d(F.gelu(self.conv(x - self.mean)), 1))


class CalledOutOfOrder(nn.Module):
    """Modules registered in another order than the forward calls them (the graph holds them in call order): a head
    and a normalisation with buffers first, the fused body last."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 3)
        self.norm = nn.BatchNorm1d(64)
        self.body = SeedA()

    def forward(self, x):
        return self.fc(self.norm(self.body(x)))


def _fresh_values(state):
    """a state dict of the same names with new random values (integer buffers kept, variances positive)"""
    fresh = {k: torch.randn_like(v) if v.is_floating_point() else v.clone() for k, v in state.items()}
    return {k: v.abs() + 0.5 if k.endswith("running_var") else v for k, v in fresh.items()}


def _fused(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fullfuse.fused_model(model)


MODELS = [SeedA, SeedB, Wrapper, Functional, TwoRegionsOneConv, NotCalledParts, UnreachedFirst, PlainTensors,
          PlainAttributes, CalledOutOfOrder]


@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_names_and_order_are_the_originals(make):
    torch.manual_seed(0)
    model = make().eval()
    fused = _fused(make().eval())
    assert list(fused.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_parameters_and_buffers_come_in_the_originals_order(make):
    """``parameters()`` and ``buffers()`` of the fused model are the original's tensors in the original's order, as
    its state dict is: an optimizer's checkpoint taken on the original's parameters loads into one built on the fused
    model's with each parameter's state where it was, and parameters_to_vector gives the same vector."""
    torch.manual_seed(0)
    model = make().eval()
    fused = _fused(model)
    assert [id(p) for p in fused.parameters()] == [id(p) for p in model.parameters()]
    assert [id(b) for b in fused.buffers()] == [id(b) for b in model.buffers()]
    assert [t for _, t in fused.named_parameters()] == list(fused.parameters())
    original_opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    original_opt.step()
    fused_opt = torch.optim.SGD(fused.parameters(), lr=0.1, momentum=0.9)
    fused_opt.load_state_dict(original_opt.state_dict())
    for p in model.parameters():
        assert torch.equal(fused_opt.state[p]["momentum_buffer"], original_opt.state[p]["momentum_buffer"])
    assert torch.equal(nn.utils.parameters_to_vector(fused.parameters()),
                       nn.utils.parameters_to_vector(model.parameters()))


@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_checkpoints_load_both_ways(make):
    torch.manual_seed(1)
    original, fused = make().eval(), _fused(make().eval())
    ckpt = _fresh_values(original.state_dict())
    fused.load_state_dict(ckpt)                        # an original checkpoint into the fused model (strict)
    original.load_state_dict(fused.state_dict())       # and the fused model's own back into an original one
    for key, value in ckpt.items():
        assert torch.equal(original.state_dict()[key], value), key
    x = torch.randn(SMALL_SHAPE["B"] if make is SeedB else (2, 3, 20, 20) if make is Wrapper else SMALL_SHAPE["A"])
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x), rtol=1e-5, atol=1e-5)


def test_fused_submodule_keeps_the_larger_models_names():
    torch.manual_seed(2)
    model, target = Wrapper().eval(), Wrapper().eval()
    target.head = _fused(target.head)
    assert list(target.state_dict()) == list(model.state_dict())
    target.load_state_dict(model.state_dict())
    assert torch.equal(target.head.graph_module.fullfuse_region_0.conv.weight, model.head.conv.weight)
    x = torch.randn(2, 3, 20, 20)
    with torch.no_grad():
        torch.testing.assert_close(target(x), model(x), rtol=1e-5, atol=1e-5)


def test_missing_and_unexpected_keys_use_original_names():
    fused = _fused(Wrapper().eval())
    state = Wrapper().state_dict()
    del state["head.conv.bias"]
    state["head.conv.extra"] = torch.zeros(1)
    result = fused.load_state_dict(state, strict=False)
    assert result.missing_keys == ["head.conv.bias"]
    assert result.unexpected_keys == ["head.conv.extra"]
    with pytest.raises(RuntimeError, match=r"head\.conv\.bias"):
        fused.load_state_dict(state)


def test_internal_names_still_load():
    """a state dict with the fused model's internal names (as fullfuse wrote them before) loads as well"""
    fused = _fused(SeedA().eval())
    internal = {"graph_module.fullfuse_region_0.conv." + k: torch.randn_like(v)
                for k, v in SeedA().conv.state_dict().items()}
    fused.load_state_dict(internal)
    assert torch.equal(fused.graph_module.fullfuse_region_0.conv.bias,
                       internal["graph_module.fullfuse_region_0.conv.bias"])


def test_names_survive_pickle_and_deepcopy():
    fused = _fused(Wrapper().eval())
    buf = io.BytesIO()
    torch.save(fused, buf)
    buf.seek(0)
    for clone in (torch.load(buf, weights_only=False), copy.deepcopy(fused)):
        assert list(clone.state_dict()) == list(Wrapper().state_dict())


def test_one_conv_in_two_regions_loads_into_both():
    fused = _fused(TwoRegionsOneConv().eval())
    assert len(fused.plans) == 2
    ckpt = _fresh_values(TwoRegionsOneConv().state_dict())
    fused.load_state_dict(ckpt)
    for name in ("fullfuse_region_0", "fullfuse_region_1"):
        assert torch.equal(getattr(fused.graph_module, name).conv.weight, ckpt["conv.weight"])


def test_modules_the_forward_does_not_reach_are_the_fused_models_too():
    """parameters(), double() and train() cover the original's modules and tensors the traced forward does not reach,
    as the original's own calls do (the fused model shares its modules)."""
    torch.manual_seed(3)
    model = NotCalledParts().eval()
    fused = _fused(model)
    assert len(fused.plans) == 1
    assert {id(p) for p in fused.parameters()} == {id(p) for p in model.parameters()}
    fused.double()
    assert all(t.dtype == torch.float64 for t in model.state_dict().values() if t.is_floating_point())
    fused.train()
    assert model.aux.training and model.spare[1].training
    fused.eval()
    assert not model.aux.training
    x = torch.randn(SMALL_SHAPE["A"], dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    assert fused.aux is model.aux
    with pytest.raises(AttributeError, match="does not reach .* set it on the original model"):
        fused.aux = nn.Linear(64, 4)
    model.aux = nn.Linear(64, 4).double()   # (as said: the fused model runs the model's own forward, saying so)
    with torch.no_grad(), pytest.warns(UserWarning, match="aux"):
        assert torch.equal(fused(x), model(x))


def test_plain_tensors_and_attributes_are_the_models():
    """A model whose forward reads plain tensors (an attribute, a constant it makes) fuses (fx's copies of them are no
    buffers of the fused model); the fused model reaches the model's own attributes by their names — its plain tensor,
    its setting, its traced-through module itself (not fx's holder of that module's tensors) — and ``double()``
    converts what the model's ``double()`` converts."""
    torch.manual_seed(4)
    model = PlainTensors().eval()
    fused = _fused(model)
    assert len(fused.plans) == 1
    assert fused.mean is model.mean and fused.scale is model.scale and fused.scale.by == 2.0
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
        fused.double()
        assert model.conv.weight.dtype == model.scale.gamma.dtype == torch.float64
        assert model.mean.dtype == model.scale.offset.dtype == torch.float32   # (plain tensors: as nn.Module does)
        assert torch.equal(fused(x.double()), model(x.double()))


def test_a_setting_set_on_the_fused_model_is_the_models():
    """``fused.by = ...`` for a plain attribute of the model sets the model's (whose forward reads it: the fused model
    then runs the model's forward, with a warning, until it is as it was); a new name is the fused model's own."""
    torch.manual_seed(5)
    model = PlainTensors().eval()
    fused = _fused(model)
    fused.scale.by = 3.0   # (the model's module itself)
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad(), pytest.warns(UserWarning, match="setting 'by'"):
        assert torch.equal(fused(x), model(x))
    model.scale.by = 2.0
    settable = _Settable().eval()
    root = _fused(settable)
    root.k = 5.0
    assert settable.k == 5.0 and "k" not in root.__dict__ and root.k == 5.0
    with torch.no_grad(), pytest.warns(UserWarning, match="root module changed its setting 'k'"):
        assert torch.equal(root(x), settable(x))
    root.mine = 1   # (a name the model does not have: the fused model's own)
    assert root.__dict__["mine"] == 1 and not hasattr(settable, "mine")


class _Settable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 4, 3)
        self.k = 2.0

    def forward(self, x):
        return F.adaptive_max_pool2d(F.relu(self.conv(x)), 1) * self.k


@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_a_larger_model_holding_a_fused_part_lists_its_tensors_in_the_originals_order(make):
    """The README's ``model.head = fused_model(model.head)``: the larger model's parameters() and buffers() are the
    same tensors in the same order as before (the fused part's graph holds its modules in the part's order)."""
    torch.manual_seed(0)
    outer = nn.Sequential(nn.Identity(), make().eval())
    params, buffers = [id(p) for p in outer.parameters()], [id(b) for b in outer.buffers()]
    outer[1] = _fused(outer[1])
    assert [id(p) for p in outer.parameters()] == params
    assert [id(b) for b in outer.buffers()] == buffers
    saved = io.BytesIO()
    torch.save(outer, saved)
    saved.seek(0)
    for copied in (copy.deepcopy(outer), torch.load(saved, weights_only=False)):   # (a copy keeps the order)
        for mine, theirs in ((outer.parameters(), copied.parameters()), (outer.buffers(), copied.buffers())):
            mine, theirs = list(mine), list(theirs)
            assert len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs))
