"""fullfuse.match: finding family A / family B regions in fx graphs (CPU only, fast)."""
import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

import fullfuse

from fullfuse.errors import FullfuseError, TraceError
from fullfuse.match import Match, find_matches
from fullfuse.trace import trace
from fullfuse.spec import ConvActPoolSpec, ConvTPoolReduceSpec


def matches_of(model):
    gm = trace(model)
    return gm, find_matches(gm)


def only_match(model) -> tuple:
    gm, ms = matches_of(model)
    assert len(ms) == 1, [m.description for m in ms]
    return gm, ms[0]


def node_named(gm, name):
    for n in gm.graph.nodes:
        if n.name == name:
            return n
    raise KeyError(name)


def check_region(gm, m: Match):
    """Structural invariants every match must satisfy."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    idx = [order[n] for n in m.nodes]
    assert idx == sorted(idx)
    assert m.output_node is m.nodes[-1]
    for n in m.nodes[:-1]:
        assert len(n.users) == 1
    assert m.input_node not in m.nodes


def A(dims=2, cin=3, cout=8, k=3, s=1, p=0, d=1, bias=True, act="gelu_erf", pool="mean", keepdim=True,
      groups=1, padding_mode="zeros", post="none"):
    t = lambda v: v if isinstance(v, tuple) else (v,) * dims  # noqa: E731
    return ConvActPoolSpec(dims=dims, in_channels=cin, out_channels=cout, kernel_size=t(k), stride=t(s),
                           padding=t(p), dilation=t(d), has_bias=bias, activation=act, pool=pool, keepdim=keepdim,
                           groups=groups, padding_mode=padding_mode, post=post)


def B(dims=3, cin=4, cout=6, k=3, s=2, p=1, op=1, d=1, bias=True, window=2, act="none", red="sum", keepdim=True,
      groups=1, padding_mode="zeros"):
    t = lambda v: v if isinstance(v, tuple) else (v,) * dims  # noqa: E731
    return ConvTPoolReduceSpec(dims=dims, in_channels=cin, out_channels=cout, kernel_size=t(k), stride=t(s),
                               padding=t(p), output_padding=t(op), dilation=t(d), has_bias=bias, window=t(window),
                               activation=act, reduction=red, keepdim=keepdim, groups=groups,
                               padding_mode=padding_mode)


# ----------------------------------------------------------------------------------------------------------------
# family A: activation kinds x pool kinds
# ----------------------------------------------------------------------------------------------------------------

# name -> (factory returning a module or a callable, activation code, description label or None)
ACTS = {
    "none": (None, "none", None),
    "GELU": (lambda: nn.GELU(), "gelu_erf", "gelu"),
    "GELU_tanh": (lambda: nn.GELU(approximate="tanh"), "gelu_tanh", "gelu(tanh)"),
    "ReLU": (lambda: nn.ReLU(), "relu", "relu"),
    "ReLU_inplace": (lambda: nn.ReLU(inplace=True), "relu", "relu"),
    "SiLU": (lambda: nn.SiLU(), "silu", "silu"),
    "SiLU_inplace": (lambda: nn.SiLU(inplace=True), "silu", "silu"),
    "F.gelu": (lambda: (lambda x: F.gelu(x)), "gelu_erf", "gelu"),
    "F.gelu_none": (lambda: (lambda x: F.gelu(x, approximate="none")), "gelu_erf", "gelu"),
    "F.gelu_tanh": (lambda: (lambda x: F.gelu(x, approximate="tanh")), "gelu_tanh", "gelu(tanh)"),
    "F.relu": (lambda: (lambda x: F.relu(x)), "relu", "relu"),
    "F.relu_inplace": (lambda: (lambda x: F.relu(x, inplace=True)), "relu", "relu"),
    "F.relu_": (lambda: (lambda x: F.relu_(x)), "relu", "relu"),
    "torch.relu": (lambda: (lambda x: torch.relu(x)), "relu", "relu"),
    "torch.relu_": (lambda: (lambda x: torch.relu_(x)), "relu", "relu"),
    "Tensor.relu": (lambda: (lambda x: x.relu()), "relu", "relu"),
    "Tensor.relu_": (lambda: (lambda x: x.relu_()), "relu", "relu"),
    "F.silu": (lambda: (lambda x: F.silu(x)), "silu", "silu"),
    "F.silu_inplace": (lambda: (lambda x: F.silu(x, inplace=True)), "silu", "silu"),
}

# name -> (factory(dims), pool code, keepdim, label(dims))
POOLS_A = {
    "AdaptiveAvgPool": (lambda n: [nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d][n - 2](1), "mean", True,
                        lambda n: f"adaptive_avg_pool{n}d(1)"),
    "AdaptiveAvgPool_tuple": (lambda n: [nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d][n - 2]((1,) * n), "mean", True,
                              lambda n: f"adaptive_avg_pool{n}d(1)"),
    "F.adaptive_avg_pool": (lambda n: (lambda x: [F.adaptive_avg_pool2d, F.adaptive_avg_pool3d][n - 2](x, 1)),
                            "mean", True, lambda n: f"adaptive_avg_pool{n}d(1)"),
    "F.adaptive_avg_pool_tuple": (
        lambda n: (lambda x: [F.adaptive_avg_pool2d, F.adaptive_avg_pool3d][n - 2](x, output_size=[1] * n)),
        "mean", True, lambda n: f"adaptive_avg_pool{n}d(1)"),
    "mean_tuple": (lambda n: (lambda x: x.mean(dim=tuple(range(2, n + 2)))), "mean", False,
                   lambda n: f"mean(dim={tuple(range(2, n + 2))})"),
    "mean_neg_keepdim": (lambda n: (lambda x: x.mean(tuple(range(-1, -n - 1, -1)), keepdim=True)), "mean", True,
                         lambda n: f"mean(dim={tuple(range(2, n + 2))}, keepdim=True)"),
    "mean_list": (lambda n: (lambda x: x.mean(list(range(2, n + 2)), False)), "mean", False,
                  lambda n: f"mean(dim={tuple(range(2, n + 2))})"),
    "torch.mean_keepdim": (lambda n: (lambda x: torch.mean(x, dim=tuple(range(2, n + 2)), keepdim=True)), "mean",
                           True, lambda n: f"mean(dim={tuple(range(2, n + 2))}, keepdim=True)"),
    "torch.mean_mixed_neg": (lambda n: (lambda x: torch.mean(x, (2,) + tuple(range(-n + 1, 0)))), "mean", False,
                             lambda n: f"mean(dim={tuple(range(2, n + 2))})"),
    "AdaptiveMaxPool": (lambda n: [nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d][n - 2](1), "max", True,
                        lambda n: f"adaptive_max_pool{n}d(1)"),
    "F.adaptive_max_pool": (lambda n: (lambda x: [F.adaptive_max_pool2d, F.adaptive_max_pool3d][n - 2](x, 1)),
                            "max", True, lambda n: f"adaptive_max_pool{n}d(1)"),
    "amax": (lambda n: (lambda x: x.amax(dim=tuple(range(2, n + 2)))), "max", False,
             lambda n: f"amax(dim={tuple(range(2, n + 2))})"),
    "amax_neg_keepdim": (lambda n: (lambda x: x.amax(dim=tuple(range(-n, 0)), keepdim=True)), "max", True,
                         lambda n: f"amax(dim={tuple(range(2, n + 2))}, keepdim=True)"),
    "torch.amax": (lambda n: (lambda x: torch.amax(x, tuple(range(2, n + 2)), False)), "max", False,
                   lambda n: f"amax(dim={tuple(range(2, n + 2))})"),
}


class Pipe(nn.Module):
    """conv (module) -> act -> pool, where act / pool are modules (registered) or plain callables."""

    def __init__(self, conv, act=None, pool=None, post=None):
        super().__init__()
        self.conv = conv
        self.act = act if isinstance(act, nn.Module) else None
        self._act_fn = None if isinstance(act, nn.Module) else act
        self.pool = pool if isinstance(pool, nn.Module) else None
        self._pool_fn = None if isinstance(pool, nn.Module) else pool
        self._post = post

    def forward(self, x):
        x = self.conv(x)
        if self.act is not None:
            x = self.act(x)
        elif self._act_fn is not None:
            x = self._act_fn(x)
        x = self.pool(x) if self.pool is not None else self._pool_fn(x)
        if self._post is not None:
            x = self._post(x)
        return x


def make(factory, *a):
    return None if factory is None else factory(*a)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("pool", list(POOLS_A))
def test_family_a_act_x_pool(act, pool):
    act_f, act_code, act_label = ACTS[act]
    pool_f, pool_code, keepdim, pool_label = POOLS_A[pool]
    model = Pipe(nn.Conv2d(3, 8, 3), make(act_f), pool_f(2))
    gm, m = only_match(model)
    check_region(gm, m)
    assert m.spec == A(act=act_code, pool=pool_code, keepdim=keepdim)
    assert m.spec.family == "A"
    assert len(m.nodes) == (2 if act == "none" else 3)
    assert m.input_node.op == "placeholder"
    assert m.conv_module == "conv" and m.weight is None and m.bias is None
    assert m.nodes[0].op == "call_module" and m.nodes[0].target == "conv"
    assert m.output_node is list(gm.graph.nodes)[-2]  # the node returned
    assert m.description == " -> ".join(x for x in ["Conv2d(conv)", act_label, pool_label(2)] if x)
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(gm(x.clone()), model(x.clone()))


@pytest.mark.parametrize("act", ["none", "GELU_tanh", "F.relu_inplace", "Tensor.relu", "SiLU"])
@pytest.mark.parametrize("pool", list(POOLS_A))
def test_family_a_conv3d(act, pool):
    act_f, act_code, act_label = ACTS[act]
    pool_f, pool_code, keepdim, pool_label = POOLS_A[pool]
    model = Pipe(nn.Conv3d(2, 5, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1), bias=False), make(act_f),
                 pool_f(3))
    gm, m = only_match(model)
    check_region(gm, m)
    assert m.spec == A(dims=3, cin=2, cout=5, k=(1, 3, 3), s=(1, 2, 2), p=(0, 1, 1), bias=False, act=act_code,
                       pool=pool_code, keepdim=keepdim)
    assert m.description == " -> ".join(x for x in ["Conv3d(conv)", act_label, pool_label(3)] if x)
    x = torch.randn(1, 2, 3, 8, 8)
    torch.testing.assert_close(gm(x.clone()), model(x.clone()))


# post op -> (the view the region absorbs (spec.POSTS) or None: left in the graph)
_POST_OPS = {
    "torch.flatten(y, 1)": (lambda y, m: torch.flatten(y, 1), "flatten"),
    "y.flatten(1)": (lambda y, m: y.flatten(1), "flatten"),
    "y.flatten(start_dim=1)": (lambda y, m: y.flatten(start_dim=1), "flatten"),
    "nn.Flatten()": (lambda y, m: m.flat(y), "flatten"),
    "y.squeeze()": (lambda y, m: y.squeeze(), "squeeze"),
    "torch.squeeze(y)": (lambda y, m: torch.squeeze(y), "squeeze"),
    "y.flatten()": (lambda y, m: y.flatten(), None),
    "nn.Flatten(0)": (lambda y, m: m.flat0(y), None),
    "y.squeeze(-1).squeeze(-1)": (lambda y, m: y.squeeze(-1).squeeze(-1), None),
    "y.squeeze(3)": (lambda y, m: y.squeeze(3), None),
    "y.view(N, -1)": (lambda y, m: y.view(y.size(0), -1), None),
}


@pytest.mark.parametrize("post", list(_POST_OPS))
@pytest.mark.parametrize("batch", [1, 2])
def test_family_a_view_after_the_pool(post, batch):
    """flatten(1) and squeeze() right after the pool join the region (one op less per call); other views stay in
    the graph.  The rewritten graph gives the model's own outputs, also for a batch of one, where squeeze() drops the
    batch dim too."""
    fn, absorbed = _POST_OPS[post]

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flat, self.flat0 = nn.Flatten(), nn.Flatten(0)

        def forward(self, x):
            return fn(self.pool(F.gelu(self.conv(x))), self)

    model = M().eval()
    gm, m = only_match(model)
    check_region(gm, m)
    assert m.spec == A(cout=16, p=1, post=absorbed or "none")
    assert [n.name for n in m.nodes[:3]] == ["conv", "gelu", "pool"]
    assert len(m.nodes) == (4 if absorbed else 3)
    label = {"flatten": " -> flatten(1)", "squeeze": " -> squeeze()", None: ""}[absorbed]
    assert m.description == "Conv2d(conv) -> gelu -> adaptive_avg_pool2d(1)" + label
    if not absorbed:   # the view after the pool is left in the graph, outside the region
        users = list(m.output_node.users)
        assert users and not set(users) & set(m.nodes)  # (view also reads y.size(0): the output may have 2 users)
    fused = fullfuse.fused_model(model, path="torch")
    x = torch.randn(batch, 3, 8, 8)
    with torch.no_grad():
        want = model(x)
        got = fused(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
        try:   # unbatched input: the view of the unbatched pool output, or the model's own error
            want = model(x[0])
        except IndexError:
            with pytest.raises(IndexError):
                fused(x[0])
            return
        assert fused(x[0]).shape == want.shape
        torch.testing.assert_close(fused(x[0]), want)


# ----------------------------------------------------------------------------------------------------------------
# family A: functional convs
# ----------------------------------------------------------------------------------------------------------------

class FConv(nn.Module):
    def __init__(self, dims=2, cin=3, cout=8, k=3, bias=True, groups=1, call=None, pool=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin // groups, *((k,) * dims)))
        self.bias = nn.Parameter(torch.randn(cout)) if bias else None
        self.call = call
        self.dims = dims
        self.pool = pool

    def forward(self, x):
        y = self.call(x, self.weight, self.bias)
        y = F.relu(y)
        if self.pool is not None:
            return self.pool(y)
        return y.mean(dim=tuple(range(2, self.dims + 2)))


@pytest.mark.parametrize("case", [
    ("F.conv2d_defaults", lambda x, w, b: F.conv2d(x, w, b), dict()),
    ("torch.conv2d_positional", lambda x, w, b: torch.conv2d(x, w, b, 2, 1, 1, 1), dict(s=2, p=1)),
    ("F.conv2d_kwargs", lambda x, w, b: F.conv2d(x, w, bias=b, stride=(2, 1), padding=[1, 0], dilation=(1, 2)),
     dict(s=(2, 1), p=(1, 0), d=(1, 2))),
    ("F.conv2d_valid", lambda x, w, b: F.conv2d(x, w, b, padding="valid"), dict(p=0)),
    ("F.conv2d_same", lambda x, w, b: F.conv2d(x, w, b, padding="same"), dict(p=1)),
    ("F.conv2d_same_dil", lambda x, w, b: F.conv2d(x, w, b, padding="same", dilation=2), dict(p=2, d=2)),
    ("F.conv2d_len1", lambda x, w, b: F.conv2d(x, w, b, stride=[2], padding=(1,)), dict(s=2, p=1)),
])
def test_family_a_functional_conv(case):
    name, call, kw = case
    gm, m = only_match(FConv(call=call))
    check_region(gm, m)
    assert m.spec == A(act="relu", pool="mean", keepdim=False, **kw)
    assert m.conv_module is None
    assert m.weight.op == "get_attr" and m.weight.target == "weight"
    assert m.bias.op == "get_attr" and m.bias.target == "bias"
    assert m.description == "conv2d -> relu -> mean(dim=(2, 3))"
    assert len(m.nodes) == 3


def test_family_a_functional_conv_no_bias_and_conv3d():
    gm, m = only_match(FConv(dims=3, cin=2, cout=4, k=1, bias=False, call=lambda x, w, b: F.conv3d(x, w, b)))
    assert m.spec == A(dims=3, cin=2, cout=4, k=1, bias=False, act="relu", pool="mean", keepdim=False)
    assert m.bias is None and m.weight.target == "weight"
    assert m.description == "conv3d -> relu -> mean(dim=(2, 3, 4))"


def test_family_a_functional_conv_groups_recorded():
    gm, m = only_match(FConv(cin=4, cout=8, groups=2, call=lambda x, w, b: F.conv2d(x, w, b, groups=2)))
    assert m.spec == A(cin=4, cout=8, act="relu", pool="mean", keepdim=False, groups=2)
    assert m.description == "conv2d(groups=2) -> relu -> mean(dim=(2, 3))"


def test_family_a_functional_weight_of_submodule():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 6, 3)

        def forward(self, x):
            return F.adaptive_max_pool2d(F.conv2d(x, self.stem.weight, self.stem.bias, 1, 1), 1)

    gm, m = only_match(M())
    assert m.spec == A(cin=3, cout=6, p=1, act="none", pool="max")
    assert m.weight.target == "stem.weight" and m.bias.target == "stem.bias"
    assert m.description == "conv2d -> adaptive_max_pool2d(1)"


class PlaceholderWeight(nn.Module):
    def forward(self, x, w, b):
        return F.gelu(F.conv2d(x, w, b)).mean((2, 3))


def test_family_a_placeholder_weight_without_shape_is_not_matched():
    _, ms = matches_of(PlaceholderWeight())
    assert ms == []


def test_family_a_placeholder_weight_with_shape_metadata():
    gm = trace(PlaceholderWeight())
    ShapeProp(gm).propagate(torch.randn(1, 3, 8, 8), torch.randn(5, 3, 3, 3), torch.randn(5))
    (m,) = find_matches(gm)
    assert m.spec == A(cin=3, cout=5, act="gelu_erf", pool="mean", keepdim=False)
    assert m.weight.op == "placeholder" and m.weight.target == "w"
    assert m.bias.op == "placeholder" and m.bias.target == "b"


# ----------------------------------------------------------------------------------------------------------------
# family A: padding strings, groups, padding_mode
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pad,kw,expected", [
    ("valid", dict(kernel_size=3), dict(p=0)),
    ("same", dict(kernel_size=3), dict(p=1)),
    ("same", dict(kernel_size=5, dilation=2), dict(k=5, d=2, p=4)),
    ("same", dict(kernel_size=(1, 3)), dict(k=(1, 3), p=(0, 1))),
    ("same", dict(kernel_size=2, dilation=2), dict(k=2, d=2, p=1)),
])
def test_family_a_string_padding(pad, kw, expected):
    gm, m = only_match(Pipe(nn.Conv2d(3, 8, padding=pad, **kw), nn.ReLU(), nn.AdaptiveAvgPool2d(1)))
    assert m.spec == A(act="relu", **expected)


def test_family_a_same_padding_asymmetric_is_not_matched():
    _, ms = matches_of(Pipe(nn.Conv2d(3, 8, 2, padding="same"), nn.ReLU(), nn.AdaptiveAvgPool2d(1)))
    assert ms == []


def test_family_a_groups_and_padding_mode_recorded():
    conv = nn.Conv2d(4, 8, 3, padding=1, groups=4, padding_mode="reflect", bias=False)
    gm, m = only_match(Pipe(conv, nn.SiLU(), lambda x: x.amax((2, 3), keepdim=True)))
    assert m.spec == A(cin=4, cout=8, p=1, bias=False, act="silu", pool="max", keepdim=True, groups=4,
                       padding_mode="reflect")
    assert m.description == "Conv2d(conv, groups=4, padding_mode='reflect') -> silu -> amax(dim=(2, 3), keepdim=True)"


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_family_a_padding_modes_conv3d(mode):
    conv = nn.Conv3d(2, 3, 3, padding=1, padding_mode=mode)
    gm, m = only_match(Pipe(conv, None, nn.AdaptiveAvgPool3d(1)))
    assert m.spec == A(dims=3, cin=2, cout=3, p=1, act="none", padding_mode=mode)


# ----------------------------------------------------------------------------------------------------------------
# patterns inside larger models
# ----------------------------------------------------------------------------------------------------------------

class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 1))
        self.head_conv = nn.Conv2d(16, 32, 1)
        self.act = nn.GELU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = x + self.block(x)
        x = self.pool(self.act(self.head_conv(x)))
        return self.fc(x.flatten(1))


def test_backbone_with_layers_before_and_after():
    model = Backbone().eval()
    gm, m = only_match(model)
    check_region(gm, m)
    assert m.spec == A(cin=16, cout=32, k=1, act="gelu_erf", post="flatten")
    assert m.conv_module == "head_conv"
    assert m.input_node.name == "add"
    assert [n.target for n in m.nodes] == ["head_conv", "act", "pool", "flatten"]
    assert m.spec.post == "flatten"
    assert m.description == "Conv2d(head_conv) -> gelu -> adaptive_avg_pool2d(1) -> flatten(1)"
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(gm(x), model(x))


class TwoHeads(nn.Module):
    """One family A head and one family B head, plus an unrelated conv."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Conv3d(2, 4, 3, padding=1)
        self.cls_conv = nn.Conv3d(4, 8, 1)
        self.up = nn.ConvTranspose3d(4, 6, 2, stride=2)
        self.mp1 = nn.MaxPool3d(2)
        self.mp2 = nn.MaxPool3d(kernel_size=(1, 3, 3), stride=(1, 3, 3))

    def forward(self, x):
        t = F.relu(self.trunk(x))
        cls = F.silu(self.cls_conv(t)).mean(dim=(-3, -2, -1))
        seg = self.mp2(self.mp1(self.up(t))).sum(dim=1, keepdim=True)
        return cls, seg


