"""GPU tests: every path against float64 on fresh random inputs (outputs poisoned with NaN first), the seed models,
bad inputs, determinism, NaN/Inf behaviour and a dense sweep of the fast GELU.  Skipped without CUDA."""
import copy
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullfuse
from fullfuse import launch
from fullfuse.check import cases, matrix, run_case
from fullfuse.measure import errors
from fullfuse.precision import TOLERANCE, cudnn_conv_precision
from fullfuse.seed_models import SeedA, SeedB

pytestmark = pytest.mark.gpu
SEED = (int.from_bytes(os.urandom(4), "little") if "FULLFUSE_TEST_SEED" not in os.environ
        else int(os.environ["FULLFUSE_TEST_SEED"]))
ALL_CASES = cases("A") + cases("B")


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(launch, "POISON_OUTPUTS", True)


def _id(combo):
    return f"{combo['path']}-{combo['dtype']}-{combo['precision']}-{'cl' if combo['channels_last'] else 'contig'}"


@pytest.mark.parametrize("combo", list(matrix(True)), ids=_id)
@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.spec.family}:{c.name}" for c in ALL_CASES])
def test_paths_match_float64(case, combo):
    result = run_case(case, device="cuda", seed=SEED, **combo)
    assert result["ok"], f"{result} (seed {SEED})"


FUSED_COMBOS = [c for c in matrix(True) if c["path"] == "fallback"]


@pytest.mark.parametrize("combo", FUSED_COMBOS, ids=_id)
@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.spec.family}:{c.name}" for c in ALL_CASES])
def test_fused_path_matches_float64(case, combo):
    """path="fused" explicitly, so a silent step down to the fallback cannot hide a fused-kernel error."""
    combo = dict(combo, path="fused")
    try:
        result = run_case(case, device="cuda", seed=SEED, **combo)
    except fullfuse.UnsupportedError as exc:
        pytest.skip(str(exc))
    assert result["ok"], f"{result} (seed {SEED})"


def test_fused_a_check_cases_when_the_driver_refuses_the_tensor_map(monkeypatch):
    """The check cases on path "fused" with every tensor map refused (runtime.tensor_map -> None, as where the driver
    cannot make one): family A's TMA plans step to the per-thread 16-byte copy loaders (VEC, NCHW4, NCHW8) and stride-2
    columns to the mma.sync kernel, which must give the same answers."""
    from fullfuse import calls, runtime
    from fullfuse.check import cases, run_case
    refused = []
    monkeypatch.setattr(runtime, "tensor_map", lambda *args: refused.append(args) and None)
    monkeypatch.setattr(calls, "_registry", {})   # fresh prepared calls: no tensor map kept from earlier tests
    bad, ran = [], 0
    for case in cases("A"):
        for dtype, prec in (("float32", "tf32"), ("float32", "ieee"), ("bfloat16", "auto")):
            for cl in (False, True):
                try:
                    r = run_case(case, path="fused", dtype=dtype, precision=prec, channels_last=cl, seed=SEED)
                except fullfuse.UnsupportedError:
                    continue
                ran += 1
                if not r["ok"]:
                    bad.append((case.name, dtype, prec, cl, r))
    assert ran and refused and not bad, f"seed {SEED}: ran {ran}, refused {len(refused)}, bad {bad}"


def _seed_input(family, dtype=torch.float32, channels_last=False):
    shape = (8, 8, 128, 160) if family == "A" else (2, 32, 32, 32, 32)
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(SEED))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if family == "A" else torch.channels_last_3d)
    return x


def _reference(model, x):
    ref = type(model)().cuda().double()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        return ref(x.double())


@pytest.mark.parametrize("path", ["fallback", "auto"])
@pytest.mark.parametrize("mode", ["tf32", "ieee", "bfloat16"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("family", ["A", "B"])
def test_seed_models(family, path, mode, channels_last):
    torch.manual_seed(SEED)
    dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
    model = (SeedA() if family == "A" else SeedB()).cuda().eval()
    x = _seed_input(family, torch.float32, channels_last)
    ref = _reference(model, x.to(dtype))
    fused = fullfuse.fused_model(model.to(dtype), path=path, precision="auto" if mode == "bfloat16" else mode)
    with torch.no_grad():
        out = fused(x.to(dtype))
    err = errors(out, ref)
    assert err["relerr"] <= TOLERANCE[mode], (err, fused.plans[0].last_path, SEED)
    assert fused.plans[0].last_path in ("fused", "fallback")


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.shape[0] > 1], ids=lambda c: f"{c.spec.family}:{c.name}")
def test_chunked_pipeline(case, overlap, monkeypatch):
    """One image per chunk, with and without the side stream: must give the unchunked answer."""
    from fullfuse.fallback import pipeline
    monkeypatch.setattr(pipeline, "AUTOTUNE", False)
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 1)
    monkeypatch.setattr(pipeline, "OVERLAP", overlap)
    result = run_case(case, "fallback", precision="ieee", device="cuda", seed=SEED)
    assert result["ok"], f"{result} (seed {SEED})"


@pytest.mark.parametrize("family", ["A", "B"])
def test_deterministic_bits(family):
    model = (SeedA() if family == "A" else SeedB()).cuda().eval()
    fused = fullfuse.fused_model(model)
    x = _seed_input(family)
    with torch.no_grad():
        first, second = fused(x), fused(x)
    assert torch.equal(first, second)


def test_state_dict_reload_is_seen_on_gpu():
    model = SeedA().cuda().eval()
    fused = fullfuse.fused_model(model, path="fallback")
    other = SeedA().cuda().eval()
    model.load_state_dict(other.state_dict())
    x = _seed_input("A")
    with torch.no_grad():
        assert errors(fused(x), _reference(other, x))["relerr"] <= TOLERANCE["tf32"]


