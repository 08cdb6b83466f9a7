"""`fullfuse check`: every path against float64 on fresh random inputs, over seed-like and odd problems.

The GPU tests use the same cases and the same tolerances (``precision.TOLERANCE``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch

from . import launch, ops, torch_path
from .measure import errors
from .precision import TOLERANCE, cudnn_conv_precision, resolve
from .spec import ConvActPoolSpec, ConvTPoolReduceSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    name: str
    spec: object
    shape: tuple          # input shape (N, C, *spatial)


def _a(name, shape, k_out, kernel, stride=1, padding=0, dilation=1, bias=True, act="gelu_erf", pool="mean",
       keepdim=True):
    dims = len(shape) - 2
    t = lambda v: (v,) * dims if isinstance(v, int) else tuple(v)  # noqa: E731
    spec = ConvActPoolSpec(dims, shape[1], k_out, t(kernel), t(stride), t(padding), t(dilation), bias, act, pool,
                           keepdim)
    return Case(name, spec, shape)


def _b(name, shape, k_out, kernel, stride, padding=0, output_padding=0, window=2, bias=True, act="none",
       reduction="sum", keepdim=True):
    dims = len(shape) - 2
    t = lambda v: (v,) * dims if isinstance(v, int) else tuple(v)  # noqa: E731
    spec = ConvTPoolReduceSpec(dims, shape[1], k_out, t(kernel), t(stride), t(padding), t(output_padding), (1,) * dims,
                               bias, t(window), act, reduction, keepdim)
    return Case(name, spec, shape)


def cases(family: str, quick: bool = False) -> List[Case]:
    if family == "A":
        out = [
            _a("seed-like", (2, 8, 40, 36), 64, 3),
            _a("odd: N1 C3 17x23 K5 s2 p1 d2 nobias", (1, 3, 17, 23), 5, 3, 2, 1, 2, bias=False),
            _a("C5 K40 5x3 kernel, tanh, max", (3, 5, 21, 19), 40, (5, 3), 1, (2, 1), act="gelu_tanh", pool="max"),
            _a("relu, keepdim False", (2, 16, 12, 12), 24, 1, act="relu", keepdim=False),
            _a("silu, stride 3", (2, 4, 31, 29), 12, 3, 3, act="silu"),
            _a("no activation, tiny image", (4, 2, 3, 3), 7, 3),
            _a("padding (1,2), W % 4 == 0", (2, 8, 20, 44), 32, 3, 1, (1, 2)),
            _a("C3 padding 3, W % 4 == 0", (1, 3, 10, 16), 8, 3, 1, 3),
            # Conv3d: on sm_90 the fused kernel runs it as the Conv2d over (channel, depth tap) pairs —
            # C 4 x depth 3 = two channel groups (the general op chain), C 2 x 3 one (the straight-line 3x3 kernel);
            # depth stride, padding and dilation; C 8 x 3 = three groups, whose ring does not fit two blocks per SM
            # (fallback)
            _a("conv3d", (2, 4, 9, 10, 11), 16, 3, 1, 1),
            _a("conv3d C2 k3 p1, depth stride 2 dilation 2, max", (2, 2, 11, 9, 13), 24, 3, (2, 1, 1), (2, 1, 1),
               (2, 1, 1), pool="max"),
            _a("conv3d C3 k(2,3,3) depth pad 1, silu, no bias", (3, 3, 5, 7, 300), 8, (2, 3, 3), 1, (1, 0, 1),
               act="silu", bias=False, keepdim=False),
            _a("conv3d C8 k3: ring too large, fallback", (1, 8, 5, 6, 7), 16, 3),
            # the sm_90 wgmma path over two 256-column segments per row (W 400; W % 8 == 0 also takes the 16-bit
            # NCHW 16-byte loader): one row per block (row stride 2), then several rows per block
            _a("3x3 C8, W 400, row stride 2", (3, 8, 13, 400), 40, 3, (2, 1), 1),
            # stride-2 columns: on sm_90 the wgmma kernel with each row's even / odd columns apart (its TMA loaders)
            _a("3x3 C8 s2 p1, W 264, two column segments", (2, 8, 12, 264), 40, 3, 2, 1),
            # rows of 33..64 output pixels: on sm_90 two output rows per wgmma tile (an odd number of rows: the last
            # row of a piece alone)
            _a("3x3 C8, W 64, two rows per tile, odd P, max", (3, 8, 9, 64), 24, 3, pool="max"),
            # more than 64 output channels: one wgmma launch per 64 (rows of 98 pixels: the wgmma kernel's)
            _a("3x3 C8 K136, W 100, max", (2, 8, 7, 100), 136, 3, pool="max"),
            _a("3x3 C6, 300x400, max", (1, 6, 300, 400), 16, 3, pool="max"),
            # more than 9 K units (R*S*ceil(C/8)): on sm_90 the 3x3 C16 case takes the wgmma kernel's general op chain,
            # the 7x7 stem needs a whole SM there and runs the fallback (both run the fallback on other GPUs)
            _a("3x3 C16 p1, 18 K units", (2, 16, 14, 33), 48, 3, 1, 1),
            _a("7x7 C3 p3 stem, 49 K units, max", (2, 3, 19, 26), 32, 7, 1, 3, pool="max"),
        ]
    else:
        out = [
            _b("seed-like (pools 2 then 3)", (2, 32, 8, 8, 8), 64, 5, 2, 2, window=6),
            _b("stride 3, output_padding 1, window (2,3,2)", (1, 5, 5, 6, 4), 7, 4, 3, 1, 1, window=(2, 3, 2)),
            _b("kernel < stride, mean", (2, 4, 6, 5, 7), 9, 2, 3, 0, window=2, reduction="mean", keepdim=False),
            _b("gelu before pools, max, no bias", (1, 6, 5, 5, 5), 10, 3, 2, 1, window=3, act="gelu_erf",
               reduction="max", bias=False),
            _b("relu, window (1,2,2)", (2, 3, 4, 7, 6), 5, 3, 1, 1, window=(1, 2, 2), act="relu"),
            _b("convtranspose2d", (2, 8, 11, 9), 12, 4, 2, 1, window=2),
            # C_in % 4 == 0 (the fused kernel serves these too; the ones with C_in 5, 6, 3 run the fallback)
            _b("C8 stride 3, output_padding 1, window (2,3,2)", (1, 8, 5, 6, 4), 7, 4, 3, 1, 1, window=(2, 3, 2)),
            _b("C16 kernel < stride, mean", (2, 16, 6, 5, 7), 9, 2, 3, 0, window=2, reduction="mean", keepdim=False),
            _b("C8 gelu before pools, max, no bias", (1, 8, 5, 5, 5), 10, 3, 2, 1, window=3, act="gelu_erf",
               reduction="max", bias=False),
            # fused-kernel structure: C_in padded 24 -> 32 and w split into chunks; stride 1 with several tile
            # groups per class; an odd number of window rows in h (a block with one window row)
            _b("C24 wide W: w-chunks", (2, 24, 5, 6, 40), 33, 3, 2, 1, 1, window=2),
            _b("C16 stride 1, window 6, max", (1, 16, 9, 10, 11), 64, 3, 1, 1, window=6, reduction="max"),
            # more blocks than SMs: whole blocks, then tail pieces that combine their window maxima across blocks
            _b("C8 N10: whole blocks + tail pieces", (10, 8, 16, 16, 16), 16, 5, 2, 2, window=6),
            _b("C4 odd window rows, silu", (2, 4, 6, 7, 9), 3, (2, 3, 4), (2, 1, 3), (0, 1, 2), (1, 0, 2),
               window=(3, 2, 2), act="silu", reduction="mean"),
        ]
    return out[:2] if quick else out


def make_inputs(case: Case, dtype: torch.dtype, channels_last: bool, device, seed: int):
    """Fresh random input, weight and bias (never zeros), PyTorch-default-like weight scale."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    spec = case.spec
    if isinstance(spec, ConvActPoolSpec):
        w_shape = (spec.out_channels, spec.in_channels, *spec.kernel_size)
    else:
        w_shape = (spec.in_channels, spec.out_channels, *spec.kernel_size)
    fan_in = w_shape[1] * math.prod(spec.kernel_size)
    bound = 1 / math.sqrt(fan_in)
    x = torch.randn(case.shape, generator=gen)
    w = (torch.rand(w_shape, generator=gen) * 2 - 1) * bound
    b = (torch.rand(spec.out_channels, generator=gen) * 2 - 1) * bound if spec.has_bias else None
    x, w = x.to(device, dtype), w.to(device, dtype)
    b = None if b is None else b.to(device, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if spec.dims == 2 else torch.channels_last_3d)
    return x, w, b