def test_two_patterns_in_one_model_in_graph_order():
    gm, ms = matches_of(TwoHeads())
    assert [type(m.spec).__name__ for m in ms] == ["ConvActPoolSpec", "ConvTPoolReduceSpec"]
    a, b = ms
    for m in ms:
        check_region(gm, m)
    assert a.spec == A(dims=3, cin=4, cout=8, k=1, act="silu", pool="mean", keepdim=False)
    assert b.spec == B(dims=3, cin=4, cout=6, k=2, s=2, p=0, op=0, window=(2, 6, 6), red="sum", keepdim=True)
    assert a.input_node is b.input_node  # both read the trunk's output; that's fine, the input is not in a region
    assert a.description == "Conv3d(cls_conv) -> silu -> mean(dim=(2, 3, 4))"
    assert b.description == "ConvTranspose3d(up) -> max_pool3d(2) -> max_pool3d((1, 3, 3)) -> sum(dim=1, keepdim=True)"
    assert len(a.nodes) == 3 and len(b.nodes) == 4
    assert not set(a.nodes) & set(b.nodes)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    assert order[a.nodes[0]] < order[b.nodes[0]]


def test_nested_submodule():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Module()
            self.block.conv = nn.Conv2d(8, 4, 3, stride=2)
            self.block.pool = nn.AdaptiveMaxPool2d((1, 1))

        def forward(self, x):
            return self.block.pool(torch.relu(self.block.conv(x))).squeeze()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Conv2d(3, 8, 1)
            self.head = Head()

        def forward(self, x):
            return self.head(self.pre(x))

    gm, m = only_match(Net())
    assert m.conv_module == "head.block.conv"
    assert m.spec == A(cin=8, cout=4, s=2, act="relu", pool="max", post="squeeze")
    assert m.input_node.target == "pre"
    assert m.description == "Conv2d(head.block.conv) -> relu -> adaptive_max_pool2d(1) -> squeeze()"