def test_non_contiguous_and_empty_batch():
    model = SeedB().cuda().eval()
    fused = fullfuse.fused_model(model, path="fallback")
    x = _seed_input("B")
    strided = x[:, :, ::2, :, ::2]
    with torch.no_grad():
        assert errors(fused(strided), _reference(model, strided))["relerr"] <= TOLERANCE["tf32"]
        empty = torch.empty(0, 32, 8, 8, 8, device="cuda")
        auto = fullfuse.fused_model(model)
        assert auto(empty).shape == model(empty).shape
        with pytest.raises(fullfuse.UnsupportedError, match="shape"):
            fused(empty)


@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_b_input_off_a_16_byte_boundary(channels_last):
    """An input view one element past a 16-byte boundary: NCDHW takes the kernel's per-element loader (not the 16-byte
    one) and must still match; channels_last_3d cannot be copied in 16-byte groups, so "fused" refuses it with the
    reason and "auto" steps down (fallback, or torch where measured faster)."""
    model = SeedB().cuda().eval()
    x = _seed_input("B", channels_last=channels_last)[:, :, :12, :12, :12].contiguous(
        memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    buf = torch.empty(x.numel() + 8, device="cuda")
    off = torch.as_strided(buf, x.shape, x.stride(), storage_offset=1).copy_(x)
    assert off.data_ptr() % 16 and off.is_contiguous(
        memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    ref = _reference(model, x)
    with torch.no_grad():
        auto = fullfuse.fused_model(model)
        assert errors(auto(off), ref)["relerr"] <= TOLERANCE["tf32"]
        fused = fullfuse.fused_model(model, path="fused")
        if channels_last:
            with pytest.raises(fullfuse.UnsupportedError, match="aligned"):
                fused(off)
            # the fallback, or torch where auto's first-call measurement found it faster at this small shape; the
            # reason says why the fused kernel stepped down either way
            plan = auto.plans[0]
            assert plan.last_path == "fallback" or "measured" in plan.last_reason, plan.last_reason
            assert plan.last_path in ("fallback", "torch") and "aligned" in plan.last_reason, plan.last_reason
        else:
            assert errors(fused(off), ref)["relerr"] <= TOLERANCE["tf32"]
            assert auto.plans[0].last_path == "fused"


@pytest.mark.parametrize("conv, width, precision, kernel", [
    ((8, 64, 3), 64, "tf32", "sm_90 wgmma kernel, NCHW rows by TMA, two output rows per tile, 10 ops per tile "
                             "(straight-line)"),                         # rows of 62
    ((8, 64, 3), 132, "tf32", "sm_90 wgmma kernel, NCHW rows by TMA, 10 ops per tile (straight-line)"),   # rows of 130
    ((8, 128, 3), 64, "tf32", "sm_90 wgmma kernel, NCHW rows by TMA"),   # two launches of 64 channels
    ((8, 64, 3), 32, "tf32", "mma.sync kernel, TF32"),                   # rows of 30 pixels
    ((8, 64, 3), 50, "tf32", "mma.sync kernel, TF32"),                   # rows of 48, W % 4 != 0: no TMA, one row
                                                                         # per tile
    ((8, 64, 3), 66, "ieee", "mma.sync kernel, 3xTF32"),                 # ieee: rows of 64
    ((8, 64, 3), 68, "ieee", "sm_90 wgmma kernel, NCHW rows by"),       # ieee: rows of 66
    ((8, 64, 3, 2, 1), 256, "tf32", "sm_90 wgmma kernel, NCHW rows by TMA split into even / odd columns (stride 2)"),
])
def test_fused_a_plan_names_the_kernel(conv, width, precision, kernel):
    """`.plans` says which fused kernel served a call (the C API's ff_fused_conv_act_pool_kernel): the seed's conv takes
    the wgmma kernel with TMA rows, also with 128 output channels; rows of 33..64 output pixels two per wgmma tile (TMA
    rows); rows of <= 32 (ieee <= 64; <= 48 where the rows cannot come by TMA) the mma.sync kernel, whose 16-pixel tiles
    are faster there."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    model = nn.Sequential(nn.Conv2d(*conv), nn.GELU(), nn.AdaptiveAvgPool2d(1)).cuda().eval()
    fused = fullfuse.fused_model(model, path="fused", precision=precision)
    x = torch.randn(2, 8, 64, width, device="cuda")
    with torch.no_grad():
        fused(x)
    assert fused.plans[0].last_path == "fused"
    assert fused.plans[0].last_reason.startswith("fused kernel serves it: " + kernel), fused.plans[0].last_reason


def test_fused_a_small_channels_last_input_is_copied():
    """channels_last input with fewer than 8 channels and W % 4 == 0 (fp32): the fused call reads a contiguous copy
    through the NCHW loaders (faster than the per-element channels_last loader, docs/design.md), same result."""
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d(1)).cuda().eval()
    x = torch.randn(2, 3, 20, 132, device="cuda", generator=torch.Generator("cuda").manual_seed(SEED))
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        want = copy.deepcopy(model).double()(x.double())
        fused = fullfuse.fused_model(model, path="fused", precision="ieee")
        got = fused(x.contiguous(memory_format=torch.channels_last))
    assert (fused.plans[0].last_path == "fused"
            and "contiguous copy" in fused.plans[0].last_reason), fused.plans[0].last_reason
    assert errors(got, want)["relerr"] <= TOLERANCE["ieee"]


def test_wrong_device_dtype_and_rank():
    model = SeedA().cuda().eval()
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        with pytest.raises(RuntimeError):
            fused(torch.randn(2, 8, 16, 16, device="cuda", dtype=torch.float16))   # dtype differs from weights
        with pytest.raises(RuntimeError):
            fused(torch.randn(2, 8, 16, device="cuda"))                            # rank 3 is unbatched C,H,W: wrong C
        model64 = SeedA().cuda().double().eval()
        x64 = torch.randn(2, 8, 16, 16, device="cuda", dtype=torch.float64)
        auto64 = fullfuse.fused_model(model64)
        assert torch.allclose(auto64(x64), model64(x64))
        assert auto64.plans[0].last_path == "torch" and "float64" in auto64.plans[0].last_reason
        with pytest.raises(fullfuse.UnsupportedError, match="float64"):
            fullfuse.fused_model(model64, path="fallback")(x64)
    cpu_weights = fullfuse.fused_model(SeedA().eval())
    with torch.no_grad(), pytest.raises(RuntimeError):
        cpu_weights(torch.randn(2, 8, 16, 16, device="cuda"))


def test_nan_and_inf_propagate_like_torch():
    """A NaN or Inf in an image makes that image's pooled values non-finite, as in torch; B keeps the NaN at
    exactly the pooled positions whose windows see it (compared with the float64 reference)."""
    model_a = SeedA().cuda().eval()
    x = _seed_input("A")[:3].clone()
    x[0, 3, 50, 60] = float("nan")
    x[1, 5, 10, 20] = float("inf")
    with torch.no_grad():
        got = fullfuse.fused_model(model_a, path="fallback")(x)
    assert torch.isnan(got[0]).all() and not torch.isfinite(got[1]).any() and torch.isfinite(got[2]).all()
    model_b = SeedB().cuda().eval()
    v = _seed_input("B").clone()
    v[0, 4, 7, 9, 11] = float("nan")
    with torch.no_grad():
        got = fullfuse.fused_model(model_b, path="fallback")(v)
    want = _reference(model_b, v)
    assert torch.isnan(got).any() and torch.equal(torch.isnan(got), torch.isnan(want))


def test_fast_gelu_dense_sweep_and_specials():
    """GELU evaluated by the fallback kernel, one value per image: conv 1x1 with weight 1 (ieee) is the identity.
    Bound: |err| <= 1e-6 * max(1, |x|) against float64, over a dense sweep of float32 values."""
    conv = nn.Conv2d(1, 1, 1, bias=False).cuda()
    with torch.no_grad():
        conv.weight.fill_(1.0)
    model = nn.Sequential(conv, nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval()
    fused = fullfuse.fused_model(model, path="fallback", precision="ieee")
    worst = 0.0
    for lo, hi in ((-12.0, 12.0), (-0.01, 0.01)):
        x = torch.linspace(lo, hi, 1 << 22, device="cuda", dtype=torch.float32).view(-1, 1, 1, 1)
        with torch.no_grad():
            got = fused(x).view(-1).double()
        x64 = x.view(-1).double()
        ref = 0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))
        worst = max(worst, ((got - ref).abs() / x64.abs().clamp(min=1)).max().item())
    assert worst <= 1e-6, worst
    specials = torch.tensor([float("-inf"), float("inf"), float("nan"), 3e38, -3e38, 1e-30],
                            device="cuda").view(-1, 1, 1, 1)
    with torch.no_grad():
        got, want = fused(specials).view(-1), F.gelu(specials).view(-1)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite]) and torch.equal(got[torch.isinf(want)], want[torch.isinf(want)])


def _tf32(t):   # drop the low 13 mantissa bits: exact in a TF32 MMA
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_fused_a_gelu_dense_sweep(pool):
    """The fused A kernel's own GELU (the clamp-free form it takes while inputs and weights are bounded, wg_epi in
    csrc/fused_conv_act_pool/wgmma_epilogue.cuh): a 1x1 conv of weight 1 over TF32-exact inputs is the identity, one
    value per image, |err| <= 1e-6 * max(1, |x|) against float64 over a dense sweep plus large finite values up to the
    bound.  (One channel per image is the same memory in either layout; test_fused_a_gelu_specials covers layouts.)"""
    conv = nn.Conv2d(1, 1, 1, bias=False).cuda()
    with torch.no_grad():
        conv.weight.fill_(1.0)
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    fused = fullfuse.fused_model(nn.Sequential(conv, nn.GELU(), pool_layer).eval(), path="fused", precision="tf32")
    big = torch.tensor([16.0, 16.5, 20.0, 1e6, 1e15], device="cuda")
    x = torch.cat([torch.linspace(-12.0, 12.0, 1 << 18, device="cuda"), big, -big])
    x = _tf32(x).view(-1, 1, 1, 1)
    # rows of 128 columns (rows of <= 56 take the mma.sync kernel): max over 128 copies of the value, or the mean of
    # the value and 127 of -1e4 (GELU -0 in the kernel too), times 128 — exact, so the sweep sees each GELU value
    wide = (x.expand(-1, 1, 1, 128) if pool == "max"
            else torch.cat([x, torch.full_like(x, -1e4).expand(-1, 1, 1, 127)], 3))
    with torch.no_grad():
        got = fused(wide.contiguous()).view(-1).double() * (1 if pool == "max" else 128)
    x64 = x.view(-1).double()
    ref = 0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))
    worst = ((got - ref).abs() / x64.abs().clamp(min=1)).max().item()
    assert worst <= 1e-6, worst
    assert fused.plans[0].last_path == "fused"
    if torch.cuda.get_device_capability() == (9, 0):
        assert "wgmma" in fused.plans[0].last_reason, fused.plans[0].last_reason


def _identity_gelu_mean(dtype):
    """The fused model of a 1x1 conv of weight 1 (the identity over one channel), GELU (erf), global mean pool: each
    image's output is the mean GELU of its own values."""
    conv = nn.Conv2d(1, 1, 1, bias=False).cuda()
    with torch.no_grad():
        conv.weight.fill_(1.0)
    model = nn.Sequential(conv, nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval().to(dtype)
    return fullfuse.fused_model(model, path="fused")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_a_16bit_gelu_dense_sweep(dtype):
    """16-bit input, GELU, mean: the fused A kernel's half-precision epilogue (wg_epi_h2; its arithmetic is emulated
    in tests/test_gelu_h2.py).  A 1x1 conv of weight 1 is the identity, one value per image, every value of the dtype in
    [-20, 20] plus large ones (fp16 up to 6.5e4 stay in the half-precision epilogue; bf16's 1e6 and 1e20 leave fp16's
    range, so the epilogue's check sends those tiles through the fp32 GELU):
    |out - gelu(x)| <= (1.5e-3 + the output's rounding to the dtype) * max(1, |x|) against float64."""
    fused = _identity_gelu_mean(dtype)
    vals = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    vals = vals[torch.isfinite(vals) & (vals.abs() <= 20)]
    big = torch.tensor([100.0, 1000.0, 3e4, 5.9e4, 6e4, 6.5e4] + ([1e6, 1e20] if dtype == torch.bfloat16 else []),
                       device="cuda", dtype=dtype)
    x = torch.cat([vals, big, -big]).view(-1, 1, 1, 1)
    with torch.no_grad():
        got = fused(x.expand(-1, 1, 1, 128).contiguous()).view(-1).double()   # 128 copies: the wgmma kernel's rows
    assert fused.plans[0].last_path == "fused"
    if torch.cuda.get_device_capability() == (9, 0):
        assert "wgmma" in fused.plans[0].last_reason, fused.plans[0].last_reason
    x64 = x.view(-1).double()
    ref = 0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))
    half_ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11   # of |out| <= max(1, |x|): 8 / 11 significant bits
    worst = ((got - ref).abs() / x64.abs().clamp(min=1)).max().item()
    assert worst <= 1.5e-3 + half_ulp, worst


