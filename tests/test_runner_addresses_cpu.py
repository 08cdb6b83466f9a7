"""The fused runners' parameter structs without a GPU: a prepared call keeps one struct per thread (and, family A, per
weight layout) and sets in each call only the addresses that may have moved (the tensors' every call; the kept
buffers', family B's packed weights' and family A's tensor map where they changed).  Every launch must still carry
every current address: new inputs and outputs, a weight in another layout, another stream's kept buffers, buffers made
again after ``fullfuse.empty_cache()``.  The kernels, the tensor maps and the kept buffers are stand-ins that record
what a launch would have passed."""
import itertools
import threading

import pytest
import torch

from cutlass_ops import conv_act_pool as abi_a
from cutlass_ops import convt_pool_reduce as abi_b
from fullfuse import launch, runtime, workspace
from fullfuse.fused import conv_act_pool as fused_a
from fullfuse.fused import convt_pool_reduce as fused_b
from fullfuse.spec import ConvActPoolSpec, ConvTPoolReduceSpec

H200 = runtime.DeviceProps(major=9, minor=0, sm_count=132, smem_optin=232448)
_addresses = itertools.count(1 << 20, 1 << 12)


class _Buffer:
    """A kept buffer at an address of its own (workspace._kept's stand-in)."""

    def __init__(self, index, size, zero, stream):
        self.size, self.ptr = size, next(_addresses)

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.size


class _Kernel:
    def __init__(self, launched):
        self.launched = launched

    def blocks_per_sm(self, block, smem):
        return 1

    def launch(self, grid, block, smem, args, stream=None):
        self.launched.append((tuple(bytes(v) for v in args.values), stream))

    def at(self, grid, block, smem):
        return lambda stream, args: self.launch(grid, block, smem, args, stream)

    dependent_at = at


@pytest.fixture
def device(monkeypatch):
    """(launched structs, the current stream's holder): kernels that record their parameter structs, tensor maps
    that name their address, kept buffers at fresh addresses, device 0 current with a stream that can change."""
    launched, stream = [], [1]
    monkeypatch.setattr(runtime, "kernel", lambda variant, index: _Kernel(launched))
    monkeypatch.setattr(runtime, "device_props", lambda index: H200)
    monkeypatch.setattr(runtime, "tensor_map", lambda geometry, address: address.to_bytes(8, "little") * 16)
    monkeypatch.setattr(launch, "device_index", lambda device: 0)
    monkeypatch.setattr(launch, "stream_and_capturing", lambda index: (stream[0], False))
    monkeypatch.setattr(workspace, "_kept", _Buffer)
    monkeypatch.setattr(workspace, "_zeroed", {})
    monkeypatch.setattr(workspace, "_scratch", threading.local())
    return launched, stream


def _kept(stream):
    """The kept buffers of device 0 and ``stream``: (zeroed, this thread's scratch buffers by purpose)."""
    zeroed = workspace._zeroed.get((0, stream))
    scratch = {purpose: buf for (purpose, _, s), buf in getattr(workspace._scratch, "buffers", {}).items()
               if s == stream}
    return zeroed, scratch


def _calls(run, x, weight, bias, stream):
    """The same prepared call under every change of address it must follow; yields (x, weight, out) per call."""
    for step in range(6):
        if step == 1:
            x = x.clone()                                                      # the input moved
        if step == 2:
            weight = weight.contiguous(memory_format=(torch.channels_last if weight.dim() == 4 else
                                                      torch.channels_last_3d))   # another weight layout
        if step == 3:
            stream[0] = 2                                                      # another stream's kept buffers
        if step == 4:
            workspace.release()                                                # kept buffers made again
        if step == 5:
            weight = weight.contiguous()                                       # the first layout, its struct again
        out = run(x, weight, bias)
        yield x, weight, out


