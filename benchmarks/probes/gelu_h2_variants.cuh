// Variants of the fused A kernel's 16-bit GELU (csrc/gelu_h2.cuh h2_gelu2) that the microbenchmarks price against it
// (probe_epilogue_a.cu: the seed's tile work; probe_wgmma_smem.cu: what runs beside a wgmma chain).  Each returns
// g = relu(x) - |x| Phi(-|x|) of a pair of fp32 values as f16x2 (V 0, the product's, returns 2g: these probes time,
// they do not check values); the epilogue around them (h2_var_epi) reduces, like wg_epi_h2, over the tile's 128
// pixels per channel by mma.sync.  Measured in docs/design.md, where V 0 was the product's earlier ex2 form:
//   V 0  the product form (h2_gelu2; the measurements: P3 with ex2, relu by HMNMX2)
//   V 1  an earlier form (fast_gelu.md's degree-5 P, relu by a second F2FP, cvt.rn.relu)
//   V 2  no MUFU: r' = -P5 clamped to <= 14, m = round(r') by the 1536 magic number, 2^-(r' - m) by a degree-3
//        polynomial (minimax on [-1/2, 1/2]), 2^-m by subtracting m << 10 from each half's exponent field
//   V 3  P5, relu by HMNMX2;  V 4  P5, relu by PRMT + LOP3 on the sign bits;  V 5  P3, relu by F2FP
//   V 6  half the pairs V 1, half V 2 (MUFU time and issue slots balanced)
//   V 7  no MUFU: Phi(-u) ~ P6(v), v = min(|x| - 7/4, 7/4) (u clamped at 3.5, Horner centred for fp16 conditioning),
//        g = relu(x) - |x| P6(v)
//   V 8  no MUFU, no relu: 2g = x + |x| Q6(v), Q6 ~ erf(u / sqrt 2) (the sum is twice the GELU's: halve it after)
//   V 9  half the pairs V 0 (MUFU), half V 7 (fp16 pipe only): the two bounds balanced
//   V 10 three quarters V 0, one quarter V 7
#pragma once
#include <stdint.h>
#include "gelu_h2.cuh"

__device__ __forceinline__ uint32_t h2_add(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

template <bool P3, int RL>   // RL 0: cvt.rn.relu (F2FP), 1: max(x, 0) by HMNMX2, 2: x & ~sign mask by PRMT + LOP3
__device__ __forceinline__ uint32_t h2_gelu_x(float lo, float hi) {
  uint32_t rl, hx, q;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hx) : "f"(hi), "f"(lo));
  if (RL == 0) asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(rl) : "f"(hi), "f"(lo));
  else if (RL == 1) asm("max.f16x2 %0, %1, %2;" : "=r"(rl) : "r"(hx), "r"(0u));
  else { uint32_t m; asm("prmt.b32 %0, %1, 0, 0xbb99;" : "=r"(m) : "r"(hx)); rl = hx & ~m; }
  const uint32_t nu = hx | 0x80008000u;
  uint32_t r;
  if (P3) {
    r = h2_fma(0x25ee25eeu, nu, 0xb80ab80au);
    r = h2_fma(r, nu, 0x3c7f3c7fu);
    r = h2_fma(r, nu, 0xbc04bc04u);
  } else {   // V 1's coefficients (c0, c2 moved a step for the truncating MUFU)
    r = h2_fma(0x10171017u, nu, 0x1f6e1f6eu);
    r = h2_fma(r, nu, 0x2aaf2aafu);
    r = h2_fma(r, nu, 0xb759b759u);
    r = h2_fma(r, nu, 0x3c9b3c9bu);
    r = h2_fma(r, nu, 0xbbffbbffu);
  }
  asm("ex2.approx.f16x2 %0, %1;" : "=r"(q) : "r"(r));
  return h2_fma(nu, q, rl);
}

