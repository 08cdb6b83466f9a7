"""GPU tests of the hazards a user meets outside the single-stream, fresh-model, eager case: weight copies shared
across streams, weights changed in place, inference_mode parameters, CUDA graphs and torch.compile's cudagraphs,
threads, autocast, special values, empty batches, autograd, a second GPU, misaligned input and the fallback's first-call
memory.  Each test compares the fused model with what the ORIGINAL model gives (run by PyTorch, or in float64), as a
user would see it.  Skipped without CUDA."""
import os
import threading

import pytest
import torch
from torch import nn

import fullfuse
from fullfuse import launch
from fullfuse.measure import errors
from fullfuse.precision import TOLERANCE, cudnn_conv_precision
from in_threads import in_threads

pytestmark = pytest.mark.gpu
SEED = (int(os.environ["FULLFUSE_TEST_SEED"]) if "FULLFUSE_TEST_SEED" in os.environ
        else int.from_bytes(os.urandom(4), "little"))
# shapes both fused kernels serve (tests/test_gpu.py, fullfuse/check.py); "Bw": family B at a grid of more than one
# wave on an H200 (240 blocks, a tail split), whose weights the packing kernel packs before the fused kernel
SHAPE = {"A": (4, 8, 64, 64), "B": (2, 32, 8, 8, 8), "Bw": (10, 32, 16, 16, 16)}
SLEEP_CYCLES = 200_000_000                              # torch.cuda._sleep: ~0.1 s of one busy block on an H200
MODE_OF = {torch.float32: "tf32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(launch, "POISON_OUTPUTS", True)


class ModelB(nn.Module):
    """Seed B's pipeline with the channel reduction of choice (sum / amax / mean over dim 1, keepdim)."""

    def __init__(self, reduction="sum"):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(32, 64, 5, stride=2, padding=2)
        self.pool1, self.pool2 = nn.MaxPool3d(2), nn.MaxPool3d(3)
        self.reduction = reduction

    def forward(self, x):
        y = self.pool2(self.pool1(self.conv_transpose(x)))
        if self.reduction == "amax":
            return torch.amax(y, dim=1, keepdim=True)
        if self.reduction == "mean":
            return torch.mean(y, dim=1, keepdim=True)
        return torch.sum(y, dim=1, keepdim=True)


def make_model(family, dtype=torch.float32, seed=SEED, pool="mean", reduction="sum", device="cuda"):
    """Seed A (Conv2d 8->64 k3 -> GELU -> global mean / max pool) or seed B, default init from ``seed``."""
    torch.manual_seed(seed)   # (family "Bw": seed B's model)
    if family == "A":
        pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
        model = nn.Sequential(nn.Conv2d(8, 64, 3), nn.GELU(), pool_layer)
    else:
        model = ModelB(reduction)
    return model.to(device=device, dtype=dtype).eval()


def conv_of(model):
    return next(m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose3d)))


def make_x(family, dtype=torch.float32, seed=SEED, shape=None, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape or SHAPE[family], generator=gen).to(device=device, dtype=dtype)


def ref64(model, x, device=None):
    """The original model evaluated in float64 (its parameters and x as they are, converted), cuDNN in IEEE fp32."""
    params = {k: v.detach().double().to(device or x.device) for k, v in model.state_dict().items()}
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        return torch.func.functional_call(model, params, (x.detach().double().to(device or x.device),))


def assert_close(out, ref, mode, what=""):
    err = errors(out, ref)
    assert err["relerr"] <= TOLERANCE[mode], f"{what}: {err} > {TOLERANCE[mode]} (seed {SEED})"


def precision_of(dtype):
    return "tf32" if dtype == torch.float32 else "auto"


# ------------------------------------------------------------------ weight copies shared across streams
STREAM_CASES = [   # (family, path, dtype, conv weight channels_last): each makes a re-laid-out weight or bias copy
    ("B", "fused", torch.float32, False),      # the fused kernel's packed weights
    ("B", "fused", torch.bfloat16, False),     # packed weights and the float32 bias copy
    ("Bw", "fused", torch.float32, False),     # packed by the packing kernel before the fused kernel
    ("Bw", "fused", torch.bfloat16, False),
    ("B", "fallback", torch.float32, False),   # channels_last_3d weight copy
    ("A", "fallback", torch.float32, False),   # channels_last weight copy
    ("A", "fallback", torch.bfloat16, False),  # ... and the float32 bias copy
    ("A", "fused", torch.bfloat16, False),     # the float32 bias copy
    ("A", "fused", torch.float32, True),       # a channels_last weight copied to the kernel's contiguous layout
]


@pytest.mark.parametrize("family, path, dtype, weight_cl", STREAM_CASES,
                         ids=[f"{f}-{p}-{str(d)[6:]}{'-wcl' if c else ''}" for f, p, d, c in STREAM_CASES])
def test_weight_copies_across_streams(family, path, dtype, weight_cl):
    """The first call runs on stream s1 behind a long busy kernel, so every weight copy it makes is still unwritten
    when the second call runs on stream s2, which waits for its input only: s2 must still see the finished copies
    (old code: s2 read the copy before s1 wrote it -> garbage).  A warm-up model of the same shape first takes the
    one-time work that synchronises (library load, cuDNN plan timing, chunk schedule) out of the measured calls."""
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep unavailable")
    warm = make_model(family, dtype, seed=SEED + 1)
    x = make_x(family, dtype)
    with torch.no_grad():
        fullfuse.fused_model(warm, path=path, precision=precision_of(dtype))(x)
    model = make_model(family, dtype)
    if weight_cl:
        model = model.to(memory_format=torch.channels_last)
        assert not conv_of(model).weight.is_contiguous()
    want = ref64(model, x)
    fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.no_grad():
        with torch.cuda.stream(s1):
            torch.cuda._sleep(SLEEP_CYCLES)
            first = fused(x)
        with torch.cuda.stream(s2):
            s2.wait_stream(torch.cuda.default_stream())   # x was made there (and is finished): the input only
            second = fused(x)
    torch.cuda.synchronize()
    assert fused.plans[0].last_path == path, fused.plans[0].last_reason
    assert_close(first, want, MODE_OF[dtype], "first call, stream s1")
    assert_close(second, want, MODE_OF[dtype], "second call, stream s2 (s1 still busy when it was queued)")


# ------------------------------------------------------------------ weights changed in place
def _mutate(how, model, fused, family, dtype):
    conv = conv_of(model)
    if how == "data_mul":             # EMA style: .data shares the storage but not the version counter
        for p in conv.parameters():
            p.data.mul_(0.5)
    elif how == "data_assign":        # a new tensor of the same shape behind the same Parameter
        for p in conv.parameters():
            p.data = p.data * -0.75
    elif how == "copy_no_grad":
        with torch.no_grad():
            for p in conv.parameters():
                p.copy_(p * -0.75)
    else:                             # a checkpoint of another model, loaded into the fused model (shared params)
        fused.load_state_dict(make_model(family, dtype, seed=SEED + 7).state_dict())


STALE_CASES = [(f, p) for f in ("A", "B") for p in ("fused", "fallback")] + [("Bw", "fused")]