@pytest.mark.parametrize("shape", [(4, 8, 64, 64), (1, 8, 16, 16)], ids=["wgmma-tma", "mma-sync"])
def test_family_a_launches_carry_every_current_address(device, shape):
    launched, stream = device
    spec = ConvActPoolSpec(dims=2, in_channels=8, out_channels=64, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0),
                           dilation=(1, 1), has_bias=True)
    x, weight, bias = torch.randn(shape), torch.randn(64, 8, 3, 3), torch.randn(64)
    run = fused_a.prepare(spec, x, "tf32", True)
    for x, weight, out in _calls(run, x, weight, bias, stream):
        (raw,), launched_on = launched[-1]
        wgmma = len(raw) == len(bytes(abi_a.WGParams()))
        q = (abi_a.WGParams if wgmma else abi_a.FAParams).from_buffer_copy(raw)
        assert launched_on == stream[0]
        assert (q.x, q.w, q.bias, q.out) == (x.data_ptr(), weight.data_ptr(), bias.data_ptr(), out.data_ptr())
        zeroed, scratch = _kept(stream[0])
        if zeroed is not None:
            assert q.ws_cnt == zeroed.ptr
            assert q.ws_part == scratch[workspace.PARTIALS].ptr       # (the mean's partials)
        if wgmma:
            assert raw[:128] == x.data_ptr().to_bytes(8, "little") * 16   # the input's own tensor map
    assert shape[2] <= 16 or wgmma


@pytest.mark.parametrize("shape", [(1, 32, 4, 4, 4), (16, 32, 16, 16, 16)], ids=["one-wave", "packing-kernel"])
def test_family_b_launches_carry_every_current_address(device, shape):
    launched, stream = device
    spec = ConvTPoolReduceSpec(dims=3, in_channels=32, out_channels=64, kernel_size=(5, 5, 5), stride=(2, 2, 2),
                               padding=(2, 2, 2), output_padding=(0, 0, 0), dilation=(1, 1, 1), has_bias=True,
                               window=(6, 6, 6))
    x, weight, bias = torch.randn(shape), torch.randn(32, 64, 5, 5, 5), torch.randn(64)
    run = fused_b.prepare(spec, x, "tf32", True)
    size = len(bytes(abi_b.FBParams()))
    for x, weight, out in _calls(run, x, weight, bias, stream):
        (raw,), launched_on = launched[-1]                                     # the fused kernel's (after the packing)
        assert len(raw) == size and launched_on == stream[0]
        p = abi_b.FBParams.from_buffer_copy(raw)
        assert (p.x, p.w, p.bias, p.out) == (x.data_ptr(), weight.data_ptr(), bias.data_ptr(), out.data_ptr())
        assert tuple(p.pg.ws) == weight.stride()
        zeroed, scratch = _kept(stream[0])
        assert p.ws == zeroed.ptr and p.wp == scratch[workspace.PACKED].ptr
        assert p.ws <= p.ws_cnt < p.ws + zeroed.size and p.ws <= p.pack_cnt < p.ws + zeroed.size
        if shape[0] > 1:                                                      # the packing kernel, launched just before
            (w_ptr, wp_ptr, _), _ = launched[-2]
            assert w_ptr == weight.data_ptr().to_bytes(8, "little") and wp_ptr == p.wp.to_bytes(8, "little")


@pytest.mark.parametrize("deterministic", [True, False], ids=["written", "atomic-mean"])
@pytest.mark.parametrize("post", ["none", "flatten", "squeeze"])
@pytest.mark.parametrize("n, k", [(1, 1), (2, 1), (1, 64), (3, 64)])
def test_family_a_outputs_have_the_shape_the_region_returns(device, deterministic, post, n, k):
    """Family A's prepared call returns spec.output_shape(n) in the input's dtype for every post view, the 0-d one of
    a squeezed (1, 1) output too (torch's size-taking calls reject no sizes at all), written or atomically added."""
    spec = ConvActPoolSpec(dims=2, in_channels=8, out_channels=k, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0),
                           dilation=(1, 1), has_bias=True, post=post)
    x, weight, bias = torch.randn(n, 8, 16, 16), torch.randn(k, 8, 3, 3), torch.randn(k)
    out = fused_a.prepare(spec, x, "tf32", deterministic)(x, weight, bias)
    assert out.shape == spec.output_shape(n) and out.dtype == x.dtype
    assert (out.dim() == 0) == (post == "squeeze" and n == k == 1)