def test_sequential():
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.ReLU(), nn.Conv2d(3, 8, 3, padding=1), nn.GELU("tanh"),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    gm, m = only_match(model)
    assert m.conv_module == "2"
    assert [n.target for n in m.nodes] == ["2", "3", "4", "5"]
    assert m.spec == A(cin=3, cout=8, p=1, act="gelu_tanh", post="flatten")
    assert m.description == "Conv2d(2) -> gelu(tanh) -> adaptive_avg_pool2d(1) -> flatten(1)"


def test_same_conv_module_called_twice_gives_two_matches():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x, y):
            return F.adaptive_avg_pool2d(self.conv(x), 1), self.conv(y).amax((2, 3))

    gm, ms = matches_of(M())
    assert [m.spec for m in ms] == [A(cout=4, act="none"), A(cout=4, act="none", pool="max", keepdim=False)]
    assert [m.input_node.target for m in ms] == ["x", "y"]
    assert [m.conv_module for m in ms] == ["conv", "conv"]


def test_chained_regions_do_not_overlap():
    # B's output (N, 1, D', H', W') feeds the conv of an A region: two regions, disjoint, in order
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose3d(2, 4, 2, stride=2)
            self.conv = nn.Conv3d(1, 3, 1)

        def forward(self, x):
            y = F.max_pool3d(self.up(x), 2).amax(1, keepdim=True)
            return F.adaptive_avg_pool3d(self.conv(y), 1)

    gm, ms = matches_of(M())
    assert [m.spec.family for m in ms] == ["B", "A"]
    assert ms[1].input_node is ms[0].output_node
    assert not set(ms[0].nodes) & set(ms[1].nodes)


