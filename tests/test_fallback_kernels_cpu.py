"""The fallbacks' epilogue kernels on CPU (no GPU needed):

- the launch arithmetic of fullfuse/fallback/epilogue_plan.py: workspace sizes equal to the former C++ host code's
  (values taken from it), items that cover every element exactly once, grids and lane layouts within the kernels'
  limits, the 16-byte paths only where their conditions hold;
- the instantiation table (cutlass_ops/fallback.py) holds every variant a plan can pick;
- the rewired epilogue() functions pass the plan's values and the tensors' pointers in the kernels' argument order
  (a stand-in for runtime.kernel reads each launch's argument array back);
- one instantiation of each kernel template compiles through NVRTC for each portable architecture, with the
  parameter struct's layout checks, where NVRTC is installed.
"""
import ctypes
import itertools
from ctypes import sizeof

import pytest
from nvrtc_available import requires_nvrtc
import torch

from cutlass_ops import fallback as abi
from cutlass_ops import nvrtc
from cutlass_ops.variants import PORTABLE
from fullfuse import launch
from fullfuse.fallback import epilogue_plan as ep

SHAPES = [(n, k, s) for n in (1, 2, 3, 8, 128, 1000) for k in (1, 3, 8, 64, 100, 257, 1000, 4096)
          for s in (1, 5, 49, 256, 1000, 4096, 64516, 984312, 1 << 24)]


@pytest.mark.parametrize("n, k, s, channels_last, expected", [
    (128, 64, 254 * 254, 1, 4162048), (128, 64, 254 * 254, 0, 294912),       # the family-A seed
    (1, 64, 254 * 254, 1, 516608), (1, 64, 254 * 254, 0, 8448),
    (8, 64, 62 * 126 * 126, 1, 3938560), (8, 64, 62 * 126 * 126, 0, 249856),
    (4, 3, 5, 0, 0), (4, 3, 5, 1, 0), (2, 1000, 49, 1, 56256), (1, 1, 1 << 24, 0, 16640),
    (0, 3, 5, 1, 0), (3, 0, 5, 0, 0), (3, 5, 0, 1, 0),
])
def test_workspace_bytes_as_the_former_host_code(n, k, s, channels_last, expected):
    assert ep.act_pool_workspace_bytes(n, k, s, bool(channels_last)) == expected