@pytest.mark.parametrize("mix", [False, True], ids=["one_scale", "with_large"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_a_16bit_gelu_mean_of_small_inputs(dtype, mix):
    """16-bit input, GELU, mean of zero-mean activations of scale 1e-4 .. 1 (a 1x1 conv of weight 1: the identity):
    their linear terms cancel, so the mean is GELU's quadratic term, which the half-precision epilogue must keep
    relatively (its tanh form) or hand to the fp32 GELU (rows whose sum is under the redo threshold).  with_large: a
    quarter of each row's pixels 100x larger.  Relative error of the 16 means vs float64 within the dtype's tolerance
    plus one step of the output dtype per mean (small fp16 means are subnormal) — the ex2 form missed scale 1e-2 by
    30 %."""
    fused = _identity_gelu_mean(dtype)
    g = torch.Generator("cuda").manual_seed(SEED)
    for scale in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 1.0):
        x = torch.randn(16, 1, 8, 256, device="cuda", generator=g) * scale
        if mix:
            x[..., ::4] *= 100
        x = x.to(dtype)
        with torch.no_grad():
            got = fused(x).view(-1).double()
        assert fused.plans[0].last_path == "fused"
        ref = F.gelu(x.double()).mean(dim=(1, 2, 3))
        mantissa = 10 if dtype == torch.float16 else 7   # the dtype's step at |ref| (subnormals: at its tiny)
        step = torch.exp2(torch.floor(torch.log2(ref.abs().clamp(min=torch.finfo(dtype).tiny))) - mantissa)
        err = (got - ref).norm().item()
        assert err <= TOLERANCE[str(dtype)[6:]] * ref.norm().item() + step.norm().item(), (scale, err, SEED)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_a_16bit_conv_outputs_beyond_fp16(dtype, channels_last):
    """Conv outputs over fp16's range (here ~2e5 at a few pixels) while the pooled means stay small: the half-precision
    epilogue turns those pixels into NaN, its check must catch that and run those tiles through the fp32 GELU.  bf16
    (fp32's range): the result matches float64.  fp16: PyTorch rounds the conv output to fp16, so those pixels are
    +inf and image 1's means inf; the fused result has PyTorch's inf / NaN masks and its finite values."""
    g = torch.Generator("cuda").manual_seed(SEED)
    conv = nn.Conv2d(8, 16, 3).cuda()
    with torch.no_grad():
        conv.weight.uniform_(0.5, 1.0, generator=g)
    model = nn.Sequential(conv, nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval().to(dtype)
    fused = fullfuse.fused_model(model, path="fused")
    x = torch.randn(4, 8, 66, 200, device="cuda", generator=g)
    x[1, :, 30:33, 40:43] = 3000.0                       # one output pixel sees 72 x 3000 x ~0.75
    x = x.to(dtype).contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    with torch.no_grad():
        got = fused(x).double()
    assert fused.plans[0].last_path == "fused"
    if dtype == torch.float16:
        with torch.no_grad():
            eager = model(x).double()
        assert torch.isinf(eager[1]).all() and torch.isfinite(eager[[0, 2, 3]]).all()
        assert torch.equal(torch.isnan(got), torch.isnan(eager)) and torch.equal(torch.isinf(got), torch.isinf(eager))
        assert torch.equal(got[1], eager[1])
        fin = torch.isfinite(eager)
        err = ((got[fin] - eager[fin]).norm() / eager[fin].norm()).item()
        assert err <= TOLERANCE["float16"], err
        return
    ref = nn.Sequential(nn.Conv2d(8, 16, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).cuda().double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        want = ref(x.double())
    assert torch.isfinite(got).all() and want[1].min() > 50   # the ~2e5 pixels dominate image 1
    err = ((got - want).norm() / want.norm()).item()
    assert err <= TOLERANCE["bfloat16"], err


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_a_16bit_partial_sums_beyond_fp16(dtype, channels_last):
    """Every conv output inside fp16's range (2e4..3e4) but the half-precision epilogue's fp16 partial sums of 4 values
    beyond it: its check must catch the overflow and run those tiles through the fp32 GELU (GELU(x) = x there, so the
    mean is the mean of x); images of mixed small and large values too."""
    fused = _identity_gelu_mean(dtype)
    g = torch.Generator("cuda").manual_seed(SEED)
    x = 2e4 + 1e4 * torch.rand(3, 1, 5, 300, device="cuda", generator=g)
    x[1] = torch.randn(1, 5, 300, device="cuda", generator=g)        # small values: the epilogue's own path
    x[2, :, :, :150] = torch.randn(1, 5, 150, device="cuda", generator=g)
    x = x.to(dtype).contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    with torch.no_grad():
        got = fused(x).view(-1).double()
    assert fused.plans[0].last_path == "fused"
    x64 = x.double()
    want = (0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))).mean((1, 2, 3))
    assert torch.isfinite(got).all(), got
    err = ((got - want).abs() / want.abs().clamp(min=1)).max().item()
    assert err <= TOLERANCE["bfloat16" if dtype == torch.bfloat16 else "float16"], err


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_a_gelu_specials(dtype, channels_last, pool):
    """Inf / NaN / huge values among finite ones through the fused A kernel (every input loader: C 8 and W 304 take the
    16-byte ones), in images of 3 rows x 304 columns (two column segments, tiles before and after the special):
    such inputs fail the kernel's bound, so those blocks take the exact GELU; +inf gives +inf, -inf and NaN give NaN,
    finite images match torch.  The conv reads channel 0 with weight 1, so its output is that channel."""
    conv = nn.Conv2d(8, 1, 1, bias=False).cuda()
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[0, 0] = 1.0
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(conv, nn.GELU(), pool_layer).eval().to(dtype)
    fused = fullfuse.fused_model(model, path="fused", precision="tf32" if dtype == torch.float32 else "auto")
    g = torch.Generator("cuda").manual_seed(SEED)
    img = _tf32(torch.randn(7, 8, 3, 304, device="cuda", generator=g))
    img[0, 0, 1, 200] = float("inf")                                   # +inf after finite tiles, finite tiles after it
    img[1, 0, 2, 10] = float("-inf")
    img[2, 0, 0, 299] = float("nan")
    img[3, 0, 1, 5] = 3e38 if dtype != torch.float16 else 6e4
    img[4, 0, 0, 0], img[4, 0, 2, 290] = float("inf"), float("-inf")
    img[5, 0, 1, 7] = 2e15 if dtype != torch.float16 else 6e4          # over the bound, finite
    img = _tf32(img).to(dtype)                                         # the TF32 MMA then reproduces channel 0 exactly
    img = img.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    with torch.no_grad():
        got = fused(img).view(-1).double()
    assert fused.plans[0].last_path == "fused"
    act = F.gelu(img[:, 0].double())
    want = (act.mean((1, 2)) if pool == "mean" else act.amax((1, 2))).view(-1)
    if dtype != torch.float32:
        want = want.to(dtype).double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    inf = torch.isinf(want)
    assert inf[0] and torch.equal(got[inf], want[inf]), (got, want)
    fin = torch.isfinite(want)
    rtol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got[fin], want[fin], rtol=rtol, atol=rtol), (got, want)