# ----------------------------------------------------------------------------------------------------------------
# family B
# ----------------------------------------------------------------------------------------------------------------

class BPipe(nn.Module):
    def __init__(self, conv, act=None, pools=(), reduce=None):
        super().__init__()
        self.conv = conv
        self.act = act if isinstance(act, nn.Module) else None
        self._act_fn = None if isinstance(act, nn.Module) else act
        self.pools = nn.ModuleList([p for p in pools if isinstance(p, nn.Module)])
        self._pools = list(pools)
        self._reduce = reduce

    def forward(self, x):
        x = self.conv(x)
        if self.act is not None:
            x = self.act(x)
        elif self._act_fn is not None:
            x = self._act_fn(x)
        i = 0
        for p in self._pools:
            if isinstance(p, nn.Module):
                x = self.pools[i](x)
                i += 1
            else:
                x = p(x)
        return self._reduce(x)


def convT3():
    return nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1)


REDUCTIONS_B = {
    "sum": (lambda x: x.sum(1), "sum", False, "sum(dim=1)"),
    "sum_keepdim": (lambda x: x.sum(dim=1, keepdim=True), "sum", True, "sum(dim=1, keepdim=True)"),
    "torch.sum_pos": (lambda x: torch.sum(x, 1, True), "sum", True, "sum(dim=1, keepdim=True)"),
    "sum_tuple": (lambda x: x.sum(dim=(1,)), "sum", False, "sum(dim=1)"),
    "sum_neg": (lambda x: x.sum(-4, keepdim=True), "sum", True, "sum(dim=1, keepdim=True)"),
    "mean": (lambda x: x.mean(1), "mean", False, "mean(dim=1)"),
    "torch.mean_neg_tuple": (lambda x: torch.mean(x, dim=(-4,), keepdim=False), "mean", False, "mean(dim=1)"),
    "amax": (lambda x: x.amax(1), "max", False, "amax(dim=1)"),
    "amax_keepdim": (lambda x: x.amax(dim=1, keepdim=True), "max", True, "amax(dim=1, keepdim=True)"),
    "torch.amax": (lambda x: torch.amax(x, dim=1), "max", False, "amax(dim=1)"),
    "torch.amax_neg": (lambda x: torch.amax(x, -4, True), "max", True, "amax(dim=1, keepdim=True)"),
}


