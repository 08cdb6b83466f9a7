// DRAFT (branch wip/fused-b, never run on a GPU): family B fully fused on sm_90a.
//   out[n, Pd, Ph, Pw] = red_k ( max_{o in window(P)} convT3d(x, w)[n, k, o] + b[k] )
// Reduces, per output window and image, over the window's conv outputs (max) and then over output channels
// (sum / mean / max), so the transposed conv's output never leaves the chip: the window maxima live in shared memory
// (encoded as ordered uints for atomicMax), only N x Pd x Ph x Pw values are written.
//
// Sub-pixel decomposition: output o = s*q + r - p (per dim, residue class r = (o + p) mod s) receives
// sum_{m} x[q - m] * w[r + s*m], m = 0 .. M_r - 1 with M_r = ceil((T - r) / s): a stride-1 conv per class (8 classes
// for s = 2) over the input, whose taps are input offsets -m.  GEMM per class and tap (wgmma m64n32k8, TF32):
//   M = 64 output channels (A = that tap's weights, streamed: 64 x C floats per tap, double-buffered in shared memory),
//   N = 32 consecutive q_w of one (q_d, q_h) row (B = the input tile in shared memory, channels_last, 4-channel planes:
//       the tap's -m_w shift is the descriptor's start address, as in family A),
//   K = C input channels (8 per wgmma).
// One block = one image x one window row (Pd, Ph) x all Pw windows, all classes; up to NT = 9 (q_d, q_h, w-chunk)
// tiles accumulate at once (9 x 16 accumulator registers) so each streamed tap slice serves all of them.
// Requirements (else the host API says why and the fallback serves it): sm_90a, fp32 channels_last_3d input with
// C % 8 == 0, K <= 64, dilation 1, the input tile of one window row fits in shared memory.
#include <cuda_runtime.h>
#include <stdint.h>
#include <algorithm>
#include "codes.h"
#include "activation.cuh"

