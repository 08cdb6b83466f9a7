// Family B fused kernel: the end of a block -- a tail piece's window maxima combined with its part's other pieces
// through the workspace, then per pooling window the bias (no activation), the channel reduction (sum / mean / max)
// in a fixed order (a warp per window, lanes over channels, then a butterfly: the same bits every run) and the
// output in the input's dtype.
#pragma once
#include "fused_convt_pool_reduce/primitives.cuh"

// After a barrier past every epilogue.  part: the block's tail part (-1: a whole item); (n, Pd, Ph): its image and
// first window row in d / h, nwh its window rows; (od0, oh0): its first output row in d / h; windows pw0 .. pw0 +
// npw - 1 in w.  s_last: a shared int.
template <bool HAS_ACT, int DT>
__device__ __forceinline__ void fb_channel_reduce(const FBParams& p, unsigned* winmax, long long part, long long n,
                                                  int Pd, int Ph, int nwh, int od0, int oh0, int pw0, int npw,
                                                  int& s_last) {
  constexpr int NTHR = 128 * fb_nwg(DT);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // A piece of a tail part: its window maxima into the part's (global workspace); the last piece reduces the part's
  // maxima straight from there (gm_part), then zeroes them for the next launch once every warp has read them.  (Not
  // copied back into winmax: that shared-memory write before the reduction's reads, though barrier-separated, is
  // what compute-sanitizer's racecheck reported as a hazard.)
  const int nent = p.wh * p.pwb * 64;
  unsigned* gm_part = nullptr;
  if (p.tail_g > 1 && part >= 0) {
    unsigned* gm = p.ws + part * nent;
    for (int i = tid; i < nent; i += NTHR)
      if (winmax[i]) atomicMax(gm + i, winmax[i]);
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(p.ws_cnt + part, 1) == p.tail_g - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    gm_part = gm;
  }
  // Classes with no tap in some dim (residue >= kernel size, e.g. kernel < stride) have conv value 0 (+ bias): they
  // are not computed above, so a window that holds one of their positions takes max(.., 0) here.
  auto holds_tapless = [&](int a, int o0, int len) {
    if (p.T[a] >= p.s[a]) return false;
    for (int o = o0; o < o0 + len; ++o)
      if ((o + p.p[a]) % p.s[a] >= p.T[a]) return true;
    return false;
  };
  const bool tapless_d = holds_tapless(0, od0, p.win[0]);
  // ---- bias after the max (no activation), then the channel reduction: a warp per window, lanes over channels
  // (k = lane, lane + 32), then a butterfly: a fixed order, the same bits every run ----
  for (int ww = warp; ww < nwh * npw; ww += NTHR / 32) {
    const int hw = ww / npw, wl = ww - hw * npw, pw = pw0 + wl;
    const bool tapless = tapless_d || holds_tapless(1, oh0 + hw * p.win[1], p.win[1]) ||
                         holds_tapless(2, pw * p.win[2], p.win[2]);
    const unsigned* wm = (gm_part ? gm_part : winmax) + (hw * p.pwb + wl) * 64;
    float v2[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = lane + 32 * h;
      float v = (p.red == FF_RED_MAX) ? -__int_as_float(0x7f800000) : 0.0f;   // identity for k >= K
      if (k < p.K) {
        const unsigned enc = gm_part ? __ldcg(wm + k) : wm[k];
        v = enc ? fb_dec(enc) : -__int_as_float(0x7f800000);   // 0: no computed position (tapless only)
        const float bk = p.bias ? ff_elem_f<fb_input_dt(DT)>(p.bias, k) : 0.0f;
        if (tapless) v = ff_max_nan(v, HAS_ACT ? fb_act(p.act, bk) : 0.0f);
        if (!HAS_ACT) v += bk;
        // fp16: PyTorch's conv output (bias included) rounded to fp16 is +-inf past 65504; the max commutes with
        // that monotone map, so it applies to the window's max + bias here (with an activation: before it, above)
        if constexpr (DT == FF_F16) if (!HAS_ACT) v = ff_f16_sat(v);
      }
      v2[h] = v;
    }
    float r = (p.red == FF_RED_MAX) ? ff_max_nan(v2[0], v2[1]) : v2[0] + v2[1];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, r, off);
      r = (p.red == FF_RED_MAX) ? ff_max_nan(r, o) : r + o;
    }
    if (lane == 0) {   // in the input's dtype, rounded once (as the model's own output)
      const long long o = ((n * p.P[0] + Pd) * p.P[1] + Ph + hw) * (long long)p.P[2] + pw;
      const float v = (p.red == FF_RED_MEAN) ? r * p.inv_k : r;
      ff_store_f<fb_input_dt(DT)>(p.out, o, v);
    }
  }
  if (gm_part) {   // block-uniform: the workspace back to zero for the next launch
    __syncthreads();
    for (int i = tid; i < nent; i += NTHR) gm_part[i] = 0u;
    if (tid == 0) p.ws_cnt[part] = 0;
  }
}