def _every_mode_layout_pool_reduction(test):
    """Parametrize a fused-A shape sweep over precision mode, layout, pool and reduction mode (ids in that order, after
    the shape)."""
    for name, values in (("mode", ["tf32", "ieee", "bfloat16", "float16"]), ("channels_last", [False, True]),
                         ("pool", ["mean", "max"]), ("deterministic", [True, False])):
        test = pytest.mark.parametrize(name, values)(test)
    return test


_CONV3D = [   # (input shape, C_out, kernel, stride, padding, dilation): each must take the fused kernel on sm_90
    ((2, 1, 6, 20, 40), 32, 3, 1, 1, 1),                       # C 1 x depth 3: one channel group, straight-line, TMA
    ((3, 4, 7, 9, 270), 64, 3, (1, 1, 1), (1, 1, 0), 1),       # 2 groups, two column segments
    ((2, 5, 12, 8, 10), 16, (3, 1, 3), (3, 2, 1), (0, 0, 1), (2, 1, 1)),   # depth stride 3, dilation 2; row stride 2
    ((1, 2, 4, 5, 6), 7, (5, 3, 3), 1, (2, 1, 1), 1),          # kernel deeper (5) than the input (4): 4 output depths
    ((2, 2, 9, 6, 48), 16, 3, (2, 1, 1), 1, (2, 1, 1)),        # C 2 x 3 <= 8, W % 8 == 0: TMA rows, every 2nd slice
    ((2, 2, 5, 4, 72), 96, 3, 1, (1, 0, 1), 1),                # 96 output channels: two launches (64 + 32)
    ((1, 8, 5, 6, 7), 16, 3, 1, 0, 1),                         # C 8 x 3: TF32's ring leaves one block per SM, which
                                                               # a grid of 12 lines takes (ieee's does not fit)
]


