"""Random sequences of changes to a model after ``fused_model`` (CPU): after each, the fused model answers as the
original does (``same_answer``).  Changes: the conv's weight updated in place, through ``.data``, or replaced by a new
Parameter; ``load_state_dict`` of new values (through the fused model's names where it no longer shares the original's
modules); the conv's stride or GELU's approximation set; a forward hook on the conv; batch-norm statistics updated; a
train / eval round; ``.double()``; ``copy.deepcopy`` and a ``torch.save`` / ``torch.load`` round trip (the copies then
change alike, through the original's names); a hook on a module the trace went into, the root's setting that the
forward reads, a plain tensor attribute re-assigned, a dict's entry, a config object's field (and a field of an object
in it), a function the forward reads by attribute and a global it reads.  Models: a conv-act-pool
region after a batch norm, a 1x1 conv or a ReLU, with a flatten / squeeze / linear head after it, a second conv branch
added to its output, or the conv's output also read outside the region; then a gain, an offset and a custom scale
module the trace goes into."""
import copy
import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import fullfuse
from same_answer import answer, assert_same_answer
from saved_and_loaded import saved_and_loaded

CHANGES = ("in place", "data", "load", "double", "deepcopy", "save and load", "stride", "approximation", "train",
           "hook", "new parameter", "batch-norm statistics", "traced-through hook", "gain", "offset", "dict entry",
           "config field", "nested config field", "function", "global")
MODELS_PER_SEED = 25
CHANGES_PER_MODEL = 6


def _scale_by_two(module, args, out):   # (a module-level hook: the models pickle)
    return out * 2


def _unchanged(x):   # (module-level, as the hook: the models pickle)
    return x


GAIN = 1.0   # (a global the forward reads: "global" sets it, for the model and its copies alike)


class _Model(nn.Module):
    def __init__(self, rng):
        super().__init__()
        self.cin, self.before = rng.choice((3, 8)), rng.choice(("none", "batch norm", "conv 1x1", "relu"))
        self.p = {"batch norm": nn.BatchNorm2d(self.cin), "conv 1x1": nn.Conv2d(self.cin, self.cin, 1),
                  "relu": nn.ReLU(), "none": nn.Identity()}[self.before]
        self.conv = nn.Conv2d(self.cin, 16, rng.choice((1, 3)), stride=rng.choice((1, 2)), padding=rng.choice((0, 1)))
        self.act = rng.choice((nn.GELU(), nn.GELU(approximate="tanh"), nn.ReLU(), nn.SiLU(), nn.Identity()))
        self.pool = nn.AdaptiveAvgPool2d(1) if rng.random() < 0.5 else nn.AdaptiveMaxPool2d(1)
        self.after = rng.choice(("flatten", "squeeze", "none", "linear", "conv output read again", "second branch"))
        self.fc = nn.Linear(16, 5)
        self.conv2 = nn.Conv2d(self.cin, 16, 3, padding=1)
        self.gain, self.offset, self.scale = 1.0, torch.zeros(1), _Scale()
        self.shifts = {"shift": 0.0}
        self.config, self.fn = SimpleNamespace(k=1.0, inner=SimpleNamespace(j=1.0)), _unchanged

    def forward(self, x):
        x = self.p(x)
        y = self.act(self.conv(x))
        z = self.scale(self.pool(y)) * self.gain + self.offset + self.shifts["shift"]
        z = self.fn(z * self.config.k * self.config.inner.j * GAIN)
        if self.after == "flatten":
            return z.flatten(1)
        if self.after == "squeeze":
            return z.squeeze()
        if self.after == "linear":
            return self.fc(torch.flatten(z, 1))
        if self.after == "conv output read again":
            return z + y.mean()
        if self.after == "second branch":
            return z + torch.relu(self.conv2(x)).mean(dim=(2, 3), keepdim=True)
        return z


class _Scale(nn.Module):
    """A custom module: fx traces into it (its ops, not its call, are in the graph)."""

    def forward(self, x):
        return x * 1.5


