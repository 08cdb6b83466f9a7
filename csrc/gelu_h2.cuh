// GELU (erf) of two fp32 values in packed half precision, for the fused A kernel's 16-bit epilogue (wg_epi_h2 below,
// called by fa_wgmma_kernel, csrc/fused_conv_act_pool/wgmma_epilogue.cuh) and the microbenchmark
// benchmarks/probes/probe_epilogue_a.cu.
// wg_epi_h2 reduces over a tile's 128 pixels per output channel (the mean pool's sum), so that on the H200 none of its
// work is on the FP32 FMA pipe, which wgmma chains block (docs/design.md: FFMA / FADD beside a wgmma chain take the sum
// of the two times; HFMA2 runs beside it ~94 % hidden, MUFU ~100 %: docs/design.md).
// The form is GELU's tanh one, 2g = x (1 + tanh(x (c1 + c2 x^2))), per pair of accumulators (two pixels of one
// channel): x -> f16x2 (F2FP), x^2 (HMUL2), c1 + c2 x^2 (HFMA2), y (HMUL2), tanh.approx.f16x2, 2g = x t + x (HFMA2);
// the mma.sync that sums the g's multiplies by 1/2 (B = 0.5, exact).  Every term keeps fp16's relative precision down
// to |x| ~ 2^-12: near 0, 2g = x + c1 x^2 + ..., c1 = sqrt(2 / pi), GELU's own quadratic term.  That term is all a
// pooled mean of zero-mean activations keeps once their linear terms cancel, so it must be right relatively: the
// former form relu(x) - |x| 2^P3(|x|) (ex2, fast_gelu.md) carried Phi(-|x|) ~ 0.5 - 0.4 |x| at fp16's absolute step
// 2^-12 near 0.5 and a fit offset, and so missed means of zero-mean inputs of scale 0.01 by 30 % (0.1: 1.1 %).
// tanh.approx.f16x2: PTX bounds its relative error by 2^-10.987.  Coefficients: c1 = sqrt(2 / pi) rounded to fp16;
// c2 = 0.044715 c1 moved 11 steps up so that the pooled mean of normal inputs is not biased (tests/test_gelu_h2.py).
// Accuracy (tests/test_gelu_h2.py emulates every step, every fp16 x and 1.3 M random fp32 x against float64, tanh
// exact and at PTX's bound): |g - gelu(x)| <= 1.5e-3 max(1, |x|) (fp16 rounding of the conv output and of the GELU,
// where PyTorch rounds both; tanh's form itself is within 1.8e-4 max(1, |x|) of erf's); mean bias over normal
// inputs of scale 0.003-3 under 1.5e-3 at tanh's bound, 3e-4 with tanh exact.  Valid while 2x rounds to a finite fp16
// or x <= -32752 (2g = 0 exactly); x >= 32752, +-inf and NaN give 2g = inf or NaN, which the kernel's check catches
// (wg_epi_h2_checked in fused_conv_act_pool/wgmma_epilogue.cuh: such tiles go through the fp32 GELU), as it catches
// tiles whose row sums are too small for fp16's absolute floor.
#pragma once
#include "device_std.h"

// the fp16 constants as packed f16x2 (both halves): c1 = sqrt(2 / pi), c2 (see above), and the sum's 1/2
constexpr uint32_t H2_C1 = 0x3a623a62u, H2_C2 = 0x289c289cu, H2_HALF = 0x38003800u;

__device__ __forceinline__ uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t h2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// 2 g of an f16x2 pair hx (the conv outputs already rounded to fp16)
__device__ __forceinline__ uint32_t h2_gelu2_pair(uint32_t hx) {
  const uint32_t y = h2_mul(h2_fma(h2_mul(hx, hx), H2_C2, H2_C1), hx);
  uint32_t t;
  asm("tanh.approx.f16x2 %0, %1;" : "=r"(t) : "r"(y));
  return h2_fma(hx, t, hx);
}
__device__ __forceinline__ uint32_t h2_gelu2(float lo, float hi) {
  uint32_t hx;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hx) : "f"(hi), "f"(lo));
  return h2_gelu2_pair(hx);
}

// One 64 x 128 tile (m64n128 accumulator layout: thread holds channels m0, m0 + 8 at pixels 8i + 2tig + {0, 1}), GELU
// then the sum over its 128 pixels per channel: the 2g pairs of 16 pixels are an m16n8k16 A fragment as they lie (the
// m64nN accumulator layout is the m16n8k16 A layout: rows = channels m0, m0 + 8, k = pixels), so one mma.sync against a
// B of halves adds the g's into the fp32 accumulators dm (dm[0] = channel m0, dm[2] = m0 + 8, summed over the quad).
// The fragments of H2_SUM_BLOCKS such 16-pixel blocks are first added in fp16 (HADD2, round to nearest: each of the
// log2 H2_SUM_BLOCKS levels adds <= 2^-11 of its partial sums, unbiased), so a tile takes 2 mma.sync instead of 8: the
// legacy tensor-core op waits for the other blocks' wgmmas (ncu: 'math' stalls), and 8 of them were 1/2 of one wgmma's
// work.  Measured A / B (docs/design.md): 8 -> 4 -> 2 mma.sync -2 / -2 % per step, one (8 blocks, 28 HADD2) +1 to +3 %.
// gelu(f, lo, hi): the pair's 2g as f16x2 (f = its place in the A fragment; the microbenchmarks pass variants).
constexpr int H2_SUM_BLOCKS = 4;
constexpr int H2_SUM_GROUPS = 8 / H2_SUM_BLOCKS;   // mma.sync per tile
// the A fragment of sum group gi: the g pairs of pixel blocks 2j, 2j + 1 (16 pixels) for j = gi + H2_SUM_GROUPS t,
// added over t in fp16
template <class G>
__device__ __forceinline__ void wg_h2_frag(const float (&acc)[64], int gi, uint32_t (&a)[4], G&& gelu) {
  constexpr int NT = H2_SUM_BLOCKS, NG = H2_SUM_GROUPS;
#pragma unroll
  for (int f = 0; f < 4; ++f) {   // A fragment: (m0, k 0-7), (m0 + 8, k 0-7), (m0, k 8-15), (m0 + 8, k 8-15)
    uint32_t v[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int i = 2 * (gi + NG * t) + (f >> 1), e = (f & 1) * 2;
      v[t] = gelu(f, acc[4 * i + e], acc[4 * i + e + 1]);
    }
#pragma unroll
    for (int w = NT / 2; w > 0; w >>= 1)
#pragma unroll
      for (int t = 0; t < w; ++t) asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v[t]) : "r"(v[t + w]));
    a[f] = v[0];
  }
}
// dm += half the fragment's row sums (one mma.sync against a B of 1/2: the g's of h2_gelu2's 2g)
__device__ __forceinline__ void wg_h2_mma(float (&dm)[4], const uint32_t (&a)[4]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
               : "+f"(dm[0]), "+f"(dm[1]), "+f"(dm[2]), "+f"(dm[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(H2_HALF));
}
template <class G>
__device__ __forceinline__ void wg_epi_h2_with(const float (&acc)[64], float (&dm)[4], G&& gelu) {
#pragma unroll
  for (int gi = 0; gi < H2_SUM_GROUPS; ++gi) {
    uint32_t a[4];
    wg_h2_frag(acc, gi, a, gelu);
    wg_h2_mma(dm, a);
  }
}
__device__ __forceinline__ void wg_epi_h2(const float (&acc)[64], float (&dm)[4]) {
  wg_epi_h2_with(acc, dm, [](int, float lo, float hi) { return h2_gelu2(lo, hi); });
}
