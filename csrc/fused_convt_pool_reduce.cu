// Family B fully fused on sm_90a:
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
// Requirements (else the host API says why and the fallback serves it): sm_90a, fp32 / bf16 / fp16 input (NCDHW or
// channels_last_3d), C <= 64 with C % 4 == 0 (fp32) or C % 8 == 0 (16-bit), K <= 64, dilation 1, one window's
// input columns fit in 32, the tile fits in shared memory.  FB_SKIP_* macros are stage-isolation switches for benchmarks/probe_fused_b.py only
// (they give wrong results); FB_NBUF32 / FB_NBUF16 / FB_WGDEPTH are pipeline-depth knobs.
#include <cuda_runtime.h>
#include <stdint.h>
#include <algorithm>
#include <cstring>
#include "codes.h"
#include "activation.cuh"
#include "smem_optin.h"
#include "fused_convt_pack.cuh"

namespace {

constexpr int FB_ROWS = 3;      // q_h rows per MMA tile
constexpr int FB_COLS = 32;     // q_w columns per tile row (row pitch of the input tile)
constexpr int FB_WH = 2;        // window rows (in h) per block, at most
#ifndef FB_WGDEPTH
#define FB_WGDEPTH 1            // steps of wgmmas left in flight when a warpgroup moves on to the next step
#endif
#ifndef FB_NBUF32
#define FB_NBUF32 3             // weight buffers per warpgroup, fp32 input: FB_NBUF32 - 1 - FB_WGDEPTH steps of prefetch
#endif
#ifndef FB_NBUF16
#define FB_NBUF16 4             // the same for bf16 / fp16 input
#endif
#ifndef FB_NBUFX3
#define FB_NBUFX3 3             // the same for the "ieee" variant (one warpgroup)
#endif
constexpr int FB_X3 = 3;        // kernel variant (not an input dtype code): fp32 input at fp32 accuracy, see above
// Each warpgroup streams its own copy of the weight slices (its own buffers, copies and named barrier), so the two
// run apart: one's epilogue overlaps the other's HGMMAs.  Taps per step: 2 for 16-bit input (a step's barrier, copies
// and descriptor setup serve twice the HGMMAs), 1 for fp32 (two warpgroups' buffers of 2 x 8 KB taps do not fit
// beside the 160 KB tile).
// dt below: the kernel variant, FF_F32 / FF_BF16 / FF_F16 or FB_X3.
__host__ __device__ constexpr int fb_tps(int dt) { return dt == FF_F32 || dt == FB_X3 ? 1 : 2; }
__host__ __device__ constexpr int fb_nbuf(int dt) { return dt == FF_F32 ? FB_NBUF32 : dt == FB_X3 ? FB_NBUFX3 : FB_NBUF16; }
__host__ __device__ constexpr int fb_nwg(int dt) { return dt == FB_X3 ? 1 : 2; }   // warpgroups per block
__host__ __device__ constexpr int fb_nt(int dt) { return 3 * fb_nwg(dt); }           // tiles per tile group
__host__ __device__ constexpr int fb_ks16(int ks) { return (ks + 1) / 2; }          // bf16 k steps of FB_X3's x_lo term
// bytes of one tap's packed weights at ks k steps: FB_X3 packs [w_hi tf32 | w_lo tf32 | bf16(w)] per tap
__host__ __device__ constexpr int fb_slice_bytes(int dt, int ks) { return dt == FB_X3 ? ks * 4096 + fb_ks16(ks) * 2048 : ks * 2048; }
static_assert(FB_NBUF32 - 1 - FB_WGDEPTH >= 1 && FB_NBUF16 - 1 - FB_WGDEPTH >= 1 && FB_NBUFX3 - 1 - FB_WGDEPTH >= 1,
              "too few buffers for FB_WGDEPTH");
constexpr int FB_MAXCLS = 27;   // residue classes: s_d * s_h * s_w <= 27
constexpr int FB_CINFO = 10;    // ints of per-class block info in shared memory
constexpr int FB_ROW_BYTES = FB_COLS * 16;                      // one tile row of one 4-channel plane
constexpr int FB_TILE_SLACK = (FB_ROWS * FB_COLS) * 16 + 512;   // a 3-row tile may read this far past the last row

struct FBParams {
  const void* x; const void* wp; const float* bias; void* out;   // x, wp, out: fp32, or bf16 / fp16 (DT)
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
};

__device__ __forceinline__ unsigned fb_enc(float f) {
  if (f != f) return 0xFFFFFFFFu;
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float fb_dec(unsigned e) {
  if (e == 0xFFFFFFFFu) return __uint_as_float(0x7FC00000u);
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7FFFFFFFu) : ~e);
}
__device__ __forceinline__ uint32_t fb_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0,%1;" : "=r"(r) : "f"(f));
  return r;
}
__host__ __device__ __forceinline__ int fb_floordiv(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Runtime activation for the (rarely used) activated kernels: one switch per value, uniform across the block.
__device__ __forceinline__ float fb_act(int act, float v) {
  switch (act) {
    case FF_ACT_RELU: return ff_activate<FF_ACT_RELU>(v);
    case FF_ACT_GELU_ERF: return ff_activate<FF_ACT_GELU_ERF>(v);
    case FF_ACT_GELU_TANH: return ff_activate<FF_ACT_GELU_TANH>(v);
    case FF_ACT_SILU: return ff_activate<FF_ACT_SILU>(v);
    default: return v;
  }
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FB_HAVE_WGMMA 1
// D (64 x 96 fp32, 48 registers per thread) += A (64 x k, descriptor) * B (k x 96, descriptor): k = 8 tf32 (fp32
// input) or 16 bf16 / fp16, both operands K-major in shared memory.
#define FB_WGMMA_N96(NAME, SHAPE_TYPES, TAIL)                                                                    \
  __device__ __forceinline__ void NAME(float (&d)[48], uint64_t da, uint64_t db, int scale_d) {                  \
    asm volatile(                                                                                                 \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"                                                            \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES " "                                                          \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
        "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, p, " TAIL   \
        ";\n}\n"                                                                                                 \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]) \
        : "l"(da), "l"(db), "r"(scale_d));                                                                       \
  }