@pytest.mark.parametrize("red", list(REDUCTIONS_B))
def test_family_b_reductions(red):
    fn, code, keepdim, label = REDUCTIONS_B[red]
    model = BPipe(convT3(), None, [nn.MaxPool3d(2)], fn)
    gm, m = only_match(model)
    check_region(gm, m)
    assert m.spec == B(red=code, keepdim=keepdim, window=2)
    assert m.spec.family == "B"
    assert len(m.nodes) == 3
    assert m.description == f"ConvTranspose3d(conv) -> max_pool3d(2) -> {label}"
    x = torch.randn(1, 4, 4, 6, 6)
    torch.testing.assert_close(gm(x), model(x))


@pytest.mark.parametrize("act", ["none", "GELU", "GELU_tanh", "ReLU_inplace", "F.silu", "Tensor.relu_", "F.gelu_tanh"])
def test_family_b_activations(act):
    act_f, code, label = ACTS[act]
    gm, m = only_match(BPipe(convT3(), make(act_f), [lambda x: F.max_pool3d(x, 2)], lambda x: x.sum(1)))
    assert m.spec == B(act=code, keepdim=False)
    assert len(m.nodes) == (3 if act == "none" else 4)
    assert m.description == " -> ".join(
        x for x in ["ConvTranspose3d(conv)", label, "max_pool3d(2)", "sum(dim=1)"] if x)