# ieee's ring leaves one block per SM: C x T 12 over 268-pixel rows, a grid of more blocks than SMs (refused); (1, 2, 4,
# 5, 6), 10 with a 3-row filter, has 12 lines: one block per SM at most, served; C x T 24 at (1, 8, 5, 6, 7) does not
# fit at all (refused)
_CONV3D_IEEE_REFUSED = {(3, 4, 7, 9, 270), (1, 8, 5, 6, 7)}


@_every_mode_layout_pool_reduction
@pytest.mark.parametrize("shape", _CONV3D, ids=lambda s: "x".join(map(str, s[0])))
def test_fused_a_conv3d(shape, mode, channels_last, pool, deterministic):
    """Conv3d -> GELU -> global pool on the fused kernel (path "fused": it must serve these, no step down), every
    precision, both layouts, atomic and deterministic partials, against float64; the deterministic mode repeats bits.
    ieee's ring is twice as large: over more than one channel group (C_in x kernel depth > 8) it leaves one block per
    SM and refuses where the grid has more blocks than SMs (_CONV3D_IEEE_REFUSED), except where the ring is small — a
    one-row filter over 10-pixel rows (ring slots of 128 + halo columns, docs/design.md)."""
    xs, k_out, kernel, stride, padding, dilation = shape
    if mode == "ieee" and xs in _CONV3D_IEEE_REFUSED:
        model = nn.Sequential(nn.Conv3d(xs[1], k_out, kernel, stride, padding, dilation), nn.GELU(),
                              nn.AdaptiveAvgPool3d(1))
        with torch.no_grad(), pytest.raises(fullfuse.UnsupportedError, match="one block per SM|shared memory"):
            fullfuse.fused_model(model.cuda().eval(), path="fused", precision="ieee")(torch.randn(xs, device="cuda"))
        return
    conv = nn.Conv3d(xs[1], k_out, kernel, stride, padding, dilation).cuda()
    pool_layer = nn.AdaptiveAvgPool3d(1) if pool == "mean" else nn.AdaptiveMaxPool3d(1)
    _fused_a_matches_float64(nn.Sequential(conv, nn.GELU(), pool_layer).eval(), xs, mode,
                             torch.channels_last_3d if channels_last else torch.contiguous_format, deterministic)


