"""Diagnostic (device): the fused A kernel's half-precision GELU (wg_epi_h2) value by value against its fp16
emulation (tests/test_gelu_h2.py) and float64.  Through the C API (fp32 output = the kernel's f16 g exactly): a 1x1
conv over 8 channels whose weight picks channel 0, one pixel per image, every fp16 value in [-20, 20].  Prints the
error bound, the signed mean error, and how often the kernel's bits equal the emulation with MUFU.EX2.F16 modelled as
round-to-nearest or round-toward-zero of the exact power.  Env: FF_FUSED_A_SO."""
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from probe_fused_a import Case, load_lib, run_kernel  # noqa: E402
from test_gelu_h2 import ex2_rn, ex2_rz, gelu_h2  # noqa: E402


lib = load_lib()
bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
vals = bits[torch.isfinite(bits) & (bits.abs() <= 20)]
for dtype in (torch.float16, torch.bfloat16):
    v = vals.to(dtype).float().unique() if dtype == torch.bfloat16 else vals
    n = v.numel()
    c = Case("id", n, 8, 1, 1, 1, 1, 1, bias=False)
    x = torch.zeros(n, 8, 1, 1, device="cuda", dtype=dtype)
    x[:, 0, 0, 0] = v.to(dtype).cuda()
    w = torch.zeros(1, 8, 1, 1, device="cuda", dtype=dtype)
    w[0, 0] = 1
    got, why = run_kernel(lib, c, x, w, None, dtype, 0, "gelu_erf", 0, 0, 1)
    assert why is None, why
    got = got.view(-1).double().cpu()
    x64 = v.double()
    ref = 0.5 * x64 * (1 + torch.erf(x64 / math.sqrt(2)))
    err = (got - ref) / x64.abs().clamp(min=1)
    emu_rn, emu_rz = gelu_h2(v, ex2=ex2_rn), gelu_h2(v, ex2=ex2_rz)
    print(f"{dtype}: {n} values; max |err|/max(1,|x|) kernel {err.abs().max():.3g} at x={v[err.abs().argmax()]:.6g}; "
          f"emulated RN {((emu_rn - ref) / x64.abs().clamp(min=1)).abs().max():.3g}, RZ {((emu_rz - ref) / x64.abs().clamp(min=1)).abs().max():.3g}")
    print(f"   bits equal: RN {(got == emu_rn).float().mean():.4f}, RZ {(got == emu_rz).float().mean():.4f}; "
          f"fp32-GELU-like (|err| < 1e-5): {(err.abs() < 1e-5).float().mean():.3f}")
    for lo, hi in ((-20, -4), (-4, -2), (-2, -1), (-1, -0.25), (-0.25, 0.25), (0.25, 1), (1, 2), (2, 4), (4, 20)):
        m = (v >= lo) & (v < hi)
        print(f"   x in [{lo:6.2f},{hi:6.2f}): mean err {((got - ref)[m]).mean():+.3e}, max {err[m].abs().max():.3e}; "
              f"emu RN mean {((emu_rn - ref)[m]).mean():+.3e}, RZ mean {((emu_rz - ref)[m]).mean():+.3e}")
    diff = (got != emu_rz).nonzero().view(-1)[:8].tolist()   # where the kernel and the RZ emulation differ
    if diff:
        print("   differs from RZ at " + ", ".join(f"x={v[i].item():+.6g} ({v[i].item().hex()}) got={got[i].item():+.6g} "
                                             f"emuRZ={emu_rz[i].item():+.6g}" for i in diff))
    worst = err.abs().argsort(descending=True)[:6]
    for i in worst.tolist():
        print(f"   x={v[i].item():+.6g} got={got[i].item():+.6g} ref={ref[i].item():+.6g} emuRN={emu_rn[i].item():+.6g} emuRZ={emu_rz[i].item():+.6g}")
