// Family B fused kernel: its compile-time shape (tile, buffers, per-variant constants) and its parameter struct.
// The host planner (fullfuse/fused/convt_pool_reduce_plan.py) fills FBParams; cutlass_ops/convt_pool_reduce.py
// mirrors it in ctypes, and every compile unit checks the mirror's layout (static_asserts).
#pragma once
#include "device_std.h"
#include "codes.h"
#include "fused_convt_pack.cuh"

constexpr int FB_ROWS = 3;      // q_h rows per MMA tile
constexpr int FB_COLS = 32;     // q_w columns per tile row (row pitch of the input tile)
constexpr int FB_WH = 2;        // window rows (in h) per block, at most
constexpr int FB_WGDEPTH = 1;   // steps of wgmmas left in flight when a warpgroup moves on to the next step
constexpr int FB_NBUF32 = 3;    // weight buffers per warpgroup, fp32 input: NBUF - 1 - FB_WGDEPTH steps of prefetch
constexpr int FB_NBUF16 = 4;    // the same for bf16 / fp16 input
constexpr int FB_NBUFX3 = 3;    // the same for the "ieee" variant (one warpgroup)
constexpr int FB_X3 = 3;        // kernel variant (not an input dtype code): fp32 input at fp32 accuracy (kernel.cuh)
// Each warpgroup streams its own copy of the weight slices (its own buffers, copies and named barrier), so the two
// run apart: one's epilogue overlaps the other's HGMMAs.  Taps per step: 2 for 16-bit input (a step's barrier, copies
// and descriptor setup serve twice the HGMMAs), 1 for fp32 (two warpgroups' buffers of 2 x 8 KB taps do not fit
// beside the 160 KB tile).
// dt below: the kernel variant, FF_F32 / FF_BF16 / FF_F16 or FB_X3.
constexpr int fb_input_dt(int dt) { return dt == FB_X3 ? FF_F32 : dt; }   // the input's (and bias's) dtype code
constexpr int fb_tps(int dt) { return dt == FF_F32 || dt == FB_X3 ? 1 : 2; }
constexpr int fb_nbuf(int dt) { return dt == FF_F32 ? FB_NBUF32 : dt == FB_X3 ? FB_NBUFX3 : FB_NBUF16; }
constexpr int fb_nwg(int dt) { return dt == FB_X3 ? 1 : 2; }   // warpgroups per block
constexpr int fb_nt(int dt) { return 3 * fb_nwg(dt); }           // tiles per tile group
constexpr int fb_ks16(int ks) { return (ks + 1) / 2; }          // bf16 k steps of FB_X3's x_lo term
// bytes of one tap's packed weights at ks k steps: FB_X3 packs [w_hi tf32 | w_lo tf32 | bf16(w)] per tap
constexpr int fb_slice_bytes(int dt, int ks) { return dt == FB_X3 ? ks * 4096 + fb_ks16(ks) * 2048 : ks * 2048; }
static_assert(FB_NBUF32 - 1 - FB_WGDEPTH >= 1 && FB_NBUF16 - 1 - FB_WGDEPTH >= 1 && FB_NBUFX3 - 1 - FB_WGDEPTH >= 1,
              "too few buffers for FB_WGDEPTH");
constexpr int FB_PACK_PER_THREAD = 8;   // items of the weight packing per thread and chunk (weight_pack.cuh)
constexpr int FB_MAXCLS = 27;   // residue classes: s_d * s_h * s_w <= 27
constexpr int FB_CINFO = 10;    // ints of per-class block info in shared memory
constexpr int FB_ROW_BYTES = FB_COLS * 16;                      // one tile row of one 16-byte channel plane
constexpr int FB_TILE_SLACK = (FB_ROWS * FB_COLS) * 16 + 512;   // a 3-row tile may read this far past the last row

template <int V> using fb_int = std::integral_constant<int, V>;

struct FBParams {
  const void* x; const void* wp; const void* bias; void* out;   // x, wp, bias, out: fp32, or bf16 / fp16 (DT)
  int N, C, D, H, W, K, channels_last, ncdhw_vec;   // ncdhw_vec: NCDHW with 16-byte column groups
  int T[3], s[3], p[3], win[3], P[3];
  int act, red, ncls;
  int cls_r[FB_MAXCLS][3], cls_M[FB_MAXCLS][3], cls_slice[FB_MAXCLS];   // residues, taps per dim, first weight slice
  int Mmax[3];                   // max taps per dim over the classes
  int nd, nh;                    // input tile rows (d x h)
  int pwb, nwc;                  // Pw windows per block, w-chunks
  int wh, nhb;                   // Ph windows per block, h-blocks
  long long nfull;               // blocks of whole items (wh window rows); every later block is a piece of the tail:
  int tail_nhalf, tail_g;        // tail item -> tail_nhalf (1 or wh) window-row parts x tail_g class groups
  unsigned* ws;                  // tail_g > 1: [tail part][wh][pwb][64] window maxima (zero between launches), then
  int* ws_cnt;                   // [tail part] piece counters (zero between launches)
  int plane_bytes, tile_bytes, tile_alloc, max_steps;   // FB_X3: the x_lo tile starts at tile_bytes + FB_TILE_SLACK
  float inv_k;
  // packing in the kernel (weight_pack.cuh): the weight as the caller has it, its layout, the chunks of the packing
  // into wp, and the blocks that compute (blockIdx.x >= nblocks: packing only)
  const void* w;
  int* pack_cnt;                 // [3] counters in the zeroed workspace: chunks claimed, chunks packed, blocks done
  fb_pack::Geometry pg;
  long long pack_total;          // items of the whole packing
  int pack_chunks;               // chunks of FB_PACK_PER_THREAD items per thread; 0: packed before the launch
  int nblocks;
};

__device__ __forceinline__ int fb_floordiv(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
