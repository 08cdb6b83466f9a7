// Family B fused kernel: the epilogue of a tile group -- the max over each pooling window's conv outputs of the
// group's tiles, in registers over the window's d, h rows, then atomicMax (ordered uints, NaN propagating) into the
// block's window maxima winmax[wh][pwb][64] in shared memory.  Bias goes after the max when there is no activation
// (channel_reduce.cuh); with one, before it, per value (fb_activate_tile).
#pragma once
#include "fused_convt_pool_reduce/primitives.cuh"

// The activation's arithmetic on one tile's 48 values, in place: bias, then (SAT, fp16 input) ff_f16_sat, as PyTorch
// rounds an fp16 conv's output to fp16 (+-inf past 65504) before the activation, then the activation.
template <int ACT, bool SAT>
__device__ __forceinline__ void fb_activate_values(float (&acc)[48], float b0, float b1) {
#pragma unroll
  for (int k = 0; k < 48; ++k) {   // value k: channel m0 + 8 * ((k >> 1) & 1), as in the max below
    const float a = acc[k] + ((k & 2) ? b1 : b0);
    acc[k] = ff_activate<ACT>(SAT ? ff_f16_sat(a) : a);
  }
}

// One switch on the (block-uniform) activation per tile, not per value: a switch per value, inlined at each of the
// window max's unrolled values, made an activated unit compile in 13-18 s against 1.8-2.2 s (NVRTC 13.5); one switch
// per tile takes 3.5-4.2 s with the same arithmetic per value.  Per 144 values of a tile group at once spills.
template <bool SAT>
__device__ __forceinline__ void fb_activate_tile(float (&acc)[48], int act, float b0, float b1) {
  switch (act) {
    case FF_ACT_RELU: fb_activate_values<FF_ACT_RELU, SAT>(acc, b0, b1); break;
    case FF_ACT_GELU_ERF: fb_activate_values<FF_ACT_GELU_ERF, SAT>(acc, b0, b1); break;
    case FF_ACT_GELU_TANH: fb_activate_values<FF_ACT_GELU_TANH, SAT>(acc, b0, b1); break;
    case FF_ACT_SILU: fb_activate_values<FF_ACT_SILU, SAT>(acc, b0, b1); break;
    default: fb_activate_values<FF_ACT_NONE, SAT>(acc, b0, b1);
  }
}

// m[16] = max(m, rows R0 .. R1 - 1 of one 3-row accumulator tile): this thread's 2 channels x 8 q_w columns per row.
template <int R0, int R1>
__device__ __forceinline__ void fb_rows_max(float (&m)[16], const float (&acc)[48]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v = m[i];
#pragma unroll
    for (int r = R0; r < R1; ++r) v = ff_max_nan(v, acc[16 * r + i]);
    m[i] = v;
  }
}

// Max over the valid rows of one 3-row tile into mx[h-window][16].  Rows >= rows_ok hold other rows' data and are
// skipped; hw_r (uniform) is row r's h-window.  Usually all three rows lie in one window: one pass.
__device__ __forceinline__ void fb_tile_max(float (&mx)[FB_WH][16], const float (&acc)[48], int rows_ok, int hw0,
                                            int hw1, int hw2) {
  static_assert(FB_WH == 2, "h-window selection below is written for two windows");
  if (rows_ok >= 3 && hw0 == hw2) {
    if (hw0 == 0) fb_rows_max<0, 3>(mx[0], acc);
    else fb_rows_max<0, 3>(mx[1], acc);
    return;
  }
  auto row = [&](auto r, int hw) {   // one row into its window
    constexpr int R = decltype(r)::value;
    if (hw == 0) fb_rows_max<R, R + 1>(mx[0], acc);
    else fb_rows_max<R, R + 1>(mx[1], acc);
  };
  if (rows_ok > 0) row(fb_int<0>{}, hw0);
  if (rows_ok > 1) row(fb_int<1>{}, hw1);
  if (rows_ok > 2) row(fb_int<2>{}, hw2);
}

// The tile group of class c (ci: its cinfo) whose tiles t_first .. t_first + 2 this warpgroup holds in acc: nhg =
// 3-row h groups per d row of the class; oh0: the block's first output row in h; nwh: its window rows; m0: this
// thread's first output channel (m0, m0 + 8), tig its column pair, b0 / b1 their biases.  HAS_ACT: acc is
// activated in place (the next tile group's first wgmma overwrites it).
template <bool HAS_ACT, int DT>
__device__ __forceinline__ void fb_window_max(const FBParams& p, unsigned* winmax, const signed char* colwin,
                                              const int* ci, int c, float (&acc)[3][48], int t_first, int nhg,
                                              int oh0, int nwh, int m0, int tig, float b0, float b1) {
  float mx[FB_WH][16];
#pragma unroll
  for (int w = 0; w < FB_WH; ++w)
#pragma unroll
    for (int i = 0; i < 16; ++i) mx[w][i] = -__int_as_float(0x7f800000);
  const int rh = p.cls_r[c][1];
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int t = t_first + j;
    if (t >= ci[6]) continue;
    const int qh = ci[2] + FB_ROWS * (t % nhg);
    auto hwin = [&](int r) { return (p.s[1] * (qh + r) + rh - p.p[1] - oh0) / p.win[1]; };
    if (HAS_ACT) fb_activate_tile<DT == FF_F16>(acc[j], p.act, b0, b1);
    fb_tile_max(mx, acc[j], ci[3] - FB_ROWS * (t % nhg), hwin(0), hwin(1), hwin(2));
  }
  // a warp whose 16 output channels all lie past K (m0 & ~15: its first) has nothing to write: one test per tile group,
  // uniform in the warp (ncu, the seed's bf16 kernel: 832k cycles, against 840k testing nothing and 861k with a K load
  // per atomic)
  if ((m0 & ~15) >= p.K) return;
  // into the window maxima: columns 2 tig, 2 tig + 1 (+ 8 ii) that share a w-window are merged first
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int cw0 = colwin[c * FB_COLS + 8 * ii + 2 * tig], cw1 = colwin[c * FB_COLS + 8 * ii + 2 * tig + 1];
#pragma unroll
    for (int w = 0; w < FB_WH; ++w) {
      if (w >= nwh) continue;
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) {
        // the warp's channel slots past K too (zero weights: their values go unread, fb_channel_reduce reads k < K
        // only, and a tail part's workspace is zeroed whole): no per-atomic test against K (above)
        unsigned* row = winmax + w * p.pwb * 64 + m0 + 8 * kh;
        float v0 = mx[w][4 * ii + 2 * kh], v1 = mx[w][4 * ii + 2 * kh + 1];
        if (cw0 == cw1) { v0 = ff_max_nan(v0, v1); v1 = -__int_as_float(0x7f800000); }
        if (cw0 >= 0 && v0 != -__int_as_float(0x7f800000)) atomicMax(row + cw0 * 64, fb_enc(v0));
        if (cw1 >= 0 && v1 != -__int_as_float(0x7f800000)) atomicMax(row + cw1 * 64, fb_enc(v1));
      }
    }
  }
}
