"""The torch path (fullfuse/torch_path.py) against the modules a model would write, for every activation, pool,
post view, padding mode and channel reduction a spec can name (float64 on CPU: the two must agree to rounding)."""
import itertools

import pytest
import torch
from torch import nn

from fullfuse import codes, torch_path
from fullfuse.spec import POSTS, ConvActPoolSpec, ConvTPoolReduceSpec

_ACTIVATION_MODULES = {"none": nn.Identity(), "relu": nn.ReLU(), "gelu_erf": nn.GELU(),
                       "gelu_tanh": nn.GELU(approximate="tanh"), "silu": nn.SiLU()}


def test_every_spec_name_has_its_op():
    assert set(torch_path._ACTIVATIONS) == set(codes.ACTIVATIONS) == set(_ACTIVATION_MODULES)
    assert set(torch_path._IN_PLACE) == set(codes.ACTIVATIONS)
    assert set(torch_path._POOLED_VIEWS) == set(POSTS)
    assert set(torch_path._CHANNEL_REDUCTIONS) == set(codes.REDUCTIONS)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("activation, pool, post, padding_mode",
                         list(itertools.product(codes.ACTIVATIONS, codes.POOLS, POSTS,
                                                ("zeros", "reflect", "circular"))))
def test_conv_act_pool_is_the_modules_answer(dims, activation, pool, post, padding_mode):
    torch.manual_seed(0)
    conv = (nn.Conv2d if dims == 2 else nn.Conv3d)(3, 5, 3, stride=2, padding=1, dilation=1,
                                                    padding_mode=padding_mode).double()
    x = torch.randn(2, 3, *([7] * dims), dtype=torch.float64)
    _check_conv_act_pool(conv, x, activation, pool, post, True)


@pytest.mark.parametrize("batch, out_channels", [(1, 5), (2, 1), (1, 1), (3, 4)])
@pytest.mark.parametrize("post", list(POSTS))
@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_act_pool_post_views_keep_the_modules_shape(batch, out_channels, post, keepdim, channels_last):
    """A signature's ops with the post view folded into the pool: size-1 batch and channel dims (squeeze drops them
    too), the pool's keepdim either way, a channels_last input: the same shape and strides as the pool's op and then
    the view."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, out_channels, 3, padding=1).double()
    x = torch.randn(batch, 3, 6, 5, dtype=torch.float64)
    if channels_last:
        x, conv = x.contiguous(memory_format=torch.channels_last), conv.to(memory_format=torch.channels_last)
    for pool in codes.POOLS:
        _check_conv_act_pool(conv, x, "gelu_erf", pool, post, keepdim)


def _check_conv_act_pool(conv, x, activation, pool, post, keepdim):
    dims = x.dim() - 2
    y = _ACTIVATION_MODULES[activation](conv(x))
    spatial = tuple(range(2, 2 + dims))
    want = y.mean(spatial, keepdim=keepdim) if pool == "mean" else y.amax(spatial, keepdim=keepdim)
    want = {"none": want, "flatten": torch.flatten(want, 1), "squeeze": want.squeeze()}[post]
    spec = ConvActPoolSpec(dims, x.shape[1], conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                           conv.dilation, True, activation=activation, pool=pool, keepdim=keepdim,
                           padding_mode=conv.padding_mode, post=post)
    got = torch_path.prepared(spec)(x, conv.weight, conv.bias)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch_path.run(spec, x, conv.weight, conv.bias), got)
    folded = torch_path.prepared(spec, x.shape[0])(x, conv.weight, conv.bias)   # (one signature's: the view folded)
    assert folded.shape == want.shape and folded.stride() == want.stride() and torch.equal(folded, got)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("activation, reduction, keepdim",
                         list(itertools.product(codes.ACTIVATIONS, codes.REDUCTIONS, (True, False))))
def test_convt_pool_reduce_is_the_modules_answer(dims, activation, reduction, keepdim):
    torch.manual_seed(0)
    conv = (nn.ConvTranspose2d if dims == 2 else nn.ConvTranspose3d)(4, 6, 3, stride=2, padding=1,
                                                                     output_padding=1).double()
    x = torch.randn(2, 4, *([4] * dims), dtype=torch.float64)
    pool = (nn.MaxPool2d if dims == 2 else nn.MaxPool3d)(2)
    y = pool(_ACTIVATION_MODULES[activation](conv(x)))
    want = {"sum": y.sum(1, keepdim=keepdim), "mean": y.mean(1, keepdim=keepdim),
            "max": y.amax(1, keepdim=keepdim)}[reduction]
    spec = ConvTPoolReduceSpec(dims, 4, 6, conv.kernel_size, conv.stride, conv.padding, conv.output_padding,
                               conv.dilation, True, (2,) * dims, activation=activation, reduction=reduction,
                               keepdim=keepdim)
    got = torch_path.prepared(spec)(x, conv.weight, conv.bias)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    in_place = torch_path.prepared(spec, x.shape[0])(x, conv.weight, conv.bias)   # (one signature's: in place)
    assert torch.equal(in_place, got)


@pytest.mark.parametrize("activation", list(codes.ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_signature_ops_in_place_equal_the_ops_as_written(activation, dtype):
    """A signature's ops run the activation in place on the conv's output: bit for bit the ops as written, the
    inputs untouched, and autograd still differentiates the ops as written."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3).to(dtype)
    x = torch.randn(2, 3, 9, 8, dtype=dtype)
    spec = ConvActPoolSpec(2, 3, 5, (3, 3), (1, 1), (0, 0), (1, 1), True, activation=activation, pool="mean",
                           keepdim=True)
    before = [t.clone() for t in (x, conv.weight, conv.bias)]
    with torch.no_grad():
        want = torch_path.prepared(spec)(x, conv.weight, conv.bias)
        got = torch_path.prepared(spec, 2)(x, conv.weight, conv.bias)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(before, (x, conv.weight, conv.bias)))
    torch_path.prepared(spec)(x, conv.weight, conv.bias).float().sum().backward()
    assert conv.weight.grad is not None