@pytest.mark.parametrize("how", ["data_mul", "data_assign", "copy_no_grad", "load_state_dict"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family, path", STALE_CASES, ids=[f"{f}-{p}" for f, p in STALE_CASES])
def test_stale_weights_after_update(family, path, dtype, how):
    """After a first call (which caches any weight / bias copy), the parameters change in place or behind .data; the
    next call must give the original model's new answer on every path (old code: `.data.mul_` left the version
    counter alone, and the cached copy was reused)."""
    model = make_model(family, dtype)
    fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
    x = make_x(family, dtype)
    with torch.no_grad():
        assert_close(fused(x), ref64(model, x), MODE_OF[dtype], "before the update")
        _mutate(how, model, fused, family, dtype)
        got = fused(x)
    assert fused.plans[0].last_path == path, fused.plans[0].last_reason
    assert_close(got, ref64(model, x), MODE_OF[dtype], f"after {how}")


# ------------------------------------------------------------------ weights of another shape, parametrized weights
def _replace_with_pruned(conv, family, how):
    """Keep the first 32 output channels of the conv (its weight and bias), the module's attributes left as they
    were: PyTorch's conv computes with the weight it finds."""
    with torch.no_grad():
        w = conv.weight[:32].clone() if family == "A" else conv.weight[:, :32].clone()
        b = conv.bias[:32].clone()
    if how == "parameter":
        conv.weight, conv.bias = nn.Parameter(w, requires_grad=False), nn.Parameter(b, requires_grad=False)
    else:   # the same Parameter objects, a new shape behind .data
        conv.weight.data, conv.bias.data = w, b


@pytest.mark.parametrize("how", ["parameter", "data"])
@pytest.mark.parametrize("path", ["auto", "fused", "fallback"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_weight_of_another_shape(family, path, how):
    """A weight replaced after fused_model by one of another shape (pruned output channels): auto gives PyTorch's
    answer with the new weight; an explicit kernel path says it cannot serve (the kernels were planned for the
    region's conv: reading the new weight as the old shape would be out of bounds)."""
    model = make_model(family)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    x = make_x(family)
    with torch.no_grad():
        fused(x)   # the signature's prepared call exists
        _replace_with_pruned(conv_of(model), family, how)
        want = ref64(model, x)
        if path != "auto":
            with pytest.raises(fullfuse.UnsupportedError, match="weight"):
                fused(x)
            return
        got = fused(x)
    assert got.shape == want.shape
    assert fused.plans[0].last_path == "torch", fused.plans[0].last_reason
    assert_close(got, want, "tf32", "pruned weight")


@pytest.mark.parametrize("path", ["auto", "fused", "fallback"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_parametrized_weight(family, path):
    """A conv whose weight is a parametrization (torch.nn.utils.parametrizations.weight_norm): the region reads
    the weight as the conv's forward does, computed per call, and the kernels serve it."""
    model = make_model(family)
    torch.nn.utils.parametrizations.weight_norm(conv_of(model))
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    x = make_x(family)
    with torch.no_grad():
        assert_close(fused(x), ref64(model, x), "tf32", "weight_norm")
        conv_of(model).parametrizations.weight.original0.mul_(2.0)   # the norm changes: the next call sees it
        assert_close(fused(x), ref64(model, x), "tf32", "weight_norm after an update")
    if path != "auto":
        assert fused.plans[0].last_path == path, fused.plans[0].last_reason


@pytest.mark.parametrize("change", ["conv hook", "conv padding"])
@pytest.mark.parametrize("path", ["auto", "fused", "fallback"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_hook_or_conv_attribute_added_after_the_first_call(family, path, change):
    """After calls on the plan's path, a forward hook on the conv (doubling its output) or a new conv padding: the
    region runs its own ops (PyTorch's, with the hook), then the plan's path again once undone."""
    model = make_model(family)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    x = make_x(family)
    conv = conv_of(model)
    with torch.no_grad():
        fused(x)
        if change == "conv hook":
            undo = conv.register_forward_hook(lambda m, a, out: out * 2).remove
        else:
            was, conv.padding = conv.padding, tuple(p + 1 for p in conv.padding)
            undo = lambda: setattr(conv, "padding", was)   # noqa: E731
        want = ref64(model, x)
        got = fused(x)
        assert fused.plans[0].last_path == "torch", fused.plans[0].last_reason
        assert got.shape == want.shape
        assert_close(got, want, "tf32", change)
        undo()
        assert_close(fused(x), ref64(model, x), "tf32", f"{change} undone")
    assert fused.plans[0].last_path == (path if path != "auto" else "fused"), fused.plans[0].last_reason


class _NoGradForward(nn.Module):
    """A model whose forward runs under @torch.no_grad() (its parameters require grad)."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    @torch.no_grad()
    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("family", ["A", "B"])
def test_transforms_and_grad_mode_decorators_on_the_gpu(family):
    """On the GPU: a forward under @torch.no_grad() runs its region on the kernel path, its output without grad;
    vmap over the fused model (PyTorch's ops) and the fused model on one poisoned-output call agree with float64."""
    model = make_model(family)
    wrapped = _NoGradForward(model)
    fused = fullfuse.fused_model(wrapped, path="auto", precision="tf32")
    x = make_x(family)
    out = fused(x)   # (grad on: the parameters require grad)
    assert not out.requires_grad and fused.plans[0].last_path in ("fused", "fallback"), fused.plans[0].last_reason
    assert_close(out, ref64(model, x), "tf32", "no_grad forward")
    batched = torch.stack([x[:1], x[1:2]]) if x.shape[0] > 1 else torch.stack([x, x])
    with torch.no_grad():
        got = torch.func.vmap(fused)(batched)
    assert fused.plans[0].last_path == "torch", fused.plans[0].last_reason
    for i in range(batched.shape[0]):
        assert_close(got[i], ref64(model, batched[i]), "tf32", f"vmap item {i}")


class _FrozenBody(nn.Module):
    """``body`` frozen by a `with torch.no_grad():` block inside forward, a trainable scale after it."""

    def __init__(self, body):
        super().__init__()
        self.body, self.scale = body, nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        with torch.no_grad():
            y = self.body(x)
        return y * self.scale


@pytest.mark.parametrize("family", ["A", "B"])
def test_a_grad_mode_block_inside_forward_on_the_gpu(family):
    """On the GPU, grad on: the region inside the block runs on the kernel path, the output (scaled outside the block)
    requires grad and agrees with float64, and backward reaches the scale only."""
    model = make_model(family)
    wrapped = _FrozenBody(model).cuda()
    fused = fullfuse.fused_model(wrapped, path="auto", precision="tf32")
    x = make_x(family)
    out = fused(x)
    assert out.requires_grad and fused.plans[0].last_path in ("fused", "fallback"), fused.plans[0].last_reason
    assert_close(out.detach(), 2 * ref64(model, x), "tf32", "no_grad block")
    out.sum().backward()
    assert wrapped.scale.grad is not None and all(p.grad is None for p in model.parameters())


class _AutocastBody(nn.Module):
    """``body`` under `with torch.autocast("cuda", dtype=torch.bfloat16):` inside forward."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.body(x)


@pytest.mark.parametrize("family", ["A", "B"])
def test_an_autocast_block_inside_forward_on_the_gpu(family):
    """On the GPU: the region inside a bfloat16 autocast block computes in bfloat16 on the kernel path and returns
    what the model returns (bfloat16; B's sum float32), within bfloat16's bound of float64; autocast is off after."""
    model = make_model(family)
    fused = fullfuse.fused_model(_AutocastBody(model), path="auto", precision="tf32")
    x = make_x(family)
    with torch.no_grad():
        out, want = fused(x), _AutocastBody(model)(x)
    assert not torch.is_autocast_enabled("cuda")
    assert fused.plans[0].last_path in ("fused", "fallback"), fused.plans[0].last_reason
    assert out.dtype == want.dtype and out.shape == want.shape
    assert_close(out.float(), ref64(model, x), "bfloat16", "autocast block")


# ------------------------------------------------------------------ family B packs its weights in every call
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 32, 4, 4, 4), (2, 32, 8, 8, 8), (16, 32, 12, 12, 12), SHAPE["Bw"]],
                         ids=["one-block", "small", "one-wave", "waves"])
def test_fused_b_packs_any_weight_layout(shape, dtype, monkeypatch):
    """Fused B packs the weights as they are in every call: within one launch, whose blocks pack
    (csrc/fused_convt_pool_reduce/weight_pack.cuh; packing-only blocks beside one computing block, a small grid, a
    full wave), or, where the grid has more than one wave, by the packing kernel launched just before the fused
    kernel, which depends on it programmatically.  The same thread's calls then see the weight in other layouts (the
    packing reads it through its strides) and with other values behind the same Parameter; each call matches
    float64."""
    from fullfuse import runtime
    from fullfuse.fused import convt_pool_reduce as fb
    model = make_model("B", dtype)
    fused = fullfuse.fused_model(model, path="fused", precision=precision_of(dtype))
    x = make_x("B", dtype, shape=shape)
    waves = fb.plan(fused.plans[0].spec, x, "tf32").pack_grid is not None   # the packing kernel's grid, if any
    assert waves == (shape == SHAPE["Bw"])   # (on an H200: 132 SMs)
    launches = []
    real = runtime._launch_in_context

    def counted(kernel, fn, *args):   # (prepared calls may predate this test)
        launches.append(("launch_dependent" if fn is kernel._launch_ex else "launch", kernel.variant.label))
        return real(kernel, fn, *args)
    monkeypatch.setattr(runtime, "_launch_in_context", counted)
    # (no device is the kernels' current one: every launch goes through _launch_in_context, in the kernel's context)
    monkeypatch.setattr(runtime, "current_device_index", lambda: -1)
    weight = conv_of(model).weight
    layouts = [weight.data, weight.data.contiguous(memory_format=torch.channels_last_3d),
               weight.data.permute(0, 1, 4, 3, 2).contiguous().permute(0, 1, 4, 3, 2), weight.data * -0.5]
    for i, data, got in _fused_calls_over_weight_layouts(fused, x, weight, layouts, launches.clear):
        kinds = [(name, label.split("<")[0]) for name, label in launches]
        if waves:
            assert kinds == [("launch", "fb_pack::pack_kernel"), ("launch_dependent", "fb_kernel")], launches
        else:
            assert kinds == [("launch", "fb_kernel")], launches
        assert_close(got, ref64(model, x), MODE_OF[dtype], f"weight layout {i}, strides {data.stride()}")


def _fused_calls_over_weight_layouts(fused, x, weight, layouts, before_call):
    """Each of ``layouts`` behind the same Parameter in turn (weight.data = it), one call of ``fused`` each (no_grad;
    before_call() first, e.g. a counter's reset): yields (index, data, output) once the call took the fused path."""
    with torch.no_grad():
        for i, data in enumerate(layouts):
            weight.data = data
            before_call()
            got = fused(x)
            assert fused.plans[0].last_path == "fused", fused.plans[0].last_reason
            yield i, data, got


# ------------------------------------------------------------------ family A reads a weight as it lies
A_LAYOUT_CASES = [   # (input shape, conv (in, out, kernel), dims)
    ((1, 8, 16, 16), (8, 64, 3), 2),      # one image: the mma.sync kernel
    ((4, 8, 64, 64), (8, 64, 3), 2),
    ((2, 16, 40, 72), (16, 96, 3), 2),    # K > 64: two launches, the second's weights at 64 output channels' offset
    ((1, 5, 30, 40), (5, 64, 5), 2),      # 5 channels, 5x5
    ((2, 8, 5, 12, 40), (8, 64, 3), 3),   # Conv3d: a non-contiguous weight is read through a contiguous copy
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape, conv, dims", A_LAYOUT_CASES, ids=[str(c[0]) for c in A_LAYOUT_CASES])
def test_fused_a_reads_any_weight_layout(shape, conv, dims, dtype, monkeypatch):
    """Fused A's kernels (wgmma and mma.sync) read a Conv2d's weight in its own layout (channels_last, taps
    transposed, input channels outermost: fullfuse/fused/conv_act_pool.py Launches.blocks_for), with no copy per call;
    a Conv3d's through a contiguous copy.  The same thread's calls see the layouts in turn and new values behind the
    same Parameter; each call matches float64."""
    from fullfuse.fused import conv_act_pool as fa
    copies = []
    real = fa.contiguous

    def counted(t):
        if t is not None and not t.is_contiguous():
            copies.append(tuple(t.shape))
        return real(t)
    monkeypatch.setattr(fa, "contiguous", counted)
    torch.manual_seed(SEED)
    c_in, c_out, kernel = conv
    layer = (nn.Conv2d if dims == 2 else nn.Conv3d)(c_in, c_out, kernel)
    pool = nn.AdaptiveAvgPool2d(1) if dims == 2 else nn.AdaptiveAvgPool3d(1)
    model = nn.Sequential(layer, nn.GELU(), pool).cuda().to(dtype).eval()
    fused = fullfuse.fused_model(model, path="fused", precision=precision_of(dtype))
    x = make_x("A", dtype, shape=shape)
    weight = layer.weight
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    layouts = [weight.data, weight.data.contiguous(memory_format=fmt),
               weight.data.transpose(-1, -2).contiguous().transpose(-1, -2),
               weight.data.transpose(0, 1).contiguous().transpose(0, 1), weight.data.contiguous() * -0.5]
    for i, data, got in _fused_calls_over_weight_layouts(fused, x, weight, layouts, copies.clear):
        if dims == 2:
            assert copies == [], f"weight layout {i}, strides {data.stride()}: copied"
        elif not data.is_contiguous():
            assert copies == [tuple(data.shape)], copies
        assert_close(got, ref64(model, x), MODE_OF[dtype], f"weight layout {i}, strides {data.stride()}")


# ------------------------------------------------------------------ inference_mode
@pytest.mark.parametrize("params_in_inference_mode", [True, False], ids=["inference-params", "normal-params"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["fused", "fallback", "auto", "torch"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_inference_mode(family, path, dtype, params_in_inference_mode):
    """A model built and moved to the GPU inside torch.inference_mode() has inference-tensor parameters (they have no
    version counter: old code raised reading it); calls inside inference_mode, and with normal parameters calls that
    alternate between inference_mode and no_grad, all give the original's answer on every path."""
    if params_in_inference_mode:
        with torch.inference_mode():
            model = make_model(family, dtype)
            fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
            x = make_x(family, dtype)
            want = ref64(model, x)
            outs = [fused(x), fused(x)]
            assert conv_of(model).weight.is_inference()
    else:
        model = make_model(family, dtype)
        fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
        x = make_x(family, dtype)
        want = ref64(model, x)
        outs = []
        for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode):
            with mode():
                outs.append(fused(x))
    for i, out in enumerate(outs):
        assert_close(out, want, MODE_OF[dtype], f"call {i}")


# ------------------------------------------------------------------ CUDA graphs and torch.compile
def _capture(fused, static_x, warmup=3):
    """PyTorch's recipe: warm-up on a side stream, then capture; returns (graph, static output)."""
    with torch.no_grad():
        if warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    fused(static_x)
            torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fused(static_x)
    return graph, static_out


def _replay_checks(graph, static_x, static_out, model, family, dtype):
    """Replay with a new input copied into the static input, then after an in-place weight update."""
    new_x = make_x(family, dtype, seed=SEED + 11)
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(static_out, ref64(model, new_x), MODE_OF[dtype], "replay with a new input")
    with torch.no_grad():
        conv_of(model).weight.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(static_out, ref64(model, new_x), MODE_OF[dtype], "replay after weight.mul_(0.5)")


GRAPH_CASES = [(f, p) for f in ("A", "B") for p in ("fused", "fallback", "auto")] + [("Bw", "fused")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family, path", GRAPH_CASES, ids=[f"{f}-{p}" for f, p in GRAPH_CASES])
def test_cuda_graph_capture(family, path, dtype):
    """torch.cuda.graph capture after a side-stream warm-up: a replay gives the original's answer for a new input
    copied into the static input, and sees an in-place weight update made after the capture (old code: the graph held
    a weight copy made during warm-up)."""
    model = make_model(family, dtype)
    fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
    static_x = make_x(family, dtype)
    graph, static_out = _capture(fused, static_x)
    _replay_checks(graph, static_x, static_out, model, family, dtype)


@pytest.mark.parametrize("path", ["fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_cuda_graph_first_call_inside_capture(family, path):
    """The model's first call, at a shape never run before, happens inside the capture (no warm-up for it): cuDNN plan
    timing, chunk-schedule tuning and weight copies must not break the capture, and the replays must be right.  Another
    model of the same kind runs first at another shape, so the kernels' libraries are loaded."""
    other = make_model(family, seed=SEED + 3)
    with torch.no_grad():
        fullfuse.fused_model(other, path=path, precision="tf32")(make_x(family, seed=SEED + 4))
    model = make_model(family)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    shape = (3, 8, 37, 45) if family == "A" else (3, 32, 7, 9, 8)
    static_x = make_x(family, shape=shape)
    graph, static_out = _capture(fused, static_x, warmup=0)
    new_x = make_x(family, seed=SEED + 5, shape=shape)
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(static_out, ref64(model, new_x), "tf32", "replay of a capture holding the first call")
    with torch.no_grad():
        conv_of(model).weight.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(static_out, ref64(model, new_x), "tf32", "replay after weight.mul_(0.5)")


@pytest.mark.parametrize("family", ["A", "B", "Bw"])
def test_torch_compile_reduce_overhead(family):
    """torch.compile(mode="reduce-overhead") (CUDA graphs through cudagraph trees) over the fused model: a few
    iterations with new inputs give the original's answers."""
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile unavailable")
    torch._dynamo.reset()
    model = make_model(family)
    fused = fullfuse.fused_model(model, precision="tf32")
    compiled = torch.compile(fused, mode="reduce-overhead")
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    with torch.no_grad():
        for i in range(5):
            if mark is not None:
                mark()
            x = make_x(family, seed=SEED + 20 + i)
            out = compiled(x).clone()
            assert_close(out, ref64(model, x), "tf32", f"iteration {i}")


# ------------------------------------------------------------------ threads
def _run_threads(jobs, main_work=None):
    """jobs: callables run at once, one per thread, each on its own stream without grad (``in_threads``)."""
    def on_own_stream(i):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.no_grad():
            jobs[i]()
        stream.synchronize()
    failures = in_threads(on_own_stream, len(jobs), main_work)
    torch.cuda.synchronize()
    return failures


def _alternating_job(fused, xs, results, iterations=6):
    def job():
        for i in range(iterations):
            x = xs[i % len(xs)]
            results.append((fused(x), i % len(xs)))
    return job


def test_threads_mixed_problem_sizes():
    """8 threads at once, each alternating two problem sizes of its own: 4 on one fused family-A model (different
    output-row lengths take different kernels / shared-memory sizes), 2 on a fallback model over the same parameters,
    2 on a fused family-B model (one of them also at a grid of several waves: the packing kernel before the fused
    kernel); every result matches its float64 reference computed beforehand."""
    model_a, model_b = make_model("A"), make_model("B")
    fused_a = fullfuse.fused_model(model_a, path="fused", precision="tf32")
    fallback_a = fullfuse.fused_model(model_a, path="fallback", precision="tf32")
    fused_b = fullfuse.fused_model(model_b, path="fused", precision="tf32")
    a_shapes = [(2, 8, 24, 132), (2, 8, 24, 64), (3, 8, 20, 32), (1, 8, 16, 256)]
    b_shapes = [(2, 32, 8, 8, 8), (1, 32, 12, 12, 12), (1, 32, 6, 10, 8), SHAPE["Bw"]]
    plan = [(fused_a, model_a, "A", (a_shapes[i], a_shapes[(i + 1) % 4])) for i in range(4)]
    plan += [(fallback_a, model_a, "A", (a_shapes[0], a_shapes[2])),
             (fallback_a, model_a, "A", (a_shapes[1], a_shapes[3]))]
    plan += [(fused_b, model_b, "B", (b_shapes[0], b_shapes[1])), (fused_b, model_b, "B", (b_shapes[2], b_shapes[3]))]
    jobs, checks = [], []
    for t, (fused, model, family, shapes) in enumerate(plan):
        xs = [make_x(family, seed=SEED + 100 * t + j, shape=s) for j, s in enumerate(shapes)]
        refs = [ref64(model, x) for x in xs]
        results = []
        jobs.append(_alternating_job(fused, xs, results))
        checks.append((t, refs, results))
    torch.cuda.synchronize()
    failures = _run_threads(jobs)
    assert not failures, "\n".join(failures) + f" (seed {SEED})"
    for t, refs, results in checks:
        assert len(results) == 6
        for out, j in results:
            assert_close(out, refs[j], "tf32", f"thread {t}, size {j}")


def _cudnn_flags():
    """The process-wide cuDNN settings a fullfuse call must leave as they were."""
    cudnn = torch.backends.cudnn
    flags = {"deterministic": cudnn.deterministic, "benchmark": cudnn.benchmark}
    holders = (("cudnn", cudnn), ("conv", getattr(cudnn, "conv", None)), ("rnn", getattr(cudnn, "rnn", None)))
    for name, holder in holders:
        if holder is not None and isinstance(getattr(holder, "fp32_precision", None), str):
            flags[name] = holder.fp32_precision
    try:
        flags["allow_tf32"] = cudnn.allow_tf32
    except RuntimeError as exc:   # "cuDNN conv and cuDNN RNN have different TF32 flags"
        flags["allow_tf32"] = f"error: {exc}"
    return flags


def test_threads_explicit_precision_while_eager_convs():
    """Threads call fallback models with precision "ieee" and "tf32" (cuDNN convolutions) while the main thread runs
    the original model eagerly: no exception, every result within its mode's tolerance (an "ieee" call that ran in TF32
    because another thread flipped the process-wide flags fails 1e-5), the main thread's eager results within TF32's,
    and torch.backends.cudnn's flags unchanged at the end (old code set and restored them process-wide, racing)."""
    flags_before = _cudnn_flags()
    model_a, model_b = make_model("A"), make_model("B")
    jobs, checks = [], []
    for t in range(8):
        mode = "ieee" if t % 2 == 0 else "tf32"
        family = "A" if t < 6 else "B"
        model = model_a if family == "A" else model_b
        fused = fullfuse.fused_model(model, path="fallback", precision=mode)
        shape = (2, 8, 40, 48 + 8 * t) if family == "A" else (2, 32, 8, 8, 8 + t)
        xs = [make_x(family, seed=SEED + 200 + t, shape=shape)]
        refs = [ref64(model, xs[0])]
        results = []
        jobs.append(_alternating_job(fused, xs, results, iterations=8))
        checks.append((t, mode, refs, results))
    x_main = make_x("A", seed=SEED + 300)
    ref_main = ref64(model_a, x_main)
    eager = []

    def main_work(threads):
        with torch.no_grad():
            while any(t.is_alive() for t in threads) or len(eager) < 10:
                eager.append(model_a(x_main))
                if len(eager) > 200:
                    break

    torch.cuda.synchronize()
    failures = _run_threads(jobs, main_work)
    assert not failures, "\n".join(failures) + f" (seed {SEED})"
    for t, mode, refs, results in checks:
        for out, j in results:
            assert_close(out, refs[j], mode, f"thread {t} ({mode})")
    for i, out in enumerate(eager):
        assert_close(out, ref_main, "tf32", f"main thread's eager call {i}")
    assert _cudnn_flags() == flags_before


# ------------------------------------------------------------------ semantics: autocast, special values, empty, grad
AUTOCAST_CASES = [("A", "mean"), ("A", "max"), ("B", "sum"), ("B", "amax"), ("B", "mean")]


@pytest.mark.parametrize("path", ["auto", "fused", "fallback", "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family, kind", AUTOCAST_CASES, ids=[f"{f}-{k}" for f, k in AUTOCAST_CASES])
def test_autocast_matches_original(family, kind, dtype, path):
    """Under torch.autocast("cuda", dtype) a float32 model returns what the original returns under autocast: the same
    dtype (family A: the autocast dtype; B with sum: float32, as autocast runs `sum` in float32; amax / mean: the
    autocast dtype) and shape, values within the dtype's tolerance of float64 over the inputs rounded to it (old code:
    float32 results).  An explicit path that cannot serve autocast says so (UnsupportedError) and is skipped."""
    model = make_model(family, pool=kind, reduction=kind)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    x = make_x(family)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        want = model(x)
        try:
            got = fused(x)
        except fullfuse.UnsupportedError as exc:
            if path in ("fused", "fallback"):
                pytest.skip(f"path {path} under autocast: {exc}")
            raise
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    rounded = make_model(family, pool=kind, reduction=kind).to(dtype)
    rounded.load_state_dict(model.state_dict())
    assert_close(got, ref64(rounded, x.to(dtype)), MODE_OF[dtype], f"{path} under autocast")


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("scale", [1e-7, 1e-5, 1e-3, 1e-2])
@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
def test_bf16_gelu_mean_tiny_activations(path, scale, channels_last):
    """bf16 family A, GELU -> mean, with the conv weight and bias scaled so the conv outputs are ~scale (1e-7, 1e-5:
    far below fp16's normal range, where a half-precision epilogue loses them; 1e-3, 1e-2: tiles whose row sums lie
    around the fused epilogue's redo threshold 2^-8): relative error vs float64 within bf16's tolerance (a fused
    kernel without the redo: 0.3-1.0)."""
    model = make_model("A")
    with torch.no_grad():
        for p in conv_of(model).parameters():
            p.mul_(scale)
    model = model.to(torch.bfloat16)
    fused = fullfuse.fused_model(model, path=path)
    x = make_x("A", torch.bfloat16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        got = fused(x)
    assert_close(got, ref64(model, x), "bfloat16", f"conv outputs ~{scale}")


def _masks(t):
    t = t.detach().float().cpu()
    return torch.isnan(t), t == float("inf"), t == float("-inf")


def _same_masks(a, b):
    return all(torch.equal(p, q) for p, q in zip(_masks(a), _masks(b)))


def _mask_differences(got, want, exact, limit=8):
    """The first output positions whose NaN / +inf / -inf class differs from torch's, with the three values there."""
    classes = [torch.stack(_masks(t)).int().argmax(0) + torch.stack(_masks(t)).any(0).int() for t in (got, want)]
    where = (classes[0] != classes[1]).nonzero().tolist()[:limit]
    flat = [t.detach().double().cpu() for t in (got, want, exact)]
    return [(tuple(i), *(f[tuple(i)].item() for f in flat)) for i in where]


def assert_masks_like_torch(got, model, x, mode):
    """got's NaN / +inf / -inf masks equal those of the model at x's dtype (or of the direct sum's, float64 on the CPU:
    where PyTorch's convolution algorithm spreads a special value beyond the outputs it reaches), and its outputs
    finite in both within the mode's tolerance of float64.  Returns PyTorch's answer and the direct sum's."""
    with torch.no_grad(), cudnn_conv_precision(mode):
        want = model(x)
    exact = ref64(model, x, device="cpu")
    assert _same_masks(got, want) or _same_masks(got, exact), (
        f"masks differ (seed {SEED}) at {_mask_differences(got, want, exact)}")
    finite = torch.isfinite(want.float().cpu()) & torch.isfinite(exact)
    assert_close(got.float().cpu()[finite], exact[finite], mode, "finite outputs")
    return want, exact


SPECIAL_CASES = [("A", "mean"), ("A", "max"), ("B", "sum"), ("B", "amax"), ("B", "mean")]


@pytest.mark.parametrize("path", ["fused", "fallback"])
@pytest.mark.parametrize("mode", ["tf32", "ieee", "bfloat16", "float16"])
@pytest.mark.parametrize("family, kind", SPECIAL_CASES, ids=[f"{f}-{k}" for f, k in SPECIAL_CASES])
def test_nan_inf_masks_match_torch(family, kind, mode, path):
    """Single NaN / +inf / -inf entries in the input (a corner +inf reaches one conv output per channel, with the sign
    of one weight: +inf or, through GELU(-inf), NaN): the fused model's NaN, +inf and -inf masks equal those of the
    original model at the same dtype.  Where PyTorch's own convolution algorithm spreads a special value beyond the
    outputs it reaches mathematically (no implementation can match that), the masks of the direct sum (float64) are
    accepted instead.  Finite outputs stay within the mode's tolerance."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(mode, torch.float32)
    model = make_model(family, dtype, pool=kind, reduction=kind)
    fused = fullfuse.fused_model(model, path=path, precision=mode if dtype == torch.float32 else "auto")
    if family == "A":
        x = make_x("A", dtype, shape=(4, 8, 20, 132))
        x[0, 3, 7, 50], x[1, 0, 0, 0], x[2, 5, 10, 100] = float("nan"), float("inf"), float("-inf")
    else:
        x = make_x("B", dtype, shape=(4, 32, 8, 8, 8))
        x[0, 4, 3, 4, 5], x[1, 0, 0, 0, 0], x[2, 7, 2, 2, 2] = float("nan"), float("inf"), float("-inf")
    with torch.no_grad():
        try:
            got = fused(x)
        except fullfuse.UnsupportedError as exc:
            pytest.skip(f"path {path}: {exc}")
    want, exact = assert_masks_like_torch(got, model, x, mode)
    assert _masks(want)[0].any() and (_masks(want)[1].any() or _masks(exact)[1].any())


class ActivatedB(nn.Module):
    """ConvTranspose3d(32 -> 33, k5, s2, p2) -> activation -> MaxPool3d(window) -> channel sum: family B with an
    activation (the fused kernel applies it per accumulator tile, bias first, before the window max) and channel
    slots past K."""

    ACTIVATIONS = {"relu": nn.ReLU, "gelu_erf": nn.GELU, "gelu_tanh": lambda: nn.GELU("tanh"), "silu": nn.SiLU}

    def __init__(self, activation, window):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(32, 33, 5, stride=2, padding=2)
        self.act, self.pool = self.ACTIVATIONS[activation](), nn.MaxPool3d(window)

    def forward(self, x):
        return torch.sum(self.pool(self.act(self.conv_transpose(x))), dim=1, keepdim=True)


def _activated_b(activation, window, dtype):
    torch.manual_seed(SEED)
    return ActivatedB(activation, window).to(device="cuda", dtype=dtype).eval()


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("window", [2, 3])
@pytest.mark.parametrize("mode", ["tf32", "bfloat16", "float16"])
@pytest.mark.parametrize("activation", list(ActivatedB.ACTIVATIONS))
def test_fused_b_each_activation(activation, mode, window, channels_last):
    """Fused B with each activation in each precision (the fused path must serve it): tiles whose three rows lie in one
    pooling window (3) or in two (2), partial tiles at the edges (input 5 x 6 x 7: conv output 9 x 11 x 13), NaN, +inf
    and -inf in the input.  NaN / +inf / -inf masks equal PyTorch's at the same dtype (or the direct sum's), finite
    outputs within the mode's tolerance of float64."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(mode, torch.float32)
    model = _activated_b(activation, window, dtype)
    fused = fullfuse.fused_model(model, path="fused", precision=precision_of(dtype))
    x = make_x("B", dtype, shape=(3, 32, 5, 6, 7))
    x[0, 4, 3, 4, 5], x[1, 0, 0, 0, 0], x[2, 7, 2, 2, 2] = float("nan"), float("inf"), float("-inf")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        got = fused(x)
    want, _ = assert_masks_like_torch(got, model, x, mode)
    assert _masks(want)[0].any()


@pytest.mark.parametrize("path", ["fused", "fallback"])
@pytest.mark.parametrize("activation", list(ActivatedB.ACTIVATIONS))
def test_fp16_family_b_conv_output_beyond_range(activation, path):
    """fp16 family B with conv outputs beyond 65504 (input 3000 in a 2 x 2 x 2 block of all 32 channels, weights +1
    for the first 16 output channels and -1 for the rest): the activation sees PyTorch's fp16 conv output, +-inf there
    (relu(-inf) = 0, the others NaN), so the masks equal PyTorch's; the other images stay within fp16's tolerance."""
    model = _activated_b(activation, 2, torch.float32)
    with torch.no_grad():
        model.conv_transpose.weight[:, :16].fill_(1.0)
        model.conv_transpose.weight[:, 16:].fill_(-1.0)
        model.conv_transpose.bias.zero_()
    model = model.to(torch.float16)
    fused = fullfuse.fused_model(model, path=path)
    x = make_x("B", shape=(3, 32, 5, 6, 7))
    x[0, :, 2:4, 2:4, 3:5] = 3000.0
    x = x.to(torch.float16)
    with torch.no_grad():
        got, want = fused(x), model(x)
    assert torch.isinf(want[0]).any() or torch.isnan(want[0]).any()   # PyTorch's own answer overflows
    assert _same_masks(got, want), f"at {_mask_differences(got, want, ref64(model, x, device='cpu'))}"
    assert_close(got[1:], ref64(model, x[1:]), "float16", "the other images")


@pytest.mark.parametrize("mode", ["tf32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["sum", "amax"])
@pytest.mark.parametrize("k_out", [5, 33])
@pytest.mark.parametrize("shape", [(2, 32, 8, 8, 8), (10, 32, 16, 16, 16)], ids=["tail-parts", "waves"])
def test_fused_b_padding_channels_stay_out(shape, k_out, reduction, mode):
    """Fused B with fewer than 64 output channels writes all 64 channel slots of its window maxima (the padding
    channels' zero weights times a NaN / inf input give NaN there, in shared memory and in a tail part's workspace);
    only the K real channels reach the output.  The NaN / +inf / -inf masks equal PyTorch's (or the direct sum's),
    finite outputs stay within the mode's tolerance, and a second call gives the same bits (the workspace was left
    zero)."""
    dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
    torch.manual_seed(SEED)
    model = ModelB(reduction)
    model.conv_transpose = nn.ConvTranspose3d(32, k_out, 5, stride=2, padding=2)
    model = model.to(device="cuda", dtype=dtype).eval()
    fused = fullfuse.fused_model(model, path="fused", precision=precision_of(dtype))
    x = make_x("B", dtype, shape=shape)
    x[0, 4, 3, 4, 5], x[1, 0, 0, 0, 0], x[-1, 7, 2, 2, 2] = float("nan"), float("inf"), float("-inf")
    with torch.no_grad():
        got, again = fused(x), fused(x)
    want, _ = assert_masks_like_torch(got, model, x, mode)
    assert _masks(want)[0].any()
    assert torch.equal(got.nan_to_num(), again.nan_to_num()) and _same_masks(got, again)


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
def test_fp16_conv_output_beyond_range(path, pool):
    """fp16 family A with conv outputs beyond 65504 (input 3000 over a 3x3 window of all 8 channels, weights +1 for half
    the output channels and -1 for the other half): where PyTorch's fp16 model gives +inf (GELU(+inf)) the fused model
    gives +inf, where it gives NaN (GELU(-inf)) NaN; the other images stay within fp16's tolerance of float64."""
    model = make_model("A", pool=pool)
    with torch.no_grad():
        w = conv_of(model).weight
        w[:32].fill_(1.0)
        w[32:].fill_(-1.0)
        conv_of(model).bias.zero_()
    model = model.to(torch.float16)
    fused = fullfuse.fused_model(model, path=path)
    x = make_x("A", shape=(3, 8, 20, 132))
    x[0, :, 5:8, 40:43] = 3000.0
    x = x.to(torch.float16)
    with torch.no_grad():
        got, want = fused(x), model(x)
    assert torch.isinf(want[0, :32]).all() and torch.isnan(want[0, 32:]).all()   # PyTorch's own answer
    assert _same_masks(got, want), f"got {got[0].flatten()} (seed {SEED})"
    assert_close(got[1:], ref64(model, x[1:]), "float16", "the other images")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["auto", "torch", "fused", "fallback"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_empty_batch(family, path, dtype):
    """N = 0: PyTorch's result shape and dtype (or PyTorch's own error type); an explicit kernel path may instead say
    it cannot serve the input (UnsupportedError)."""
    model = make_model(family, dtype)
    fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
    x = torch.empty((0, *SHAPE[family][1:]), device="cuda", dtype=dtype)
    with torch.no_grad():
        try:
            want = model(x)
        except Exception as exc:   # PyTorch's own error: the fused model raises the same kind
            with pytest.raises((type(exc), fullfuse.UnsupportedError) if path in ("fused", "fallback") else type(exc)):
                fused(x)
            return
        try:
            got = fused(x)
        except fullfuse.UnsupportedError:
            assert path in ("fused", "fallback")
            return
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)


@pytest.mark.parametrize("path", ["auto", "fused", "fallback"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_requires_grad_runs_torch_path(family, path):
    """An input that requires grad (grad mode on) runs the torch path — `.plans[0].last_path` says "torch" even right
    after a kernel call — and gives the original's values and input gradient."""
    model = make_model(family)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    x = make_x(family)
    with torch.no_grad():
        fused(x)
    # (auto may have measured the torch path faster at this small shape)
    assert fused.plans[0].last_path in (("fused", "fallback", "torch") if path == "auto" else (path,))
    xg, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got = fused(xg)
    assert fused.plans[0].last_path == "torch", (fused.plans[0].last_path, fused.plans[0].last_reason)
    assert got.requires_grad
    want = model(xo)
    assert_close(got, ref64(model, x), "tf32", "values")
    got.sum().backward()
    want.sum().backward()
    assert_close(xg.grad, xo.grad, "tf32", "input gradient vs the original's")


# ------------------------------------------------------------------ a second GPU
@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B", "Bw"])
def test_second_gpu(family, path):
    """Model and input on cuda:1 while cuda:0 is current: every path gives the original's answer there."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with torch.cuda.device(0):
        model = make_model(family, device="cuda:1")
        fused = fullfuse.fused_model(model, path=path, precision="tf32")
        x = make_x(family, device="cuda:1")
        with torch.no_grad():
            got = fused(x)
            again = fused(x)
        assert torch.cuda.current_device() == 0
    assert got.device == x.device
    torch.cuda.synchronize(1)
    assert_close(got, ref64(model, x), "tf32", "first call on cuda:1")
    assert_close(again, ref64(model, x), "tf32", "second call on cuda:1")


def _needs_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")


@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_model_moved_to_another_gpu(family, path):
    """A fused model called on cuda:0, moved with ``.to("cuda:1")``, called there, then moved back: each call gives
    the original's answer on the device its input is on (prepared calls are per device: kernels, streams, buffers)."""
    _needs_two_gpus()
    model = make_model(family)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    with torch.no_grad():
        for device in ("cuda:0", "cuda:1", "cuda:0"):
            fused.to(device)
            x = make_x(family, seed=SEED + int(device[-1]), device=device)
            got = fused(x)
            assert got.device == x.device
            assert_close(got, ref64(model, x), "tf32", f"on {device}")


@pytest.mark.parametrize("set_device", [True, False], ids=["device-set", "device-0-current"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_threads_one_gpu_each(family, set_device):
    """Two threads, each calling its own copy of a fused model on its own GPU (the common multi-GPU inference loop),
    with that GPU made current in the thread or with cuda:0 current in both: every result is its own model's."""
    _needs_two_gpus()
    import copy
    models = [make_model(family, seed=SEED + i, device=f"cuda:{i}") for i in range(2)]
    fused = [fullfuse.fused_model(copy.deepcopy(models[0]), path="auto", precision="tf32"),
             fullfuse.fused_model(models[1], path="auto", precision="tf32")]
    xs = [[make_x(family, seed=SEED + 10 * i + j, device=f"cuda:{i}") for j in range(3)] for i in range(2)]
    results = {}

    def job(i):
        with torch.no_grad(), torch.cuda.device(i if set_device else 0):
            results[i] = [fused[i](x) for _ in range(4) for x in xs[i]]
    failures = in_threads(job, 2)
    assert not failures, failures[0]
    for i in range(2):
        torch.cuda.synchronize(i)
        for k, got in enumerate(results[i]):
            x = xs[i][k % 3]
            assert got.device == x.device
            assert_close(got, ref64(models[i], x), "tf32", f"thread on cuda:{i}, call {k}")


@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_side_stream_on_second_gpu(family, path):
    """A call on a side stream of cuda:1 launches on that stream: the input is rewritten there after a ~0.1 s sleep,
    so a launch on any other stream would read the old values."""
    _needs_two_gpus()
    model = make_model(family, device="cuda:1")
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    old, new = (make_x(family, seed=SEED + k, device="cuda:1") for k in (1, 2))
    x = old.clone()
    with torch.no_grad():
        fused(x)   # (prepared: the timed call below is the kernel alone)
        torch.cuda.synchronize(1)
        side = torch.cuda.Stream(device=1)
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.copy_(new)
            got = fused(x)
        torch.cuda.current_stream(1).wait_stream(side)
    torch.cuda.synchronize(1)
    assert_close(got, ref64(model, new), "tf32", "side stream of cuda:1")


@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_cuda_graph_on_second_gpu(family, path):
    """CUDA graph capture and replay on cuda:1 (cuda:0 current outside the capture)."""
    _needs_two_gpus()
    model = make_model(family, device="cuda:1")
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    with torch.cuda.device(1):
        static_x = make_x(family, device="cuda:1")
        graph, static_out = _capture(fused, static_x)
        new_x = make_x(family, seed=SEED + 11, device="cuda:1")
        static_x.copy_(new_x)
        graph.replay()
    torch.cuda.synchronize(1)
    assert_close(static_out, ref64(model, new_x), "tf32", "replay on cuda:1")


@pytest.mark.parametrize("family", ["A", "B"])
def test_input_on_another_gpu_than_the_model(family):
    """Input on cuda:1, model on cuda:0: the fused model raises as the original does (no kernel reads across GPUs)."""
    _needs_two_gpus()
    model = make_model(family)
    fused = fullfuse.fused_model(model, path="auto", precision="tf32")
    x = make_x(family, device="cuda:1")
    with torch.no_grad():
        with pytest.raises(RuntimeError) as want:
            model(x)
        with pytest.raises(RuntimeError) as got:
            fused(x)
    assert type(got.value) is type(want.value), (got.value, want.value)


@pytest.mark.parametrize("path", ["fused", "fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_data_parallel(family, path):
    """nn.DataParallel over two GPUs around a fused model: its replicas (shallow copies holding broadcast weights) run
    in threads, one per GPU, and the gathered result is the original's."""
    _needs_two_gpus()
    model = make_model(family)
    fused = fullfuse.fused_model(model, path=path, precision="tf32")
    x = make_x(family, shape=(4,) + SHAPE[family][1:])
    with torch.no_grad():
        got = nn.DataParallel(fused, device_ids=[0, 1])(x)
        again = nn.DataParallel(fused, device_ids=[0, 1])(x)
    want = ref64(model, x)
    assert_close(got, want, "tf32", "DataParallel")
    assert_close(again, want, "tf32", "DataParallel, second call")


# ------------------------------------------------------------------ misaligned channels_last input
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["fallback", "auto"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_misaligned_channels_last_input(family, path, dtype):
    """A channels_last input one element past an aligned address (a view at storage offset 1): the fallback gives the
    original's answer (old code: CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)."""
    model = make_model(family, dtype)
    fused = fullfuse.fused_model(model, path=path, precision=precision_of(dtype))
    memory_format = torch.channels_last if family == "A" else torch.channels_last_3d
    x = make_x(family, dtype).contiguous(memory_format=memory_format)
    buf = torch.empty(x.numel() + 16, device="cuda", dtype=dtype)
    off = torch.as_strided(buf, x.shape, x.stride(), storage_offset=1).copy_(x)
    assert off.data_ptr() % 16 and off.is_contiguous(memory_format=memory_format)
    with torch.no_grad():
        got = fused(off)
    assert_close(got, ref64(model, x), MODE_OF[dtype], "misaligned channels_last")


# ------------------------------------------------------------------ workspaces kept per stream
def _kept_zeroed_buffers():
    from fullfuse import workspace
    return list(workspace._zeroed.values())


class _ConvA(nn.Module):
    """Conv -> activation -> global pool of any size (K > 64 takes one launch per 64 channels)."""

    def __init__(self, c, k, kernel, pool):
        super().__init__()
        self.conv = nn.Conv2d(c, k, kernel)
        self.pool = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)

    def forward(self, x):
        return self.pool(torch.nn.functional.gelu(self.conv(x)))


def test_kept_workspaces_stay_zero_across_kernels():
    """One stream, one kept workspace: calls of every kernel that takes a zeroed workspace (fused A wgmma mean / max,
    K > 64, the mma.sync kernel, fused B sum / amax with a tail split, the fallback epilogues, NCHW and channels_last)
    alternate on it, two rounds, each after another kernel used the same bytes.  Every result matches float64 (a
    counter or maximum left behind by one kernel would corrupt the next), and every kept buffer is zero at the end
    (the kernels' invariant, csrc/fused_conv_act_pool/wgmma_reduce.cuh, channel_reduce.cuh, fallback_act_pool.cuh)."""
    from fullfuse import workspace
    workspace.release()
    cases = []
    for pool in ("mean", "max"):
        torch.manual_seed(SEED + 31)
        cases.append(("A", _ConvA(8, 64, 3, pool), (4, 8, 64, 64), "fused"))
        cases.append(("A", _ConvA(8, 96, 3, pool), (2, 8, 40, 72), "fused"))          # K > 64
        cases.append(("A", _ConvA(8, 64, 3, pool), (3, 8, 20, 30), "fused"))          # narrow rows
        cases.append(("A", _ConvA(8, 64, 3, pool), (2, 8, 50, 50), "fallback"))
    for reduction in ("sum", "amax"):
        torch.manual_seed(SEED + 32)
        cases.append(("B", ModelB(reduction), (16, 32, 8, 8, 8), "fused"))            # a tail split over parts
        cases.append(("B", ModelB(reduction), (1, 32, 4, 4, 4), "fused"))             # packing-only blocks
        cases.append(("B", ModelB(reduction), SHAPE["Bw"], "fused"))                  # the packing kernel before it
    runs = []
    for family, model, shape, path in cases:
        model = model.cuda().eval()
        fused = fullfuse.fused_model(model, path=path, precision="tf32")
        for layout in ("nchw", "cl"):
            x = make_x(family, seed=SEED + len(runs), shape=shape)
            if layout == "cl":
                x = x.contiguous(memory_format=torch.channels_last if family == "A" else torch.channels_last_3d)
            runs.append((fused, model, x, ref64(model, x), f"{family} {shape} {path} {layout}"))
    with torch.no_grad():
        for round_ in range(2):
            for fused, model, x, want, what in runs:
                got = fused(x)
                assert fused.plans[0].last_path in ("fused", "fallback"), fused.plans[0].last_reason
                assert_close(got, want, "tf32", f"round {round_}: {what}")
    torch.cuda.synchronize()
    kept = _kept_zeroed_buffers()
    assert kept, "no workspace was kept"
    for buf in kept:
        view = torch.as_tensor(buf, device=f"cuda:{buf.device}")
        assert int(torch.count_nonzero(view)) == 0, "a kernel left its workspace non-zero"


def test_scratch_is_per_thread_and_stream():
    """Family B's packed weights live in a scratch buffer that one launch writes and the next reads, so two threads
    on ONE stream (their launches interleave) never share one; each stream has its own, and a capture gets a fresh
    one.  Then 4 threads on the default stream call two family-B models with different weights: each result is its
    own model's."""
    from fullfuse import workspace
    got = {}

    def take(name):   # (the tensor itself: held here, its memory cannot pass to the next thread)
        got[name] = workspace.buffer(0, 4096, workspace.PACKED)

    threads = [threading.Thread(target=take, args=(f"t{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    take("main")
    assert len({got["t0"].data_ptr(), got["t1"].data_ptr(), got["main"].data_ptr()}) == 3
    assert workspace.buffer(0, 4096, workspace.PACKED) is got["main"]   # kept for this thread
    with torch.cuda.stream(torch.cuda.Stream()):
        assert workspace.buffer(0, 4096, workspace.PACKED).data_ptr() != got["main"].data_ptr()
        assert workspace.buffer(0, 4096).data_ptr() != workspace.buffer(0, 4096, workspace.PACKED).data_ptr()
    models = [make_model("B", seed=SEED + 40 + i) for i in range(2)]
    fused = [fullfuse.fused_model(m, path="fused", precision="tf32") for m in models]
    xs = [make_x("B"), make_x("Bw")]   # packed in the fused kernel / by the packing kernel before it
    refs = [[ref64(m, x) for x in xs] for m in models]
    results = [[] for _ in range(4)]

    def job(t):
        with torch.no_grad():
            for i in range(8):
                results[t].append(fused[t % 2](xs[i % 2]))

    failures = in_threads(job, 4)
    torch.cuda.synchronize()
    assert not failures, "\n".join(failures)
    for t in range(4):
        for i, out in enumerate(results[t]):
            assert_close(out, refs[t % 2][i % 2], "tf32", f"thread {t} call {i}")


@pytest.mark.parametrize("family", ["A", "B", "Bw"])
def test_graph_replays_beside_eager_calls(family):
    """A captured fused call replays on one stream while eager calls of the same model run on another, both queued
    behind busy kernels so that they overlap: the graph's workspace is its own (old design risk: a kept workspace
    shared by a replay and an eager call on another stream)."""
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep unavailable")
    model = make_model(family)
    fused = fullfuse.fused_model(model, path="fused", precision="tf32")
    static_x = make_x(family)
    graph, static_out = _capture(fused, static_x)
    xs = [make_x(family, seed=SEED + 50 + i) for i in range(3)]
    refs = [ref64(model, x) for x in xs]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for i, x in enumerate(xs):
        static_x.copy_(x)
        torch.cuda.synchronize()
        with torch.no_grad():
            with torch.cuda.stream(s1):
                torch.cuda._sleep(SLEEP_CYCLES // 10)
                graph.replay()
            with torch.cuda.stream(s2):
                torch.cuda._sleep(SLEEP_CYCLES // 10)
                eager = fused(x)
        torch.cuda.synchronize()
        assert_close(static_out, refs[i], "tf32", f"replay {i}")
        assert_close(eager, refs[i], "tf32", f"eager call {i} beside the replay")


# ------------------------------------------------------------------ the fallback's first-call memory
def test_fallback_first_call_peak_memory():
    """The fallback's first call for a problem tunes its chunk schedule; it must not hold the whole conv output (old
    code: one candidate ran the whole batch as one chunk, ~0.8 GB here, an out-of-memory risk where chunking fits).
    Its extra memory stays within the default schedule's (two 256 MB chunks, what every call may use, e.g. under
    capture) or 1.15 x a later call's, whichever is larger, and below the whole conv output."""
    from fullfuse.fallback import pipeline

    model = make_model("A")
    fused = fullfuse.fused_model(model, path="fallback", precision="tf32")
    x = make_x("A", shape=(64, 8, 224, 232))   # a shape no other test runs: the first call is the problem's first
    per_image = 64 * 222 * 230 * 4
    spans = pipeline.chunks(64, per_image, pipeline.CHUNK_BYTES)
    default_peak = pipeline.peak_bytes(spans, pipeline.OVERLAP and len(spans) > 1, per_image)

    def extra():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            out = fused(x)
        torch.cuda.synchronize()
        result = torch.cuda.max_memory_allocated() - base
        del out
        return result

    first, second = extra(), extra()
    # the chunk's channels_last input copy and cuDNN's workspace come on top of the conv outputs: 25 % margin
    bound = max(1.25 * default_peak, 1.15 * second)
    assert first <= bound < 64 * per_image, (
        f"first call {first / 2**20:.0f} MiB, second {second / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB")
