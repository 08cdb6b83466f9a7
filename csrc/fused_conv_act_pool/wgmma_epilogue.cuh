// Family A, fused, sm_90a: the epilogue of one 64-channel x 128-pixel accumulator tile — bias already in, the
// activation, then the tile added into the thread's running per-channel sums (mean) or maxima (max), exact fp32 or the
// 16-bit half-precision GELU mean (gelu_h2.cuh) with its own range check.
#pragma once
#include "activation.cuh"
#include "gelu_h2.cuh"
#include "fused_conv_act_pool/wgmma_params.cuh"

// Epilogue of one 64 x 128 tile: thread holds channels m0, m0 + 8 at pixels 8i + 2tig + {0,1}; pixels >= qv are
// padding.  Column blocks wholly inside qv (all but the last of a partial tile) skip the mask test; FULL (qv >= 128)
// has none.  NOCLAMP: GELU (erf) through ff_gelu_erf_noclamp (see wg_epi).  SAT (fp16 input): the conv output goes
// through ff_f16_sat first, as PyTorch rounds an fp16 conv's output to fp16 (+-inf past 65504) before the activation;
// ff_gelu_erf_noclamp would turn +inf into NaN, so SAT never takes it.
template <int ACT, int POOL, bool NOCLAMP, bool FULL, bool SAT = false>
__device__ __forceinline__ void wg_epi_pass(const float (&acc)[64], float (&red)[2][2], int qv, int tig) {
  static_assert(!(NOCLAMP && SAT), "the clamp-free GELU is not exact at +inf");
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float y[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = SAT ? ff_f16_sat(acc[4 * i + e]) : acc[4 * i + e];
      y[e] = NOCLAMP ? ff_gelu_erf_noclamp(x) : ff_activate<ACT>(x);
    }
    if (FULL || 8 * i + 8 <= qv) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& rr = red[e >> 1][e & 1];
        rr = (POOL == FF_POOL_MEAN) ? rr + y[e] : ff_max_nan(rr, y[e]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = 8 * i + 2 * tig + (e & 1) < qv;
        float& rr = red[e >> 1][e & 1];
        if (POOL == FF_POOL_MEAN) rr += ok ? y[e] : 0.0f;
        else if (ok) rr = ff_max_nan(rr, y[e]);
      }
    }
  }
}

// GELU (erf), the hot case: fast = the block has seen only finite, bounded inputs and weights (WGInBound), so every
// conv output is finite and the clamp-free form (9 issue slots per value with the sum instead of 11) is bitwise
// ff_gelu_erf; otherwise (WGParams gelu_fast = 0) ff_gelu_erf itself.  full: no pixel of the tile is padding
// (a whole 128-pixel tile, or a mean whose padding accumulators were zeroed, wg_epi_any), so the pass runs without the
// per-column-block mask tests: one straight-line block of 64 values.  SAT: fp16 input (wg_epi_pass), where a conv
// output past fp16's range is +-inf even from bounded inputs, so it takes the exact form.
template <int ACT, int POOL, bool SAT = false>
__device__ __forceinline__ void wg_epi(const float (&acc)[64], float (&red)[2][2], int qv, int tig, bool fast,
                                       bool full) {
  if (ACT == FF_ACT_GELU_ERF && fast && !SAT) {
    if (full) wg_epi_pass<ACT, POOL, !SAT, true>(acc, red, qv, tig);
    else wg_epi_pass<ACT, POOL, !SAT, false>(acc, red, qv, tig);
  } else if (POOL == FF_POOL_MEAN && full) {
    wg_epi_pass<ACT, POOL, false, true, SAT>(acc, red, qv, tig);
  } else {
    wg_epi_pass<ACT, POOL, false, false, SAT>(acc, red, qv, tig);
  }
}

