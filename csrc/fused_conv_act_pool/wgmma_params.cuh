// Family A, fused, sm_90a wgmma path: its design (below), compile-time constants and the kernel parameters (WGParams,
// mirrored by cutlass_ops/conv_act_pool.py).
#pragma once
#include "device_std.h"   // CUtensorMap
#include "fused_conv_act_pool/device_common.cuh"

// sm_90a path: wgmma SS (A = weights, B = pixels, both from shared memory through descriptors, no swizzle).
//   GEMM M = 64 output channels, N = 128 consecutive output pixels (half of a 256-pixel row segment, stride 1), K = one
//   K-unit = filter tap (r,s) x 8 input channels per wgmma (tf32 k8; 16-bit k16 over two taps (r, s), (r, s + 1) of one
//   channel group — the second tap's pixels are the first's shifted by dw columns, so LBO = dw positions — or one
//   tap whose second 8 columns read the slot's ones plane: zero weights, or the bias — see below). The input rows
//   live in a ring of RB shared-memory slots, one input row of one 256-pixel segment (+ halo) each, K-major core
//   matrices: [cg][K chunk][col][16 B] (fp32: chunk = 4 channels, LBO = plane; 16-bit: [cg][col][8 ch] + one ones
//   plane), so the im2col matrix of tap (r, s) is simply the slot of input row p*sh - ph + r*dh with its start address
//   shifted by s*dw columns: no copies, no im2col.
//   Bias rides as one more K-unit whose B is a block of ones (SBO = 0), A = (b_hi, b_lo) split; 16-bit: in the second
//   K chunk of the first op that has one to spare (its B = the slot's ones plane, every entry (1, 1, 0, ...)), no op of
//   its own.
//   Rows stream through the ring with cp.async D rows ahead (16-bit input without 16-byte copies: register loads); the
//   copies of a row group and the post-copy pass of the next one (tf32 rounding, NCHW transposes, the input bound) run
//   while the current row's wgmmas do, so only a barrier stands between rows. The 10 ops (16-bit: 5) of a 3x3 filter
//   over <= 8 channels are issued as straight-line code with descriptors from a shared-memory table, so the HGMMAs
//   chain under one fence. Each block (one warpgroup, 64 accumulator registers, 3 blocks per SM so that one block's
//   epilogue overlaps another's MMAs) owns a contiguous range of (image, segment, row) lines: exact balance, and ring
//   reuse of the R-1 halo rows between consecutive output rows.
constexpr int WG_NT = 256;
// Stride-2 columns (sw == 2; the TMA loaders TVEC / TNCHW, Conv2d; template parameter SW2 of fa_wgmma_kernel): output
// pixel q reads input columns 2 q + s dw, 32 bytes apart, which no descriptor can step over (a core matrix's 8 rows are
// 16 bytes apart), so each channel plane of a ring slot holds the segment's even columns, then its odd ones: column c
// (relative to the segment's first, 2 q0 - pw; may be < 0) at position WG_PAD + (c & 1) sw2_sub + (c >> 1) (wg_pos).
// Tap s then reads positions (s dw >> 1) .. + 127 of parity (s dw) & 1, consecutive: a stride-1 B operand again.
// Segments are WG_NT2 output pixels (one half), so that a slot holds ~2 x 128 columns as a stride-1 one holds 256.
constexpr int WG_NT2 = 128;
// Two output rows per tile (template parameter R2 of fa_wgmma_kernel; rows of 8 ..  WG_NT_R2 output pixels, one
// segment; the TMA loaders, Conv2d, not ieee): a 128-pixel tile would hold one such row and leave the rest of its MMAs
// and epilogue on padding, so rows t and t + 1 each get an m64n64 chain into one half of the 64 accumulators (the first
// 8 column blocks: row t, the last 8: row t + 1), both waited for together, then one epilogue over both.  Row t's chain
// is still in flight while row t + 1's rows land, so the ring holds sh more slots and the copies run one row group
// less far ahead (wg_plan).
constexpr int WG_NT_R2 = 64;
constexpr int WG_MAXOPS = 64;     // K units (ops) per half-row a plan may have: R*S*ceil(C/8) (+ bias) <= 64
constexpr int WG_OPS3X3 = 10;     // fp32, 3x3 over <= 8 channels: 9 taps + bias, straight-line issue
// 16-bit 3x3 with the column pair: ops (r, 0) + (r, 1) for r = 0..2, (2, 2) with the bias in its
// spare chunk, then (0, 2) + (1, 2) as one op whose two K chunks lie in two ring slots (LBO = the slots' distance;
// where the second row's slot comes first in the ring, its K chunks are swapped: B starts at that slot and the op reads
// A block WG_COL16_OPS, the op's weights with the two chunks swapped): 5 ops of K 16 for 72 + bias instead of 6
constexpr int WG_COL16_OPS = 5, WG_COL16_J = 4;
// input loaders: VEC = channels_last, C % 8 == 0 (16-byte cp.async; fp32: two per 8 channels, 16-bit: one, straight
// into the [cg][col][8 ch] slot); NCHW4 = fp32 NCHW, W % 4 == 0 (16-byte cp.async of 4 columns of one channel,
// transposed in place per thread); NCHW8 = 16-bit NCHW, W % 8 == 0 (the same with 8 columns of one channel per copy);
// ELEM = fp32 otherwise (4-byte cp.async); REG = 16-bit otherwise (register loads)
// TVEC / TNCHW = channels_last (C % 8 == 0) / NCHW (W % 4 fp32, % 8 16-bit) through the tensor-memory-access engine
// (TMA, wg_tma_row): one thread issues a row's few bulk copies instead of every thread its 16-byte ones (the copies'
// issue and index arithmetic were ~70-100 instructions per tile and warp, docs/design.md); TVEC lands in the slot's own
// layout, TNCHW in a staging buffer that the post-copy pass transposes into the slot.
enum { WG_LM_VEC = 0, WG_LM_ELEM = 1, WG_LM_REG = 2, WG_LM_NCHW4 = 3, WG_LM_NCHW8 = 4, WG_LM_TVEC = 5,
       WG_LM_TNCHW = 6 };
