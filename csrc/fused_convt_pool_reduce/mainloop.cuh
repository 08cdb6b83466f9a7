// Family B fused kernel: the main loop's two pieces per step -- a warpgroup's weight slices for one step into its
// shared-memory buffer, and the step's wgmmas on its 3 accumulator tiles.
#pragma once
#include "fused_convt_pool_reduce/primitives.cuh"

// Step e's TPS weight slices (consecutive in the packing) into this warpgroup's buffer at dst, a missing second tap
// (e.z < 0) as zeros; one commit group per call, empty past the end of the sequence (!has).
template <int KS, int DT>
__device__ __forceinline__ void fb_load_step(const void* wp, uint32_t dst, int4 e, bool has) {
  constexpr int SLICE_BYTES = fb_slice_bytes(DT, KS), STEP_BYTES = fb_tps(DT) * SLICE_BYTES;
  if (has) {
    const char* src = static_cast<const char*>(wp) + (size_t)e.x * SLICE_BYTES;
#pragma unroll
    for (int i = threadIdx.x & 127; i < STEP_BYTES / 16; i += 128) {
      const bool ok = i < SLICE_BYTES / 16 || e.z >= 0;
      ff_cp_async16(dst + i * 16, ok ? src + i * 16 : src, ok);
    }
  }
  ff_cp_commit();
}

#ifdef FF_HAVE_WGMMA
// The wgmmas of step e (TPS taps x KS k steps x 3 tiles), not committed: A = the step's weights at a_lo (descriptor
// address | LBO), B = the tiles' descriptors bdesc shifted by the taps' offsets.  accumulate == 0 starts the tiles'
// sums.  A step without a second tap (odd tap count) multiplies zero weights by the tile's zero slack (zero_desc,
// read with LBO 0), so Inf / NaN in the input cannot leak into it.  The "ieee" variant (FB_X3): w_hi x_hi and
// w_lo x_hi in TF32 over the rounded tile, then bf16(w) x_lo over the x_lo tile (lo16: its offset, 16-byte units).
template <int KS, int DT>
__device__ __forceinline__ void fb_step_mmas(float (&acc)[3][48], uint32_t a_lo, const uint32_t (&bdesc)[3], int4 e,
                                             int accumulate, uint32_t zero_desc, uint32_t plane16, uint32_t lo16) {
  constexpr bool X3 = DT == FB_X3;
  constexpr int KS16 = X3 ? fb_ks16(KS) : 0;
  constexpr int SLICE_BYTES = fb_slice_bytes(DT, KS), TPS = fb_tps(DT);
  const uint64_t desc_hi = (uint64_t)(128 >> 4) << 32;            // SBO: 8-column core matrices 128 B apart
  const bool none1 = e.z < 0;
  uint32_t b1[3];
#pragma unroll
  for (int j = 0; j < 3; ++j) b1[j] = none1 ? zero_desc : bdesc[j] - (uint32_t)e.z;
  const uint32_t kstep1 = none1 ? 0u : 2 * plane16;
  ff_wg_fence();
  if constexpr (X3) {   // w_hi x_hi, w_lo x_hi (tf32), bf16(w) x_lo (bf16)
#pragma unroll
    for (int part = 0; part < 2; ++part)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const uint64_t da = (uint64_t)(a_lo + (part * KS + ks) * (2048 >> 4)) | desc_hi;
#pragma unroll
        for (int j = 0; j < 3; ++j)
          ff_wgmma<96, FF_F32>(acc[j], da, (uint64_t)(bdesc[j] + ks * 2 * plane16 - (uint32_t)e.y) | desc_hi,
                        (accumulate || part > 0 || ks > 0) ? 1 : 0);
      }
#pragma unroll
    for (int ks = 0; ks < KS16; ++ks) {
      const uint64_t da = (uint64_t)(a_lo + (2 * KS + ks) * (2048 >> 4)) | desc_hi;
#pragma unroll
      for (int j = 0; j < 3; ++j)
        ff_wgmma<96, FF_BF16>(acc[j], da, (uint64_t)(bdesc[j] + lo16 + ks * 2 * plane16 - (uint32_t)e.y) | desc_hi, 1);
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {   // tap 0
      const uint64_t da = (uint64_t)(a_lo + ks * (2048 >> 4)) | desc_hi;
#pragma unroll
      for (int j = 0; j < 3; ++j)
        ff_wgmma<96, DT>(acc[j], da, (uint64_t)(bdesc[j] + ks * 2 * plane16 - (uint32_t)e.y) | desc_hi,
                     (accumulate || ks > 0) ? 1 : 0);
    }
#pragma unroll
    for (int ks = 0; ks < (TPS == 2 ? KS : 0); ++ks) {   // tap 1
      const uint64_t da = (uint64_t)(a_lo + (SLICE_BYTES >> 4) + ks * (2048 >> 4)) | desc_hi;
#pragma unroll
      for (int j = 0; j < 3; ++j) ff_wgmma<96, DT>(acc[j], da, (uint64_t)(b1[j] + ks * kstep1) | desc_hi, 1);
    }
  }
}
#endif