FB_WGMMA_N96(fb_wgmma_tf32, "m64n96k8.f32.tf32.tf32", "1, 1")
FB_WGMMA_N96(fb_wgmma_bf16, "m64n96k16.f32.bf16.bf16", "1, 1, 0, 0")
FB_WGMMA_N96(fb_wgmma_f16, "m64n96k16.f32.f16.f16", "1, 1, 0, 0")
#undef FB_WGMMA_N96
template <int DT>
__device__ __forceinline__ void fb_wgmma(float (&d)[48], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (DT == FF_F32) fb_wgmma_tf32(d, da, db, scale_d);
  else if constexpr (DT == FF_BF16) fb_wgmma_bf16(d, da, db, scale_d);
  else fb_wgmma_f16(d, da, db, scale_d);
}
#endif

__device__ __forceinline__ void fb_cp16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void fb_cp4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}

// m[16] = max(m, rows R0 .. R1 - 1 of one 3-row accumulator tile): this thread's 2 channels x 8 q_w columns per row.
// SAT (fp16 input): the activation sees conv + bias through ff_f16_sat, as PyTorch rounds an fp16 conv's output to
// fp16 (+-inf past 65504) before it.
template <int R0, int R1, bool HAS_ACT, bool SAT>
__device__ __forceinline__ void fb_rows_max(float (&m)[16], const float (&acc)[48], int act, float b0, float b1) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v = m[i];
#pragma unroll
    for (int r = R0; r < R1; ++r) {
      float a = acc[16 * r + i];
      if (HAS_ACT) {
        a += (i & 2) ? b1 : b0;
        a = fb_act(act, SAT ? ff_f16_sat(a) : a);
      }
      v = ff_max_nan(v, a);
    }
    m[i] = v;
  }
}

// Max over the valid rows of one 3-row tile into mx[h-window][16].  Rows >= rows_ok hold other rows' data and are
// skipped; hw_r (uniform) is row r's h-window.  Usually all three rows lie in one window: one pass.
template <bool HAS_ACT, bool SAT>
__device__ __forceinline__ void fb_tile_max(float (&mx)[FB_WH][16], const float (&acc)[48], int rows_ok, int hw0,
                                            int hw1, int hw2, int act, float b0, float b1) {
  static_assert(FB_WH == 2, "h-window selection below is written for two windows");
  if (rows_ok >= 3 && hw0 == hw2) {
    if (hw0 == 0) fb_rows_max<0, 3, HAS_ACT, SAT>(mx[0], acc, act, b0, b1);
    else fb_rows_max<0, 3, HAS_ACT, SAT>(mx[1], acc, act, b0, b1);
    return;
  }
  auto row = [&](auto r, int hw) {   // one row into its window
    constexpr int R = decltype(r)::value;
    if (hw == 0) fb_rows_max<R, R + 1, HAS_ACT, SAT>(mx[0], acc, act, b0, b1);
    else fb_rows_max<R, R + 1, HAS_ACT, SAT>(mx[1], acc, act, b0, b1);
  };
  if (rows_ok > 0) row(ff_int<0>{}, hw0);
  if (rows_ok > 1) row(ff_int<1>{}, hw1);
  if (rows_ok > 2) row(ff_int<2>{}, hw2);
}

