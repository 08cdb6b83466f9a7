// Family B fused kernel (fb_kernel), sm_90a:
//   out[n, Pd, Ph, Pw] = red_k ( max_{o in window(P)} act(convT3d(x, w)[n, k, o] + b[k]) )
// Reduces, per image and pooling window, over the window's conv outputs (max), then over output channels
// (sum / mean / max): the window maxima stay in shared memory, so the transposed conv's output (1 GB at the seed)
// never leaves the chip; only N x Pd x Ph x Pw values are written.
//
// Sub-pixel decomposition: output o = s*q + r - p (per dim; residue class r = (o + p) mod s) receives
// sum_m x[q - m] * w[r + s*m], m = 0 .. M_r - 1, M_r = ceil((T - r) / s): a stride-1 conv per class (8 classes for
// s = 2) whose taps are input offsets -m.  GEMM per class and tap (wgmma m64n96k8 TF32 for fp32 input, m64n96k16
// for bf16 / fp16 input; fp32 accumulation):
//   M = 64 output channels: A = the tap's weight slice (64 x C, streamed through shared-memory buffers),
//   N = 96 = 3 consecutive q_h rows x 32 q_w columns of the input tile (B, shared memory; the tap's (-m_d, -m_h, -m_w)
//       shift is only the descriptor's start address, because the tile rows are 32 columns apart, contiguous),
//   K = C input channels (8 fp32 or 16 bf16 / fp16 per wgmma, channels zero-padded to a whole number of steps).
// One block = one image x one window-row d index Pd x FB_WH (or fewer) consecutive window rows Ph x a chunk of Pw
// windows whose input columns fit in 32.  Each warpgroup of a block streams all weight slices once (1 MB at the
// seed); covering two window rows halves that traffic per MMA (without its MMAs the kernel took 0.77 ms at one row,
// 0.67 at two).  Two warpgroups share the tile; a tile group = fb_nt = 6 tiles (q_d, 3-row q_h group), 3 per
// warpgroup (3 x 48 accumulator registers).  A block walks a step list (class, tile group, taps) built in shared
// memory, 1 (fp32) or 2 (16-bit) taps per step; each warpgroup walks it with its own weight buffers and barrier.
// The epilogue of a tile group takes the max over the d, h rows of each window in registers, then atomicMax
// (ordered uints, NaN propagating) into the window maxima; bias goes after the max when there is no activation.
// The final channel reduction runs in a fixed order: deterministic.
// Precision "ieee" (fp32 input, fp32 accuracy; kernel variant FB_X3): x = x_hi + x_lo with x_hi = tf32(x) and w the
// same, x * w ~ w_hi x_hi + w_lo x_hi + w x_lo.  The first two are TF32 wgmmas on the rounded tile; the third reads a
// second tile of x_lo rounded to bf16 (half the bytes of a tf32 copy; its error 2^-9 of |x_lo| <= 2^-11 |x| is
// 2^-20 |x w|) against bf16(w) (error 2^-9 |w| times |x_lo|: 2^-20 again): ~2^-19 |x w| per product, as 3xTF32
// without the room of a third fp32 tile.  Both tiles fit beside three 20 KB weight steps only for one window row
// and one warpgroup per block.
// Requirements (else the planner, fullfuse/fused/convt_pool_reduce_plan.py, says why and the fallback serves it):
// sm_90a, fp32 / bf16 / fp16 input (NCDHW or channels_last_3d), C <= 64 with C % 4 == 0 (fp32) or C % 8 == 0
// (16-bit), K <= 64, dilation 1, one window's input columns fit in 32, the tile fits in shared memory.
// Instantiations: fb_kernel<HAS_ACT, KS, DT> per activation on / off, k steps (KS x 8 fp32 or 16 bf16 / fp16 input
// channels: 1, 2, 4, and 8 for fp32) and kernel variant DT (FF_F32, FF_BF16, FF_F16, FB_X3); launch: grid = the
// plan's blocks plus its packing-only blocks, 128 x fb_nwg(DT) threads, the plan's dynamic shared memory, FBParams by
// value.  The weights are packed by the kernel's own blocks (weight_pack.cuh: one kernel per call), or, where the grid
// has more than one wave (pack_chunks == 0), by the packing kernel just before this one (fused_convt_pack_kernel.cuh),
// this kernel launched with a programmatic dependency on it.
// Headers: params.cuh (constants, FBParams), primitives.cuh (encoding, cp.async, wgmma), tile.cuh (input tile),
// steps.cuh (the block's step list), weight_pack.cuh (the packing's chunks), mainloop.cuh (a step's weights and
// wgmmas), window_max.cuh (epilogue), channel_reduce.cuh (tail combine, channel reduction, output).
#pragma once
#include "fused_convt_pool_reduce/params.cuh"
#include "fused_convt_pool_reduce/primitives.cuh"
#include "fused_convt_pool_reduce/tile.cuh"
#include "fused_convt_pool_reduce/steps.cuh"
#include "fused_convt_pool_reduce/mainloop.cuh"
#include "fused_convt_pool_reduce/window_max.cuh"
#include "fused_convt_pool_reduce/channel_reduce.cuh"
#include "fused_convt_pool_reduce/weight_pack.cuh"