def _fused_a_matches_float64(model, shape, mode, memory_format, deterministic, kernel=None):
    """``model`` (fp32, on the GPU) on path "fused" at precision ``mode`` (tf32 / ieee / bfloat16 / float16) against
    float64 on a fresh random input of ``shape``; the deterministic mode repeats bits; on sm_90 the kernel that served
    it must be named ``kernel`` in `.plans` (where given)."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(mode, torch.float32)
    x = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(SEED))
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        want = model.double()(x.double().to(dtype).double())
    model = model.float().to(dtype)
    fused = fullfuse.fused_model(model, path="fused", precision=mode if dtype == torch.float32 else "auto",
                                 deterministic=deterministic)
    x = x.to(dtype).contiguous(memory_format=memory_format)
    with torch.no_grad():
        got = fused(x)
        again = fused(x)
    assert fused.plans[0].last_path == "fused", fused.plans[0].last_reason
    if kernel and torch.cuda.get_device_capability() == (9, 0):
        assert kernel in fused.plans[0].last_reason, fused.plans[0].last_reason
    err = errors(got, want)
    assert err["relerr"] <= TOLERANCE[mode], (err, SEED)
    if deterministic:
        assert torch.equal(got, again)


_MANY_CHANNELS = [   # (input shape, C_out, kernel, padding): rows of > 64 output pixels, so the wgmma kernel on sm_90
    ((2, 8, 12, 100), 128, 3, 0),          # two launches of 64 channels
    ((3, 5, 9, 140), 200, 3, (1, 2)),      # four, the last of 8 channels
    ((1, 16, 6, 130), 72, 1, 0),           # two, 64 + 8
]


@_every_mode_layout_pool_reduction
@pytest.mark.parametrize("shape", _MANY_CHANNELS, ids=lambda s: f"{'x'.join(map(str, s[0]))}-K{s[1]}")
def test_fused_a_more_than_64_output_channels(shape, mode, channels_last, pool, deterministic):
    """C_out > 64 on the wgmma kernel: one launch per 64 output channels, each with its weights and bias and into its
    columns of the output (WGPlan in csrc/fused_conv_act_pool.cu), every precision, layout, pool and reduction mode,
    against float64; the deterministic mode repeats bits."""
    xs, k_out, kernel, padding = shape
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(xs[1], k_out, kernel, padding=padding), nn.GELU(), pool_layer).cuda().eval()
    _fused_a_matches_float64(model, xs, mode, torch.channels_last if channels_last else torch.contiguous_format,
                             deterministic, kernel="sm_90 wgmma kernel")


_STRIDE2 = [   # (input shape, C_out, kernel, stride, padding, dilation, modes): stride-2 columns, rows of > 64
    # output pixels
    ((2, 8, 12, 264), 40, 3, 2, 1, 1, "all"),           # two segments of 128 output pixels (the second of 4), row
                                                        # stride 2
    ((2, 8, 9, 136), 16, 3, (1, 2), 1, 1, "all"),       # row stride 1
    ((1, 8, 10, 240), 24, 3, 2, 2, (1, 2), "all"),      # column dilation 2: every tap in the even columns
    # 5 channels (channels_last: read through an NCHW copy), an even filter width, two launches of 64 channels; ieee's
    # 3xTF32 ring leaves one block per SM, which its 8 lines' grid (one block per SM at most) takes
    ((2, 5, 7, 160), 72, (3, 4), 2, (1, 3), 1, "all"),
    # ieee's ring leaving one block per SM over more lines than SMs, and 12 K units beyond the mma.sync kernel: refused
    ((8, 5, 40, 160), 72, (3, 4), 2, (1, 3), 1, "no ieee"),
]


@_every_mode_layout_pool_reduction
@pytest.mark.parametrize("shape", _STRIDE2, ids=lambda s: f"{'x'.join(map(str, s[0]))}-K{s[1]}-k{s[2]}-s{s[3]}")
def test_fused_a_stride_2_columns(shape, mode, channels_last, pool, deterministic):
    """Stride-2 columns on the wgmma kernel (its TMA loaders put each row's even columns, then its odd ones, in the ring
    slot: wgmma_params.cuh, WG_NT2) against float64, every precision, layout, pool and reduction mode; the kernel named
    in `.plans` (ieee: its ring does not fit two blocks per SM, the mma.sync kernel serves it, or refuses with the
    reason)."""
    xs, k_out, kernel, stride, padding, dilation, modes = shape
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(xs[1], k_out, kernel, stride, padding, dilation), nn.GELU(),
                          pool_layer).cuda().eval()
    if mode == "ieee" and modes == "no ieee":
        with torch.no_grad(), pytest.raises(fullfuse.UnsupportedError, match="one block per SM|K units"):
            fullfuse.fused_model(model, path="fused", precision="ieee")(torch.randn(xs, device="cuda"))
        return
    _fused_a_matches_float64(model, xs, mode, torch.channels_last if channels_last else torch.contiguous_format,
                             deterministic, kernel=None if mode == "ieee" else "even / odd columns (stride 2)")


_TWO_ROWS = [   # (input shape, C_out, kernel, stride, padding): rows of 33..64 output pixels, two per wgmma tile
    ((3, 8, 9, 64), 64, 3, 1, 0),            # Q 62, P 7: pairs and a last row alone
    ((2, 8, 11, 40), 24, 3, 1, 1),           # Q 40, padding
    ((2, 8, 5, 40), 16, (3, 8), 1, 0),       # Q 33: the shortest rows that keep the wgmma kernel; an even filter width
    ((2, 16, 6, 48), 72, 3, 1, 1),           # two channel groups (the general op chain), two launches (64 + 8)
    ((2, 8, 10, 128), 32, 3, 2, 1),          # stride 2: Q 64 of even / odd columns
    ((2, 3, 8, 64), 64, 3, 1, 1),            # RGB (channels_last: on an NCHW copy)
]


@_every_mode_layout_pool_reduction
@pytest.mark.parametrize("shape", _TWO_ROWS, ids=lambda s: f"{'x'.join(map(str, s[0]))}-K{s[1]}-s{s[3]}")
def test_fused_a_two_rows_per_tile(shape, mode, channels_last, pool, deterministic):
    """Rows of 33..64 output pixels: two output rows per wgmma tile (WG_NT_R2 in wgmma_params.cuh) against float64,
    every precision, layout, pool and reduction mode; the kernel named in `.plans` (ieee has no two-row tiles: the
    mma.sync kernel serves it)."""
    xs, k_out, kernel, stride, padding = shape
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(xs[1], k_out, kernel, stride, padding), nn.GELU(), pool_layer).cuda().eval()
    try:
        _fused_a_matches_float64(model, xs, mode, torch.channels_last if channels_last else torch.contiguous_format,
                                 deterministic, kernel=None if mode == "ieee" else "two output rows per tile")
    except fullfuse.UnsupportedError as exc:   # ieee beyond both kernels (3xTF32's ring, > 9 K units): with the reason
        assert mode == "ieee" and re.search("one block per SM|shared memory", str(exc)), exc


def _issue(line_layouts, channels_last):
    """How `.plans` names the issue of a tile's wgmmas for a case whose straight-line layouts are ``line_layouts``."""
    return "straight-line" if ("CL" if channels_last else "NCHW") in line_layouts else "general chain"