def run_case(case: Case, path: str, dtype: str = "float32", precision: str = "auto", channels_last: bool = False,
             device="cuda", seed: int = 0) -> dict:
    """Run one case through ``path``; returns errors vs float64, the tolerance and whether it passed."""
    x, w, b = make_inputs(case, DTYPES[dtype], channels_last, device, seed)
    mode = resolve(precision, x.dtype)
    saved, launch.POISON_OUTPUTS = launch.POISON_OUTPUTS, True
    try:
        out = ops.run_spec(case.spec, x, w, b, path=path, precision=precision)
    finally:
        launch.POISON_OUTPUTS = saved
    with cudnn_conv_precision("ieee"):
        ref = torch_path.float64_reference(case.spec, x, w, b)
    err = errors(out, ref)
    tol = _tolerance(mode, x.device)
    return {"case": case.name, "family": case.spec.family, "path": path, "dtype": dtype, "mode": mode,
            "channels_last": channels_last, **err, "tolerance": tol, "ok": err["relerr"] <= tol}


def _tolerance(mode: str, device) -> float:
    if torch.device(device).type == "cpu" and mode in ("tf32", "ieee"):
        return TOLERANCE["ieee"]        # CPU convs never use TF32
    return TOLERANCE[mode]


def matrix(device_is_cuda: bool, quick: bool = False) -> Iterator[dict]:
    """The combinations `fullfuse check` runs: (path, dtype, precision, layout)."""
    if not device_is_cuda:
        yield {"path": "torch", "dtype": "float32", "precision": "ieee", "channels_last": False}
        return
    for path in ("fallback", "auto", "torch"):
        for dtype, precision in (("float32", "tf32"), ("float32", "ieee"), ("bfloat16", "auto"), ("float16", "auto")):
            for channels_last in ((False,) if quick else (False, True)):
                yield {"path": path, "dtype": dtype, "precision": precision, "channels_last": channels_last}


