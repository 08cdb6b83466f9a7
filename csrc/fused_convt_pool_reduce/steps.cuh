// Family B fused kernel: a block's work list.  Per residue class c, cinfo[c][0..9] = (q_d0, n_qd, q_h0, n_qh, q_w0,
// n_qw, MMA tiles, steps per tile group, steps of the class, first step); the step list steps[] holds per step
// (first weight slice, tap 0's B shift, tap 1's B shift or -1, class | tile group << 8); colwin[c][col] is tile
// column col's w-window in the block (-1: not an output of the block).
#pragma once
#include "fused_convt_pool_reduce/primitives.cuh"

// Builds cinfo, steps and colwin in shared memory and sets s_total (steps), s_off (the class boundary nearest half
// the steps, where warpgroup 1 starts) and s_split (the two warpgroups split the list instead of sharing each tile
// group); ends with every thread past a barrier for cinfo, not for steps / colwin.  A tail piece (part >= 0,
// tail_g > 1) keeps only its class group's steps.  (od0, oh0): the block's first output row in d and h; nwh: its
// window rows; [ow_lo, ow_hi): its output columns.
template <int DT>
__device__ __forceinline__ void fb_build_steps(const FBParams& p, int* cinfo, int4* steps, signed char* colwin,
                                               int od0, int oh0, int nwh, int ow_lo, int ow_hi, long long part,
                                               int cgroup, int& s_total, int& s_off, int& s_split) {
  constexpr int NTHR = 128 * fb_nwg(DT), NT = fb_nt(DT), TPS = fb_tps(DT);
  const int tid = threadIdx.x;
  if (tid < p.ncls) {
    const int c = tid;
    const int rd = p.cls_r[c][0], rh = p.cls_r[c][1], rw = p.cls_r[c][2];
    const int qd0 = fb_floordiv(od0 + p.p[0] - rd + p.s[0] - 1, p.s[0]);
    const int nqd = fb_floordiv(od0 + p.win[0] - 1 + p.p[0] - rd, p.s[0]) - qd0 + 1;
    const int qh0 = fb_floordiv(oh0 + p.p[1] - rh + p.s[1] - 1, p.s[1]);
    const int nqh = fb_floordiv(oh0 + nwh * p.win[1] - 1 + p.p[1] - rh, p.s[1]) - qh0 + 1;
    const int qw0 = fb_floordiv(ow_lo + p.p[2] - rw + p.s[2] - 1, p.s[2]);
    const int nqw = fb_floordiv(ow_hi - 1 + p.p[2] - rw, p.s[2]) - qw0 + 1;
    const int taps = p.cls_M[c][0] * p.cls_M[c][1] * p.cls_M[c][2];
    const int tiles = (nqd > 0 && nqh > 0 && nqw > 0 && taps > 0) ? nqd * ((nqh + FB_ROWS - 1) / FB_ROWS) : 0;
    int* ci = cinfo + c * FB_CINFO;
    ci[0] = qd0; ci[1] = nqd; ci[2] = qh0; ci[3] = nqh; ci[4] = qw0; ci[5] = nqw; ci[6] = tiles;
    ci[7] = (taps + TPS - 1) / TPS;                                // steps per tile group: TPS taps each
    ci[8] = (tiles + NT - 1) / NT * ci[7];                     // steps of this class
  }
  __syncthreads();
  if (tid == 0) {
    int t = 0;
    for (int c = 0; c < p.ncls; ++c) { cinfo[c * FB_CINFO + 9] = t; t += cinfo[c * FB_CINFO + 8]; }
    if (p.tail_g > 1 && part >= 0) {   // this piece's class group: between the class boundaries nearest g / G and
      // (g + 1) / G of the steps; the other classes get no steps
      auto bound = [&](int k) {
        int best = 0;
        long long bestd = -1;
        for (int c = 0; c <= p.ncls; ++c) {
          const long long st = c < p.ncls ? cinfo[c * FB_CINFO + 9] : t;
          const long long d = llabs(st * p.tail_g - (long long)k * t);
          if (bestd < 0 || d < bestd) { bestd = d; best = c; }
        }
        return best;
      };
      const int c_lo = bound(cgroup), c_hi = cgroup + 1 == p.tail_g ? p.ncls : bound(cgroup + 1);
      t = 0;
      for (int c = 0; c < p.ncls; ++c) {
        if (c < c_lo || c >= c_hi) cinfo[c * FB_CINFO + 8] = 0;
        cinfo[c * FB_CINFO + 9] = t;
        t += cinfo[c * FB_CINFO + 8];
      }
    }
    s_total = t;
    int off = 0;   // the class boundary nearest half the steps
    bool small = true;   // every class's tiles fit one warpgroup (<= 3)
    for (int c = 0; c < p.ncls; ++c) {
      if (abs(2 * cinfo[c * FB_CINFO + 9] - t) < abs(2 * off - t)) off = cinfo[c * FB_CINFO + 9];
      small = small && (cinfo[c * FB_CINFO + 8] == 0 || cinfo[c * FB_CINFO + 6] <= 3);
    }
    s_off = off;
    s_split = fb_nwg(DT) == 2 && nwh == 1 && small;
  }
  __syncthreads();
  for (int i = tid; i < s_total; i += NTHR) {
    int c = 0;
    while (c + 1 < p.ncls && cinfo[(c + 1) * FB_CINFO + 9] <= i) ++c;
    const int* ci = cinfo + c * FB_CINFO;
    const int local = i - ci[9], nst = ci[7];
    const int grp = local / nst, tap = (local - grp * nst) * TPS;
    const int Mh = p.cls_M[c][1], Mw = p.cls_M[c][2], taps = p.cls_M[c][0] * Mh * Mw;
    auto delta = [&](int t) {   // tap t's B start shift in 16-byte units; -1: past the class's last tap (none)
      if (t >= taps) return -1;
      const int md = t / (Mh * Mw), mh = (t / Mw) % Mh, mw = t % Mw;
      return ((md * p.nh + mh) * FB_ROW_BYTES + mw * 16) >> 4;
    };
    steps[i] = make_int4(p.cls_slice[c] + tap, delta(tap), TPS == 2 ? delta(tap + 1) : -1, c | grp << 8);
  }
  for (int i = tid; i < p.ncls * FB_COLS; i += NTHR) {   // tile column -> the block's w-window (-1: not an output)
    const int c = i / FB_COLS, col = i % FB_COLS;
    const int* ci = cinfo + c * FB_CINFO;
    colwin[i] = col < ci[5] ? (signed char)((p.s[2] * (ci[4] + col) + p.cls_r[c][2] - p.p[2] - ow_lo) / p.win[2]) : -1;
  }
}
