// GELU (erf) of two fp32 values in packed half precision, for the fused A kernel's 16-bit epilogue (wg_epi_h2 below,
// called by fa_wgmma_kernel, csrc/fused_conv_act_pool/wgmma_epilogue.cuh) and the microbenchmark
// benchmarks/probe_epilogue_a.cu.
// wg_epi_h2 reduces over a tile's 128 pixels per output channel (the mean pool's sum), so that on the H200 none of its
// work is on the FP32 FMA pipe, which wgmma chains block (docs/design.md: FFMA / FADD beside a wgmma chain take the sum
// of the two times; HFMA2 runs beside it ~94 % hidden, MUFU ~100 %: docs/design.md).  Per pair of accumulators (two
// pixels of one channel): x -> f16x2 (F2FP), relu(x) = max(x, 0) (HMNMX2), nu = -|x| (an operand modifier of the
// HFMA2s, docs/design.md; a LOP3 before), Phi(-|x|) = 2^P3(|x|) by 3 HFMA2 in nu and ex2.approx.f16x2 (two
// MUFU.EX2.F16), g = relu(x) + nu Phi by one HFMA2: fast_gelu.md's form relu(x) - |x| 2^P(|x|), with a degree-3 P
// fitted for fp16 accuracy (max |g error| on [0, 4] ~1e-4 in exact arithmetic; fast_gelu.md's degree 5 is for fp32)
// — 7 cycles per tile fewer than degree 5 with a second F2FP for relu (docs/design.md, probe_epilogue_a.cu).
// MUFU.EX2.F16 rounds toward zero (measured bit for bit on the H200, benchmarks/diag_gelu_h2.py); P's fp16 coefficients
// are the fit's moved by a step or two so that this rounding does not bias the pooled mean (tests/test_gelu_h2.py).
// Accuracy (tests/test_gelu_h2.py emulates every step, every fp16 x and 1.3 M random fp32 x against float64):
// |g - gelu(x)| <= 1.2e-3 max(1, |x|) (~2 fp16 ulps: fp16 rounding of the conv output and of the GELU, where PyTorch
// rounds both to the input's 16-bit type); mean bias over normal inputs of scale 0.3-3 under 1.5e-4.  Valid only while
// x rounds to a finite fp16 (|x| < 65520); any other x gives g = NaN, which the kernel's check after each tile catches
// (wg_epi_h2_checked in fused_conv_act_pool/wgmma_epilogue.cuh: such tiles go through the fp32 GELU).
#pragma once
#include "device_std.h"

__device__ __forceinline__ uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// g of an f16x2 pair hx (the conv outputs already rounded to fp16)
__device__ __forceinline__ uint32_t h2_gelu_pair(uint32_t hx) {
  uint32_t rl, q;
  asm("max.f16x2 %0, %1, %2;" : "=r"(rl) : "r"(hx), "r"(0u));
  uint32_t nu;   // -|x|: ptxas folds it into the HFMA2s as an operand modifier (-|R|), no instruction of its own
  asm("abs.f16x2 %0, %1;" : "=r"(nu) : "r"(hx));
  asm("neg.f16x2 %0, %0;" : "+r"(nu));
  // P3(u) in nu = -u: the coefficients carry the signs (-1)^i (0.0232, -0.5049, 1.1240, -1.0039)
  uint32_t r = h2_fma(0x25ee25eeu, nu, 0xb80ab80au);
  r = h2_fma(r, nu, 0x3c7f3c7fu);
  r = h2_fma(r, nu, 0xbc04bc04u);
  asm("ex2.approx.f16x2 %0, %1;" : "=r"(q) : "r"(r));
  return h2_fma(nu, q, rl);
}
__device__ __forceinline__ uint32_t h2_gelu(float lo, float hi) {
  uint32_t hx;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hx) : "f"(hi), "f"(lo));
  return h2_gelu_pair(hx);
}

// One 64 x 128 tile (m64n128 accumulator layout: thread holds channels m0, m0 + 8 at pixels 8i + 2tig + {0, 1}), GELU
// then the sum over its 128 pixels per channel: the g pairs of 16 pixels are an m16n8k16 A fragment as they lie (the
// m64nN accumulator layout is the m16n8k16 A layout: rows = channels m0, m0 + 8, k = pixels), so one mma.sync against a
// B of ones adds them into the fp32 accumulators dm (dm[0] = channel m0, dm[2] = m0 + 8, already summed over the quad).
// The fragments of H2_SUM_BLOCKS such 16-pixel blocks are first added in fp16 (HADD2, round to nearest: each of the
// log2 H2_SUM_BLOCKS levels adds <= 2^-11 of its partial sums, unbiased), so a tile takes 2 mma.sync instead of 8: the
// legacy tensor-core op waits for the other blocks' wgmmas (ncu: 'math' stalls), and 8 of them were 1/2 of one wgmma's
// work.  Measured A / B (docs/design.md): 8 -> 4 -> 2 mma.sync -2 / -2 % per step, one (8 blocks, 28 HADD2) +1 to +3 %.
// gelu(f, lo, hi): the pair's g as f16x2 (f = its place in the A fragment; the microbenchmarks pass variants).
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
// dm += the fragment's row sums (one mma.sync against a B of ones)
__device__ __forceinline__ void wg_h2_mma(float (&dm)[4], const uint32_t (&a)[4]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
               : "+f"(dm[0]), "+f"(dm[1]), "+f"(dm[2]), "+f"(dm[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(0x3c003c00u));
}
// this thread's share of a fragment's two row sums in fp16, as f16x2 (row m0, row m0 + 8): its pixel pairs added
__device__ __forceinline__ uint32_t wg_h2_frag_rows(const uint32_t (&a)[4]) {
  uint32_t p, q, s;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(p) : "r"(a[0]), "r"(a[2]));   // row m0
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(q) : "r"(a[1]), "r"(a[3]));   // row m0 + 8
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(s) : "r"(__byte_perm(p, q, 0x5410)), "r"(__byte_perm(p, q, 0x7632)));
  return s;
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
  wg_epi_h2_with(acc, dm, [](int, float lo, float hi) { return h2_gelu(lo, hi); });
}