// Two warpgroups share the tile: warpgroup g takes tiles 3g .. 3g + 2 of every tile group and streams its own copy of
// the weight slices, its step sequence rotated (warpgroup 1 starts half-way), so their epilogues fall apart in time.
template <bool HAS_ACT, int KS, int DT>
__global__ void __launch_bounds__(256, 1) fb_kernel(const __grid_constant__ FBParams p) {
#ifdef FB_HAVE_WGMMA
  constexpr bool X3 = DT == FB_X3;
  constexpr int NWG = fb_nwg(DT), NTHR = 128 * NWG, NT = fb_nt(DT);
  constexpr int ES = DT == FF_F32 || X3 ? 4 : 2;   // bytes per input / weight element
  constexpr int CPL = 16 / ES;                      // channels per 16-byte plane entry: 4 (fp32) or 8 (16-bit)
  constexpr int KS16 = X3 ? fb_ks16(KS) : 0;        // FB_X3: bf16 k steps over the x_lo tile
  constexpr int SLICE_BYTES = fb_slice_bytes(DT, KS);   // one tap's weights: [2 KS planes][64][CPL], 2 KB per k step
  constexpr int TPS = fb_tps(DT), NBUF = fb_nbuf(DT), PF = NBUF - 1 - FB_WGDEPTH;
  constexpr int STEP_BYTES = TPS * SLICE_BYTES;     // one step's weights
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* tile = smem;
  unsigned* winmax = reinterpret_cast<unsigned*>(smem + p.tile_alloc + NWG * NBUF * STEP_BYTES);   // [wh][pwb][64]
  int4* steps = reinterpret_cast<int4*>(winmax + p.wh * p.pwb * 64);
  int* cinfo = reinterpret_cast<int*>(steps + p.max_steps);
  signed char* colwin = reinterpret_cast<signed char*>(cinfo + p.ncls * FB_CINFO);   // [class][32]: w-window or -1
  __shared__ int s_total, s_off, s_split, s_last;
  const uint32_t tile_s = (uint32_t)__cvta_generic_to_shared(tile);
  const uint32_t wbuf_s = tile_s + (uint32_t)p.tile_alloc;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
  const int wg = tid >> 7;

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
    if (half >= nwh) return;   // the whole block: no barrier reached yet
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
  {
    constexpr int CP = 2 * KS;
    const int rows = p.nd * p.nh;
#ifdef FB_SKIP_TILE   // stage-isolation experiments only (wrong results)
    if (true) {} else
#endif
    if (p.channels_last) {   // a warp per tile row: 32 columns x CP planes of 16 contiguous bytes, planes fastest
      for (int row = warp; row < rows; row += NTHR / 32) {
        const int d = id_lo + row / p.nh, h = ih_lo + row % p.nh;
        const bool row_ok = d >= 0 && d < p.D && h >= 0 && h < p.H;
        const char* xrow = static_cast<const char*>(p.x) + (((n * p.D + d) * p.H + h) * (long long)p.W) * p.C * ES;
#pragma unroll
        for (int j = lane; j < FB_COLS * CP; j += 32) {
          const int cp = j % CP, col = j / CP, w = iw_lo + col;
          const bool ok = row_ok && CPL * cp < p.C && w >= 0 && w < p.W;
          const void* src = ok ? xrow + ((long long)w * p.C + CPL * cp) * ES : p.x;
          fb_cp16(tile_s + cp * p.plane_bytes + row * FB_ROW_BYTES + col * 16, src, ok);
        }
      }
    } else if (p.ncdhw_vec) {   // NCDHW, W % CPL == 0, 16-byte aligned: a thread per (row, plane, CPL-column group)
      // loads CPL 16-byte vectors (one per channel, CPL columns each) and transposes them in registers into CPL
      // 16-byte tile entries (one per column, CPL channels each); U items in flight: 16 loads per thread
      constexpr int U = 16 / CPL;
      const int g_lo = fb_floordiv(iw_lo, CPL);
      const int ngr = fb_floordiv(iw_lo + FB_COLS - 1, CPL) - g_lo + 1;
      const int items = rows * CP * ngr;
      const long long chs = (long long)p.D * p.H * p.W;   // elements between channels
      for (int i0 = tid; i0 < items; i0 += NTHR * U) {
        uint4 v[U][CPL];
        int rowoff[U], col0[U];   // tile byte offset of the item's (plane, row), or -1; its first column (may be < 0)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int it = i0 + u * NTHR, grp = it % ngr, cp = (it / ngr) % CP, row = it / (ngr * CP);
          const int d = id_lo + row / p.nh, h = ih_lo + row % p.nh, w0 = (g_lo + grp) * CPL;
          const bool ok = it < items && d >= 0 && d < p.D && h >= 0 && h < p.H && w0 >= 0 && w0 < p.W;
          rowoff[u] = it < items ? cp * p.plane_bytes + row * FB_ROW_BYTES : -1;
          col0[u] = w0 - iw_lo;
          const char* src = static_cast<const char*>(p.x) +
                            (ok ? ((((n * p.C + cp * CPL) * p.D + d) * (long long)p.H + h) * p.W + w0) * ES : 0);
#pragma unroll
          for (int c = 0; c < CPL; ++c)
            v[u][c] = ok && cp * CPL + c < p.C ? __ldg(reinterpret_cast<const uint4*>(src + c * chs * ES))
                                               : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (rowoff[u] < 0) continue;
#pragma unroll
          for (int j = 0; j < CPL; ++j) {   // column j of the group: channel c's element j of v[u][c]
            const int col = col0[u] + j;
            if (col < 0 || col >= FB_COLS) continue;
            uint32_t e[4];
            if constexpr (ES == 4) {   // rounded to tf32 on the way (no rounding pass), FB_X3: as it is (split below)
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const float f = reinterpret_cast<const float*>(&v[u][c])[j];
                e[c] = X3 ? __float_as_uint(f) : fb_tf32(f);
              }
            } else {
#pragma unroll
              for (int k = 0; k < 4; ++k)
                e[k] = __byte_perm(reinterpret_cast<const uint32_t*>(&v[u][2 * k])[j >> 1],
                                   reinterpret_cast<const uint32_t*>(&v[u][2 * k + 1])[j >> 1], (j & 1) ? 0x7632 : 0x5410);
            }
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" :: "r"(tile_s + rowoff[u] + col * 16), "r"(e[0]), "r"(e[1]),
                         "r"(e[2]), "r"(e[3]) : "memory");
          }
        }
      }
    } else {                 // NCDHW read natively: a warp per (row, channel), a lane per column
      for (int rc = warp; rc < rows * CP * CPL; rc += NTHR / 32) {
        const int ch = rc % (CP * CPL), row = rc / (CP * CPL);
        const int d = id_lo + row / p.nh, h = ih_lo + row % p.nh, w = iw_lo + lane;
        const bool ok = ch < p.C && d >= 0 && d < p.D && h >= 0 && h < p.H && w >= 0 && w < p.W;
        const long long e = ok ? (((n * p.C + ch) * p.D + d) * (long long)p.H + h) * p.W + w : 0;
        const uint32_t dst = tile_s + (ch / CPL) * p.plane_bytes + row * FB_ROW_BYTES + lane * 16 + (ch % CPL) * ES;
        if constexpr (ES == 4) {   // 4-byte asynchronous copies
          fb_cp4(dst, static_cast<const float*>(p.x) + e, ok);
        } else {                   // no 2-byte cp.async: a plain load and store
          const unsigned short v = ok ? __ldg(static_cast<const unsigned short*>(p.x) + e) : (unsigned short)0;
          asm volatile("st.shared.u16 [%0], %1;" :: "r"(dst), "h"(v) : "memory");
        }
      }
    }
    for (int i = p.tile_bytes / 16 + tid; i < p.tile_alloc / 16; i += NTHR)
      *reinterpret_cast<uint4*>(tile + i * 16) = make_uint4(0, 0, 0, 0);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }

  // ---- per-class q ranges of this block, then the step list (class, tile group, tap) ----
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
    s_split = NWG == 2 && nwh == 1 && small;
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

  // ---- tile ready: fp32 rounded to tf32 in place (the 16-byte NCDHW loader rounded already; the slack is zeros);
  // 16-bit input is used as it is ----
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
#ifndef FB_SKIP_ROUND   // stage-isolation experiments only (truncated tf32)
  const bool rounded = !p.channels_last && p.ncdhw_vec;
  if constexpr (X3) {   // x -> x_hi = tf32(x) in place, x_lo = bf16(x - x_hi) into the x_lo tile: lo plane j holds the
    // 8 channels of hi planes 2j, 2j + 1 (planes past the channels stay zero)
    const int ents = p.plane_bytes / 16;
    unsigned char* lo_tile = tile + p.tile_bytes + FB_TILE_SLACK;
    for (int i = tid; i < KS * ents; i += NTHR) {
      const int j = i / ents, e = i - j * ents;
      uint4* h[2] = {reinterpret_cast<uint4*>(tile + 2 * j * p.plane_bytes + e * 16),
                     reinterpret_cast<uint4*>(tile + (2 * j + 1) * p.plane_bytes + e * 16)};
      uint32_t lo[4];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        uint4 v = *h[k];
        uint32_t* f = reinterpret_cast<uint32_t*>(&v);
        float l[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // x_lo = x - x_hi exactly.  A non-finite x goes into x_lo alone (x_hi = 0): it then meets bf16(w) only,
          // whose sign is w's; in x_hi it would also meet w_lo (0, or of the other sign: inf * 0 or inf - inf = NaN
          // where PyTorch's x w is +-inf).  (Non-finite weights are packed the other way round: w_hi alone.)
          const float x = __uint_as_float(f[c]);
          const uint32_t h = fb_tf32(x);
          const bool fin = isfinite(__uint_as_float(h));
          f[c] = fin ? h : 0u;
          l[c] = fin ? x - __uint_as_float(h) : x;
        }
        *h[k] = v;
        __nv_bfloat162 l01 = __floats2bfloat162_rn(l[0], l[1]), l23 = __floats2bfloat162_rn(l[2], l[3]);
        lo[2 * k] = *reinterpret_cast<uint32_t*>(&l01);
        lo[2 * k + 1] = *reinterpret_cast<uint32_t*>(&l23);
      }
      *reinterpret_cast<uint4*>(lo_tile + j * p.plane_bytes + e * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }
  for (int i = tid; DT == FF_F32 && !rounded && i < p.tile_bytes / 16; i += NTHR) {
    uint4* a = reinterpret_cast<uint4*>(tile + i * 16);
    uint4 v = *a;
    v.x = fb_tf32(__uint_as_float(v.x)); v.y = fb_tf32(__uint_as_float(v.y));
    v.z = fb_tf32(__uint_as_float(v.z)); v.w = fb_tf32(__uint_as_float(v.w));
    *a = v;
  }
#endif

  // This warpgroup's step sequence: normally the whole step list, rotated by s_off for warpgroup 1, the warpgroups
  // taking tiles 0-2 and 3-5 of each group; in a tail block whose classes have <= 3 tiles each (one window row),
  // warpgroup 0 takes steps [0, s_off) and warpgroup 1 [s_off, total), both on tiles 0-2, so neither idles.  Step
  // st's weight slices (consecutive in the packing) go into this warpgroup's buffer st % NBUF, a missing second tap
  // as zeros; one commit group per call, empty past the end.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // this thread's tile writes -> the wgmmas of both
  __syncthreads();   // steps[], s_off and the rounded tile are visible to every thread (both warpgroups)
  const int total = s_total, off = wg ? s_off : 0, split = s_split;
  const int nseq = split ? (wg ? total - off : s_off) : total;
  auto entry = [&](int st) { const int i = st + off; return steps[i < total ? i : i - total]; };
  auto load_step = [&](int st) {
    if (st < nseq) {
      const int4 e = entry(st);
      const char* src = static_cast<const char*>(p.wp) + (size_t)e.x * SLICE_BYTES;
      const uint32_t dst = wbuf_s + (wg * NBUF + st % NBUF) * STEP_BYTES;
#pragma unroll
      for (int i = tid & 127; i < STEP_BYTES / 16; i += 128) {
        const bool ok = i < SLICE_BYTES / 16 || e.z >= 0;
        fb_cp16(dst + i * 16, ok ? src + i * 16 : src, ok);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int i = 0; i < PF; ++i) load_step(i);

  const int m0 = 16 * (warp & 3) + g8;   // this thread's output channels: m0, m0 + 8
  const float b0 = (p.bias && m0 < p.K) ? __ldg(p.bias + m0) : 0.0f;
  const float b1 = (p.bias && m0 + 8 < p.K) ? __ldg(p.bias + m0 + 8) : 0.0f;
  const uint64_t desc_hi = (uint64_t)(128 >> 4) << 32;            // SBO: 8-column core matrices 128 B apart
  const uint32_t plane16 = (uint32_t)p.plane_bytes >> 4;
  const uint32_t zero_desc = (tile_s + (uint32_t)p.tile_bytes) >> 4;   // the zero slack, LBO 0 (see step below)
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
      asm volatile("cp.async.wait_group %0;" :: "n"(PF - 1) : "memory");
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" :: "r"(1 + wg) : "memory");   // this warpgroup: step st's slices landed,
                                                                      // its warps are past step st - 1's wait_group
      load_step(st + PF);  // its buffer held step st - 1 - FB_WGDEPTH, finished by now
      if constexpr (decltype(mma)::value) {
        const uint32_t a_lo = ((wbuf_s + (wg * NBUF + st % NBUF) * STEP_BYTES) >> 4) | ((uint32_t)(1024 >> 4) << 16);
        const int accumulate = st > st_begin;
        const bool none1 = e.z < 0;
        uint32_t b1[3];
#pragma unroll
        for (int j = 0; j < 3; ++j) b1[j] = none1 ? zero_desc : bdesc[j] - (uint32_t)e.z;
        const uint32_t kstep1 = none1 ? 0u : 2 * plane16;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#ifndef FB_SKIP_MMA   // stage-isolation experiments only (wrong results)
        if constexpr (X3) {   // w_hi x_hi, w_lo x_hi (tf32), bf16(w) x_lo (bf16)
          const uint32_t lo16 = (uint32_t)(p.tile_bytes + FB_TILE_SLACK) >> 4;
#pragma unroll
          for (int part = 0; part < 2; ++part)
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
              const uint64_t da = (uint64_t)(a_lo + (part * KS + ks) * (2048 >> 4)) | desc_hi;
#pragma unroll
              for (int j = 0; j < 3; ++j)
                fb_wgmma_tf32(acc[j], da, (uint64_t)(bdesc[j] + ks * 2 * plane16 - (uint32_t)e.y) | desc_hi,
                              (accumulate || part > 0 || ks > 0) ? 1 : 0);
            }
#pragma unroll
          for (int ks = 0; ks < KS16; ++ks) {
            const uint64_t da = (uint64_t)(a_lo + (2 * KS + ks) * (2048 >> 4)) | desc_hi;
#pragma unroll
            for (int j = 0; j < 3; ++j)
              fb_wgmma_bf16(acc[j], da, (uint64_t)(bdesc[j] + lo16 + ks * 2 * plane16 - (uint32_t)e.y) | desc_hi, 1);
          }
        } else {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {   // tap 0
          const uint64_t da = (uint64_t)(a_lo + ks * (2048 >> 4)) | desc_hi;
#pragma unroll
          for (int j = 0; j < 3; ++j)
            fb_wgmma<DT>(acc[j], da, (uint64_t)(bdesc[j] + ks * 2 * plane16 - (uint32_t)e.y) | desc_hi,
                         (accumulate || ks > 0) ? 1 : 0);
        }
#pragma unroll
        for (int ks = 0; ks < (TPS == 2 ? KS : 0); ++ks) {   // tap 1
          const uint64_t da = (uint64_t)(a_lo + (SLICE_BYTES >> 4) + ks * (2048 >> 4)) | desc_hi;
#pragma unroll
          for (int j = 0; j < 3; ++j) fb_wgmma<DT>(acc[j], da, (uint64_t)(b1[j] + ks * kstep1) | desc_hi, 1);
        }
        }
#endif
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(FB_WGDEPTH) : "memory");
      }
    };
    if (wg_busy)
      for (; st < st_end; ++st) step(st, std::true_type{});
    else
      for (; st < st_end; ++st) step(st, std::false_type{});
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 3; ++j)
#pragma unroll
      for (int i = 0; i < 48; ++i) asm volatile("" : "+f"(acc[j][i]) :: "memory");
    // ---- epilogue of a tile group: max over the valid (q_d, q_h) rows of each h-window in registers, then into the
    // window maxima ----
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
      fb_tile_max<HAS_ACT, DT == FF_F16>(mx, acc[j], ci[3] - FB_ROWS * (t % nhg), hwin(0), hwin(1), hwin(2), p.act, b0, b1);
    }
    // into the window maxima: columns 2 tig, 2 tig + 1 (+ 8 ii) that share a w-window are merged first
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      const int cw0 = colwin[c * FB_COLS + 8 * ii + 2 * tig], cw1 = colwin[c * FB_COLS + 8 * ii + 2 * tig + 1];
#pragma unroll
      for (int w = 0; w < FB_WH; ++w) {
        if (w >= nwh) continue;
#pragma unroll
        for (int kh = 0; kh < 2; ++kh) {
          const int k = m0 + 8 * kh;
          if (k >= p.K) continue;
          unsigned* row = winmax + w * p.pwb * 64 + k;
          float v0 = mx[w][4 * ii + 2 * kh], v1 = mx[w][4 * ii + 2 * kh + 1];
          if (cw0 == cw1) { v0 = ff_max_nan(v0, v1); v1 = -__int_as_float(0x7f800000); }
          if (cw0 >= 0 && v0 != -__int_as_float(0x7f800000)) atomicMax(row + cw0 * 64, fb_enc(v0));
          if (cw1 >= 0 && v1 != -__int_as_float(0x7f800000)) atomicMax(row + cw1 * 64, fb_enc(v1));
        }
      }
    }
  }
  __syncthreads();
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
    const bool tapless = tapless_d || holds_tapless(1, oh0 + hw * p.win[1], p.win[1]) || holds_tapless(2, pw * p.win[2], p.win[2]);
    const unsigned* wm = (gm_part ? gm_part : winmax) + (hw * p.pwb + wl) * 64;
    float v2[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = lane + 32 * h;
      float v = (p.red == FF_RED_MAX) ? -__int_as_float(0x7f800000) : 0.0f;   // identity for k >= K
      if (k < p.K) {
        const unsigned enc = gm_part ? __ldcg(wm + k) : wm[k];
        v = enc ? fb_dec(enc) : -__int_as_float(0x7f800000);   // 0: no computed position (tapless only)
        const float bk = p.bias ? __ldg(p.bias + k) : 0.0f;
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
      if constexpr (ES == 4) static_cast<float*>(p.out)[o] = v;
      else if constexpr (DT == FF_BF16) static_cast<__nv_bfloat16*>(p.out)[o] = __float2bfloat16_rn(v);
      else static_cast<__half*>(p.out)[o] = __float2half_rn(v);
    }
  }
  if (gm_part) {   // block-uniform: the workspace back to zero for the next launch
    __syncthreads();
    for (int i = tid; i < nent; i += NTHR) gm_part[i] = 0u;
    if (tid == 0) p.ws_cnt[part] = 0;
  }