def main(families=("A", "B"), quick: bool = False, seed: Optional[int] = None) -> int:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda:
        print("fullfuse check: no CUDA GPU here: checking the torch path on the CPU only")
    seed = seed if seed is not None else torch.seed() % (1 << 31)
    failures, rows = 0, 0
    print(f"{'family':6} {'case':44} {'path':8} {'dtype':8} {'mode':8} {'layout':6} {'relerr':>9} {'maxabs':>9} "
          f"{'tol':>7}  ok")
    for family in families:
        for case in cases(family, quick):
            for combo in matrix(cuda, quick):
                try:
                    r = run_case(case, device=device, seed=seed + rows, **combo)
                except Exception as exc:  # an error is a failure, with its message
                    print(f"{family:6} {case.name[:44]:44} {combo['path']:8} {combo['dtype']:8} ERROR {exc}")
                    failures += 1
                    continue
                rows += 1
                failures += not r["ok"]
                layout = "NHWC" if r["channels_last"] else "NCHW"
                print(f"{family:6} {case.name[:44]:44} {r['path']:8} {r['dtype']:8} {r['mode']:8} {layout:6} "
                      f"{r['relerr']:9.2e} {r['maxabs']:9.2e} {r['tolerance']:7.0e}  {'ok' if r['ok'] else 'FAIL'}")
    print(f"fullfuse check: {rows - failures} passed, {failures} failed (seed {seed})")
    return 1 if failures else 0