_GROUP_PAIRS = [   # (input shape, C_out, kernel, stride, padding, dilation, ops per tile, layouts whose kernel
    # issues them straight-line): 16-bit, > 8 input channels.  10 ops through TMA rows or NCHW's 16-byte copies (NCHW:
    # W % 8 == 0; channels_last: C % 8 == 0), one row per tile, stride-1 columns: a straight-line kernel (wg_ops_c16);
    # everything else the general chain
    ((2, 16, 10, 70), 64, 3, 1, 1, 1, 10, ("CL",)),     # 2 groups: 9 paired ops + the bias op
    ((2, 24, 9, 66), 48, 3, 1, 0, 1, 18, ()),           # 3: a pair and a lone group per tap, the bias in a lone
                                                        # op's spare chunk
    ((2, 24, 8, 128), 64, 3, 1, 1, 1, 18, ()),          # 128-pixel rows (channels_last: 3 blocks per SM)
    ((2, 12, 7, 90), 40, 3, 1, 1, 1, 10, ()),           # 12 channels: the second group half empty (rows per element)
    ((2, 16, 9, 70), 64, (1, 5), 1, (0, 2), 1, 6, ()),  # a 1x5 row filter: 5 paired ops + the bias op
    ((2, 16, 10, 264), 32, 3, 2, 1, 1, 10, ()),         # stride 2 (even / odd columns; NCHW: one block per SM, which a
                                                        # grid of 20 lines takes)
    ((16, 16, 40, 264), 32, 3, 2, 1, 1, 10, ()),        # likewise over 320 lines (NCHW: refused)
    ((2, 16, 11, 80), 16, 3, 1, 2, 2, 10, ("NCHW", "CL")),   # dilation 2 (NCHW: the 16-byte copies; TNCHW's staging
                                                             # would cost a block per SM)
    ((2, 16, 6, 296), 64, 3, 1, 1, 1, 10, ("NCHW", "CL")),   # two segments per row (296 output pixels), both halves
    # 32 channels over rows of <= 128 output pixels: the ring sized for one half (128 + halo columns), 2 blocks per SM
    ((2, 32, 6, 128), 64, 3, 1, 1, 1, 19, ()),
    ((2, 16, 7, 96), 32, 5, 1, 2, 1, 26, ()),           # 5x5 over 16 channels, likewise
]


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("mode", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", _GROUP_PAIRS,
                         ids=lambda s: f"{'x'.join(map(str, s[0]))}-K{s[1]}-k{s[2]}-s{s[3]}-d{s[5]}")
def test_fused_a_16bit_channel_group_pairs(shape, mode, channels_last, deterministic, pool):
    """16-bit input over more than 8 channels: each k16 op takes two channel groups of one tap (its second K chunk the
    next group's plane), so a 3x3 over 16 channels is 10 ops, not 18 (wg_plan_lm in csrc/fused_conv_act_pool.cu),
    against float64 in both layouts, pools and reduction modes, with the op count and the issue (straight-line or the
    general chain) named in `.plans`."""
    xs, k_out, kernel, stride, padding, dilation, nops, line = shape
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(xs[1], k_out, kernel, stride, padding, dilation), nn.GELU(),
                          pool_layer).cuda().eval()
    if stride == 2 and not channels_last and xs[0] > 2:   # TNCHW's staging + the ring: one block per SM, more lines
                                                         # than SMs (tests/test_plan_cpu.py)
        dtype = getattr(torch, mode)
        with torch.no_grad(), pytest.raises(fullfuse.UnsupportedError, match="one block per SM"):
            fullfuse.fused_model(model.to(dtype), path="fused")(torch.randn(xs, device="cuda", dtype=dtype))
        return
    _fused_a_matches_float64(model, xs, mode, torch.channels_last if channels_last else torch.contiguous_format,
                             deterministic, kernel=f"{nops} ops per tile ({_issue(line, channels_last)})")


