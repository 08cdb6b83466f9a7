"""Random models of both families on the CPU (where every region runs PyTorch's ops): ``fused_model(model)(x)`` is
``model(x)`` bit for bit — shape, dtype and requires_grad too — and an input the model rejects gets the same error
type.
Drawn per case: conv dims, channels, kernel, stride, padding (also 'same' / 'valid'), padding mode, bias, groups,
dilation / output padding, the activation (module or none), the pool or reduction and its keepdim, the post view, the
dtype (float32, float64), the input's batch (empty too), layout (contiguous, channels_last, a channel slice, unbatched)
and the mode (grad, no_grad, inference_mode, the CPU's bfloat16 autocast)."""
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullfuse
from same_answer import answer, assert_same_answer

CASES_PER_SEED = 40
ACTIVATIONS = (nn.GELU, lambda: nn.GELU(approximate="tanh"), nn.ReLU, nn.SiLU, nn.Identity)


class ConvActPool(nn.Module):
    def __init__(self, dims, cin, cout, kernel, stride, padding, dilation, activation, pool, post, padding_mode="zeros",
                 bias=True, groups=1):
        super().__init__()
        self.conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1](cin, cout, kernel, stride=stride, padding=padding,
                                                                dilation=dilation, padding_mode=padding_mode,
                                                                bias=bias, groups=groups)
        self.act = activation()
        self.dims, self.pool, self.post = dims, pool, post

    def forward(self, x):
        y = self.act(self.conv(x))
        space = tuple(range(-self.dims, 0))
        if self.pool == "avg":
            y = (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d)[self.dims - 1](y, 1)
        elif self.pool == "max":
            y = (F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d)[self.dims - 1](y, 1)
        elif self.pool == "mean":
            y = y.mean(dim=space, keepdim=True)
        else:
            y = torch.amax(y, dim=space)
        if self.post == "squeeze":
            return y.squeeze()
        return y.flatten(1) if self.post == "flatten" else y


class ConvTPoolReduce(nn.Module):
    def __init__(self, cin, cout, kernel, stride, padding, output_padding, window, second_window, activation,
                 reduction, keepdim):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(cin, cout, kernel, stride=stride, padding=padding,
                                                 output_padding=output_padding)
        self.act = activation()
        self.pool1 = nn.MaxPool3d(window)
        self.pool2 = nn.MaxPool3d(second_window) if second_window else nn.Identity()
        self.reduction, self.keepdim = reduction, keepdim

    def forward(self, x):
        y = self.pool2(self.pool1(self.act(self.conv_transpose(x))))
        if self.reduction == "sum":
            return torch.sum(y, dim=1, keepdim=self.keepdim)
        if self.reduction == "mean":
            return y.mean(dim=1, keepdim=self.keepdim)
        return torch.amax(y, dim=1, keepdim=self.keepdim)