#else
  __trap();
#endif
}

// K steps of the kernel that serves C input channels: 8 channels each (fp32, C padded up to 8, 16, 32 or 64) or 16
// (bf16 / fp16, C padded up to 16, 32 or 64).  The packed weights hold, per residue class (rd, rh, rw) and tap
// (md, mh, mw), one [C_pad / CPL][64][CPL] slice of KS x 2 KB (output channels padded to 64; CPL = 4 tf32 or 8
// 16-bit values): fullfuse/fused/convt_pool_reduce.py pack_weights, same padding rule.
int fb_ksteps(int dtype, int C) {
  if (dtype == FF_F32) return C <= 8 ? 1 : C <= 16 ? 2 : C <= 32 ? 4 : 8;
  return C <= 16 ? 1 : C <= 32 ? 2 : 4;
}

struct FBPlan {
  const char* why;
  FBParams prm;
  size_t smem;
  long long blocks;
  int ks, dtype;   // dtype: the kernel variant (FB_X3 for fp32 input at precision ieee)
  long long ws_parts;   // workspace: [ws_parts][wh][pwb][64] window maxima, then [ws_parts] counters
  size_t ws_bytes;      //   (zeroed once by the caller, left zeroed by every launch)
};

// Input columns a block of windows [pw0, pw0 + npw) needs: q_w from the first window's lowest class to the last
// window's highest, plus the taps' reach.
int fb_cols_needed(int pw0, int npw, int win, int s, int pad, int Mmax) {
  return (pw0 + npw) * win - 1 + pad >= 0 ? ((pw0 + npw) * win - 1 + pad) / s - (pw0 * win + pad) / s + Mmax : 0;
}