def _change(model, change: str, values: torch.Generator) -> None:
    """``change`` made to ``model`` (the original, or a fused copy through the original's names); new values drawn
    from ``values``."""
    conv = model.conv
    if change == "in place":
        with torch.no_grad():
            conv.weight.mul_(1.5)
    elif change == "data":
        conv.weight.data = torch.randn(conv.weight.shape, generator=values, dtype=conv.weight.dtype)
    elif change == "new parameter":
        conv.weight = nn.Parameter(torch.randn(conv.weight.shape, generator=values, dtype=conv.weight.dtype))
    elif change == "load":
        state = {name: torch.randn(v.shape, generator=values, dtype=v.dtype) if v.is_floating_point() else v
                 for name, v in model.state_dict().items()}
        state.update({name: v.abs() + 0.1 for name, v in state.items() if name.endswith("running_var")})
        model.load_state_dict(state)
    elif change == "stride":
        conv.stride = (1, 1) if tuple(conv.stride) == (2, 2) else (2, 2)
    elif change == "approximation" and isinstance(model.act, nn.GELU):
        model.act.approximate = "tanh" if model.act.approximate == "none" else "none"
    elif change == "train":
        model.train()
        model.eval()
    elif change == "hook":
        conv.register_forward_hook(_scale_by_two)
    elif change == "batch-norm statistics" and isinstance(model.p, nn.BatchNorm2d):
        with torch.no_grad():
            model.p.running_mean.add_(0.5)
    elif change == "traced-through hook":
        model.scale.register_forward_hook(_scale_by_two)
    elif change == "gain":
        model.gain = 1.0 if model.gain != 1.0 else 2.0
    elif change == "offset":
        model.offset = torch.randn(1, generator=values, dtype=model.offset.dtype)
    elif change == "dict entry":
        model.shifts["shift"] += 0.5
    elif change == "config field":
        model.config.k = 1.0 if model.config.k != 1.0 else 3.0
    elif change == "nested config field":
        model.config.inner.j = 1.0 if model.config.inner.j != 1.0 else 0.5
    elif change == "function":
        model.fn = torch.tanh if model.fn is _unchanged else _unchanged


@pytest.mark.filterwarnings("ignore:fullfuse. no fusable conv pipeline")
@pytest.mark.filterwarnings("ignore:fullfuse. the model's")
@pytest.mark.parametrize("seed", range(6))
def test_changes_after_fusing(seed):
    global GAIN
    GAIN = 1.0
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for case in range(MODELS_PER_SEED):
        model = _Model(rng).eval()
        x = torch.randn(rng.choice((1, 2, 3)), model.cin, rng.randint(5, 12), rng.randint(5, 12))
        fused, shared = fullfuse.fused_model(model), True   # (shared: the fused model shares model's modules)
        changes = [rng.choice(CHANGES) for _ in range(CHANGES_PER_MODEL)]
        what = f"case {case} ({model.before}, {model.after}), changes {changes}"
        assert_same_answer(answer(model, x, torch.no_grad), answer(fused, x, torch.no_grad), what)
        for step, change in enumerate(changes):
            if change == "double":
                fused, x = fused.double(), x.double()   # (shared: the original's parameters converted too)
                if not shared:
                    model = model.double()
            elif change in ("deepcopy", "save and load"):
                copied = copy.deepcopy if change == "deepcopy" else saved_and_loaded
                fused, model, shared = copied(fused), copied(model), False
            elif change == "global":
                GAIN = 1.0 if GAIN != 1.0 else 0.5
            else:
                values = rng.randrange(1 << 30)
                _change(model, change, torch.Generator().manual_seed(values))
                if not shared:
                    _change(fused, change, torch.Generator().manual_seed(values))
            assert_same_answer(answer(model, x, torch.no_grad), answer(fused, x, torch.no_grad),
                               f"{what}, after step {step}")
