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
    assert set(torch_path._POOLED_VIEWS) == set(POSTS)
    assert set(torch_path._CHANNEL_REDUCTIONS) == set(codes.REDUCTIONS)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("activation, pool, post, padding_mode",
                         list(itertools.product(codes.ACTIVATIONS, codes.POOLS, POSTS, ("zeros", "reflect", "circular"))))
def test_conv_act_pool_is_the_modules_answer(dims, activation, pool, post, padding_mode):
    torch.manual_seed(0)
    conv = (nn.Conv2d if dims == 2 else nn.Conv3d)(3, 5, 3, stride=2, padding=1, dilation=1,
                                                    padding_mode=padding_mode).double()
    x = torch.randn(2, 3, *([7] * dims), dtype=torch.float64)
    y = _ACTIVATION_MODULES[activation](conv(x))
    spatial = tuple(range(2, 2 + dims))
    want = y.mean(spatial, keepdim=True) if pool == "mean" else y.amax(spatial, keepdim=True)
    want = {"none": want, "flatten": torch.flatten(want, 1), "squeeze": want.squeeze()}[post]
    spec = ConvActPoolSpec(dims, 3, 5, conv.kernel_size, conv.stride, conv.padding, conv.dilation, True,
                           activation=activation, pool=pool, keepdim=True, padding_mode=padding_mode, post=post)
    got = torch_path.prepared(spec)(x, conv.weight, conv.bias)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch_path.run(spec, x, conv.weight, conv.bias), got)


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