FBPlan fb_plan(int dtype, int precision, int channels_last, long long N, int C, int D, int H, int W, int K, const int* T, const int* s,
               const int* pad, const int* outpad, const int* win, int act, int red) {
  FBPlan pl{};
  pl.why = nullptr;
  FBParams& p = pl.prm;
  if (dtype != FF_F32 && dtype != FF_BF16 && dtype != FF_F16) { pl.why = "fused convT-pool-reduce: bad dtype"; return pl; }
  if (precision != FF_PREC_TF32 && precision != FF_PREC_IEEE) { pl.why = "fused convT-pool-reduce: bad precision code"; return pl; }
  const int kv = dtype == FF_F32 && precision == FF_PREC_IEEE ? FB_X3 : dtype;   // the kernel variant
  if (C % (dtype == FF_F32 ? 4 : 8) != 0 || C > 64) {
    pl.why = "fused convT-pool-reduce: needs C_in <= 64 and C_in % 4 == 0 (fp32) or % 8 == 0 (bf16 / fp16)";
    return pl;
  }
  if (K > 64) { pl.why = "fused convT-pool-reduce: C_out > 64"; return pl; }
  if (act < 0 || act > 4 || red < 0 || red > 2) { pl.why = "fused convT-pool-reduce: bad activation/reduction code"; return pl; }
  if (N <= 0) { pl.why = "fused convT-pool-reduce: empty batch"; return pl; }
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (!(major == 9 && minor == 0)) { pl.why = "fused convT-pool-reduce: needs sm_90 (wgmma)"; return pl; }
  p.N = (int)N; p.C = C; p.D = D; p.H = H; p.W = W; p.K = K; p.act = act; p.red = red;
  p.channels_last = channels_last != 0;
  p.inv_k = 1.0f / (float)K;
  pl.ks = fb_ksteps(dtype, C);
  pl.dtype = kv;
  if (kv == FB_X3 && pl.ks > 4) { pl.why = "fused convT-pool-reduce: precision ieee needs C_in <= 32 (two tiles in shared memory)"; return pl; }
  const int I[3] = {D, H, W};
  int ncls = 1;
  for (int a = 0; a < 3; ++a) {
    p.T[a] = T[a]; p.s[a] = s[a]; p.p[a] = pad[a]; p.win[a] = win[a];
    if (T[a] <= 0 || s[a] <= 0 || pad[a] < 0 || outpad[a] < 0 || win[a] <= 0) {
      pl.why = "fused convT-pool-reduce: bad parameters";
      return pl;
    }
    const long long O = (long long)(I[a] - 1) * s[a] - 2LL * pad[a] + T[a] + outpad[a];
    p.P[a] = (int)(O / win[a]);
    if (p.P[a] <= 0) { pl.why = "fused convT-pool-reduce: empty pooled output"; return pl; }
    ncls *= s[a];
    p.Mmax[a] = (T[a] + s[a] - 1) / s[a];
  }
  if (ncls > FB_MAXCLS) { pl.why = "fused convT-pool-reduce: more than 27 residue classes"; return pl; }
  p.ncls = ncls;
  int slice = 0;
  for (int c = 0; c < ncls; ++c) {
    const int r[3] = {c / (s[1] * s[2]), (c / s[2]) % s[1], c % s[2]};
    int taps = 1;
    for (int a = 0; a < 3; ++a) {
      p.cls_r[c][a] = r[a];
      p.cls_M[c][a] = r[a] < T[a] ? (T[a] - r[a] + s[a] - 1) / s[a] : 0;
      taps *= p.cls_M[c][a];
    }
    p.cls_slice[c] = slice;
    slice += taps;
  }
  // windows per block in w: as many as keep every block's input columns within the tile's 32
  p.pwb = 0;
  for (int pwb = p.P[2]; pwb >= 1 && !p.pwb; --pwb) {
    bool fits = true;
    for (int pw0 = 0; pw0 < p.P[2] && fits; pw0 += pwb)
      fits = fb_cols_needed(pw0, std::min(pwb, p.P[2] - pw0), win[2], s[2], pad[2], p.Mmax[2]) <= FB_COLS;
    if (fits) p.pwb = pwb;
  }
  if (!p.pwb) { pl.why = "fused convT-pool-reduce: one pooling window's input columns exceed the 32-column tile"; return pl; }
  p.nwc = (p.P[2] + p.pwb - 1) / p.pwb;
  // window rows per block in h: FB_WH when its tile fits in shared memory, else 1
  for (int wh = std::min(FB_WH, p.P[1]); wh >= 1; --wh) {
    p.wh = wh;
    p.nhb = (p.P[1] + wh - 1) / wh;
    // tile rows: input rows q - m over the block's windows (wd = 1 in d, wh in h); the span and the step count
    // depend on the block's first output index mod s only
    const int wins[2] = {1, wh}, nblk[2] = {p.P[0], p.nhb};
    int ext[2] = {0, 0};
    for (int a = 0; a < 2; ++a)
      for (int k = 0; k < s[a] && k < nblk[a]; ++k) {
        const int X = k * wins[a] * win[a] + pad[a], len = std::min(wins[a], p.P[a] - k * wins[a]) * win[a];
        ext[a] = std::max(ext[a], (X + len - 1) / s[a] - X / s[a] + p.Mmax[a]);
      }
    p.nd = ext[0]; p.nh = ext[1];
    p.max_steps = 0;
    for (int kd = 0; kd < s[0] && kd < nblk[0]; ++kd)
      for (int kh = 0; kh < s[1] && kh < nblk[1]; ++kh) {
        const int o[2] = {kd * win[0], kh * wh * win[1]};
        const int len[2] = {win[0], std::min(wh, p.P[1] - kh * wh) * win[1]};
        int total = 0;
        for (int c = 0; c < ncls; ++c) {
          int nq[2];
          for (int a = 0; a < 2; ++a) {
            const int r = p.cls_r[c][a];
            nq[a] = fb_floordiv(o[a] + len[a] - 1 + pad[a] - r, s[a]) - fb_floordiv(o[a] + pad[a] - r + s[a] - 1, s[a]) + 1;
          }
          const int taps = p.cls_M[c][0] * p.cls_M[c][1] * p.cls_M[c][2];
          if (nq[0] <= 0 || nq[1] <= 0 || taps == 0) continue;
          const int tiles = nq[0] * ((nq[1] + FB_ROWS - 1) / FB_ROWS);
          total += (tiles + fb_nt(kv) - 1) / fb_nt(kv) * ((taps + fb_tps(kv) - 1) / fb_tps(kv));
        }
        p.max_steps = std::max(p.max_steps, total);
      }
    p.plane_bytes = p.nd * p.nh * FB_ROW_BYTES;
    p.tile_bytes = 2 * pl.ks * p.plane_bytes;
    p.tile_alloc = p.tile_bytes + FB_TILE_SLACK;
    if (kv == FB_X3) p.tile_alloc += 2 * fb_ks16(pl.ks) * p.plane_bytes + FB_TILE_SLACK;   // + the x_lo tile (bf16)
    pl.smem = (size_t)p.tile_alloc + (size_t)fb_nwg(kv) * fb_nbuf(kv) * fb_tps(kv) * fb_slice_bytes(kv, pl.ks) +
              (size_t)wh * p.pwb * 64 * 4 +
              (size_t)p.max_steps * 16 + (size_t)ncls * FB_CINFO * 4 + (size_t)ncls * FB_COLS;
    if (pl.smem <= 227 * 1024) break;
  }
  if (pl.smem > 227 * 1024) {
    pl.why = "fused convT-pool-reduce: the input tile of one window row does not fit in shared memory";
    return pl;
  }
  const long long items = N * p.P[0] * p.nhb * p.nwc;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  // one block per SM: the last wave holds `tail` items; split them into window rows (when that fits the SMs), then
  // into class groups (at most ncls / 2 of them: two warpgroups take a class each) as far as the SMs go
  const long long tail = sms > 0 ? items % sms : 0;
  p.tail_nhalf = (tail > 0 && p.wh > 1 && p.wh * tail <= sms) ? p.wh : 1;
  const long long gmax = fb_nwg(kv) == 2 ? ncls / 2 : ncls;   // two warpgroups: a class each (one: a class)
  p.tail_g = tail > 0 ? (int)std::max(1LL, std::min((long long)sms / (tail * p.tail_nhalf), gmax)) : 1;
  p.nfull = (p.tail_nhalf > 1 || p.tail_g > 1) ? items - tail : items;
  pl.blocks = p.nfull + (items - p.nfull) * p.tail_nhalf * p.tail_g;
  pl.ws_parts = p.tail_g > 1 ? (items - p.nfull) * p.tail_nhalf : 0;   // tail parts whose pieces combine in global memory
  pl.ws_bytes = (size_t)pl.ws_parts * ((size_t)p.wh * p.pwb * 64 + 1) * 4;
  if (pl.blocks > 0x7fffffffLL) { pl.why = "fused convT-pool-reduce: too many blocks"; return pl; }
  return pl;
}

