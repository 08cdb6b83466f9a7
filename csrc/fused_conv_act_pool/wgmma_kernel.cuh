// Family A, fused, the sm_90a kernel (fa_wgmma_kernel): implicit-GEMM conv on wgmma over a ring of input rows.
// Reduces, per (image, output channel), over all output pixels (the global pool), so the conv output stays in
// registers: each 64 x 128 accumulator tile is activated and added into running sums / maxima right after its wgmma
// chain, and only one partial per (block, image, channel) leaves the chip.
#pragma once
#include "fused_conv_act_pool/wgmma_issue.cuh"
#include "fused_conv_act_pool/wgmma_block_setup.cuh"
#include "fused_conv_act_pool/wgmma_reduce.cuh"

// Before row t's wgmmas (fa_wgmma_kernel): the barrier after which the rows of output row t are in, and whether they
// are bounded where the epilogue needs to know (the result only grows: a later row's answer covers the earlier rows
// too).
template <int DT>
__device__ __forceinline__ bool wg_row_ready(const WGParams& p, bool h2_cap, const WGInBound& bound) {
  ff_fence_proxy_async();
  bool in_ok = true;
  if (h2_cap) {
    __syncthreads();
  } else {
    in_ok = __syncthreads_and(bound.ok<DT>()) != 0;
  }
  return in_ok;
}
// MINB = blocks per SM the register budget is cut for (4: 128 registers, 3: 168, 2: 255); VOL: a Conv3d (WGParams vT;
// the per-element and NCHW loaders only); SW2: stride-2 columns (WG_NT2; the TMA loaders, Conv2d); R2: two output rows
// per tile (WG_NT_R2; the TMA loaders, Conv2d, not ieee)
template <int DT, bool SPLIT, int LM, int NOPS, int MINB, bool VOL, bool SW2 = false, bool R2 = false>
__global__ void __launch_bounds__(128, MINB) fa_wgmma_kernel(const __grid_constant__ WGParams p) {
  static_assert(!VOL || LM == WG_LM_ELEM || LM == WG_LM_REG || LM == WG_LM_NCHW4 || LM == WG_LM_NCHW8
                || LM == WG_LM_TNCHW, "Conv3d loaders");
  static_assert(!SW2 || (!VOL && wg_lm_tma(LM)), "stride-2 columns: the TMA loaders, Conv2d");
  static_assert(!R2 || (!VOL && !SPLIT && wg_lm_tma(LM)), "two rows per tile: the TMA loaders, Conv2d, not ieee");
#ifdef FF_HAVE_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr bool TMA = wg_lm_tma(LM);
  // TMA destinations must be 128-byte aligned; the dynamic shared memory starts after the static (1040 bytes on sm_90),
  // whatever alignment the declaration asks for, so the TMA kernels move their layout up to the next 128 bytes (wg_plan
  // adds them)
  unsigned char* const smem = smem_raw + (TMA ? (128u - ((uint32_t)__cvta_generic_to_shared(smem_raw) & 127u)) & 127u
                                          : 0u);
  const uint32_t sbase16 = (uint32_t)__cvta_generic_to_shared(smem) >> 4;
  __shared__ int last_s;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem) + (uint32_t)p.ring_off;
  uint32_t* dtab = reinterpret_cast<uint32_t*>(smem + p.dtab_off);
  const long long L0 = wg_line0(p, blockIdx.x), L1 = wg_line0(p, blockIdx.x + 1);
  // GELU (erf) in its clamp-free form while every staged input, weight and bias is bounded (WGInBound, wg_epi)
  const bool gelu_fast = p.gelu_fast && p.act == FF_ACT_GELU_ERF;
  const bool h2_cap = wg_h2_cap<DT>(p);
  // the post-copy pass of 16-bit channels_last rows (the bound: its only work there) only when the bound is used;
  // 16-bit TNCHW skips the bound then
  const bool tpost = DT == FF_F32 || (gelu_fast && !h2_cap);
  WGInBound bound;
  const WGTn16<SW2> tn(p, NOPS > 0);   // (16-bit TNCHW only; dead code elsewhere)
  // the first piece's first D row groups go out before the setup, so their DRAM latency runs under it (the ring, the
  // A operands, the ones plane and the descriptor table are disjoint shared memory); the line loop skips them.
  // TMA: the first `pre` rows (as many as the stages hold), after thread 0 initialised the stages' mbarriers.
  const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(smem) + (uint32_t)p.bar_off;
  const uint32_t stage0 = (uint32_t)__cvta_generic_to_shared(smem) + (uint32_t)p.stage_off;
  uint32_t tph = 0u;   // TMA: phase bit of each stage's mbarrier
  WGRowSlot tak;       // TMA: where the piece's next row to take goes
  int pre = 0;
  if constexpr (TMA) {
    if (tid == 0) {
      for (int s = 0; s < p.NST; ++s) ff_mbar_init(bar0 + 8u * s, 1);
      ff_fence_mbar_init();
      ff_fence_proxy_async();
    }
    if (L0 < L1) {
      const WGPiece<VOL, SW2> pc(p, L0, L1);
      pre = min(p.NST, wg_group_hi(p, min(p.D, pc.np) - 1) + 1);
      if (tid == 0)
        for (int j = 0; j < pre; ++j)   // (pre <= NST)
          wg_tma_row<DT, LM, VOL, SW2>(p, ring, stage0, bar0, j, pc.nx, pc.hbase + j, pc.wbase);
    }
  } else if (LM != WG_LM_REG && L0 < L1) {
    const WGPiece<VOL, SW2> pc(p, L0, L1);
    for (int t = 0; t < p.D; ++t) {
      wg_group<DT, SPLIT, LM, 0, VOL>(p, ring, t, pc.np, pc.nx, pc.hbase, pc.wbase, bound);
      ff_cp_commit();
    }
  }
  if constexpr (VOL && LM == WG_LM_TNCHW)   // (read after that barrier too)
    wg_tma_zero_vol<DT>(p, smem + p.stage_off, tid, 128);
  wg_dtab_fill<NOPS>(p, dtab, sbase16);   // read after the first __syncthreads of the line loop
  wg_setup_operands<DT, SPLIT>(p, smem, tid, 128, bound);
  float dm[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // wg_epi_h2's sums (dm[0] channel m0, dm[2] m0 + 8, whole quad)
  const uint32_t abase = (uint32_t)__cvta_generic_to_shared(smem);
  const int m0 = 16 * warp + g;
  const long long n_first = L0 / p.lines_img;
  const float red_init = (p.pool == FF_POOL_MEAN) ? 0.0f : -__int_as_float(0x7f800000);
  float red[2][2] = {{red_init, red_init}, {red_init, red_init}};
  long long cur_n = n_first;
  float acc[64];

  auto flush = [&](long long n) {
    float v[2];
    if (h2_cap) wg_h2_fold(red, dm, tig);
#pragma unroll
    for (int h = 0; h < 2; ++h) v[h] = wg_quad_reduce(red[h], p.pool == FF_POOL_MEAN, red_init);
    if (tig == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = m0 + 8 * h;
        if (k < p.K) {
          if (p.pool == FF_POOL_MEAN) {
            if (!p.det) atomicAdd(p.out + n * p.K + k, v[h] * p.inv_pq);
            else p.ws_part[((long long)blockIdx.x * p.J + (n - n_first)) * 64 + k] = v[h];
          } else {
            atomicMax(p.ws_max + n * p.K + k, enc_max(v[h]));
          }
        }
      }
    }
    if (p.pool == FF_POOL_MEAN && !p.det) return;
    __threadfence();
    __syncthreads();
    long long blo, bhi;
    wg_image_blocks(p, n, blo, bhi);
    if (tid == 0) {
      const int old = atomicAdd(p.ws_cnt + n, 1);
      last_s = (old == (int)(bhi - blo));
    }
    __syncthreads();
    if (last_s) wg_finish_image<DT>(p, n, blo, bhi, tid, 128);
    __syncthreads();
  };

  for (long long l = L0; l < L1;) {
    const WGPiece<VOL, SW2> pc(p, l, L1);
    const long long n = pc.n, nx = pc.nx;   // the image the pool reduces over, the loaders' image (WGPiece)
    const int np = pc.np, qv = pc.qv, hbase = pc.hbase, wbase = pc.wbase;
    if (n != cur_n) { flush(cur_n); cur_n = n; }
    __syncthreads();                                             // previous piece's wgmmas done in every warp
    if constexpr (TMA) {
      // rows of groups 0 .. D-1 go out as stages free up (TNCHW has fewer stages than group 0 has rows: a barrier
      // before a stage is refilled, once or twice per piece); group 0's rows are waited for and post-processed
      const int nahead = wg_group_hi(p, min(p.D, np) - 1) + 1;
      int issued = (l == L0) ? pre : 0;
      tak = WGRowSlot{};
      for (int j = 0; j <= wg_group_hi(p, 0); ++j) {
        const int want = min(j + p.NST, nahead);
        if (issued < want) {
          if (j > 0) __syncthreads();
          if (tid == 0)
            for (int r = issued; r < want; ++r)
              wg_tma_row<DT, LM, VOL, SW2>(p, ring, stage0, bar0, wg_stage_of(p, r), nx, hbase + r, wbase);
          issued = want;
        }
        wg_tma_take<DT, SPLIT, LM, SW2>(p, ring, stage0, bar0, tak, tph, tpost, bound, tn);
      }
      if (issued < nahead) {
        __syncthreads();
        if (tid == 0)
          for (int r = issued; r < nahead; ++r)
            wg_tma_row<DT, LM, VOL, SW2>(p, ring, stage0, bar0, wg_stage_of(p, r), nx, hbase + r, wbase);
      }
    } else if (LM != WG_LM_REG) {
      for (int t = 0; t < p.D && l != L0; ++t) {                // (the first piece's went out before the setup)
        wg_group<DT, SPLIT, LM, 0, VOL>(p, ring, t, np, nx, hbase, wbase, bound);
        ff_cp_commit();
      }
    } else {
      wg_group<DT, SPLIT, LM, 0, VOL>(p, ring, 0, np, nx, hbase, wbase, bound);
    }
    // post-copy pass (MODE 1: tf32 rounding, NCHW transposes, the input bound) of row group t + 1 and the copies of
    // group t + D run while row t's wgmmas do: only the barrier stays between rows
    const bool mode1 = LM != WG_LM_REG && (tpost || LM == WG_LM_NCHW8);
    if (LM != WG_LM_REG && !TMA) {
      ff_cp_wait_n(p.D - 1);
      if (mode1) wg_group<DT, SPLIT, LM, 1, VOL>(p, ring, 0, np, nx, hbase, wbase, bound);
    }
    int rs = 0;                                                  // ring slot of input row t*sh
    // R2 (two output rows per tile, WG_NT_R2): rows t, t + 1 (u = 0, 1) each issue an m64n64 chain into one half of the
    // accumulators, waited for together after both, then one epilogue (the wait after the unrolled pair, not on a
    // branch: a wait there made ptxas serialise every wgmma, C7518).  Row t + 1's in_ok covers row t's rows too.
    constexpr int NR = R2 ? 2 : 1;
    bool fast = false;
    for (int t0 = 0; t0 < np; t0 += NR) {
#pragma unroll
      for (int u = 0; u < NR; ++u) {
        const int t = t0 + u;
        if (R2 && t >= np) break;
        const bool in_ok = wg_row_ready<DT>(p, h2_cap, bound);   // (before the &&: every thread reaches its barrier)
        fast = gelu_fast && in_ok;
        // ---- row t as two 64 x 128 halves (64 accumulator registers: the other blocks on the SM hide each other's
        //      MMA and epilogue latencies; R2: one 64-pixel half) ----
#pragma unroll 1
        for (int half = 0; half < pc.nhalf; ++half) {
          if constexpr (R2) {
            if (u == 0) wg_issue<DT, SPLIT, NOPS, 0>(p, acc, sbase16, dtab, rs, 0);
            else wg_issue<DT, SPLIT, NOPS, 1>(p, acc, sbase16, dtab, rs, 0);
          } else {
            wg_issue<DT, SPLIT, NOPS>(p, acc, sbase16, dtab, rs, half);
          }
          if constexpr (TMA) {
            if (half == 0 && tid == 0 && t + p.D < np) {   // group t + D (TVEC: into the ring slots row t - 1 left)
              // its first row is (D - 1) sh rows past the next to take, wg_group_hi(t) + 1 (< NST rows: one wrap at
              // most)
              int st = tak.st() + (p.D - 1) * p.sh;
              st -= st >= p.NST ? p.NST : 0;
              for (int r = wg_group_hi(p, t + p.D - 1) + 1; r <= wg_group_hi(p, t + p.D); ++r) {
                wg_tma_row<DT, LM, VOL, SW2>(p, ring, stage0, bar0, st, nx, hbase + r, wbase);
                st = wg_stage_next(p, st);
              }
            }
            if (half == pc.nhalf - 1 && t + 1 < np)      // group t + 1: wait, post-copy pass
              for (int r = wg_group_hi(p, t) + 1; r <= wg_group_hi(p, t + 1); ++r)
                wg_tma_take<DT, SPLIT, LM, SW2>(p, ring, stage0, bar0, tak, tph, tpost, bound, tn);
          } else {
            if (half == 0) {   // group t + D into the ring slots row t - 1 left (not read by row t's wgmmas)
              wg_group<DT, SPLIT, LM, 0, VOL>(p, ring, LM == WG_LM_REG ? t + 1 : t + p.D, np, nx, hbase, wbase, bound);
              if (LM != WG_LM_REG) ff_cp_commit();
            }
            if (LM != WG_LM_REG && half == pc.nhalf - 1) {
              ff_cp_wait_n(p.D - 1);   // group t + 1's copies (committed D groups ago) have landed
              if (mode1) wg_group<DT, SPLIT, LM, 1, VOL>(p, ring, t + 1, np, nx, hbase, wbase, bound);
            }
          }
          if constexpr (!R2) {
            ff_wg_wait<0>();
            wg_epi_any<DT, SPLIT>(p, acc, red, dm, qv - half * (WG_NT / 2), tig, fast, h2_cap);
          }
        }
        rs += p.sh;
        rs -= (rs >= p.RB) ? p.RB : 0;
      }
      if constexpr (R2) {
        ff_wg_wait<0>();
        wg_epi_r2<DT>(p, acc, red, dm, qv, t0 + 1 < np, tig, fast, h2_cap);
      }
    }
    if (LM != WG_LM_REG && !TMA) ff_cp_wait_all();
    l += np;
  }
  flush(cur_n);
#else
  __trap();
#endif
}
