"""Accuracy of a GELU (erf) for the TF32 epilogue with part of its polynomial in packed half precision (issue 35's
precision-matched epilogue), by emulation on the CPU; no GPU.

The fp32 epilogue (csrc/activation.cuh, ff_gelu_erf_noclamp) computes gelu(x) = relu(x) - u 2^R(u), u = |x|, with
R(u) = ((((c5 u + c4) u + c3) u + c2) u + c1) u + c0 in 5 FFMA.  The split form evaluates the inner part
t = (c5 u + c4) u + c3 in f16x2 (2 HFMA2 per pair of values, u and the coefficients rounded to fp16), then the outer
part ((t u + c2) u + c1) u + c0 in fp32 (3 FFMA): 2 FFMA fewer per value on the FP32 pipe that wgmma chains block,
paid with a conversion each way (whose pipe is to be measured).  Why the inner part may be half: its value times u^3
is what it adds to R, and an error e in R moves the result by u 2^R ln 2 e, at most 0.17 ln 2 e; the inner part's
fp16 rounding keeps that below the TF32 mode's bound 2^-15 max(1, |x|) (issue 35).

Emulation: every fp32 operation rounds to fp32, every f16x2 operation to fp16 (numpy's float16, round to nearest
even, as cvt.rn / fma.rn.f16x2), FMA computed exactly in float64 then rounded once; ex2.approx.ftz.f32 as the exact
power rounded to fp32 and then moved by +-2 ulps (its documented bound) in the direction that hurts.  Reference: float64
x * Phi(x) (scipy.special.ndtr).  Sweep: every 7th fp32 value of |x| in [2^-20, 10] for both signs (~160 M values; the
step is odd so every exponent and mantissa pattern class is visited), plus a log sweep to 1e4.  Prints the worst
|err| / max(1, |x|) of the fp32 form (a check of the emulation: 3.1e-7 in docs/design.md 5) and of the split form.

Result (step 7, 2026-12-03): fp32 form 3.34e-7 (the documented 3.34e-7 with ex2 at +-2 ulps); split form 4.53e-6,
0.149 of 2^-15.  Rejected: the inner part one term longer (c2 in half too, 3 HFMA2 and 2 FFMA) gives 4.3e-5, 1.4x the
bound.

Usage: python3 benchmarks/probes/gelu_tf32_split.py [step=7]   (needs numpy, scipy)
"""
import sys

import numpy as np
from scipy.special import ndtr

# c0..c5 of csrc/activation.cuh ff_phi_neg_log2 (C99 hex floats there)
C = [float.fromhex(h) for h in ("-0x1.000120p+0", "-0x1.26a4a0p+0", "-0x1.d6a0a2p-2", "-0x1.abd318p-5",
                                "0x1.db850ap-8", "-0x1.05cf34p-11")]
BOUND = 2.0 ** -15


def f32(a):
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def f16(a):
    with np.errstate(over="ignore"):   # |u| > 65504 rounds to inf, as cvt.rn.f16x2 does (then R = -inf, q = 0)
        return np.asarray(a, dtype=np.float64).astype(np.float16).astype(np.float64)


def fma32(a, b, c):
    return f32(a * b + c)


def fma16(a, b, c):
    return f16(a * b + c)


def ex2(r, sign):
    """ex2.approx.ftz.f32 within its 2-ulp bound, pushed by ``sign`` (+1 / -1) ulps x 2."""
    q = f32(np.exp2(r))
    q = np.where(q < 2.0 ** -126, 0.0, q)                       # ftz
    return f32(q * (1.0 + sign * 2.0 * 2.0 ** -23))


def gelu_fp32(x, sign):
    u = np.abs(x)
    r = np.full_like(u, C[5])
    for c in reversed(C[:5]):
        r = fma32(r, u, c)
    return fma32(-u, ex2(r, sign), np.maximum(x, 0.0))


def gelu_split(x, sign, half_terms=3):
    """The inner ``half_terms`` coefficients' Horner in f16x2 (half_terms - 1 HFMA2 per pair), the rest in fp32."""
    u = np.abs(x)
    uh = f16(u)
    t = f16(C[5])
    with np.errstate(invalid="ignore", over="ignore"):
        for c in reversed(C[6 - half_terms:5]):
            t = fma16(t, uh, f16(c))
        r = t                                                      # f16 -> f32: exact
        for c in reversed(C[:6 - half_terms]):
            r = fma32(r, u, c)
    return fma32(-u, ex2(r, sign), np.maximum(x, 0.0))


def gelu_split4(x, sign):
    return gelu_split(x, sign, 4)


def worst(form, step: int) -> float:
    top = int(np.array(10.0, dtype=np.float32).view(np.uint32))
    low = int(np.array(2.0 ** -20, dtype=np.float32).view(np.uint32))
    result = 0.0
    chunk = 1 << 24
    for start in range(low, top + 1, chunk * step):
        bits = np.arange(start, min(top + 1, start + chunk * step), step, dtype=np.uint32)
        mag = bits.view(np.float32).astype(np.float64)
        for x in (mag, -mag):
            ref = x * ndtr(x)
            for sign in (1.0, -1.0):
                err = np.abs(form(x, sign) - ref) / np.maximum(1.0, np.abs(x))
                result = max(result, float(err.max()))
    x = np.geomspace(10.0, 3.4e38, 400001)   # the clamp-free form serves every finite x
    for xs in (x, -x):
        for sign in (1.0, -1.0):
            result = max(result, float((np.abs(form(xs, sign) - xs * ndtr(xs)) / np.abs(xs)).max()))
    return result


def main() -> None:
    step = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    for name, form in (("fp32 (5 FFMA)", gelu_fp32), ("split (2 HFMA2-pair + 3 FFMA)", gelu_split),
                       ("split (3 HFMA2-pair + 2 FFMA)", gelu_split4)):
        w = worst(form, step)
        print(f"{name:32s} max |err| / max(1, |x|) = {w:.3e}   ({w / BOUND:.3f} of 2^-15)", flush=True)


if __name__ == "__main__":
    main()