def _family_a(rng):
    dims, kernel, dilation = rng.choice((1, 2, 2, 2, 3)), rng.choice((1, 2, 3, 5)), rng.choice((1, 1, 2))
    stride = rng.choice((1, 1, 2, 3))
    # string padding ('same' only unstrided, as PyTorch takes it; an even kernel's 'same' pads one side more), padding
    # modes other than zeros, no bias, groups: each in some cases
    padding = rng.choice((0, 1, 2, "valid") + (("same",) * 2 if stride == 1 else ()))
    cin, cout = rng.choice((1, 3, 4, 8)), rng.choice((1, 7, 16, 64))
    groups = rng.choice((1,) * 5 + tuple(g for g in (2, 4) if cin % g == 0 and cout % g == 0))
    model = ConvActPool(dims, cin, cout, kernel, stride, padding, dilation, rng.choice(ACTIVATIONS),
                        rng.choice(("avg", "max", "mean", "amax")), rng.choice(("squeeze", "flatten", None)),
                        rng.choice(("zeros",) * 4 + ("reflect", "replicate", "circular")), rng.random() < 0.8, groups)
    pads = {0: 0, 1: 1, 2: 2, "valid": 0, "same": dilation * (kernel - 1) // 2}[padding]
    least = max(1, dilation * (kernel - 1) + 1 - 2 * pads)
    return model, (rng.choice((0, 1, 2, 3)), model.conv.in_channels, *[rng.randint(least, 12) for _ in range(dims)])


def _family_b(rng):
    kernel, stride = rng.choice((1, 2, 3, 5)), rng.choice((1, 2, 3))
    model = ConvTPoolReduce(rng.choice((1, 4, 8)), rng.choice((1, 5, 16)), kernel, stride,
                            min(rng.choice((0, 1, 2)), kernel - 1), rng.choice((0, 1)) if stride > 1 else 0,
                            rng.choice((1, 2, 3)), rng.choice((0, 2, 3)), rng.choice(ACTIVATIONS),
                            rng.choice(("sum", "mean", "amax")), rng.choice((True, False)))
    return model, (rng.choice((0, 1, 2)), model.conv_transpose.in_channels, *[rng.randint(2, 6) for _ in range(3)])


def _input(rng, shape, dtype):
    x = torch.randn(shape, dtype=dtype)
    layout = rng.choice(("contiguous", "channels_last", "slice", "unbatched"))
    if layout == "channels_last" and x.dim() in (4, 5):
        return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    if layout == "slice":
        return torch.cat([x, x], dim=1)[:, ::2]
    if layout == "unbatched" and shape[0] >= 1:
        return x[0]
    return x


def _same(a, b) -> bool:
    """Whether two answers of the original agree bit for bit (under CPU autocast torch 2.13's bfloat16 convs leave
    some outputs unwritten on some shapes, a 3-d replicate-padded stride-3 conv among them: two calls then differ, and
    only the answer's form is compared)."""
    return isinstance(a, Exception) or isinstance(b, Exception) or torch.equal(a, b)


def cpu_autocast_bfloat16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.filterwarnings("ignore:fullfuse. no fusable conv pipeline")
@pytest.mark.parametrize("seed", range(8))
def test_random_models_answer_as_the_originals(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    matched = 0
    for case in range(CASES_PER_SEED):
        model, shape = (_family_a if rng.random() < 0.5 else _family_b)(rng)
        # (no bfloat16 models: torch 2.13's CPU bfloat16 convs crash the process (3-d) or leave outputs unwritten
        # (2-d, e.g. a 5x5 stride-2 conv of an 11x1 input) on some shapes; CPU autocast computes convs in bfloat16)
        dtype = rng.choice((torch.float32, torch.float64))
        model = model.eval().to(dtype)
        x = _input(rng, shape, dtype)
        mode = rng.choice((torch.enable_grad, torch.no_grad, torch.inference_mode, cpu_autocast_bfloat16))
        fused = fullfuse.fused_model(model)
        matched += bool(fused.plans)
        expected, what = answer(model, x, mode), f"case {case}: {model}, x {tuple(x.shape)} {dtype} stride {x.stride()}"
        got = answer(fused, x, mode)
        # (values where the original's and the fused model's answers each repeat: torch's CPU bfloat16 convs may
        # leave outputs unwritten in either, as they run the same ops here)
        values = mode is not cpu_autocast_bfloat16 or (_same(expected, answer(model, x, mode))
                                                       and _same(got, answer(fused, x, mode)))
        assert_same_answer(expected, got, f"{what}, {mode.__name__}", values)
    assert matched >= CASES_PER_SEED // 4   # (the cases reach fused regions, not only models left as they are)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("pool", ["avg", "max", "mean", "amax"])
def test_cpu_autocast_runs_the_ops_the_model_wrote(dims, pool):
    """CPU autocast casts by op (adaptive_avg_pool3d and adaptive_max_pool3d to float32, mean and amax not): a CPU
    input under it runs the region's own ops, whatever pool op the model wrote."""
    torch.manual_seed(0)
    model = ConvActPool(dims, 4, 8, 3, 1, 1, 1, nn.GELU, pool, None).eval()
    fused = fullfuse.fused_model(model)
    assert len(fused.plans) == 1
    x = torch.randn(2, 4, *([6] * dims))
    with torch.no_grad(), cpu_autocast_bfloat16():
        expected, got = model(x), fused(x)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert "autocast on a non-CUDA input" in fused.plans[0].last_reason