POOL_CHAINS = {
    "one_module": ([lambda: nn.MaxPool3d(2)], (2, 2, 2), ["max_pool3d(2)"]),
    "one_F_kw": ([lambda: (lambda x: F.max_pool3d(x, kernel_size=(1, 2, 2), stride=(1, 2, 2)))], (1, 2, 2),
                 ["max_pool3d((1, 2, 2))"]),
    "one_F_explicit_defaults": (
        [lambda: (lambda x: F.max_pool3d(x, 3, 3, 0, 1, False, False))], (3, 3, 3), ["max_pool3d(3)"]),
    "one_torch_builtin": ([lambda: (lambda x: torch.max_pool3d(x, [2, 2, 2]))], (2, 2, 2), ["max_pool3d(2)"]),
    "two_2_then_3": ([lambda: nn.MaxPool3d(2), lambda: nn.MaxPool3d(3, stride=3)], (6, 6, 6),
                     ["max_pool3d(2)", "max_pool3d(3)"]),
    "two_122_then_2": ([lambda: nn.MaxPool3d((1, 2, 2)), lambda: (lambda x: F.max_pool3d(x, 2))], (2, 4, 4),
                       ["max_pool3d((1, 2, 2))", "max_pool3d(2)"]),
    "three": ([lambda: nn.MaxPool3d(2), lambda: (lambda x: F.max_pool3d(x, (1, 2, 1), (1, 2, 1))),
               lambda: nn.MaxPool3d((2, 1, 1), padding=0, dilation=1)], (4, 4, 2),
              ["max_pool3d(2)", "max_pool3d((1, 2, 1))", "max_pool3d((2, 1, 1))"]),
}


@pytest.mark.parametrize("chain", list(POOL_CHAINS))
@pytest.mark.parametrize("act", ["none", "ReLU"])
def test_family_b_pool_chains(chain, act):
    factories, window, labels = POOL_CHAINS[chain]
    act_f, code, act_label = ACTS[act]
    model = BPipe(nn.ConvTranspose3d(4, 6, 2, stride=2), make(act_f), [f() for f in factories],
                  lambda x: x.mean(dim=1, keepdim=True))
    gm, m = only_match(model)
    check_region(gm, m)
    assert m.spec == B(k=2, s=2, p=0, op=0, window=window, act=code, red="mean", keepdim=True)
    assert len(m.nodes) == 1 + (act != "none") + len(factories) + 1
    assert m.description == " -> ".join(
        x for x in ["ConvTranspose3d(conv)", act_label, *labels, "mean(dim=1, keepdim=True)"] if x)
    x = torch.randn(1, 4, 6, 6, 6)
    torch.testing.assert_close(gm(x), model(x))


def test_family_b_conv_transpose2d_maxpool2d():
    model = BPipe(nn.ConvTranspose2d(3, 5, 4, stride=2, padding=1, bias=False), nn.GELU(),
                  [nn.MaxPool2d(2), lambda x: F.max_pool2d(x, (3, 1))], lambda x: x.sum(-3))
    gm, m = only_match(model)
    assert m.spec == B(dims=2, cin=3, cout=5, k=4, s=2, p=1, op=0, bias=False, window=(6, 2), act="gelu_erf",
                       red="sum", keepdim=False)
    assert m.description == "ConvTranspose2d(conv) -> gelu -> max_pool2d(2) -> max_pool2d((3, 1)) -> sum(dim=1)"
    x = torch.randn(2, 3, 7, 7)
    torch.testing.assert_close(gm(x), model(x))


@pytest.mark.parametrize("dims", [2, 3])
def test_family_b_functional_conv_transpose(dims):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            # conv_transpose weight: (in, out // groups, k...)
            self.w = nn.Parameter(torch.randn(4, 3, *((3,) * dims)))
            self.b = nn.Parameter(torch.randn(6))

        def forward(self, x):
            f = F.conv_transpose2d if dims == 2 else F.conv_transpose3d
            mp = F.max_pool2d if dims == 2 else F.max_pool3d
            y = f(x, self.w, self.b, stride=2, padding=1, output_padding=1, groups=2, dilation=1)
            return torch.amax(mp(F.relu(y), 2), dim=1)

    gm, m = only_match(M())
    assert m.spec == B(dims=dims, cin=4, cout=6, groups=2, window=2, act="relu", red="max", keepdim=False)
    assert m.conv_module is None and m.weight.target == "w" and m.bias.target == "b"
    assert m.description == (f"conv_transpose{dims}d(groups=2) -> relu -> max_pool{dims}d(2) -> amax(dim=1)")


def test_family_b_functional_conv_transpose_positional_dilation():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(2, 3, 3, 3, 3))

        def forward(self, x):
            # positional order: input, weight, bias, stride, padding, output_padding, groups, dilation
            y = torch.conv_transpose3d(x, self.w, None, 1, 0, 0, 1, 2)
            return F.max_pool3d(y, 2).sum(1)

    gm, m = only_match(M())
    assert m.spec == B(cin=2, cout=3, s=1, p=0, op=0, d=2, bias=False, keepdim=False)
    assert m.bias is None