namespace {

constexpr int FB_NT = 9;        // tiles (q_d, q_h, 32-wide q_w chunk) accumulated together
constexpr int FB_MAXCLS = 27;   // residue classes: s_d * s_h * s_w <= 27
constexpr int FB_PAD = 4;       // slack positions in front of every plane

struct FBParams {
  const float* x; const float* wp; const float* bias; float* out;
  int N, C, D, H, W, K;
  int T[3], s[3], p[3], win[3], P[3];
  int act, red;
  int ncls;
  int cls_r[FB_MAXCLS][3], cls_M[FB_MAXCLS][3], cls_woff[FB_MAXCLS];   // residues, taps per dim, packed-weight offset
  int Mmax[3];                   // max taps per dim over the classes
  int nd, nh, nw, ilo_w;         // input tile extents (rows nd x nh, nw columns from ilo_w)
  int plane_pos, plane_bytes, row_bytes, tile_bytes;
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

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FB_HAVE_WGMMA 1
__device__ __forceinline__ void fb_wgmma(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
#endif

__device__ __forceinline__ void fb_cp16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

// One tap slice of packed weights (64 x C tf32, K-major core matrices [C/4][64][4]) into a shared-memory buffer.
__device__ __forceinline__ void fb_load_tap(const FBParams& p, uint32_t dst, const float* src) {
  const int chunks = p.C / 4 * 64;                 // 16-byte chunks
  for (int i = threadIdx.x; i < chunks; i += 128) fb_cp16(dst + i * 16, src + i * 4, true);
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int ACT>
__global__ void __launch_bounds__(128, 1) fb_kernel(const __grid_constant__ FBParams p) {
#ifdef FB_HAVE_WGMMA
  extern __shared__ __align__(128) unsigned char smem[];
  // layout: [input tile][2 weight buffers][window maxima Pw x 64 uints]
  const int wbuf_bytes = p.C * 64 * 4;
  unsigned char* tile = smem;
  unsigned* winmax = reinterpret_cast<unsigned*>(smem + p.tile_bytes + 2 * wbuf_bytes);
  const uint32_t tile_s = (uint32_t)__cvta_generic_to_shared(tile);
  const uint32_t wbuf_s = tile_s + (uint32_t)p.tile_bytes;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;

  const int b = blockIdx.x;
  const int Ph = b % p.P[1], Pd = (b / p.P[1]) % p.P[0];
  const long long n = b / (p.P[1] * p.P[0]);
  const int od0 = Pd * p.win[0], oh0 = Ph * p.win[1];
  const int id_lo = (od0 + p.p[0]) / p.s[0] - (p.Mmax[0] - 1);
  const int ih_lo = (oh0 + p.p[1]) / p.s[1] - (p.Mmax[1] - 1);

  for (int i = tid; i < p.P[2] * 64; i += 128) winmax[i] = 0u;   // below every encoded value

  // ---- input tile: rows (d, h), each CP = C/4 planes x plane_pos positions x 16 B; zero outside the input ----
  const int CP = p.C / 4;
  {
    const int per_row = CP * p.nw;
    for (int i = tid; i < p.nd * p.nh * per_row; i += 128) {
      const int row = i / per_row, rem = i - row * per_row;
      const int col = rem / CP, cp = rem - col * CP;
      const int d = id_lo + row / p.nh, h = ih_lo + row % p.nh, w = p.ilo_w + col;
      const bool ok = d >= 0 && d < p.D && h >= 0 && h < p.H && w >= 0 && w < p.W;
      const float* src = p.x;
      if (ok) src += ((((n * p.D + d) * p.H + h) * (long long)p.W + w) * p.C) + cp * 4;
      fb_cp16(tile_s + row * p.row_bytes + cp * p.plane_bytes + (FB_PAD + col) * 16, src, ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    // round to tf32 in place (every byte of the tile, slack included: it is finite zero or data)
    for (int i = tid; i < p.tile_bytes / 16; i += 128) {
      uint4* a = reinterpret_cast<uint4*>(tile + i * 16);
      uint4 v = *a;
      v.x = fb_tf32(__uint_as_float(v.x)); v.y = fb_tf32(__uint_as_float(v.y));
      v.z = fb_tf32(__uint_as_float(v.z)); v.w = fb_tf32(__uint_as_float(v.w));
      *a = v;
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
  }

  const int m0 = 16 * warp + g;   // this thread's output channels: m0, m0 + 8
  float acc[FB_NT][16];

  for (int c = 0; c < p.ncls; ++c) {
    const int rd = p.cls_r[c][0], rh = p.cls_r[c][1], rw = p.cls_r[c][2];
    const int Md = p.cls_M[c][0], Mh = p.cls_M[c][1], Mw = p.cls_M[c][2];
    if (Md == 0 || Mh == 0 || Mw == 0) continue;
    // q ranges of this class inside the block: o = s*q + r - p for o in [o0, o0 + win)
    const int qd0 = fb_floordiv(od0 + p.p[0] - rd + p.s[0] - 1, p.s[0]), qd1 = fb_floordiv(od0 + p.win[0] - 1 + p.p[0] - rd, p.s[0]);
    const int qh0 = fb_floordiv(oh0 + p.p[1] - rh + p.s[1] - 1, p.s[1]), qh1 = fb_floordiv(oh0 + p.win[1] - 1 + p.p[1] - rh, p.s[1]);
    const int qw0 = fb_floordiv(p.p[2] - rw + p.s[2] - 1, p.s[2]), qw1 = fb_floordiv(p.P[2] * p.win[2] - 1 + p.p[2] - rw, p.s[2]);
    const int nqd = qd1 - qd0 + 1, nqh = qh1 - qh0 + 1, nch = (qw1 - qw0 + 32) / 32;
    if (nqd <= 0 || nqh <= 0 || nch <= 0) continue;
    const int ntiles = nqd * nqh * nch;
    const int ntaps = Md * Mh * Mw;
    const float* wclass = p.wp + p.cls_woff[c];
    for (int t0 = 0; t0 < ntiles; t0 += FB_NT) {
      // tile j: (qd, qh, chunk); invalid tiles (j >= ntiles) repeat tile t0 (finite data, results dropped)
      int tq_row[FB_NT], tq_w[FB_NT];
#pragma unroll
      for (int j = 0; j < FB_NT; ++j) {
        const int tj = (t0 + j < ntiles) ? t0 + j : t0;
        const int ch = tj % nch, rr = tj / nch;
        tq_row[j] = rr;                      // (qd - qd0) * nqh + (qh - qh0)
        tq_w[j] = qw0 + 32 * ch;
      }
      fb_load_tap(p, wbuf_s, wclass);
      for (int tap = 0; tap < ntaps; ++tap) {
        const int md = tap / (Mh * Mw), mh = (tap / Mw) % Mh, mw = tap % Mw;
        if (tap + 1 < ntaps) fb_load_tap(p, wbuf_s + ((tap + 1) & 1) * wbuf_bytes, wclass + (size_t)(tap + 1) * p.C * 64);
        if (tap + 1 < ntaps) asm volatile("cp.async.wait_group 1;" ::: "memory");
        else asm volatile("cp.async.wait_group 0;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        const uint32_t wcur = wbuf_s + (tap & 1) * wbuf_bytes;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        for (int ks = 0; ks < p.C / 8; ++ks) {
          // A: 64 x 8 at wcur + ks * 2 KB, planes of 4 k at LBO 1 KB, 8-row groups at SBO 128 B
          const uint32_t a_addr = wcur + ks * 2048;
          const uint64_t da = (uint64_t)((a_addr >> 4) & 0x3FFF) | ((uint64_t)(1024 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
#pragma unroll
          for (int j = 0; j < FB_NT; ++j) {
            const int rr = tq_row[j];
            const int qd = qd0 + rr / nqh, qh = qh0 + rr % nqh;
            const int row = (qd - md - id_lo) * p.nh + (qh - mh - ih_lo);
            const int col = tq_w[j] - mw - p.ilo_w;
            const uint32_t b_addr = tile_s + row * p.row_bytes + (2 * ks) * p.plane_bytes + (FB_PAD + col) * 16;
            const uint64_t db = (uint64_t)((b_addr >> 4) & 0x3FFF) | ((uint64_t)((p.plane_bytes >> 4) & 0x3FFF) << 16) |
                                ((uint64_t)(128 >> 4) << 32);
            fb_wgmma(acc[j], da, db, (tap > 0 || ks > 0) ? 1 : 0);
          }
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        // pin the accumulators behind the wait: later reads of acc must not be hoisted above it
#pragma unroll
        for (int j = 0; j < FB_NT; ++j)
#pragma unroll
          for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(acc[j][i]) :: "memory");
        __syncthreads();   // the weight buffer of this tap is reused two taps later
      }
      // ---- epilogue: window max of each valid (channel, position) ----
#pragma unroll
      for (int j = 0; j < FB_NT; ++j) {
        if (t0 + j >= ntiles) break;
        const int rr = tq_row[j];
        const int qd = qd0 + rr / nqh, qh = qh0 + rr % nqh;
        (void)qd; (void)qh;   // inside the block's window row by construction
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = m0 + 8 * (e >> 1);
            const int q = tq_w[j] + 8 * i + 2 * tig + (e & 1);
            const int ow = p.s[2] * q + rw - p.p[2];
            if (q > qw1 || ow < 0 || ow >= p.P[2] * p.win[2] || k >= p.K) continue;
            float v = acc[j][4 * i + e];
            if (ACT != FF_ACT_NONE) v = ff_activate<ACT>(v + (p.bias ? __ldg(p.bias + k) : 0.0f));
            atomicMax(winmax + (ow / p.win[2]) * 64 + k, fb_enc(v));
          }
      }
    }
  }
  __syncthreads();
  // Classes with no tap in some dim (residue >= kernel size, e.g. kernel < stride) have conv value 0 (+ bias): they
  // are not computed above, so a window that holds one of their positions takes max(.., 0) here.
  auto holds_tapless = [&](int a, int o0, int len) {
    if (p.T[a] >= p.s[a]) return false;
    for (int o = o0; o < o0 + len; ++o)
      if ((o + p.p[a]) % p.s[a] >= p.T[a]) return true;
    return false;
  };
  const bool tapless_dh = holds_tapless(0, od0, p.win[0]) || holds_tapless(1, oh0, p.win[1]);
  // ---- bias after the max (no activation), then the channel reduction in a fixed order ----
  for (int pw = tid; pw < p.P[2]; pw += 128) {
    const bool tapless = tapless_dh || holds_tapless(2, pw * p.win[2], p.win[2]);
    float r = (p.red == 2) ? -__int_as_float(0x7f800000) : 0.0f;
    for (int k = 0; k < p.K; ++k) {
      const unsigned e = winmax[pw * 64 + k];
      float v = e ? fb_dec(e) : -__int_as_float(0x7f800000);   // 0: no computed position in the window (tapless only)
      if (tapless) v = ff_max_nan(v, ACT == FF_ACT_NONE ? 0.0f : ff_activate<ACT>(p.bias ? __ldg(p.bias + k) : 0.0f));
      if (ACT == FF_ACT_NONE && p.bias) v += __ldg(p.bias + k);
      r = (p.red == 2) ? ff_max_nan(r, v) : r + v;
    }
    if (p.red == 1) r *= p.inv_k;
    p.out[((n * p.P[0] + Pd) * p.P[1] + Ph) * (long long)p.P[2] + pw] = r;
  }
#else
  __trap();
#endif
}

struct FBPlan {
  const char* why;
  FBParams prm;
  size_t smem;
  long long blocks;
};

FBPlan fb_plan(int dtype, int channels_last, long long N, int C, int D, int H, int W, int K, const int* T, const int* s,
               const int* pad, const int* outpad, const int* win, int act, int red) {
  FBPlan pl{};
  pl.why = nullptr;
  FBParams& p = pl.prm;
  if (dtype != FF_F32) { pl.why = "fused convT-pool-reduce (draft): fp32 only"; return pl; }
  if (!channels_last) { pl.why = "fused convT-pool-reduce (draft): channels_last_3d input only"; return pl; }
  if (C % 8 != 0) { pl.why = "fused convT-pool-reduce (draft): C_in % 8 != 0"; return pl; }
  if (K > 64) { pl.why = "fused convT-pool-reduce (draft): C_out > 64"; return pl; }
  if (act < 0 || act > 4 || red < 0 || red > 2) { pl.why = "fused convT-pool-reduce: bad activation/reduction code"; return pl; }
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (!(major == 9 && minor == 0)) { pl.why = "fused convT-pool-reduce: needs sm_90 (wgmma)"; return pl; }
  p.N = (int)N; p.C = C; p.D = D; p.H = H; p.W = W; p.K = K; p.act = act; p.red = red;
  p.inv_k = 1.0f / (float)K;
  const int I[3] = {D, H, W};
  int ncls = 1;
  for (int a = 0; a < 3; ++a) {
    p.T[a] = T[a]; p.s[a] = s[a]; p.p[a] = pad[a]; p.win[a] = win[a];
    if (T[a] <= 0 || s[a] <= 0 || pad[a] < 0 || outpad[a] < 0 || win[a] <= 0) { pl.why = "fused convT-pool-reduce: bad parameters"; return pl; }
    const long long O = (long long)(I[a] - 1) * s[a] - 2LL * pad[a] + T[a] + outpad[a];
    p.P[a] = (int)(O / win[a]);
    if (p.P[a] <= 0) { pl.why = "fused convT-pool-reduce: empty pooled output"; return pl; }
    ncls *= s[a];
    p.Mmax[a] = (T[a] + s[a] - 1) / s[a];
  }
  if (ncls > FB_MAXCLS) { pl.why = "fused convT-pool-reduce: more than 27 residue classes"; return pl; }
  p.ncls = ncls;
  long long woff = 0;
  for (int c = 0; c < ncls; ++c) {
    const int r[3] = {c / (s[1] * s[2]), (c / s[2]) % s[1], c % s[2]};
    int taps = 1;
    for (int a = 0; a < 3; ++a) {
      p.cls_r[c][a] = r[a];
      p.cls_M[c][a] = r[a] < T[a] ? (T[a] - r[a] + s[a] - 1) / s[a] : 0;
      taps *= p.cls_M[c][a];
    }
    p.cls_woff[c] = (int)woff;
    woff += (long long)taps * C * 64;
  }
  // input tile of one window row: rows covering q - m over the block's o range, w over every pooled column
  // rows of the tile: input rows q - m over the block's window row; the span depends on (P * win + pad) mod s
  int ext[2] = {0, 0};
  for (int a = 0; a < 2; ++a)
    for (int q = 0; q < s[a] && q < p.P[a]; ++q) {
      const int X = q * win[a] + pad[a];
      ext[a] = std::max(ext[a], (X + win[a] - 1) / s[a] - X / s[a] + p.Mmax[a]);
    }
  p.nd = ext[0]; p.nh = ext[1];
  const int qw_lo = pad[2] / s[2], qw_hi = (p.P[2] * win[2] - 1 + pad[2]) / s[2];
  p.ilo_w = qw_lo - (p.Mmax[2] - 1);
  p.nw = qw_hi - p.ilo_w + 1;
  int need = FB_PAD + p.nw;                               // 32-wide chunks may read past the last column
  for (int rw = 0; rw < s[2]; ++rw) {
    const int qw0 = fb_floordiv(pad[2] - rw + s[2] - 1, s[2]);   // same q range as the kernel's
    const int qw1 = fb_floordiv(p.P[2] * win[2] - 1 + pad[2] - rw, s[2]);
    const int nch = (qw1 - qw0 + 32) / 32;
    need = std::max(need, FB_PAD + (qw0 - p.ilo_w) + 32 * nch);
  }
  p.plane_pos = ((need + 7) / 8) * 8;
  p.plane_bytes = p.plane_pos * 16;
  p.row_bytes = (C / 4) * p.plane_bytes;
  p.tile_bytes = p.nd * p.nh * p.row_bytes;
  pl.smem = (size_t)p.tile_bytes + 2 * (size_t)C * 64 * 4 + (size_t)p.P[2] * 64 * 4;
  if (pl.smem > 227 * 1024) { pl.why = "fused convT-pool-reduce: the input tile of one window row does not fit in shared memory"; return pl; }
  pl.blocks = N * p.P[0] * p.P[1];
  if (pl.blocks > 0x7fffffffLL) { pl.why = "fused convT-pool-reduce: too many blocks"; return pl; }
  return pl;
}

}  // namespace

extern "C" {

// Geometry arguments, all per dim (d, h, w): kernel T, stride s, padding p, output_padding op, pooling window win.
#define FB_GEOM_PARAMS int Td, int Th, int Tw, int sd, int sh, int sw, int pd, int ph, int pw, int opd, int oph, int opw, \
                       int wd, int wh, int ww
#define FB_GEOM_ARRAYS const int T[3] = {Td, Th, Tw}, s[3] = {sd, sh, sw}, pad[3] = {pd, ph, pw}, outpad[3] = {opd, oph, opw}, \
                       win[3] = {wd, wh, ww}

const char* ff_fused_convt_pool_reduce_unsupported(int dtype, int channels_last, long long N, int C, int D, int H, int W,
                                                   int K, FB_GEOM_PARAMS, int act, int red) {
  FB_GEOM_ARRAYS;
  return fb_plan(dtype, channels_last, N, C, D, H, W, K, T, s, pad, outpad, win, act, red).why;
}

// Floats of the packed weights: per class, per tap (md, mh, mw), [C/4][64][4] tf32 (see fb_load_tap).
long long ff_fused_convt_pool_reduce_packed_weight_floats(int C, int Td, int Th, int Tw, int sd, int sh, int sw) {
  const int T[3] = {Td, Th, Tw}, s[3] = {sd, sh, sw};
  long long total = 0;
  for (int rd = 0; rd < s[0]; ++rd)
    for (int rh = 0; rh < s[1]; ++rh)
      for (int rw = 0; rw < s[2]; ++rw) {
        const int r[3] = {rd, rh, rw};
        long long taps = 1;
        for (int a = 0; a < 3; ++a) taps *= r[a] < T[a] ? (T[a] - r[a] + s[a] - 1) / s[a] : 0;
        total += taps * C * 64;
      }
  return total;
}

int ff_fused_convt_pool_reduce(const float* x, const float* packed_w, const float* bias, float* out, int dtype,
                               int channels_last, long long N, int C, int D, int H, int W, int K, FB_GEOM_PARAMS, int act,
                               int red, cudaStream_t stream) {
  FB_GEOM_ARRAYS;
  FBPlan pl = fb_plan(dtype, channels_last, N, C, D, H, W, K, T, s, pad, outpad, win, act, red);
  if (pl.why) return (int)cudaErrorNotSupported;
  pl.prm.x = x; pl.prm.wp = packed_w; pl.prm.bias = bias; pl.prm.out = out;
  return ff_dispatch_act(act, [&](auto a) {
    auto kern = fb_kernel<decltype(a)::value>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem);
    if (e != cudaSuccess) return (int)e;
    kern<<<(unsigned)pl.blocks, 128, pl.smem, stream>>>(pl.prm);
    return (int)cudaGetLastError();
  });
}

}  // extern "C"