_TF32_C16 = [   # (input shape, C_out, kernel, padding, layouts whose kernel issues them straight-line): fp32 3x3 over
    # 9..16 channels, 18 ops + the bias op, issued straight-line (wg_ops_c16 in csrc/fused_conv_act_pool.cu) where the
    # rows come by TMA or NCHW's 16-byte copies
    ((2, 16, 10, 72), 64, 3, 1, ("NCHW", "CL")),     # 72-pixel rows (ring slots for 128 + halo columns)
    ((2, 16, 6, 300), 48, 3, 1, ("NCHW", "CL")),     # two segments per row (NCHW: the 16-byte copies, TNCHW's staging
                                                     # would cost a block per SM)
    ((2, 12, 8, 70), 64, 3, 1, ()),                  # 12 channels, W % 4 != 0: rows per element, the general chain
]


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", _TF32_C16, ids=lambda s: f"{'x'.join(map(str, s[0]))}-K{s[1]}")
def test_fused_a_tf32_3x3_over_16_channels(shape, channels_last, deterministic, pool):
    """TF32, 3x3 over 9..16 input channels: 19 ops per tile, straight-line through TMA rows or NCHW's 16-byte copies,
    the general chain otherwise (rows per element), against float64 in both layouts, pools and reduction modes, with
    the issue named in `.plans`."""
    xs, k_out, kernel, padding, line = shape
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(xs[1], k_out, kernel, padding=padding), nn.GELU(), pool_layer).cuda().eval()
    _fused_a_matches_float64(model, xs, "tf32", torch.channels_last if channels_last else torch.contiguous_format,
                             deterministic, kernel=f"19 ops per tile ({_issue(line, channels_last)})")


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [((1, 3, 20, 20), 64, 5, 2, 2)], ids=lambda s: "x".join(map(str, s[0])))
def test_fused_a_one_block_per_sm_where_the_grid_has_no_more(shape, channels_last, deterministic, pool):
    """A ring that leaves one block per SM is refused only where the grid has more blocks than SMs: a small problem
    (a 5x5 stride-2 conv over 3 channels, TF32) takes the fused kernel at one block per SM, against float64."""
    xs, k_out, kernel, stride, padding = shape
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "mean" else nn.AdaptiveMaxPool2d(1)
    model = nn.Sequential(nn.Conv2d(xs[1], k_out, kernel, stride, padding), nn.GELU(), pool_layer).cuda().eval()
    _fused_a_matches_float64(model, xs, "tf32", torch.channels_last if channels_last else torch.contiguous_format,
                             deterministic, kernel="1 blocks per SM")


def test_fused_a_conv3d_beyond_the_kernel_says_why():
    """A Conv3d whose (channel, depth tap) pairs make a ring too large for two blocks per SM, over more lines than SMs:
    path "fused" refuses with the reason, "auto" runs the fallback (or, where it measured the torch path faster here,
    torch) and records the reason."""
    model = nn.Sequential(nn.Conv3d(8, 16, 3), nn.GELU(), nn.AdaptiveAvgPool3d(1)).cuda().eval()
    x = torch.randn(4, 8, 5, 40, 40, device="cuda")
    with torch.no_grad(), pytest.raises(fullfuse.UnsupportedError, match="shared memory|one block per SM"):
        fullfuse.fused_model(model, path="fused")(x)
    auto = fullfuse.fused_model(model)
    with torch.no_grad():
        auto(x)
    assert auto.plans[0].last_path in ("fallback", "torch") and "block" in auto.plans[0].last_reason


def test_torch_compile_fullgraph_on_gpu():
    model = SeedA().cuda().eval()
    compiled = torch.compile(fullfuse.fused_model(model), fullgraph=True)
    x = _seed_input("A")[:2]
    with torch.no_grad():
        assert errors(compiled(x), _reference(model, x))["relerr"] <= TOLERANCE["tf32"]


@pytest.mark.parametrize("family, shape, conv", [
    ("A", (1, 3, 20, 20), (64, 5, 2, 2)),        # tiny: a few kernels' fixed cost against eager's three ops
    ("A", (2, 8, 64, 64), None),                 # small
    ("B", (1, 32, 4, 4, 4), None),               # tiny transposed conv
])
def test_auto_is_never_slower_than_eager(family, shape, conv):
    """Path "auto" times its kernel path against the torch path on a signature's first call and keeps the faster
    (`.plans` says which, with both times): per call it then costs no more than the original model (best of rounds of
    back-to-back calls, host and GPU time together; 25 % allowance for noise on a shared machine)."""
    from fullfuse.first_call import per_call_ms
    from fullfuse.seed_models import seed_model

    torch.manual_seed(SEED)
    model = (seed_model(family, in_channels=shape[1], conv=conv) if family == "A" else SeedB()).cuda().eval()
    auto = fullfuse.fused_model(model)
    x = torch.randn(shape, device="cuda")

    def per_call(fn):
        return per_call_ms(fn, x.device, rounds=7, calls=20)

    with torch.no_grad():
        auto(x)
        plan = auto.plans[0]
        assert "measured" in plan.last_reason, plan.last_reason
        eager_s, auto_s = per_call(lambda: model(x)), per_call(lambda: auto(x))
    assert auto_s <= 1.25 * eager_s, (auto_s, eager_s, plan.last_path, plan.last_reason)


@pytest.mark.parametrize("poison", [True, False], ids=["poisoned", "plain"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("path", ["fused", "fallback", "torch", "auto"])
def test_squeezed_single_channel_output(path, n, poison, monkeypatch):
    """One output channel, pooled and squeezed: a batch of one gives a 0-d tensor, as the model does, on every path,
    with outputs made plain (as users run) or poisoned (as the other tests do)."""
    monkeypatch.setattr(launch, "POISON_OUTPUTS", poison)
    torch.manual_seed(SEED)

    class OneChannel(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.pool = nn.Conv2d(3, 1, 3), nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            return self.pool(F.gelu(self.conv(x))).squeeze()

    model = OneChannel().cuda().eval()
    x = torch.randn(n, 3, 16, 16, device="cuda")
    fused = fullfuse.fused_model(model, path=path)
    with torch.no_grad():
        got = fused(x)
        want = _reference(model, x)
    assert got.shape == want.shape == ((n,) if n > 1 else ())
    assert errors(got, want)["relerr"] <= TOLERANCE["tf32"]
    assert path == "auto" or fused.plans[0].last_path == path