def test_family_b_groups_recorded():
    conv = nn.ConvTranspose3d(4, 8, 2, stride=2, groups=4)
    gm, m = only_match(BPipe(conv, None, [nn.MaxPool3d(2)], lambda x: x.sum(1)))
    assert m.spec == B(cin=4, cout=8, k=2, s=2, p=0, op=0, groups=4, keepdim=False)
    assert m.description == "ConvTranspose3d(conv, groups=4) -> max_pool3d(2) -> sum(dim=1)"


# ----------------------------------------------------------------------------------------------------------------
# non-matches
# ----------------------------------------------------------------------------------------------------------------

def _b(pools, reduce=lambda x: x.sum(1), act=None):
    return BPipe(nn.ConvTranspose3d(4, 6, 2, stride=2), act, pools, reduce)


NON_MATCHES = {
    # family B pool rules
    "pool_padding": lambda: _b([nn.MaxPool3d(2, padding=1)]),
    "pool_overlapping": lambda: _b([nn.MaxPool3d(3, stride=2)]),
    "pool_stride_1": lambda: _b([lambda x: F.max_pool3d(x, 2, 1)]),
    "pool_ceil_mode": lambda: _b([nn.MaxPool3d(2, ceil_mode=True)]),
    "pool_dilation": lambda: _b([nn.MaxPool3d(2, dilation=2)]),
    "pool_return_indices": lambda: _b([lambda x: F.max_pool3d(x, 2, return_indices=True)[0]]),
    "bad_pool_ends_chain": lambda: _b([nn.MaxPool3d(2), nn.MaxPool3d(3, stride=2)]),
    "bad_first_pool": lambda: _b([nn.MaxPool3d(2, ceil_mode=True), nn.MaxPool3d(2)]),
    "no_pool": lambda: _b([]),
    "pool2d_after_convT3d": lambda: BPipe(nn.ConvTranspose2d(4, 6, 2, stride=2), None,
                                          [lambda x: F.max_pool3d(x, 2)], lambda x: x.sum(1)),
    "avg_pool_in_chain": lambda: _b([nn.AvgPool3d(2)]),
    "reduce_dim2": lambda: _b([nn.MaxPool3d(2)], lambda x: x.sum(2)),
    "reduce_dims_1_2": lambda: _b([nn.MaxPool3d(2)], lambda x: x.sum((1, 2))),
    "reduce_neg_wrong": lambda: _b([nn.MaxPool3d(2)], lambda x: x.sum(-1)),
    "reduce_all": lambda: _b([nn.MaxPool3d(2)], lambda x: x.sum()),
    "reduce_dtype": lambda: _b([nn.MaxPool3d(2)], lambda x: x.sum(1, dtype=torch.float64)),
    "reduce_max_tuple": lambda: _b([nn.MaxPool3d(2)], lambda x: x.max(1)[0]),
    "reduce_then_other_op_between": lambda: _b([nn.MaxPool3d(2)], lambda x: (x * 2).sum(1)),
    "pool_output_used_twice": lambda: _b([nn.MaxPool3d(2)], lambda x: x.sum(1) + x.mean()),
    "conv_output_used_twice_B": lambda: _Twice(nn.ConvTranspose3d(4, 6, 2, stride=2),
                                               lambda y: F.max_pool3d(y, 2).sum(1)),
    "unsupported_activation_B": lambda: _b([nn.MaxPool3d(2)], act=nn.Sigmoid()),
    "convT_output_size": lambda: _ConvTOutputSize(),
    "convT_global_pool": lambda: BPipe(nn.ConvTranspose2d(4, 6, 2, stride=2), None, [],
                                       lambda x: x.mean((2, 3))),
    # family A pool rules
    "mean_one_spatial_dim": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), lambda x: x.mean(2)),
    "mean_channel_and_spatial": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), lambda x: x.mean((1, 2, 3))),
    "mean_two_of_three_dims": lambda: Pipe(nn.Conv3d(3, 4, 3), nn.ReLU(), lambda x: x.mean((3, 4))),
    "mean_all": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), lambda x: x.mean()),
    "sum_spatial": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), lambda x: x.sum((2, 3))),
    "adaptive_avg_to_2": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(2)),
    "adaptive_avg_to_1x2": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), lambda x: F.adaptive_avg_pool2d(x, (1, 2))),
    "adaptive_avg_None": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d((1, None))),
    "adaptive_max_return_indices": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(),
                                                lambda x: F.adaptive_max_pool2d(x, 1, return_indices=True)[0]),
    "avg_pool_not_global": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AvgPool2d(2)),
    "pool3d_after_conv2d": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), lambda x: F.adaptive_avg_pool3d(x, 1)),
    "unsupported_activation_A": lambda: Pipe(nn.Conv2d(3, 4, 3), nn.Tanh(), nn.AdaptiveAvgPool2d(1)),
    "two_activations": lambda: Pipe(nn.Conv2d(3, 4, 3), lambda x: F.relu(F.gelu(x)), nn.AdaptiveAvgPool2d(1)),
    "conv_output_used_twice_A": lambda: _Twice(nn.Conv2d(3, 4, 3), lambda y: F.adaptive_avg_pool2d(y, 1)),
    "act_output_used_twice_A": lambda: _ActTwice(),
    "conv1d": lambda: Pipe(nn.Conv1d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool1d(1)),
    "same_asymmetric": lambda: Pipe(nn.Conv2d(3, 4, 4, padding="same"), None, nn.AdaptiveAvgPool2d(1)),
    # functional conv argument rules
    "F_conv_node_stride": lambda: _FConvNodeStride(),
    "F_conv_computed_weight": lambda: _FConvComputedWeight(),
    "F_conv_same_even_kernel": lambda: FConv(k=2, call=lambda x, w, b: F.conv2d(x, w, b, padding="same")),
    # modules that must not be replaced
    "conv_with_forward_hook": lambda: _hooked(),
    "conv_subclass_overriding_forward": lambda: Pipe(_MyConv(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1)),
    "relu_subclass_overriding_forward": lambda: Pipe(nn.Conv2d(3, 4, 3), _MyReLU(), nn.AdaptiveAvgPool2d(1)),
    "lazy_conv": lambda: Pipe(nn.LazyConv2d(4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1)),
}


