"""Diagnostic (a CUDA GPU): the fused A kernel's half-precision GELU (h2_gelu2, csrc/gelu_h2.cuh) value by value
against its fp16 emulation (tests/test_gelu_h2.py) and float64, through the public op: a 1x1 identity conv over one
channel, 128 copies of each fp16 value per image (one tile row), so the pooled mean is the kernel's g of that value
(fp16 input: g is exact in the fp16 output).  Prints the error bound, how often the kernel's bits equal the emulation
with tanh.approx.f16x2 modelled as the exact tanh rounded to nearest, the signed mean error per range of x, and the
relative error of the pooled mean of zero-mean normal inputs per scale (the case the epilogue's form is chosen for).

Usage: python3 benchmarks/probes/diag_gelu_h2.py
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import fullfuse  # noqa: E402
from test_gelu_h2 import T, gelu_h2  # noqa: E402


def main() -> None:
    conv = nn.Conv2d(1, 1, 1, bias=False).cuda()
    with torch.no_grad():
        conv.weight.fill_(1.0)
    model = nn.Sequential(conv, nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval().half()
    fused = fullfuse.fused_model(model, path="fused")
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    v = bits[torch.isfinite(bits) & (bits.abs() <= 20)]
    with torch.no_grad():
        got = fused(v.cuda().view(-1, 1, 1, 1).expand(-1, 1, 1, 128).contiguous()).view(-1).double().cpu()
    print("path", fused.plans[0].last_path, fused.plans[0].last_reason)
    x64 = v.double()
    ref = F.gelu(x64)
    emu = gelu_h2(v.float())
    err = (got - ref) / x64.abs().clamp(min=1)
    redone = (128 * ref).abs() < T   # rows the epilogue sends through the fp32 GELU
    kept = ~redone
    print(f"{v.numel()} fp16 values in [-20, 20]: max |err| / max(1, |x|) {err.abs().max():.3g} at x = "
          f"{v[err.abs().argmax()].item():.6g}; emulation {((emu - ref) / x64.abs().clamp(min=1)).abs().max():.3g}")
    print(f"bits equal to the emulation (tanh exact, rounded to nearest) where the half-precision path runs: "
          f"{(got[kept] == emu[kept]).double().mean():.4f}; rows redone in fp32: {redone.double().mean():.4f}")
    for lo, hi in ((-20, -4), (-4, -2), (-2, -1), (-1, -0.25), (-0.25, -0.01), (-0.01, 0.01), (0.01, 0.25),
                   (0.25, 1), (1, 2), (2, 4), (4, 20)):
        m = (x64 >= lo) & (x64 < hi) & kept
        if m.any():
            print(f"  x in [{lo:6.2f}, {hi:6.2f}): mean err {(got - ref)[m].mean():+.3e} (emulated "
                  f"{(emu - ref)[m].mean():+.3e}), max {err[m].abs().max():.3e}")
    g = torch.Generator("cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        model_d = nn.Sequential(conv, nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval().to(dtype)
        fused_d = fullfuse.fused_model(model_d, path="fused")
        row = []
        for scale in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0):
            x = (torch.randn(64, 1, 16, 256, device="cuda", generator=g) * scale).to(dtype)
            with torch.no_grad():
                out = fused_d(x).view(-1).double()
            r = F.gelu(x.double()).mean(dim=(1, 2, 3))
            row.append(f"{scale:g}: {((out - r).norm() / r.norm()).item():.1e}")
        print(f"{str(dtype)[6:]} zero-mean inputs, relative error of the 64 means by scale: " + ", ".join(row))


if __name__ == "__main__":
    main()