__device__ __forceinline__ uint32_t h2_gelu_poly(float lo, float hi) {
  uint32_t rl, hx;
  asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(rl) : "f"(hi), "f"(lo));
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hx) : "f"(hi), "f"(lo));
  const uint32_t nu = hx | 0x80008000u;
  // r' = -P5(u) (every coefficient negated: fast_gelu.md's rounded to fp16), clamped to 14
  uint32_t r = h2_fma(0x90179017u, nu, 0x9f6e9f6eu);
  r = h2_fma(r, nu, 0xaaafaaafu);
  r = h2_fma(r, nu, 0x375a375au);
  r = h2_fma(r, nu, 0xbc9bbc9bu);
  r = h2_fma(r, nu, 0x3c003c00u);
  asm("min.f16x2 %0, %0, %1;" : "+r"(r) : "r"(0x4b004b00u));
  const uint32_t t = h2_add(r, 0x66006600u);           // 1536 + m, m = round(r') in 0..14: bits 0x6600 + m
  const uint32_t mi = h2_add(t, 0xe600e600u);          // m
  const uint32_t f = h2_fma(mi, 0xbc00bc00u, r);       // r' - m in [-1/2, 1/2], exact
  uint32_t p = h2_fma(0xab10ab10u, f, 0x33c333c3u);    // 2^-f
  p = h2_fma(p, f, 0xb98cb98cu);
  p = h2_fma(p, f, 0x3c003c00u);
  uint32_t s;
  asm("shf.l.wrap.b32 %0, %1, %1, 10;" : "=r"(s) : "r"(t));
  const uint32_t q = p - (s & 0xfc00fc00u);            // 2^-f 2^-m: m << 10 off each half's exponent field
  return h2_fma(nu, q, rl);
}

// V 7 / 8: v = min(|x| - 7/4, 7/4), then P6 (V 7: ~Phi(-u)) or Q6 (V 8: ~erf(u / sqrt 2)) by Horner in v
template <bool G2>
__device__ __forceinline__ uint32_t h2_gelu_p6(float lo, float hi) {
  uint32_t hx, t, v;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hx) : "f"(hi), "f"(lo));
  asm("abs.f16x2 %0, %1;" : "=r"(t) : "r"(hx));
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(v) : "r"(t), "r"(0xbf00bf00u));   // |x| - 1.75
  asm("min.f16x2 %0, %0, %1;" : "+r"(v) : "r"(0x3f003f00u));               // <= 1.75
  // packed f16x2 coefficients, highest power first (benchmarks/fit_gelu_h2_poly.py)
  constexpr uint32_t P6[7] = {0x91829182u, 0x1aa61aa6u, 0x8d578d57u, 0xa736a736u, 0x2cd92cd9u, 0xad8dad8du,
                              0x291d291du};
  constexpr uint32_t Q6[7] = {0x17431743u, 0x9f139f13u, 0x92db92dbu, 0x2b542b54u, 0xb0cdb0cdu, 0x318b318bu,
                              0x3b5b3b5bu};
  uint32_t r = h2_fma(G2 ? Q6[0] : P6[0], v, G2 ? Q6[1] : P6[1]);
#pragma unroll
  for (int k = 2; k < 7; ++k) r = h2_fma(r, v, G2 ? Q6[k] : P6[k]);
  if (G2) return h2_fma(t, r, hx);
  uint32_t rl, nu;
  asm("max.f16x2 %0, %1, %2;" : "=r"(rl) : "r"(hx), "r"(0u));
  asm("neg.f16x2 %0, %1;" : "=r"(nu) : "r"(t));
  return h2_fma(nu, r, rl);
}

template <int V>
__device__ __forceinline__ uint32_t h2_var(int f, float lo, float hi) {   // f: the pair's place in its A fragment
  if (V == 0) return h2_gelu2(lo, hi);
  if (V == 1 || (V == 6 && !(f & 1))) return h2_gelu_x<false, 0>(lo, hi);
  if (V == 2 || V == 6) return h2_gelu_poly(lo, hi);
  if (V == 3) return h2_gelu_x<false, 1>(lo, hi);
  if (V == 4) return h2_gelu_x<false, 2>(lo, hi);
  if (V == 7 || V == 8) return h2_gelu_p6<V == 8>(lo, hi);
  if (V == 9) return (f & 1) ? h2_gelu_p6<false>(lo, hi) : h2_gelu2(lo, hi);
  if (V == 10) return (f == 3) ? h2_gelu_p6<false>(lo, hi) : h2_gelu2(lo, hi);
  return h2_gelu_x<true, 0>(lo, hi);
}
template <int V>
__device__ __forceinline__ void h2_var_epi(const float (&acc)[64], float (&dm)[4]) {   // wg_epi_h2 with variant V
  wg_epi_h2_with(acc, dm, [](int f, float lo, float hi) { return h2_var<V>(f, lo, hi); });
}