class _Twice(nn.Module):
    def __init__(self, conv, tail):
        super().__init__()
        self.conv = conv
        self.tail = tail

    def forward(self, x):
        y = self.conv(x)
        return self.tail(y), y


class _ActTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = F.gelu(self.conv(x))
        return y.mean((2, 3)), y.amax((2, 3))


class _ConvTOutputSize(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1)

    def forward(self, x):
        return F.max_pool3d(self.up(x, output_size=[8, 8, 8]), 2).sum(1)


class _FConvNodeStride(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x):
        return F.conv2d(x, self.w, None, x.dim() - 3).mean((2, 3))


class _FConvComputedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x):
        return F.conv2d(x, self.w * 2).mean((2, 3))


class _MyConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


class _MyReLU(nn.ReLU):
    def forward(self, x):
        return super().forward(x) - 1


def _hooked():
    m = Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
    m.conv.register_forward_hook(lambda mod, inp, out: out * 2)
    return m


class _TracerWithCustomLeaves(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, (_MyConv, _MyReLU)) or super().is_leaf_module(m, qualname)


@pytest.mark.parametrize("case", list(NON_MATCHES))
def test_non_matches(case):
    model = NON_MATCHES[case]()
    if case in ("conv_subclass_overriding_forward", "relu_subclass_overriding_forward"):
        # traced as leaves (as a custom tracer might): the module is not a plain ConvNd / ReLU
        gm = torch.fx.GraphModule(model, _TracerWithCustomLeaves().trace(model))
    elif case == "F_conv_node_stride" and torch.__version__ < "2.5":   # (TorchVersion compares as a version)
        pytest.skip("torch < 2.5: fx cannot trace an F.conv2d given a traced stride (no match either way)")
    else:
        gm = trace(model)
    assert find_matches(gm) == []


def test_subclass_traced_through_matches_as_functional():
    # with the default tracer a user subclass is traced into; its F.conv2d is then matched as a functional conv
    class MyConv(nn.Conv2d):
        pass

    model = Pipe(MyConv(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
    gm = trace(model)
    (m,) = find_matches(gm)
    assert m.spec == A(cout=4, p=1, act="relu")
    assert m.conv_module is None and m.weight.target == "conv.weight"


def test_intermediate_used_twice_leaves_model_untouched_but_other_region_matches():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3)
            self.c2 = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            a = F.relu(self.c1(x))
            pa = a.mean((2, 3))
            b = F.relu(self.c2(x)).mean((2, 3))
            return pa + a.sum(), b

    gm, ms = matches_of(M())
    assert [m.conv_module for m in ms] == ["c2"]


# ----------------------------------------------------------------------------------------------------------------
# tracing
# ----------------------------------------------------------------------------------------------------------------

class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.conv(x).mean((2, 3))
        return x.mean((2, 3))


def test_untraceable_model_raises_trace_error():
    with pytest.raises(TraceError) as ei:
        trace(DataDependent())
    err = ei.value
    assert isinstance(err, RuntimeError) and isinstance(err, FullfuseError)
    msg = str(err)
    assert "DataDependent" in msg
    assert "control flow" in msg  # fx's own reason is carried over
    assert "torch.fx.wrap" in msg and "submodule" in msg
    assert err.__cause__ is not None


def test_trace_returns_graph_module_and_accepts_one():
    model = Backbone()
    gm = trace(model)
    assert isinstance(gm, torch.fx.GraphModule)
    assert gm.head_conv.weight is model.head_conv.weight  # parameters are shared, not copied
    gm2 = trace(gm)  # a GraphModule is retraced into a new one: rewriting it leaves the caller's graph alone
    assert isinstance(gm2, torch.fx.GraphModule) and gm2 is not gm and gm2.graph is not gm.graph
    assert [m.spec for m in find_matches(gm2)] == [m.spec for m in find_matches(gm)]


def test_traceable_submodule_of_untraceable_model():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = Pipe(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1))

        def forward(self, x):
            if x.sum() > 0:
                return self.head(x)
            return self.head(-x)

    with pytest.raises(TraceError):
        trace(Outer())
    gm, m = only_match(Outer().head)
    assert m.spec == A(cout=4, act="relu")


@pytest.mark.parametrize("spec", [
    ConvActPoolSpec(2, 8, 64, (3, 3), (1, 1), (0, 0), (1, 1), True),
    ConvTPoolReduceSpec(3, 32, 64, (5, 5, 5), (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1), True, (6, 6, 6)),
], ids=["A", "B"])
def test_spec_hash_is_the_fields_and_survives_pickling(spec):
    """Specs key the per-call decisions: equal specs hash equal (the hash is kept once worked out), a changed field
    changes it, and a pickled spec works its hash out again (string hashes differ between processes)."""
    import dataclasses
    import pickle
    twin = dataclasses.replace(spec)
    assert twin == spec and hash(twin) == hash(spec) and {spec: 1}[twin] == 1
    other = dataclasses.replace(spec, keepdim=False)
    assert other != spec and hash(other) != hash(spec)
    hash(spec)
    loaded = pickle.loads(pickle.dumps(spec))
    assert "_hash" not in loaded.__dict__ and loaded == spec and hash(loaded) == hash(spec)
