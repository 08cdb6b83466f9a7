// Candidate GELU (erf) forms for family A's TF32 mode (an epilogue whose accuracy matches the mode, 2^-15 max(1,
// |x|)) that the product does not use, for the probes that measured them: benchmarks/probes/probe_wgmma_smem.cu (what
// overlaps wgmma chains), gelu_tf32_sweep.cu (every finite fp32 x against float64) and the seed kernel A/B of
// docs/design.md 3.1.  The split form holds the bound but left the seed kernel as fast as before (its f16x2 work runs
// on the FP32 pipe there); the cubic was 9 % faster but is 1.15 x over the bound; the degree-4 form holds it and was
// 4 % slower.  The product keeps ff_gelu_erf_noclamp (csrc/activation.cuh).
#pragma once
#include "activation.cuh"

// The split form.
// TF32 rounds every conv operand to 2^-11 relative, so a GELU error of 2^-15 max(1, |x|) is invisible in the result;
// that allows the inner part of ff_phi_neg_log2's Horner, t(u) = (c5 u + c4) u + c3, in f16x2: HFMA2 runs beside the
// kernel's wgmma chains where FFMA does not (the FP32 pipe's time adds to the MMAs').  Per pair: one F2FP (x0, x1 to
// f16x2, |.| as the HFMAs' operand modifier), 2 HFMA2, t back to fp32 (exact), then per value 3 FFMA, MUFU.EX2 and the
// tail of ff_gelu_erf_noclamp: 5 FP32-pipe operations with the sum instead of 7.
// Accuracy: |err| <= 4.51e-6 max(1, |x|), 0.15 of 2^-15, over every finite fp32 x on the H200 (gelu_tf32_sweep.cu; the
// CPU emulation gelu_tf32_split.py gives 4.5e-6).  FF_TF32_GELU_HALF_TERMS 4 (c2 in half too, 3 HFMA2 and 2 FFMA)
// reaches 4.3e-5 max(1, |x|) by emulation: over 2^-15, under 2^-13.
// Finite x only (the clamp-free form): |x| > 65504 rounds to inf in f16x2, so t = -inf, R = -inf and q = 0, as the
// fp32 form's q flushes there; -0 -> -0 and denormals as ff_gelu_erf_noclamp (u = 0 gives t = c3, q = 2^c0).
#ifndef FF_TF32_GELU_HALF_TERMS
#define FF_TF32_GELU_HALF_TERMS 3
#endif
__device__ __forceinline__ float ff_gelu_erf_from_inner(float x, float t) {
  const float u = fabsf(x);
  float r = t;
  if (FF_TF32_GELU_HALF_TERMS == 3) r = fmaf(r, u, -0x1.d6a0a2p-2f);
  r = fmaf(r, u, -0x1.26a4a0p+0f);
  r = fmaf(r, u, -0x1.000120p+0f);
  float q;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q) : "f"(r));
  return fmaf(-u, q, fmaxf(x, -0.0f));
}
__device__ __forceinline__ void ff_gelu_erf_tf32x2(float x0, float x1, float& y0, float& y1) {
  static_assert(FF_TF32_GELU_HALF_TERMS == 3 || FF_TF32_GELU_HALF_TERMS == 4, "3 or 4 Horner terms in half");
  uint32_t a, t;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(a) : "f"(x1), "f"(x0));
  asm("abs.f16x2 %0, %0;" : "+r"(a));   // fp16(|x|) = |fp16(x)|; ptxas folds it into the HFMA2s
  // c5, c4, c3 (and c2) of ff_phi_neg_log2 rounded to fp16, in both halves
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(t) : "r"(0x90179017u), "r"(a), "r"(0x1f6e1f6eu));
  asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(t) : "r"(a), "r"(0xaaafaaafu));
  if (FF_TF32_GELU_HALF_TERMS == 4) asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(t) : "r"(a), "r"(0xb75bb75bu));
  float t0, t1;
  asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
      : "=f"(t0), "=f"(t1) : "r"(t));
  y0 = ff_gelu_erf_from_inner(x0, t0);
  y1 = ff_gelu_erf_from_inner(x1, t1);
}

// The cubic form: ff_gelu_erf_noclamp with a degree-3 log2 Phi(-u) fitted for the TF32 bound (weighted minimax of
// u Phi(-u) ln 2 |P - log2 Phi(-u)| / max(1, u) on [0, 6]; its leading coefficient is negative, so P -> -inf and
// the clamp-free form stays valid): 3 FFMA instead of 5, 7 instructions per value with the sum instead of 9.  A
// degree 4 does not help: its best fit with a negative leading coefficient is this cubic, and a positive one needs
// the clamp back.  |err| <= 3.51e-5 max(1, |x|) in exact arithmetic: 1.15 of 2^-15.
__device__ __forceinline__ float ff_gelu_erf_cubic(float x) {
  const float u = fabsf(x);
  float r = fmaf(-0x1.ba0b1ap-6f, u, -0x1.f84a36p-2f);
  r = fmaf(r, u, -0x1.226ad6p+0f);
  r = fmaf(r, u, -0x1.00a10ap+0f);
  float q;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q) : "f"(r));
  return fmaf(-u, q, fmaxf(x, -0.0f));
}

// The degree-4 form on min(|x|, 6): 4 FFMA and the clamp (FMNMX, ALU pipe) instead of 5 FFMA; its positive leading
// coefficient needs the clamp.  3.57e-6 max(1, |x|) over every finite fp32 on the H200 (0.12 of 2^-15), but the seed
// kernel ran 4 % slower with it.  Finite x only; -0 -> -0, +inf -> +inf.
__device__ __forceinline__ float ff_gelu_erf_tf32(float x) {
  const float u = fminf(fabsf(x), 6.0f);
  float r = fmaf(0x1.122934p-8f, u, -0x1.752aacp-5f);
  r = fmaf(r, u, -0x1.dd017cp-2f);
  r = fmaf(r, u, -0x1.260752p+0f);
  r = fmaf(r, u, -0x1.0013b2p+0f);
  float q;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q) : "f"(r));
  return fmaf(-u, q, fmaxf(x, -0.0f));
}