// k steps -> template parameter (1, 2, 4, and 8 when MAXKS allows it: fp32 only)
// FB_DEV_KS (development builds only, e.g. probe variants: seconds to compile): that k-step count alone, no activation
template <int MAXKS, class F>
int fb_dispatch_ks(int ks, F&& f) {
#ifdef FB_DEV_KS
  if constexpr (FB_DEV_KS <= MAXKS) { if (ks == FB_DEV_KS) return f(ff_int<FB_DEV_KS>{}); }
  return (int)cudaErrorInvalidValue;
#else
  switch (ks) {
    case 1: return f(ff_int<1>{});
    case 2: return f(ff_int<2>{});
    case 4: return f(ff_int<4>{});
    case 8:
      if constexpr (MAXKS >= 8) return f(ff_int<8>{});
      else return (int)cudaErrorInvalidValue;
    default: return (int)cudaErrorInvalidValue;
  }
#endif
}


// The problem as one int64 array (one ctypes argument instead of 26: host time per call):
//   dtype, precision, channels_last, N, C, D, H, W, K, then per dim (d, h, w): kernel T, stride s, padding,
//   output_padding, pooling window; then activation, channel reduction.
constexpr int FB_PROBLEM_LEN = 26;
FBPlan fb_plan_of(const long long* q) {
  int T[3], s[3], pad[3], outpad[3], win[3];
  for (int a = 0; a < 3; ++a) {
    T[a] = (int)q[9 + a]; s[a] = (int)q[12 + a]; pad[a] = (int)q[15 + a]; outpad[a] = (int)q[18 + a]; win[a] = (int)q[21 + a];
  }
  return fb_plan((int)q[0], (int)q[1], (int)q[2], q[3], (int)q[4], (int)q[5], (int)q[6], (int)q[7], (int)q[8], T, s, pad,
                 outpad, win, (int)q[24], (int)q[25]);
}

}  // namespace