template <int POOL, bool SAT = false>
__device__ __forceinline__ void wg_epi_dispatch(int act, const float (&acc)[64], float (&red)[2][2], int qv, int tig,
                                                bool fast, bool full) {
  switch (act) {
    case FF_ACT_NONE: wg_epi<FF_ACT_NONE, POOL, SAT>(acc, red, qv, tig, fast, full); break;
    case FF_ACT_RELU: wg_epi<FF_ACT_RELU, POOL, SAT>(acc, red, qv, tig, fast, full); break;
    case FF_ACT_GELU_ERF: wg_epi<FF_ACT_GELU_ERF, POOL, SAT>(acc, red, qv, tig, fast, full); break;
    case FF_ACT_GELU_TANH: wg_epi<FF_ACT_GELU_TANH, POOL, SAT>(acc, red, qv, tig, fast, full); break;
    default: wg_epi<FF_ACT_SILU, POOL, SAT>(acc, red, qv, tig, fast, full); break;
  }
}

// The 16-bit GELU mean epilogue, checked: wg_epi_h2 holds its bound only for conv outputs whose double rounds to a
// finite fp16 or that are <= -32752, and any other (x >= 32752; +-inf; NaN) turns its pair's 2g into inf or NaN, and
// with it the quad's row sum in dm, which is otherwise finite (a sum of at most ~1e4 tiles of 128 values <= 65504; fp16
// partial sums of 4 2g's that overflow give inf).  So a non-finite dm after the tile takes the tile back — dm as before
// it (dm[1], dm[3] are the same sums as dm[0], dm[2]: every column of the B matrix) — and runs it through the exact
// GELU (ff_gelu_erf) into red instead.  fp16 input: that redo sees the conv outputs through ff_f16_sat, so |x| >= 65520
// gives PyTorch's GELU(+-inf) = inf / NaN.  The check costs four compares per tile (it replaced a guard on the staged
// inputs whose running bound cost a pass over every row, docs/design.md).
// A tile is also redone when it adds less than T = 2^-4 to either row sum (128 pixels).  fp16 keeps a relative 2^-11
// down to |x| ~ 2^-12 in h2_gelu2, but 2g = x + c1 x^2 rounds to fp16 at the step of x, so for |x| below ~1e-3 the
// quadratic term is lost against it — and the quadratic term is all a mean of zero-mean activations keeps (PyTorch in
// bf16 / fp16 rounds g itself, relatively).  Zero-mean rows of |x| <= 2e-3 sum to ~0.5 |x| sqrt(128) <= 1.1e-2, 5.5
// sigma under T; from |x| ~ 3e-3 up the tanh form's means are within ~1e-3 (tests/test_gelu_h2.py).  Rows of real data
// rarely fall below T (seed data: row sums ~40), and a redo costs its warpgroup one fp32 epilogue.
// Only rows of real output channels count (m0 < K, m0 + 8 < K; m0 as fa_wgmma_kernel's, worked out here so that it
// holds no register across the tile loop): a padding channel's row sums to 0 and would send every tile of its warp
// through the fp32 GELU.
template <int DT>
__device__ __forceinline__ void wg_epi_h2_checked(const WGParams& p, const float (&acc)[64], float (&red)[2][2],
                                                  float (&dm)[4], int tig) {
  constexpr float T = 0x1p-4f;
  const float d0 = dm[0], d2 = dm[2];
  wg_epi_h2(acc, dm);
  const int m0 = 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2);
  // (NaN fails every compare)
  const bool keep = (fabsf(dm[0] - d0) >= T || m0 >= p.K) && (fabsf(dm[2] - d2) >= T || m0 + 8 >= p.K) &&
                    fabsf(dm[0]) < __int_as_float(0x7f800000) && fabsf(dm[2]) < __int_as_float(0x7f800000);
  if (!keep) {
    dm[0] = dm[1] = d0;
    dm[2] = dm[3] = d2;
    wg_epi_pass<FF_ACT_GELU_ERF, FF_POOL_MEAN, false, true, DT == FF_F16>(acc, red, WG_NT / 2, tig);
  }
}