// Two warpgroups share the tile: warpgroup g takes tiles 3g .. 3g + 2 of every tile group and streams its own copy of
// the weight slices, its step sequence rotated (warpgroup 1 starts half-way), so their epilogues fall apart in time.
template <bool HAS_ACT, int KS, int DT>
__global__ void __launch_bounds__(256, 1) fb_kernel(const __grid_constant__ FBParams p) {
#ifdef FF_HAVE_WGMMA
  constexpr int NWG = fb_nwg(DT), NTHR = 128 * NWG, NT = fb_nt(DT);
  // one tap's weights: [2 KS planes][64][CPL channels], 2 KB per k step (CPL = 4 fp32 or 8 16-bit values)
  constexpr int SLICE_BYTES = fb_slice_bytes(DT, KS);
  constexpr int TPS = fb_tps(DT), NBUF = fb_nbuf(DT), PF = NBUF - 1 - FB_WGDEPTH;
  constexpr int STEP_BYTES = TPS * SLICE_BYTES;     // one step's weights
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* tile = smem;
  unsigned* winmax = reinterpret_cast<unsigned*>(smem + p.tile_alloc + NWG * NBUF * STEP_BYTES);   // [wh][pwb][64]
  int4* steps = reinterpret_cast<int4*>(winmax + p.wh * p.pwb * 64);
  int* cinfo = reinterpret_cast<int*>(steps + p.max_steps);
  signed char* colwin = reinterpret_cast<signed char*>(cinfo + p.ncls * FB_CINFO);   // [class][32]: w-window or -1
  __shared__ int s_total, s_off, s_split, s_last, s_claim;
  const uint32_t tile_s = (uint32_t)__cvta_generic_to_shared(tile);
  const uint32_t wbuf_s = tile_s + (uint32_t)p.tile_alloc;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
  const int wg = tid >> 7;
  if (blockIdx.x >= p.nblocks) {   // packing only (weight_pack.cuh)
    fb_pack_share<NTHR, fb_pack_op<DT>(), false>(p, s_claim);
    fb_pack_reset_if_last(p, fb_pack_done(p));
    return;
  }

  // ---- block -> (image, window row d, window rows h, w-chunk) and its input tile origin ----
  // blocks past nfull split the last wave's items into pieces: tail_nhalf window-row parts (one window row each when
  // 2) x tail_g class groups (each piece computes the classes of its group; the pieces of a part combine their window
  // maxima in global memory and the last one reduces), so the tail wave is that much shorter
  long long b = blockIdx.x;
  int half = -1, cgroup = 0;
  long long part = -1;   // tail part (the workspace slot of its window maxima), -1: a whole item
  if (b >= p.nfull) {
    const long long r = b - p.nfull;
    const int per = p.tail_nhalf * p.tail_g, q = (int)(r % per);
    b = p.nfull + r / per;
    part = r / p.tail_g;
    cgroup = q % p.tail_g;
    if (p.tail_nhalf > 1) half = q / p.tail_g;
  }
  const int wc = (int)(b % p.nwc); b /= p.nwc;
  int Ph = (int)(b % p.nhb) * p.wh; b /= p.nhb;
  int nwh = min(p.wh, p.P[1] - Ph);
  if (half >= 0) {
    if (half >= nwh) {   // the whole block: no barrier reached yet
      fb_pack_reset_if_last(p, fb_pack_done(p));
      return;
    }
    Ph += half;
    nwh = 1;
  }
  const int Pd = (int)(b % p.P[0]);
  const long long n = b / p.P[0];
  const int od0 = Pd * p.win[0], oh0 = Ph * p.win[1];
  const int pw0 = wc * p.pwb, npw = min(p.pwb, p.P[2] - pw0);
  const int ow_lo = pw0 * p.win[2], ow_hi = (pw0 + npw) * p.win[2];
  const int id_lo = (od0 + p.p[0]) / p.s[0] - (p.Mmax[0] - 1);
  const int ih_lo = (oh0 + p.p[1]) / p.s[1] - (p.Mmax[1] - 1);
  const int iw_lo = (ow_lo + p.p[2]) / p.s[2] - (p.Mmax[2] - 1);

  for (int i = tid; i < p.wh * p.pwb * 64; i += NTHR) winmax[i] = 0u;   // below every encoded value

  // ---- input tile: [2 KS planes of CPL channels][nd x nh rows][32 columns][16 B], zero outside the input ----
  fb_load_tile<KS, DT>(p, tile, tile_s, n, id_lo, ih_lo, iw_lo);

  // ---- per-class q ranges of this block, then the step list (class, tile group, tap) ----
  fb_build_steps<DT>(p, cinfo, steps, colwin, od0, oh0, nwh, ow_lo, ow_hi, part, cgroup, s_total, s_off, s_split);

  // ---- this block's share of the weight packing, and the wait for all of it, while its tile is in flight ----
  fb_pack_share<NTHR, fb_pack_op<DT>(), true>(p, s_claim);
  const int pack_done = fb_pack_done(p);

  // ---- tile ready (fp32: rounded to tf32 in place; "ieee": split into x_hi, x_lo) ----
  ff_cp_wait<0>();
  __syncthreads();
  fb_round_tile<KS, DT>(p, tile);

  // This warpgroup's step sequence: normally the whole step list, rotated by s_off for warpgroup 1, the warpgroups
  // taking tiles 0-2 and 3-5 of each group; in a tail block whose classes have <= 3 tiles each (one window row),
  // warpgroup 0 takes steps [0, s_off) and warpgroup 1 [s_off, total), both on tiles 0-2, so neither idles.  Step
  // st's weight slices (consecutive in the packing) go into this warpgroup's buffer st % NBUF, a missing second tap
  // as zeros; one commit group per call, empty past the end.
  ff_fence_proxy_async();   // this thread's tile writes -> the wgmmas of both
  __syncthreads();   // steps[], s_off and the rounded tile are visible to every thread (both warpgroups)
  const int total = s_total, off = wg ? s_off : 0, split = s_split;
  const int nseq = split ? (wg ? total - off : s_off) : total;
  auto entry = [&](int st) { const int i = st + off; return steps[i < total ? i : i - total]; };
  auto load_step = [&](int st) {
    const bool has = st < nseq;
    fb_load_step<KS, DT>(p.wp, wbuf_s + (wg * NBUF + st % NBUF) * STEP_BYTES, has ? entry(st) : int4{}, has);
  };
  // the packing kernel's writes (a grid launched with a programmatic dependency on it: everything above overlaps the
  // packing and reads nothing it writes; a no-op otherwise)
  ff_grid_dependency_wait();
#pragma unroll
  for (int i = 0; i < PF; ++i) load_step(i);

  const int m0 = 16 * (warp & 3) + g8;   // this thread's output channels: m0, m0 + 8
  const float b0 = (p.bias && m0 < p.K) ? ff_elem_f<fb_input_dt(DT)>(p.bias, m0) : 0.0f;
  const float b1 = (p.bias && m0 + 8 < p.K) ? ff_elem_f<fb_input_dt(DT)>(p.bias, m0 + 8) : 0.0f;
  const uint32_t plane16 = (uint32_t)p.plane_bytes >> 4;
  const uint32_t zero_desc = (tile_s + (uint32_t)p.tile_bytes) >> 4;   // the zero slack, LBO 0 (fb_step_mmas)
  const uint32_t lo16 = (uint32_t)(p.tile_bytes + FB_TILE_SLACK) >> 4;   // FB_X3: the x_lo tile
  float acc[3][48];   // this warpgroup's 3 tiles

  for (int st = 0; st < nseq;) {
    // ---- one tile group: its class's taps, TPS weight slices per step, PF steps in flight ----
    const int4 e0 = entry(st);
    const int c = e0.w & 255, grp = e0.w >> 8;
    const int* ci = cinfo + c * FB_CINFO;
    const int nhg = (ci[3] + FB_ROWS - 1) / FB_ROWS;
    const int t_first = grp * NT + (split ? 0 : 3 * wg);   // this warpgroup's tiles: t_first .. t_first + 2
    const bool wg_busy = t_first < ci[6];
    uint32_t bdesc[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) {   // tiles past the class's last are duplicates of the group's first (dropped later)
      const int t = t_first + j < ci[6] ? t_first + j : grp * NT;
      const int qd = ci[0] + t / nhg, qh = ci[2] + FB_ROWS * (t % nhg);
      const uint32_t addr = tile_s + ((qd - id_lo) * p.nh + (qh - ih_lo)) * FB_ROW_BYTES + (ci[4] - iw_lo) * 16;
      bdesc[j] = (addr >> 4) | (plane16 << 16);                      // LBO: next 4-channel plane
    }
    const int st_begin = st, st_end = st + ci[7];
    // one step: wait for its weight slices (and this warpgroup's warps past the previous step), prefetch, then (MMA)
    // the TPS x KS x 3 wgmmas; a warpgroup whose 3 tiles are all past the class's last runs the loop
    // without them (two straight-line copies: a branch around the wgmmas inside the loop makes ptxas serialise them,
    // C7520).  A step without a second tap (odd tap count) multiplies zero weights by the tile's zero slack (read
    // with LBO 0), so Inf / NaN in the input cannot leak into it.
    auto step = [&](int st, auto mma) {
      const int4 e = entry(st);
      ff_cp_wait<PF - 1>();
      ff_fence_proxy_async();
      asm volatile("bar.sync %0, 128;" :: "r"(1 + wg) : "memory");   // this warpgroup: step st's slices landed,
                                                                      // its warps are past step st - 1's wait_group
      load_step(st + PF);  // its buffer held step st - 1 - FB_WGDEPTH, finished by now
      if constexpr (decltype(mma)::value) {
        const uint32_t a_lo = ((wbuf_s + (wg * NBUF + st % NBUF) * STEP_BYTES) >> 4) | ((uint32_t)(1024 >> 4) << 16);
        fb_step_mmas<KS, DT>(acc, a_lo, bdesc, e, st > st_begin, zero_desc, plane16, lo16);
        ff_wg_commit();
        ff_wg_wait<FB_WGDEPTH>();
      }
    };
    if (wg_busy)
      for (; st < st_end; ++st) step(st, std::true_type{});
    else
      for (; st < st_end; ++st) step(st, std::false_type{});
    ff_wg_wait<0>();
#pragma unroll
    for (int j = 0; j < 3; ++j)
#pragma unroll
      for (int i = 0; i < 48; ++i) asm volatile("" : "+f"(acc[j][i]) :: "memory");
    // ---- epilogue of a tile group: max over the valid (q_d, q_h) rows of each h-window in registers, then into the
    // window maxima ----
    fb_window_max<HAS_ACT, DT>(p, winmax, colwin, ci, c, acc, t_first, nhg, oh0, nwh, m0, tig, b0, b1);
  }
  __syncthreads();
  fb_channel_reduce<HAS_ACT, DT>(p, winmax, part, n, Pd, Ph, nwh, od0, oh0, pw0, npw, s_last);
  fb_pack_reset_if_last(p, pack_done);
#else
  __trap();
#endif
}
