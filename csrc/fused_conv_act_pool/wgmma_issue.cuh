// Family A, fused, sm_90a: the B-descriptor table of the input-row ring and the issue of one half-row's wgmma chain.
#pragma once
#include "fused_conv_act_pool/wgmma_params.cuh"
#include "arch_sm90.cuh"

// The B descriptor table (low words), entry (rs * 2 + h) * WG_DSTRIDE(NOPS) + j: op j for output-row ring slot rs and
// half h reads ring slot (rs + op_rd[j]) % RB at column h * 128 (the bias op's ones block: op_mask 0, always the same
// address).  Straight-line kernels (NOPS > 0) pack it NOPS ops wide, the general one WG_MAXOPS (wg_plan sizes it the
// same).
// The column-pair op (col_j >= 0, 16-bit 3x3: WG_COL16_OPS) reads ring slots sl0 = (rs + op_rd) % RB and
// sl1 = (rs + col_rd2) % RB: its entry starts at the lower of the two with LBO = their distance, and entry NOPS holds
// the low word of its A descriptor (block col_j, or block na - 1 = the swapped one where sl1 < sl0).
#define WG_DSTRIDE(NOPS) ((NOPS) == WG_COL16_OPS ? (NOPS) + 1 : (NOPS) > 0 ? (NOPS) : WG_MAXOPS)
template <int NOPS>
__device__ __forceinline__ void wg_dtab_fill(const WGParams& p, uint32_t* dtab, uint32_t sbase16) {
  constexpr int DS = WG_DSTRIDE(NOPS);
  for (int i = threadIdx.x; i < p.RB * 2 * DS; i += blockDim.x) {
    const int j = i % DS, half = (i / DS) & 1, rs = i / (2 * DS);
    const int jo = (NOPS == WG_COL16_OPS && j == NOPS) ? p.col_j : j;   // entry NOPS: the column op's A word
    int sl = rs + p.op_rd[jo];
    sl -= (sl >= p.RB) ? p.RB : 0;
    if (NOPS == WG_COL16_OPS && jo == p.col_j) {
      int sl1 = rs + p.col_rd2;
      sl1 -= (sl1 >= p.RB) ? p.RB : 0;
      const bool swap = sl1 < sl;
      if (j == NOPS) {
        dtab[i] = sbase16 + (uint32_t)(swap ? p.na - 1 : p.col_j) * (2048 >> 4) + ((1024u >> 4) << 16);
      } else {
        const int lo = swap ? sl1 : sl, gap = swap ? sl - sl1 : sl1 - sl;
        dtab[i] = sbase16 + p.op_d[j] + (uint32_t)(lo * p.slot16 + half * (WG_NT / 2))
                  + ((uint32_t)(gap * p.slot16) << 16);
      }
      continue;
    }
    dtab[i] = sbase16 + p.op_d[j] + ((uint32_t)(sl * p.slot16 + half * (WG_NT / 2)) & p.op_mask[j]);
  }
}

// All wgmmas of one half (128 pixels) of output row t, rs = ring slot of the row's first input row.  NOPS > 0 is the op
// count at compile time (straight-line code: ptxas then chains the HGMMAs without a fence or scoreboard wait between
// them); NOPS == 0 reads it at run time (ptxas then fences every HGMMA: correct, slower), its loop unrolled by 4: as
// fast as unrolled in full and ~40 % less compile (rolled: 5-8.5 % slower at 5x5; docs/design.md).  fp32's bias op is
// the last op (it has no ieee small terms); 16-bit carries the bias in a spare chunk or in a last op of its own alike.
// B descriptors' low words come from the table dtab[(rs * 2 + half) * WG_DSTRIDE(NOPS) + j] (wg_dtab_fill): one shared
// load per op instead of ~10 instructions of ring-slot arithmetic.
// H >= 0 (two output rows per tile, WG_NT_R2): m64n64 wgmmas into accumulators 32 H .. 32 H + 31 only (not ieee).
template <int DT, bool SPLIT, int NOPS, int H = -1>
__device__ __forceinline__ void wg_issue(const WGParams& p, float (&acc)[64], uint32_t sbase16, const uint32_t* dtab,
                                         int rs, int half) {
#ifdef FF_HAVE_WGMMA
  // straight-line kernels read the whole row of descriptor words first, so that the shared-memory latencies overlap
  // (one LDS before each HGMMA made every R2UR wait on its own load: ncu, docs/design.md); not the ieee kernel (SPLIT),
  // whose 246 registers grew to 254 with it and whose NCHW time by 5 %
  constexpr bool PRE = NOPS > 0 && !SPLIT;
  constexpr bool COL = NOPS == WG_COL16_OPS;    // + the column op's A word (wg_dtab_fill)
  constexpr int NL = PRE ? NOPS + (COL ? 1 : 0) : 1;
  uint32_t dl[NL];
  const uint32_t* drow = dtab + (rs * 2 + half) * WG_DSTRIDE(NOPS);
  if (PRE) {
#pragma unroll
    for (int j = 0; j < NL; ++j) dl[j] = drow[j];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
  ff_wg_fence();
#pragma unroll(NOPS > 0 ? NOPS : 4)
  for (int j = 0; j < (NOPS > 0 ? NOPS : WG_MAXOPS); ++j) {
    if (NOPS == 0 && j >= p.nops) break;
    const uint64_t desc = (uint64_t)(PRE ? dl[j < NL ? j : 0] : drow[j]) | ((uint64_t)p.op_hi[j] << 32);
    const uint64_t da = (COL && j == WG_COL16_J)
                            ? ((uint64_t)dl[NL - 1] | ((uint64_t)(128 >> 4) << 32))
                            : ((uint64_t)(sbase16 + j * (2048 >> 4)) | ((uint64_t)(1024 >> 4) << 16)
                               | ((uint64_t)(128 >> 4) << 32));
    const bool bias_op = (NOPS > 0) ? (j == NOPS - 1) : (j == p.nops - 1);
    if constexpr (H >= 0) {
      static_assert(!SPLIT && H < 2, "two rows per tile: halves 0 and 1, not ieee");
      float* const d = acc + 32 * H;
      ff_wgmma<64, DT>(d, da, desc, j > 0);
    } else if (DT == FF_BF16) {
      ff_wgmma<128, FF_BF16>(acc, da, desc, j > 0);
    } else if (DT == FF_F16) {
      ff_wgmma<128, FF_F16>(acc, da, desc, j > 0);
    } else if (SPLIT && !bias_op) {   // x w ~ x_hi w_hi (tf32) + [bf16(x) | bf16(x_lo)] . [bf16(w_lo) | bf16(w)] (k16)
      ff_wgmma<128, FF_BF16>(acc, da + (uint64_t)(p.a_small_off >> 4), desc + (uint64_t)(p.small_off >> 4), j > 0);
      ff_wgmma<128, FF_F32>(acc, da, desc, 1);
    } else {
      ff_wgmma<128, FF_F32>(acc, da, desc, j > 0);
    }
  }
  ff_wg_commit();
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
#endif
}