// Mean pooling zeroes a partial tile's padding accumulators (pixels >= qv) first: every activation maps 0 to (+-)0,
// which adds nothing to a sum, so the epilogue then runs as for a whole tile — one straight-line block of 64 values,
// where the per-column-block mask tests split it into 16 small blocks (measured: TF32 NCHW / channels_last,
// docs/design.md).  Where only the last column block is partial (qv > 120: the seed's second half-row has 126 pixels)
// only its 4 values are tested; the general loop, which ptxas predicates whole (2 compares and 4 selects per column
// block, issued even where off: 9 % of the 16-bit kernel's issue at the seed, docs/design.md), serves the rest.  Max
// pooling keeps the masks (0 is not neutral for a max); 16-bit whole tiles skip them too (WGParams fulltile).
// ieee (SPLIT) keeps the masked pass as well: its 255-register kernel measured 3 % slower NCHW with this one.
// h2: the half-precision GELU (wg_epi_h2_checked, 16-bit input only) adds into dm[0..3] instead of red.
template <int DT, bool SPLIT>
__device__ __forceinline__ void wg_epi_any(const WGParams& p, float (&acc)[64], float (&red)[2][2], float (&dm)[4],
                                           int qv, int tig, bool fast, bool h2) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
  if (p.pool == FF_POOL_MEAN && !SPLIT) {
    if (qv < WG_NT / 2) {
      if (qv > WG_NT / 2 - 8) {
        const int lim = qv - (WG_NT / 2 - 8) - 2 * tig;   // pixel 120 + 2 tig + (e & 1) is valid iff (e & 1) < lim
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[60 + e] = (e & 1) < lim ? acc[60 + e] : 0.0f;
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (8 * i + 8 > qv) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[4 * i + e] = (8 * i + 2 * tig + (e & 1) < qv) ? acc[4 * i + e] : 0.0f;
          }
      }
    }
    if (DT != FF_F32 && h2) wg_epi_h2_checked<DT>(p, acc, red, dm, tig);
    else wg_epi_dispatch<FF_POOL_MEAN, DT == FF_F16>(p.act, acc, red, WG_NT / 2, tig, fast, true);
  } else {
    // mask-free whole tiles for 16-bit input only (measured: 16-bit channels_last -4 %, TF32 even, ieee +7 %), so the
    // fp32 kernels do not carry that code
    const bool full = DT != FF_F32 && p.fulltile && qv >= WG_NT / 2;
    if (p.pool == FF_POOL_MEAN) wg_epi_dispatch<FF_POOL_MEAN, DT == FF_F16>(p.act, acc, red, qv, tig, fast, full);
    else wg_epi_dispatch<FF_POOL_MAX, DT == FF_F16>(p.act, acc, red, qv, tig, fast, full);
  }
}

// The epilogue of two output rows per tile (WG_NT_R2): accumulators 4i + e hold row t's pixel 8i + 2 tig + (e & 1) for
// i < 8, row t + 1's pixel 8 (i - 8) + 2 tig + (e & 1) for i >= 8 (two: row t + 1 exists).  Pixels >= qv of each row,
// and the second row where there is none, are neutralised — mean: 0, which every activation maps to (+-)0; max: the
// thread's value of the same channel at row t's pixel 2 tig (valid: qv >= 8), a duplicate that leaves the maximum as it
// is — so that the whole-tile pass (no masks) serves both pools.
template <int DT>
__device__ __forceinline__ void wg_epi_r2(const WGParams& p, float (&acc)[64], float (&red)[2][2], float (&dm)[4],
                                          int qv, bool two, int tig, bool fast, bool h2) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
  const bool mean = p.pool == FF_POOL_MEAN;
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if ((i >= 8 && !two) || 8 * (i & 7) + 8 > qv) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = (i < 8 || two) && 8 * (i & 7) + 2 * tig + (e & 1) < qv;
        acc[4 * i + e] = ok ? acc[4 * i + e] : mean ? 0.0f : acc[e & 2];
      }
    }
  if (mean) {
    if (DT != FF_F32 && h2) wg_epi_h2_checked<DT>(p, acc, red, dm, tig);
    else wg_epi_dispatch<FF_POOL_MEAN, DT == FF_F16>(p.act, acc, red, WG_NT / 2, tig, fast, true);
  } else {
    wg_epi_dispatch<FF_POOL_MAX, DT == FF_F16>(p.act, acc, red, WG_NT / 2, tig, fast, true);
  }
}

// 16-bit GELU means take the half-precision epilogue (wg_epi_h2_checked), which checks its own
// range, so their rows need no input bound
template <int DT>
__device__ __forceinline__ bool wg_h2_cap(const WGParams& p) {
  return DT != FF_F32 && p.h2 && p.gelu_fast && p.act == FF_ACT_GELU_ERF && p.pool == FF_POOL_MEAN;
}