extern "C" {

// The packed weights of the fused kernel, built on the caller's stream before every launch (nothing packed is kept
// that could go stale, cross streams or sit in a CUDA graph's memory): fused_convt_pack.cuh, geometry as there.
// Returns cudaGetLastError() (0: success).
int ff_fused_convt_pack_weights(const void* w, const long long* geometry, void* out, cudaStream_t stream) {
  return fb_pack::launch(w, geometry, out, stream);
}

const char* ff_fused_convt_pool_reduce_unsupported(const long long* problem) { return fb_plan_of(problem).why; }

// Bytes of the workspace the launcher needs for this problem (0: none): zeroed once by the caller; every launch
// leaves it zeroed, so one buffer serves every later launch of the problem in stream order.
size_t ff_fused_convt_pool_reduce_workspace_bytes(const long long* problem) {
  const FBPlan pl = fb_plan_of(problem);
  return pl.why ? 0 : pl.ws_bytes;
}

int ff_fused_convt_pool_reduce(const void* x, const void* packed_w, const float* bias, void* out, const long long* problem,
                               void* workspace, cudaStream_t stream) {
  // the plan of the previous call is reused when the problem repeats (host time per call: the plan asks the device
  // for its attributes); a kernel's shared-memory limit is the device's maximum, set once (ff_smem_optin)
  int dev = 0;
  cudaGetDevice(&dev);
  static thread_local long long last_key[FB_PROBLEM_LEN];
  static thread_local int last_dev = -1;
  static thread_local FBPlan last_plan;
  if (dev != last_dev || std::memcmp(problem, last_key, sizeof last_key) != 0) {
    last_plan = fb_plan_of(problem);
    std::memcpy(last_key, problem, sizeof last_key);
    last_dev = dev;
  }
  FBPlan pl = last_plan;
  if (pl.why) return (int)cudaErrorNotSupported;
  const int channels_last = pl.prm.channels_last, W = pl.prm.W, act = pl.prm.act;
  if (channels_last && reinterpret_cast<uintptr_t>(x) % 16) return (int)cudaErrorMisalignedAddress;   // 16-byte copies
  pl.prm.x = x; pl.prm.wp = packed_w; pl.prm.bias = bias; pl.prm.out = out;
  if (pl.ws_bytes && !workspace) return (int)cudaErrorInvalidValue;
  pl.prm.ws = static_cast<unsigned*>(workspace);
  pl.prm.ws_cnt = reinterpret_cast<int*>(pl.prm.ws + (size_t)pl.ws_parts * pl.prm.wh * pl.prm.pwb * 64);
  pl.prm.ncdhw_vec = !channels_last && W % (pl.dtype == FF_BF16 || pl.dtype == FF_F16 ? 8 : 4) == 0 &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0;
  auto launch = [&](auto kern) {
    const cudaError_t e = ff_smem_optin(reinterpret_cast<const void*>(kern));
    if (e != cudaSuccess) return (int)e;
    kern<<<(unsigned)pl.blocks, 128 * fb_nwg(pl.dtype), pl.smem, stream>>>(pl.prm);
    return (int)cudaGetLastError();
  };
#ifdef FB_DEV_KS
  if (act != FF_ACT_NONE) return (int)cudaErrorInvalidValue;
  return [&](auto has_act) {
#else
  return ff_dispatch_bool(act != FF_ACT_NONE, [&](auto has_act) {
#endif
    constexpr bool A = decltype(has_act)::value;
    if (pl.dtype == FF_F32)
      return fb_dispatch_ks<8>(pl.ks, [&](auto ks) { return launch(fb_kernel<A, decltype(ks)::value, FF_F32>); });
    if (pl.dtype == FB_X3)     // 8 k steps (C_in > 32): its tiles never fit, the plan refuses it
      return fb_dispatch_ks<4>(pl.ks, [&](auto ks) { return launch(fb_kernel<A, decltype(ks)::value, FB_X3>); });
    if (pl.dtype == FF_BF16)   // 16-bit: 16-channel k steps, at most 4
      return fb_dispatch_ks<4>(pl.ks, [&](auto ks) { return launch(fb_kernel<A, decltype(ks)::value, FF_BF16>); });
    return fb_dispatch_ks<4>(pl.ks, [&](auto ks) { return launch(fb_kernel<A, decltype(ks)::value, FF_F16>); });
#ifdef FB_DEV_KS
  }(std::false_type{});
#else
  });
#endif
}

}  // extern "C"