constexpr bool wg_lm_tma(int lm) { return lm == WG_LM_TVEC || lm == WG_LM_TNCHW; }
// Each channel plane of a ring slot = WG_PAD positions of slack, then TWa positions (16 B each), then slack (the
// NCHW4 / NCHW8 column groups overhang by up to 3 / 7 positions on either side).
constexpr int WG_PAD = 8;
constexpr int WG_UNIT_NONE = -1, WG_UNIT_BIAS = -2;

struct WGParams {
  CUtensorMap tmap;   // TMA loaders: the input as a 5-d (TVEC: 16 bytes of channels, the rest, W, H, N) or 4-d
                      // (TNCHW: W, H, C, N) tensor
  const void* x; const void* w; const void* bias; float* out;   // bias: DT; out: DT, float32 for atomics
  int N, C, H, W, K, R, S, sh, ph, pw, dh, dw;
  int P, Q, act, pool, det, nhwc, gelu_fast, fulltile;
  int h2;     // 16-bit GELU mean: the half-precision epilogue allowed (wg_epi_h2_checked)
  int CG, nops, nseg, TWa, RB, D;
  int na, col_j, col_rd2;   // A blocks (ops + the column op's swapped copy); the column-pair op and its second row,
                            // or -1
  int plane_bytes, nq;                 // bytes per 4-channel plane of a ring slot; NCHW4: 4-column quads per row
  int slot_bytes, small_off, ones_off, ring_off, a_small_off, dtab_off;   // smem: [A ops][ones][ring][B descriptors]
  unsigned long long mCG, mTWa, mHP, mNQ, mRB; int sCG, sTWa, sHP, sNQ, sRB;
  long long L, lines_img; int G, J;
  float inv_pq;
  int op_u0[WG_MAXOPS], op_u1[WG_MAXOPS];
  // the A operands' sources, per K chunk h (the 16 bytes a setup thread stores) of op j: op_wo = offset of the chunk's
  // first weight w[0][c0][r][s], op_wn = its valid channels (0..4 fp32, 0..8 16-bit) or -1 = the bias pair (b_hi, b_lo)
  int op_wo[2][WG_MAXOPS], op_wn[2][WG_MAXOPS];
  // B descriptors, precomputed (fp32): low word = op_d + smem_base/16 + ((ring slot * slot16 + half * 128) & op_mask),
  // high word = op_hi (stride byte offset / 16).  Ring slot of op j for output row t = (t*sh + op_rd[j]) % RB.
  unsigned op_d[WG_MAXOPS], op_mask[WG_MAXOPS], op_hi[WG_MAXOPS];
  int op_rd[WG_MAXOPS], slot16;
  float* ws_part; unsigned* ws_max; int* ws_cnt;
  // TMA loaders: boxes of tma_bc columns (tma_nbox per plane / channel group), tma_bytes per row; NST stages with one
  // mbarrier each at bar_off (TVEC: the RB ring slots themselves; TNCHW: stage_bytes each at stage_off)
  // TNCHW: boxes start tma_delta columns before wbase, at a 16-byte boundary (a box whose innermost coordinate was not
  // 16-byte aligned raised an illegal instruction on the H200), and tma_cols counts those columns too
  int tma_nbox, tma_bc, tma_bytes, tma_cols, tma_delta, NST, stage_off, stage_bytes, bar_off;
  unsigned long long mST, mBC; int sST, sBC;
  // Conv3d (vT > 0; 0 = Conv2d): the kernel runs it as a Conv2d over loader images (image, output depth d) and
  // channels C = vC x vT, channel c = (input channel c / vT, depth tap c % vT), which reads depth slice
  // d vsd - vpd + (c % vT) vdd of the vD slices (outside them: zero padding).  The weights (K, vC, vT, R, S) are then
  // the Conv2d's (K, C, R, S) as they lie.  An image's lines run over its vDout output depths (lines_d lines each),
  // so its pool covers every output depth (wg_x_at_vol, WGPiece).  (Last, so that the Conv2d kernels' parameter
  // offsets, and with them their code, stay as they were.)
  int vT, vC, vD, vDout, vsd, vpd, vdd, lines_d;
  // stride-2 columns (SW2): positions from a plane's even columns to its odd ones (0: stride 1)
  int sw2_sub;
  // two output rows per tile (R2; rows of 8..64 output pixels): 1, else 0
  int r2;
  // the weights' strides in elements: input channel (wsc) and output channel (wsk); op_wo counts with these and the
  // tap strides, so a weight is read as it lies (contiguous: R S and C R S; channels_last: 1 and R S C)
  int wsc;
  long long wsk;
};

// slot position (in 16-byte entries from the plane's start) of input column c relative to the segment's first (the
// loaders' stores, and on the host the ops' B offsets)
template <bool SW2>
__host__ __device__ __forceinline__ int wg_pos(const WGParams& p, int c) {
  return SW2 ? WG_PAD + (c & 1) * p.sw2_sub + (c >> 1) : WG_PAD + c;
}

static_assert(sizeof(WGParams) <= 4096, "kernel parameters are limited to 4 KB");