@pytest.mark.parametrize("channels_last", [False, True])
def test_act_pool_items_cover_each_plane_or_image_once(channels_last):
    for n, k, s in SHAPES:
        items, length = ep.act_pool_items(n, k, s, channels_last)
        assert 1 <= items <= 4096 and (items - 1) * length < s <= items * length, (n, k, s)
        if not channels_last:
            assert length % 256 == 0                        # items start 1 KB-aligned in a 16-byte-aligned plane
        ws = ep.act_pool_workspace_bytes(n, k, s, channels_last)
        counters = n if channels_last else n * k
        assert ws == (0 if items == 1 else -(-counters * 4 // 256) * 256 + n * k * items * 4)


@pytest.mark.parametrize("dtype", [0, 1, 2])
def test_act_pool_launch(dtype):
    vw = 16 // abi.ITEM_BYTES[dtype]
    for (n, k, s), channels_last, aligned in itertools.product(SHAPES, (False, True), (False, True)):
        plan = ep.act_pool(n, k, s, channels_last, dtype, 2, 0, aligned)
        assert plan.variant in VARIANT_SET
        items, length = ep.act_pool_items(n, k, s, channels_last)
        assert plan.workspace_bytes == ep.act_pool_workspace_bytes(n, k, s, channels_last)
        assert plan.partials_offset % 256 == 0 and plan.partials_offset <= plan.workspace_bytes
        if not channels_last:
            assert "pool_planes" in plan.variant.kernel
            assert plan.grid == (-(-n * k // 8), items, 1) and plan.grid[1] <= 65535
            assert [v for _, v in plan.scalars][:5] == [n * k, k, s, items, length]
            continue
        vec = aligned and k % vw == 0
        assert plan.variant == abi.pool_rows(dtype, 2, 0, vec)
        k_, s_, c_, rows, b, cw, r, scale = [v for _, v in plan.scalars]
        kv = k // vw if vec else k
        assert (k_, s_, c_, rows) == (k, s, items, length)
        assert cw * b >= kv > cw * (b - 1) and cw * r <= ep.THREADS and r >= 1
        assert plan.grid == (n * items * b, 1, 1) and scale == 1.0 / s


def test_act_pool_refuses_what_the_kernels_cannot_take():
    for bad in [(0, 4, 4), (4, 0, 4), (4, 4, 0), (1 << 16, 1 << 15, 4)]:
        with pytest.raises(ValueError):
            ep.act_pool(*bad, False, 0, 0, 0, True)


def _strides(layout, n, k, d, h, w):
    if layout == "ncdhw":
        return (k * d * h * w, d * h * w, h * w, w, 1)
    if layout == "ndhwc":
        return (d * h * w * k, 1, h * w * k, w * k, k)
    return (d * h * w * (k + 1), 1, h * w * (k + 1), w * (k + 1), k + 1)   # channels_last with a padded channel dim


@pytest.mark.parametrize("dtype", [0, 1, 2])
@pytest.mark.parametrize("layout", ["ncdhw", "ndhwc", "padded"])
def test_window_reduce_launch(dtype, layout):
    vw = 16 // abi.ITEM_BYTES[dtype]
    for n, k, (d, h, w), window, aligned in itertools.product(
            (1, 3), (1, 3, 8, 16, 64, 100, 256), ((1, 62, 62), (62, 62, 62), (3, 7, 9)),
            ((1, 2, 2), (6, 6, 6), (1, 1, 1), (2, 3, 1)), (False, True)):
        strides = _strides(layout, n, k, d, h, w)
        plan = ep.window_reduce((n, k, d, h, w), strides, window, dtype, 0, 0, aligned)
        n_out = n * (d // window[0]) * (h // window[1]) * (w // window[2])
        assert plan.variant in VARIANT_SET
        if n_out == 0:
            assert plan.blocks == 0
            continue
        g = plan.geo
        positions = window[0] * window[1] * window[2]
        assert plan.blocks == -(-n_out // 8) and g["n_out"] == n_out and g["P"] == positions
        assert plan.smem == (4 * positions if g["use_tab"] else 0)
        assert 1 <= g["CL"] * g["PL"] <= 32
        s_k = 1 if k == 1 else strides[1]
        vec = s_k == 1 and aligned and k % vw == 0 and all(x % vw == 0 for x in strides[:1] + strides[2:])
        assert plan.variant == abi.window_reduce(dtype, 0, 0, vec)
        if s_k == 1:   # lanes along channels: each pass covers CL channel slots, every slot is used
            kv = k // vw if vec else k
            passes = -(-kv // 32)
            assert g["CL"] == -(-kv // passes) and (g["cs_stride"], g["ps_stride"]) == (1, g["CL"])
        else:          # lanes along window positions
            assert g["PL"] == min(positions, 32) and (g["cs_stride"], g["ps_stride"]) == (g["PL"], 1)
        assert abi.Geo(**g).n_out == n_out                   # every value fits its C field


def test_window_reduce_large_window_and_refusals():
    plan = ep.window_reduce((2, 4, 1, 4096, 4096), (4 << 24, 1, 4 << 24, 4 * 4096, 4), (1, 128, 128), 0, 0, 0, True)
    assert not plan.geo["use_tab"] and plan.smem == 0           # 16384 positions: offsets computed, no table
    assert ep.window_reduce((0, 4, 1, 8, 8), (256, 1, 256, 32, 4), (1, 2, 2), 0, 0, 0, True).blocks == 0
    with pytest.raises(ValueError):
        ep.window_reduce((1, 4, 1, 8, 8), (256, 1, 256, 32, 4), (1, 0, 2), 0, 0, 0, True)
    with pytest.raises(ValueError):
        ep.window_reduce((1, 0, 1, 8, 8), (256, 1, 256, 32, 4), (1, 2, 2), 0, 0, 0, True)


VARIANT_SET = set(abi.VARIANTS)


def test_variant_table():
    # family A: 4 storage types (fp16's float32 conv output included) x 5 activations x 2 pools x 3 kernels;
    # family B: 3 dtypes x 5 activations x 3 reductions x 2 load widths
    assert len(abi.VARIANTS) == len(VARIANT_SET) == 4 * 5 * 2 * 3 + 3 * 5 * 3 * 2
    assert len({v.label for v in abi.VARIANTS}) == len(abi.VARIANTS)
    with pytest.raises(ValueError):
        abi.window_reduce(abi.F16_RANGE, 0, 0, True)
    assert all(v.archs == PORTABLE for v in abi.VARIANTS)
    assert sizeof(abi.Geo) == 104


@requires_nvrtc
@pytest.mark.parametrize("variant", [abi.pool_planes(1, 2, 0), abi.pool_rows(0, 4, 1, True),
                                     abi.pool_rows(2, 3, 0, False), abi.window_reduce(1, 0, 2, True),
                                     abi.window_reduce(0, 1, 1, False), abi.pool_rows(abi.F16_RANGE, 2, 0, True),
                                     abi.pool_planes(abi.F16_RANGE, 2, 1)], ids=lambda v: v.label)
@pytest.mark.parametrize("arch", PORTABLE)
def test_each_kernel_template_compiles_with_nvrtc(variant, arch):
    code, name = nvrtc.compile_variant(variant, arch)
    assert code[:4] == b"\x7fELF" and name.startswith("_ZN") and name.encode() in code


class _RecordingKernel:
    """Stands in for runtime.Kernel: keeps each launch's geometry and reads its argument array back."""
    launches = []

    def __init__(self, variant, device):
        self.variant = variant

    def launch(self, grid, block, smem, args, stream=None):
        params = args.address
        if "pool_planes" in self.variant.kernel:
            types = [ctypes.c_void_p] * 3 + [ctypes.c_uint, ctypes.c_uint, ctypes.c_longlong, ctypes.c_int,
                                             ctypes.c_longlong, ctypes.c_float] + [ctypes.c_void_p] * 2
        elif "pool_rows" in self.variant.kernel:
            types = [ctypes.c_void_p] * 3 + [ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_longlong,
                                             ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float] + \
                [ctypes.c_void_p] * 2
        else:
            types = [ctypes.c_void_p] * 3 + [abi.Geo]
        pointers = (ctypes.c_void_p * len(types)).from_address(params)
        values = [ty.from_address(p) for ty, p in zip(types, pointers)]
        # (copied now, as a launch copies its parameters: the prepared launch's memory may be freed after)
        values = [abi.Geo.from_buffer_copy(v) if isinstance(v, abi.Geo) else (v.value or 0) for v in values]
        self.launches.append((self.variant, grid, block, smem, values))

    def at(self, grid, block, smem):
        return lambda stream, args: self.launch(grid, block, smem, args, stream)


@pytest.fixture
def recording(monkeypatch):
    from fullfuse import runtime
    monkeypatch.setattr(runtime, "kernel", _RecordingKernel)
    monkeypatch.setattr(launch, "stream_of", lambda index: 0)   # (the CPU tensors' device -1 has no stream)
    _RecordingKernel.launches = []
    return _RecordingKernel.launches


@pytest.mark.parametrize("channels_last", [False, True])
def test_act_pool_epilogue_passes_the_plan(recording, channels_last):
    """The family-A epilogue's launches (CPU tensors, no kernel run): pointers in their slots, the plan's scalars."""
    from fullfuse.fallback.conv_act_pool import Epilogue
    from fullfuse.spec import ConvActPoolSpec
    spec = ConvActPoolSpec(dims=2, in_channels=3, out_channels=64, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0),
                           dilation=(1, 1), has_bias=True, activation="silu", pool="max")
    epilogue = Epilogue(spec, -1)
    y = torch.zeros(3, 64, 100, 100, dtype=torch.bfloat16)
    if channels_last:
        y = y.contiguous(memory_format=torch.channels_last)
    bias, out = torch.zeros(64), torch.empty(3, 64)
    for _ in range(2):                                       # the second call re-uses the prepared launch
        epilogue(y, bias, out)
    plan = ep.act_pool(3, 64, 10000, channels_last, 1, 4, 1, y.data_ptr() % 16 == 0)
    assert len(recording) == 2
    for variant, grid, block, smem, values in recording:
        assert (variant, grid, block, smem) == (plan.variant, plan.grid, 256, 0)
        assert values[:3] == [y.data_ptr(), bias.data_ptr(), out.data_ptr()]
        assert values[3:-2] == [pytest.approx(v, rel=1e-7) for _, v in plan.scalars]
        counters, partials = values[-2:]   # (two buffers: the zeroed counters, the partials' scratch)
        assert (counters == 0) == (plan.workspace_bytes == 0) == (partials == 0)
        assert counters != partials or counters == 0
    assert len(epilogue._launches) == 1


def test_act_pool_epilogue_reads_an_unreadable_layout_through_a_contiguous_copy(recording):
    """A conv output in neither NCHW nor channels_last order (the kernels read those two only) is launched as its
    contiguous copy, with the NCHW plan, on every call."""
    from fullfuse.fallback.conv_act_pool import Epilogue
    from fullfuse.spec import ConvActPoolSpec
    spec = ConvActPoolSpec(dims=2, in_channels=3, out_channels=64, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0),
                           dilation=(1, 1), has_bias=True)
    epilogue = Epilogue(spec, -1)
    y = torch.zeros(2, 64, 9, 7).transpose(2, 3)
    assert not (y.is_contiguous() or y.is_contiguous(memory_format=torch.channels_last))
    out = torch.empty(2, 64)
    for _ in range(2):
        epilogue(y, None, out)
    plan = ep.act_pool(2, 64, 63, False, 0, 2, 0, True)
    assert len(recording) == 2
    for variant, grid, block, smem, values in recording:
        assert (variant, grid) == (plan.variant, plan.grid)
        assert values[0] != y.data_ptr() and values[1:3] == [0, out.data_ptr()]


def test_fp16_model_float32_conv_output_takes_the_f16_range_epilogue(recording):
    """An fp16 model's conv output written in float32 (the cuDNN path) is read as float and given fp16's overflow:
    the ff_f16_range instantiation; an fp16 conv output (PyTorch's call) keeps the __half one; the two are cached
    apart."""
    from fullfuse.fallback.conv_act_pool import Epilogue
    from fullfuse.spec import ConvActPoolSpec
    spec = ConvActPoolSpec(dims=2, in_channels=8, out_channels=64, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0),
                           dilation=(1, 1), has_bias=True)
    epilogue = Epilogue(spec, -1)
    y32 = torch.zeros(2, 64, 30, 30).contiguous(memory_format=torch.channels_last)
    y16 = torch.zeros(2, 64, 30, 30, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    bias, out = torch.zeros(64), torch.empty(2, 64)
    epilogue(y32, bias, out, f16_range=True)
    epilogue(y16, bias, out)
    epilogue(y32, bias, out)
    kernels = [variant.kernel for variant, *_ in recording]
    assert kernels == ["ff_act_pool::pool_rows<ff_f16_range, 2, false, 4>",
                       "ff_act_pool::pool_rows<__half, 2, false, 8>", "ff_act_pool::pool_rows<float, 2, false, 4>"]


@pytest.mark.parametrize("dims", [2, 3])
def test_window_reduce_epilogue_passes_the_plan(recording, dims):
    """The family-B epilogue's launches: a 2-D problem as depth 1 with the strides unsqueeze(2) gives."""
    from fullfuse.fallback.convt_pool_reduce import Epilogue
    from fullfuse.spec import ConvTPoolReduceSpec
    one = (1,) * dims
    spec = ConvTPoolReduceSpec(dims=dims, in_channels=4, out_channels=16, kernel_size=one, stride=one,
                               padding=(0,) * dims, output_padding=(0,) * dims, dilation=one, has_bias=False,
                               window=(2,) * dims, activation="relu", reduction="mean")
    y = torch.zeros(2, 16, *(8,) * dims, dtype=torch.float16)
    out = torch.empty(2, *(4,) * dims)
    Epilogue(spec, -1)(y, None, out)
    y5 = y.unsqueeze(2) if dims == 2 else y
    plan = ep.window_reduce(tuple(y5.shape), y5.stride(), (1,) * (3 - dims) + (2,) * dims, 2, 1, 1, True)
    (variant, grid, block, smem, values), = recording
    assert (variant, grid, block, smem) == (plan.variant, plan.blocks, 256, plan.smem)
    assert values[:3] == [y.data_ptr(), 0, out.data_ptr()]
    assert bytes(values[3]) == bytes(abi.Geo(**plan.geo))


def test_unavailable_gives_the_reason_and_run_raises_unsupported(monkeypatch):
    import fullfuse
    from cutlass_ops import cache
    from fullfuse.fallback import conv_act_pool, convt_pool_reduce, epilogue_launch

    def no_nvrtc(*args, **kwargs):
        raise cache.BuildError(f"fullfuse: NVRTC is not available (test); {nvrtc.FIX}")
    monkeypatch.setattr(epilogue_launch, "_reasons", {})
    monkeypatch.setattr(cache, "cubin", no_nvrtc)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for module in (conv_act_pool, convt_pool_reduce):
        reason = module.unavailable()
        assert reason.startswith(f"fallback epilogue kernel {module.PROBE.label} unavailable: fullfuse: NVRTC is not")
        assert "\n" not in reason and module.unavailable() is reason            # decided once
        with pytest.raises(fullfuse.UnsupportedError, match="fallback path cannot serve"):
            module.run(None, None, None, None, "tf32")                      # refused before it looks at its arguments
