"""Property tests (hypothesis) on the GPU: per family, random valid problems — shapes, kernel sizes, strides, padding,
dilation (A) / output_padding (B), pools / reductions, activations, dtypes and precisions, layouts (contiguous,
channels_last, a non-contiguous slice of a larger tensor) — each run through every path of the functional ops against
the float64 reference.  Path "fused" either serves the problem within tolerance or says why not (UnsupportedError);
"fallback", "auto" and "torch" must always serve it.  Skipped without CUDA.

FULLFUSE_PROPERTY_EXAMPLES sets the number of examples per family (default 200)."""
import math
import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fullfuse  # noqa: E402
from fullfuse import launch, ops  # noqa: E402
from fullfuse.fallback import cudnn_conv, pipeline  # noqa: E402
from fullfuse.precision import TOLERANCE, cudnn_conv_precision  # noqa: E402

pytestmark = pytest.mark.gpu
EXAMPLES = int(os.environ.get("FULLFUSE_PROPERTY_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])
PATHS = ("fused", "fallback", "auto", "torch")
ACTIVATIONS = ("gelu_erf", "gelu_tanh", "relu", "silu", "none")
MODES = (("float32", "tf32"), ("float32", "ieee"), ("bfloat16", "auto"), ("float16", "auto"))


@pytest.fixture(autouse=True)
def fast_and_poisoned(monkeypatch):
    """Kernel outputs start as NaN (an unwritten element cannot pass); the fallback's chunk-schedule tuning and the
    cuDNN frontend's plan timing are off (each times many candidates per new problem, and these problems are all new:
    runtime, not correctness; the frontend's conv is checked by the other GPU tests)."""
    monkeypatch.setattr(launch, "POISON_OUTPUTS", True)
    monkeypatch.setattr(pipeline, "AUTOTUNE", False)
    monkeypatch.setattr(cudnn_conv, "ENABLED", False)


def _mode_name(dtype_name, precision):
    return precision if dtype_name == "float32" else dtype_name


def _input(shape, dtype, layout, seed):
    """x of ``shape`` in the drawn layout: contiguous, channels_last(_3d), or a slice of a larger tensor."""
    gen = torch.Generator().manual_seed(seed)
    n, c, *space = shape
    if layout == "slice":
        big = torch.randn(n, c + 2, *[s + 3 for s in space], generator=gen)
        index = (slice(None), slice(1, c + 1), *[slice(2, 2 + s) for s in space])
        return big.to("cuda", dtype)[index]
    x = torch.randn(shape, generator=gen).to("cuda", dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    return x


def _params(w_shape, fan_in, out_channels, has_bias, dtype, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    bound = 1 / math.sqrt(fan_in)
    w = ((torch.rand(w_shape, generator=gen) * 2 - 1) * bound).to("cuda", dtype)
    b = ((torch.rand(out_channels, generator=gen) * 2 - 1) * bound).to("cuda", dtype) if has_bias else None
    return w, b


def _check(out, ref, scale, mode, what):
    """|out - ref| <= tol * max(|ref|, |scale|, floor).  A mode's rounding errors are relative to the terms each output
    sums, not to the result: ``scale`` is the problem run on |x|, |w|, |b| without activation (the terms' magnitude),
    so a result that cancels to near zero is held to its terms' rounding; the floor covers a zero problem."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(out64).all(), f"{what}: non-finite output {out64.flatten()[:16]}"
    tol = TOLERANCE[mode]
    diff, norm, terms = (out64 - ref64).norm().item(), ref64.norm().item(), scale.double().cpu().norm().item()
    floor = 1e-4 * math.sqrt(max(ref64.numel(), 1))
    assert diff <= tol * max(norm, terms, floor), (
        f"{what}: |out-ref| {diff:.3e}, |ref| {norm:.3e}, |terms| {terms:.3e}, tol {tol}")


def _every_path(run, ref, scale, mode, what):
    """run(path) on every path; "fused" may refuse (UnsupportedError), the others must serve."""
    served = []
    for path in PATHS:
        try:
            with torch.no_grad():
                out = run(path)
        except fullfuse.UnsupportedError as exc:
            assert path == "fused", f"{what}: path {path} refused: {exc}"
            note(f"fused refused: {exc}")
            continue
        torch.cuda.synchronize()
        _check(out, ref, scale, mode, f"{what}, path {path}")
        served.append(path)
    note(f"served by {served}")


@st.composite
def problems_a(draw):
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    # smallest input with one output position: H + 2p >= d (k - 1) + 1
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), max(1, dh * (kh - 1) + 1 - 2 * ph) + 30))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), max(1, dw * (kw - 1) + 1 - 2 * pw) + 140))
    return dict(n=draw(st.integers(1, 4)), c_in=draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16])),
                c_out=draw(st.sampled_from([1, 7, 16, 24, 40, 64, 72])), h=h, w=w,
                kernel=(kh, kw), stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw),
                bias=draw(st.booleans()), activation=draw(st.sampled_from(ACTIVATIONS)),
                pool=draw(st.sampled_from(["mean", "max"])), keepdim=draw(st.booleans()),
                dtype_mode=draw(st.sampled_from(MODES)),
                layout=draw(st.sampled_from(["contiguous", "channels_last", "slice"])),
                seed=draw(st.integers(0, 2**31 - 1)))


def _check_problem(p, op, space, w_shape, fan_in, geometry, label):
    """One drawn problem through ``op`` (ops.conv_act_pool / ops.convt_pool_reduce) on every path vs float64."""
    note(str(p))
    dtype_name, precision = p["dtype_mode"]
    dtype, mode = getattr(torch, dtype_name), _mode_name(*p["dtype_mode"])
    x = _input((p["n"], p["c_in"], *space), dtype, p["layout"], p["seed"])
    w, b = _params(w_shape, fan_in, p["c_out"], p["bias"], dtype, p["seed"])
    with cudnn_conv_precision("ieee"):
        ref = op(x.double(), w.double(), None if b is None else b.double(), path="torch", **geometry)
        scale = op(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), path="torch",
                   **{**geometry, "activation": "none"})
    _every_path(lambda path: op(x, w, b, path=path, precision=precision, **geometry), ref, scale, mode,
                f"{label} {p}")


@SETTINGS
@given(p=problems_a())
def test_family_a_property(p):
    """Family A (Conv2d -> activation -> global mean / max pool) on every path vs float64."""
    geometry = dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"], activation=p["activation"],
                    pool=p["pool"], keepdim=p["keepdim"])
    _check_problem(p, ops.conv_act_pool, (p["h"], p["w"]), (p["c_out"], p["c_in"], *p["kernel"]),
                   p["c_in"] * math.prod(p["kernel"]), geometry, "A")


@st.composite
def problems_b(draw):
    dims = draw(st.sampled_from([3, 3, 3, 2]))
    kernel, stride, padding, output_padding, window, space = [], [], [], [], [], []
    for _ in range(dims):
        i, k, s = draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 3))
        op = draw(st.integers(0, s - 1))                       # output_padding < stride
        base = (i - 1) * s + (k - 1) + op                      # conv output = base - 2p + 1 >= 1
        pad = draw(st.integers(0, min(2, k - 1, base // 2)))
        conv_out = base - 2 * pad + 1
        kernel.append(k), stride.append(s), padding.append(pad), output_padding.append(op), space.append(i)
        window.append(draw(st.integers(1, min(3, conv_out))))  # the pooling window fits the conv output
    return dict(dims=dims, n=draw(st.integers(1, 3)), c_in=draw(st.sampled_from([3, 4, 5, 8, 16, 24, 32])),
                c_out=draw(st.sampled_from([1, 5, 16, 33, 64])), space=tuple(space), kernel=tuple(kernel),
                stride=tuple(stride), padding=tuple(padding), output_padding=tuple(output_padding),
                window=tuple(window), bias=draw(st.booleans()), activation=draw(st.sampled_from(ACTIVATIONS)),
                reduction=draw(st.sampled_from(["sum", "mean", "max"])), keepdim=draw(st.booleans()),
                dtype_mode=draw(st.sampled_from(MODES)),
                layout=draw(st.sampled_from(["contiguous", "channels_last", "slice"])),
                seed=draw(st.integers(0, 2**31 - 1)))


@SETTINGS
@given(p=problems_b())
def test_family_b_property(p):
    """Family B (ConvTranspose -> activation -> max-pool window -> channel sum / mean / max), every path vs float64."""
    geometry = dict(stride=p["stride"], padding=p["padding"], output_padding=p["output_padding"], dilation=1,
                    window=p["window"], activation=p["activation"], reduction=p["reduction"], keepdim=p["keepdim"])
    _check_problem(p, ops.convt_pool_reduce, p["space"], (p["c_in"], p["c_out"], *p["kernel"]),
                   p["c_out"] * math.prod(p["kernel"]), geometry, "B")
