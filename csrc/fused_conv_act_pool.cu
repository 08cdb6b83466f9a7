// Family A, fully fused: out[n,k] = pool_{p,q} act(conv2d(x, w)[n,k,p,q] + b[k]), one kernel, conv output never stored.
// Reduces, per (image, output channel), over all output pixels (p,q) (a global average/max pool), so the conv output
// can stay in registers: each block reduces its rows in registers and only 64 partials per image piece leave the chip.
//
// Two implementations, chosen per call:
//   * sm_90 (H100/H200), any dtype (TF32 / ieee / bf16 / fp16), stride-1 columns, K <= 64: wgmma path
//     (fa_wgmma_kernel, below) - weights (A) and input rows (B, a shared-memory ring with the halo) both fed to the
//     tensor cores by descriptors.  ieee there: x w ~ x_hi w_hi (tf32) + bf16(x) bf16(w_lo) + bf16(x_lo) bf16(w)
//     (x_hi = tf32(x), x_lo = x - x_hi, w likewise): the two small terms are ONE bf16 k16 wgmma whose K chunks are the
//     (x, w_lo) and (x_lo, w) pairs, so a tap costs two wgmmas instead of 3xTF32's three; each bf16 rounding is 2^-9
//     of a term already 2^-11 of x w, i.e. <= 2^-18 |x w| per product (3xTF32: ~2^-21), well inside ieee's 1e-5.
//   * otherwise (sm_80, strided columns, K > 64, ...): implicit GEMM on mma.sync (TF32 m16n8k8; 3xTF32 for
//     precision=ieee; bf16/fp16 m16n8k16 + k8). GEMM M = output channels (A = weights, register-resident: K-dim <= 9
//     "units"), GEMM N = output pixels (B = im2col straight from a shared-memory input tile with its halo), K-dim unit
//     = one filter tap (r,s) x 8 input channels; tile [chgroup][row][col][8 ch]; epilogue per 64ch x 16px tile.
#include <cuda.h>   // CUtensorMap (the driver function that fills it is looked up at run time: no libcuda link)
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <algorithm>
#include "codes.h"
#include "activation.cuh"
#include "gelu_h2.cuh"   // wg_epi_h2: the 16-bit GELU + mean epilogue

// --------------------------------------------------------------------------------------------------------------
struct FAParams {
  const void* x; const void* w; const float* bias; float* out;
  long long N; int C, H, W, K, R, S, sh, sw, ph, pw, dh, dw;
  int P, Q, act, pool, det, nhwc, vec_ok;
  int CG, nu;                          // channel groups of 8, K-dim units = R*S*CG (<= 9)
  int BR, QS, nbands, nseg, nksl;      // output rows per band, output cols per segment, counts
  int TR, TWa;                         // smem tile rows / cols
  unsigned long long mTWa, mTR;         // fast division magic (see fdiv)
  int sTWa, sTR;
  long long nitems_total;
  float inv_pq;
  float* ws_part; unsigned* ws_max; int* ws_cnt;
};

// fp32 -> tf32 (low 13 bits 0), round to nearest: sm_90 has it as one instruction (F2FP.TF32, ties to even); sm_80's
// cvt.rna (ties away) compiles to 3-4 instructions.  Inf / NaN stay Inf / NaN.
__device__ __forceinline__ uint32_t f2tf32(float f) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0,%1;" : "=r"(r) : "f"(f));
#else
  asm("cvt.rna.tf32.f32 %0,%1;" : "=r"(r) : "f"(f));
#endif
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3},{%4,%5,%6,%7},{%8,%9},{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <int DT>
__device__ __forceinline__ void mma_k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  if (DT == FF_BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3},{%4,%5,%6,%7},{%8,%9},{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3},{%4,%5,%6,%7},{%8,%9},{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <int DT>
__device__ __forceinline__ void mma_k8h(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  if (DT == FF_BF16)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3},{%4,%5},{%6},{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b0));
  else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3},{%4,%5},{%6},{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b0));
}

template <int DT> __device__ __forceinline__ float load_elem_f(const void* x, long long i) {
  if (DT == FF_F32) return __ldg(reinterpret_cast<const float*>(x) + i);
  if (DT == FF_BF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(x)[i]);
  return __half2float(reinterpret_cast<const __half*>(x)[i]);
}
template <int DT> __device__ __forceinline__ uint16_t load_elem_h(const void* x, long long i) {
  return __ldg(reinterpret_cast<const unsigned short*>(x) + i);
}

// weight element w[k][c][r][s] as float (0 outside K / C)
template <int DT> __device__ __forceinline__ float wget(const FAParams& p, int k, int c, int r, int s) {
  if (k >= p.K || c >= p.C) return 0.0f;
  long long i = (((long long)k * p.C + c) * p.R + r) * p.S + s;
  return load_elem_f<DT>(p.w, i);
}
template <int DT> __device__ __forceinline__ uint32_t wget_h2(const FAParams& p, int k, int c, int r, int s) {
  uint32_t lo = 0, hi = 0;
  if (k < p.K) {
    long long i = (((long long)k * p.C + c) * p.R + r) * p.S + s;
    if (c < p.C) lo = load_elem_h<DT>(p.w, i);
    if (c + 1 < p.C) hi = load_elem_h<DT>(p.w, i + (long long)p.R * p.S);
  }
  return lo | (hi << 16);
}

__device__ __forceinline__ unsigned enc_max(float f) {
  if (f != f) return 0xFFFFFFFFu;
  unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float dec_max(unsigned e) {
  if (e == 0xFFFFFFFFu) return __uint_as_float(0x7FC00000u);
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7FFFFFFFu) : ~e);
}

// exact n / d for 0 <= n < 2^31: (n * m) >> s with m = ceil(2^s / d), s = 31 + ceil(log2 d)
__device__ __forceinline__ int fdiv(int n, unsigned long long m, int s) {
  return (int)(((unsigned long long)(unsigned)n * m) >> s);
}

// --------------------------------------------------------------------------------------------------------------
// Stage the input tile [CG][TR][TWa][8ch] (16-byte chunks) for this block; out-of-image positions are zero.
template <int DT, bool ROUND>
__device__ __forceinline__ void stage_tile(const FAParams& p, unsigned char* tile, long long n, int h0, int w0) {
  constexpr int CPP = (DT == FF_F32) ? 2 : 1;          // 16-byte chunks per (cg,row,col)
  const int total = p.CG * p.TR * p.TWa * CPP;
  const int nthr = blockDim.x;
  if (p.nhwc && p.vec_ok) {                              // channels_last, C % 8 == 0: async 16-byte copies
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(tile);
    for (int i = threadIdx.x; i < total; i += nthr) {
      int half = (CPP == 2) ? (i & 1) : 0;
      int rest = (CPP == 2) ? (i >> 1) : i;
      int q1 = fdiv(rest, p.mTWa, p.sTWa), col = rest - q1 * p.TWa;
      int cg = fdiv(q1, p.mTR, p.sTR), row = q1 - cg * p.TR;
      int h = h0 + row, w = w0 + col;
      bool ok = (h >= 0 && h < p.H && w >= 0 && w < p.W);
      const char* src = reinterpret_cast<const char*>(p.x);
      if (ok) src += ((((n * p.H + h) * p.W + w) * p.C) + cg * 8 + half * 4 * (CPP - 1)) * (DT == FF_F32 ? 4 : 2);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(sbase + i * 16), "l"(src), "r"(ok ? 16 : 0));
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (ROUND) {                                          // round to tf32 in place (each thread its own chunks)
      for (int i = threadIdx.x; i < total; i += nthr) {
        uint4* a = reinterpret_cast<uint4*>(tile + (size_t)i * 16);
        uint4 v = *a;
        v.x = f2tf32(__uint_as_float(v.x)); v.y = f2tf32(__uint_as_float(v.y));
        v.z = f2tf32(__uint_as_float(v.z)); v.w = f2tf32(__uint_as_float(v.w));
        *a = v;
      }
    }
    return;
  }
  constexpr int UNR = (DT == FF_F32) ? 8 : 4;
  for (int base = threadIdx.x; base < total; base += UNR * nthr) {
    uint4 v[UNR];
#pragma unroll
    for (int j = 0; j < UNR; ++j) {
      int i = base + j * nthr;
      v[j] = make_uint4(0, 0, 0, 0);
      if (i < total) {
        int half = (CPP == 2) ? (i & 1) : 0;
        int rest = (CPP == 2) ? (i >> 1) : i;
        int q1 = fdiv(rest, p.mTWa, p.sTWa), col = rest - q1 * p.TWa;
        int cg = fdiv(q1, p.mTR, p.sTR), row = q1 - cg * p.TR;
        int h = h0 + row, w = w0 + col;
        if (h >= 0 && h < p.H && w >= 0 && w < p.W) {
          const int c0 = cg * 8 + half * 4;
          if (DT == FF_F32) {
            float f[4];
            if (p.nhwc) {
              long long gi = ((n * p.H + h) * p.W + w) * p.C + c0;
              if (p.vec_ok) {
                float4 t = __ldg(reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.x) + gi));
                f[0] = t.x; f[1] = t.y; f[2] = t.z; f[3] = t.w;
              } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) f[e] = (c0 + e < p.C) ? load_elem_f<DT>(p.x, gi + e) : 0.0f;
              }
            } else {
              long long plane = (long long)p.H * p.W;
              long long gi = (n * p.C + c0) * plane + (long long)h * p.W + w;
#pragma unroll
              for (int e = 0; e < 4; ++e) f[e] = (c0 + e < p.C) ? load_elem_f<DT>(p.x, gi + e * plane) : 0.0f;
            }
            if (ROUND) {
              v[j] = make_uint4(f2tf32(f[0]), f2tf32(f[1]), f2tf32(f[2]), f2tf32(f[3]));
            } else {
              v[j] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
            }
          } else {
            uint32_t hv[8];
            if (p.nhwc) {
              long long gi = ((n * p.H + h) * p.W + w) * p.C + c0;
              if (p.vec_ok) {
                v[j] = __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(p.x) + gi));
                continue;
              }
#pragma unroll
              for (int e = 0; e < 8; ++e) hv[e] = (c0 + e < p.C) ? load_elem_h<DT>(p.x, gi + e) : 0u;
            } else {
              long long plane = (long long)p.H * p.W;
              long long gi = (n * p.C + c0) * plane + (long long)h * p.W + w;
#pragma unroll
              for (int e = 0; e < 8; ++e) hv[e] = (c0 + e < p.C) ? load_elem_h<DT>(p.x, gi + e * plane) : 0u;
            }
            v[j] = make_uint4(hv[0] | (hv[1] << 16), hv[2] | (hv[3] << 16), hv[4] | (hv[5] << 16), hv[6] | (hv[7] << 16));
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < UNR; ++j) {
      int i = base + j * nthr;
      if (i < total) *reinterpret_cast<uint4*>(tile + (size_t)i * 16) = v[j];
    }
  }
}

// --------------------------------------------------------------------------------------------------------------
// Epilogue of one 64ch x 16px tile: activation + accumulate into per-thread running sums / maxima.
template <int ACT, int POOL, int MT>
__device__ __forceinline__ void epi_tile(float (&acc)[MT][2][4], float (&red)[MT][2], int nvalid, int tig) {
  if (nvalid >= 16) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float y = ff_activate<ACT>(acc[mt][j][e]);
          if (POOL == FF_POOL_MEAN) red[mt][e >> 1] += y;
          else red[mt][e >> 1] = ff_max_nan(red[mt][e >> 1], y);
        }
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          bool ok = (j * 8 + 2 * tig + (e & 1)) < nvalid;
          float y = ff_activate<ACT>(acc[mt][j][e]);
          if (POOL == FF_POOL_MEAN) red[mt][e >> 1] += ok ? y : 0.0f;
          else if (ok) red[mt][e >> 1] = ff_max_nan(red[mt][e >> 1], y);
        }
  }
}

template <int POOL, int MT>
__device__ __forceinline__ void epi_dispatch(int act, float (&acc)[MT][2][4], float (&red)[MT][2], int nvalid, int tig) {
  switch (act) {
    case FF_ACT_NONE: epi_tile<FF_ACT_NONE, POOL, MT>(acc, red, nvalid, tig); break;
    case FF_ACT_RELU: epi_tile<FF_ACT_RELU, POOL, MT>(acc, red, nvalid, tig); break;
    case FF_ACT_GELU_ERF: epi_tile<FF_ACT_GELU_ERF, POOL, MT>(acc, red, nvalid, tig); break;
    case FF_ACT_GELU_TANH: epi_tile<FF_ACT_GELU_TANH, POOL, MT>(acc, red, nvalid, tig); break;
    default: epi_tile<FF_ACT_SILU, POOL, MT>(acc, red, nvalid, tig); break;
  }
}

// --------------------------------------------------------------------------------------------------------------
constexpr int NU_MAX = 9;

template <int DT, bool SPLIT, int MT, int NW, bool FULL>
__global__ void __launch_bounds__(NW * 32, NW == 8 ? 1 : (NW == 4 ? (DT == FF_F32 ? 2 : 3) : (DT == FF_F32 ? 4 : 6)))
fused_conv_act_pool_kernel(const FAParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red_s[NW][MT * 16];
  __shared__ int last_s;
  constexpr int PIXB = (DT == FF_F32) ? 32 : 16;
  constexpr int CHG = 4 / MT;                       // warps sharing one tile (each owns MT*16 channels)
  constexpr int NSTREAM = NW / CHG;                 // independent tile streams in a block

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int chg = warp % CHG, stream = warp / CHG;

  // ---- per-block constants: K-dim unit offsets into the smem tile (unit u = t * CG + cg, tap t = r * S + s) ----
  int uoff[NU_MAX];
#pragma unroll
  for (int u = 0; u < NU_MAX; ++u) {
    int uu = (FULL || u < p.nu) ? u : 0;
    int t = uu / p.CG, cg = uu - t * p.CG, r = t / p.S, s = t - r * p.S;
    uoff[u] = ((cg * p.TR + r * p.dh) * p.TWa + s * p.dw) * PIXB + tig * (PIXB / 4);
  }
  uint32_t wa[MT][NU_MAX][(DT == FF_F32) ? 4 : 2];
  uint32_t wsm[MT][NU_MAX][SPLIT ? 4 : 1];
  float bias_r[MT][2];
  int ksl_loaded = -1;

  // ---- persistent loop over work items (n, kslice, band, seg); band fastest so co-resident blocks share halos in L2
  for (long long item_id = blockIdx.x; item_id < p.nitems_total; item_id += gridDim.x) {
  long long bid = item_id;
  const int seg = (int)(bid % p.nseg); bid /= p.nseg;
  const int band = (int)(bid % p.nbands); bid /= p.nbands;
  const int ksl = (int)(bid % p.nksl);
  const long long n = bid / p.nksl;

  const int p0 = band * p.BR, q0 = seg * p.QS;
  const int rows_b = min(p.BR, p.P - p0), qs_b = min(p.QS, p.Q - q0);
  const int kbase = ksl * 64 + chg * MT * 16;

  __syncthreads();                                   // previous item done with the tile and red_s
  // ---- stage input tile (all threads) ----
  stage_tile<DT, (DT == FF_F32 && !SPLIT)>(p, smem, n, p0 * p.sh - p.ph, q0 * p.sw - p.pw);

  // ---- weights -> registers (fragment order), bias; reloaded only when the 64-channel slice changes ----
  if (ksl != ksl_loaded) {
  ksl_loaded = ksl;
#pragma unroll
  for (int u = 0; u < NU_MAX; ++u) {
    int uu = (FULL || u < p.nu) ? u : 0;
    int t = uu / p.CG, cg = uu - t * p.CG, r = t / p.S, s = t - r * p.S;
    const int c = cg * 8 + 2 * tig;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int k0 = kbase + mt * 16 + g;
      bool live = FULL || u < p.nu;
      if (DT == FF_F32) {
        float w4[4] = {0.f, 0.f, 0.f, 0.f};
        if (live) {
          w4[0] = wget<DT>(p, k0, c, r, s); w4[1] = wget<DT>(p, k0 + 8, c, r, s);
          w4[2] = wget<DT>(p, k0, c + 1, r, s); w4[3] = wget<DT>(p, k0 + 8, c + 1, r, s);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          uint32_t big = f2tf32(w4[e]);
          wa[mt][u][e] = big;
          if (SPLIT) wsm[mt][u][e] = f2tf32(w4[e] - __uint_as_float(big));
        }
      } else {
        wa[mt][u][0] = live ? wget_h2<DT>(p, k0, c, r, s) : 0u;
        wa[mt][u][1] = live ? wget_h2<DT>(p, k0 + 8, c, r, s) : 0u;
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int k = kbase + mt * 16 + g + 8 * h;
      bias_r[mt][h] = (p.bias != nullptr && k < p.K) ? __ldg(p.bias + k) : 0.0f;
    }
  }

  float redv[MT][2];
  const float red_init = (p.pool == FF_POOL_MEAN) ? 0.0f : -__int_as_float(0x7f800000);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) redv[mt][0] = redv[mt][1] = red_init;

  __syncthreads();

  // ---- main loop over 16-pixel tiles (two n8 tiles in one output row) ----
  const int ppr = (qs_b + 15) >> 4;
  const int ntiles = rows_b * ppr;
  const uint32_t tile_base = (uint32_t)__cvta_generic_to_shared(smem);
  const int dq8 = 8 * p.sw * PIXB;
  for (int it = stream; it < ntiles; it += NSTREAM) {
    const int pl = it / ppr, qp = it - pl * ppr;
    const uint32_t pix = tile_base + (uint32_t)((pl * p.sh * p.TWa + (qp * 16 + g) * p.sw) * PIXB);
    float acc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        acc[mt][j][0] = acc[mt][j][1] = bias_r[mt][0];
        acc[mt][j][2] = acc[mt][j][3] = bias_r[mt][1];
      }
    if (DT == FF_F32) {
#pragma unroll
      for (int u = 0; u < NU_MAX; ++u) {
        if (FULL || u < p.nu) {
          uint32_t a = pix + uoff[u];
          uint32_t b[2][2];
          asm volatile("ld.shared.v2.u32 {%0,%1},[%2];" : "=r"(b[0][0]), "=r"(b[0][1]) : "r"(a));
          asm volatile("ld.shared.v2.u32 {%0,%1},[%2];" : "=r"(b[1][0]), "=r"(b[1][1]) : "r"(a + dq8));
          if (SPLIT) {
            uint32_t bs[2][2];
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                uint32_t big = b[j][e] & 0xFFFFE000u;
                bs[j][e] = __float_as_uint(__uint_as_float(b[j][e]) - __uint_as_float(big));
                b[j][e] = big;
              }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                uint32_t ws4[4] = {wsm[mt][u][0], wsm[mt][u][1], wsm[mt][u][2], wsm[mt][u][3]};
                uint32_t wb4[4] = {wa[mt][u][0], wa[mt][u][1], wa[mt][u][2], wa[mt][u][3]};
                mma_tf32(acc[mt][j], ws4, b[j][0], b[j][1]);
                mma_tf32(acc[mt][j], wb4, bs[j][0], bs[j][1]);
                mma_tf32(acc[mt][j], wb4, b[j][0], b[j][1]);
              }
          } else {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                uint32_t wb4[4] = {wa[mt][u][0], wa[mt][u][1], wa[mt][u][2], wa[mt][u][3]};
                mma_tf32(acc[mt][j], wb4, b[j][0], b[j][1]);
              }
          }
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < NU_MAX; u += 2) {
        if (u + 1 < NU_MAX && (FULL || u + 1 < p.nu)) {
          uint32_t a0 = pix + uoff[u], a1 = pix + uoff[u + 1];
          uint32_t b[2][2];
          asm volatile("ld.shared.u32 %0,[%1];" : "=r"(b[0][0]) : "r"(a0));
          asm volatile("ld.shared.u32 %0,[%1];" : "=r"(b[0][1]) : "r"(a1));
          asm volatile("ld.shared.u32 %0,[%1];" : "=r"(b[1][0]) : "r"(a0 + dq8));
          asm volatile("ld.shared.u32 %0,[%1];" : "=r"(b[1][1]) : "r"(a1 + dq8));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              mma_k16<DT>(acc[mt][j], wa[mt][u][0], wa[mt][u][1], wa[mt][u + 1][0], wa[mt][u + 1][1], b[j][0], b[j][1]);
        } else if (FULL || u < p.nu) {
          uint32_t a0 = pix + uoff[u];
          uint32_t b[2];
          asm volatile("ld.shared.u32 %0,[%1];" : "=r"(b[0]) : "r"(a0));
          asm volatile("ld.shared.u32 %0,[%1];" : "=r"(b[1]) : "r"(a0 + dq8));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < 2; ++j) mma_k8h<DT>(acc[mt][j], wa[mt][u][0], wa[mt][u][1], b[j]);
        }
      }
    }
    const int nvalid = qs_b - qp * 16;
    if (p.pool == FF_POOL_MEAN) epi_dispatch<FF_POOL_MEAN, MT>(p.act, acc, redv, nvalid, tig);
    else epi_dispatch<FF_POOL_MAX, MT>(p.act, acc, redv, nvalid, tig);
  }

  // ---- block reduction: across the 4 lanes of a quad (pixels), then across streams in fixed order ----
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = redv[mt][h];
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = (p.pool == FF_POOL_MEAN) ? v + w : ff_max_nan(v, w);
      }
      redv[mt][h] = v;
    }
  // red_s[stream*CHG + chg][...]: index by warp directly
  if (tig == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      red_s[warp][mt * 16 + g] = redv[mt][0];
      red_s[warp][mt * 16 + g + 8] = redv[mt][1];
    }
  }
  __syncthreads();
  const int nitems = p.nbands * p.nseg;
  const int item = band * p.nseg + seg;
  if (threadIdx.x < 64) {
    const int kl = threadIdx.x, cgrp = kl / (MT * 16), kk = kl % (MT * 16);
    float v = red_s[cgrp][kk];
    for (int st = 1; st < NSTREAM; ++st) {
      float w = red_s[st * CHG + cgrp][kk];
      v = (p.pool == FF_POOL_MEAN) ? v + w : ff_max_nan(v, w);
    }
    const int k = ksl * 64 + kl;
    if (k < p.K) {
      if (p.pool == FF_POOL_MEAN) {
        if (!p.det) atomicAdd(p.out + n * p.K + k, v * p.inv_pq);
        else p.ws_part[((n * p.nksl + ksl) * nitems + item) * 64 + kl] = v;
      } else {
        atomicMax(p.ws_max + n * p.K + k, enc_max(v));
      }
    }
  }
  if (p.pool == FF_POOL_MEAN && !p.det) continue;
  // ---- last block of this image finishes (fixed order, same bits every run) and re-zeroes the workspace ----
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int old = atomicAdd(p.ws_cnt + n, 1);
    last_s = (old == p.nksl * nitems - 1);
  }
  __syncthreads();
  if (!last_s) continue;
  __threadfence();
  for (int k = threadIdx.x; k < p.K; k += blockDim.x) {
    if (p.pool == FF_POOL_MEAN) {
      const int ks = k >> 6, kl = k & 63;
      const float* src = p.ws_part + ((n * p.nksl + ks) * nitems) * 64 + kl;
      float s = 0.0f;
      for (int i = 0; i < nitems; ++i) s += __ldcg(src + (size_t)i * 64);
      p.out[n * p.K + k] = s * p.inv_pq;
    } else {
      unsigned* a = p.ws_max + n * p.K + k;
      p.out[n * p.K + k] = dec_max(__ldcg(a));
      *a = 0u;
    }
  }
  if (threadIdx.x == 0) p.ws_cnt[n] = 0;
  }  // item loop
}

// ==============================================================================================================
// sm_90a path: wgmma SS (A = weights, B = pixels, both from shared memory through descriptors, no swizzle).
//   GEMM M = 64 output channels, N = 128 consecutive output pixels (half of a 256-pixel row segment, stride 1), K = one
//   K-unit = filter tap (r,s) x 8 input channels per wgmma (tf32 k8; 16-bit k16 over two taps (r, s), (r, s + 1) of
//   one channel group — the second tap's pixels are the first's shifted by dw columns, so LBO = dw positions — or one
//   tap whose second 8 columns read the slot's ones plane: zero weights, or the bias — see below). The input rows live in a ring of RB shared-memory slots, one input row
//   of one 256-pixel segment (+ halo) each, K-major core matrices: [cg][K chunk][col][16 B] (fp32: chunk = 4 channels,
//   LBO = plane; 16-bit: [cg][col][8 ch] + one ones plane), so the im2col matrix of tap (r, s) is simply the slot of input row
//   p*sh - ph + r*dh with its start address shifted by s*dw columns: no copies, no im2col.
//   Bias rides as one more K-unit whose B is a block of ones (SBO = 0), A = (b_hi, b_lo) split; 16-bit: in the second
//   K chunk of the first op that has one to spare (its B = the slot's ones plane, every entry (1, 1, 0, ...)), no op of its own.
//   Rows stream through the ring with cp.async D rows ahead (16-bit input without 16-byte copies: register loads);
//   the copies of a row group and the post-copy pass of the next one (tf32 rounding, NCHW transposes, the input
//   bound) run while the current row's wgmmas do, so only a barrier stands between rows. The
//   10 ops (16-bit: 5) of a 3x3 filter over <= 8 channels are issued as straight-line code with descriptors from a
//   shared-memory table, so the HGMMAs chain under one fence. Each block (one warpgroup, 64 accumulator registers, 3 blocks per SM so that one
//   block's epilogue overlaps another's MMAs) owns a contiguous range of (image, segment, row) lines: exact balance, and ring
//   reuse of the R-1 halo rows between consecutive output rows.
constexpr int WG_NT = 256;
constexpr int WG_MAXOPS = 64;     // K units (ops) per half-row a plan may have: R*S*ceil(C/8) (+ bias) <= 64
constexpr int WG_OPS3X3 = 10;     // fp32, 3x3 over <= 8 channels: 9 taps + bias, straight-line issue
// 16-bit 3x3 with the column pair (knob FF_FUSED_A_COL16): ops (r, 0) + (r, 1) for r = 0..2, (2, 2) with the bias in its
// spare chunk, then (0, 2) + (1, 2) as one op whose two K chunks lie in two ring slots (LBO = the slots' distance; where
// the second row's slot comes first in the ring, its K chunks are swapped: B starts at that slot and the op reads A block
// WG_COL16_OPS, the op's weights with the two chunks swapped): 5 ops of K 16 for 72 + bias instead of 6
constexpr int WG_COL16_OPS = 5, WG_COL16_J = 4;
// input loaders: VEC = channels_last, C % 8 == 0 (16-byte cp.async; fp32: two per 8 channels, 16-bit: one, straight
// into the [cg][col][8 ch] slot); NCHW4 = fp32 NCHW, W % 4 == 0 (16-byte cp.async of 4 columns of one channel,
// transposed in place per thread); NCHW8 = 16-bit NCHW, W % 8 == 0 (the same with 8 columns of one channel per copy);
// ELEM = fp32 otherwise (4-byte cp.async); REG = 16-bit otherwise (register loads)
// TVEC / TNCHW = channels_last (C % 8 == 0) / NCHW (W % 4 fp32, % 8 16-bit) through the tensor-memory-access engine (TMA,
// wg_tma_row): one thread issues a row's few bulk copies instead of every thread its 16-byte ones (the copies' issue and
// index arithmetic were ~70-100 instructions per tile and warp, NOTES run 19 item 9); TVEC lands in the slot's own layout,
// TNCHW in a staging buffer that the post-copy pass transposes into the slot.
enum { WG_LM_VEC = 0, WG_LM_ELEM = 1, WG_LM_REG = 2, WG_LM_NCHW4 = 3, WG_LM_NCHW8 = 4, WG_LM_TVEC = 5, WG_LM_TNCHW = 6 };
constexpr bool wg_lm_tma(int lm) { return lm == WG_LM_TVEC || lm == WG_LM_TNCHW; }
// Each channel plane of a ring slot = WG_PAD positions of slack, then TWa positions (16 B each), then slack (the
// NCHW4 / NCHW8 column groups overhang by up to 3 / 7 positions on either side).
constexpr int WG_PAD = 8;
constexpr int WG_UNIT_NONE = -1, WG_UNIT_BIAS = -2;

struct WGParams {
  CUtensorMap tmap;   // TMA loaders: the input as a 5-d (TVEC: 16 bytes of channels, the rest, W, H, N) or 4-d (TNCHW: W, H, C, N) tensor
  const void* x; const void* w; const float* bias; float* out;
  int N, C, H, W, K, R, S, sh, ph, pw, dh, dw;
  int P, Q, act, pool, det, nhwc, gelu_fast, fulltile;
  int h2;     // 16-bit GELU mean: the half-precision epilogue allowed (wg_epi_h2_checked)
  int diag;   // builds with -DFF_FUSED_A_DIAG only (benchmarks): FF_FUSED_A_DIAG_OFF bits switch parts of the kernel off
  int CG, nops, nseg, TWa, RB, D;
  int na, col_j, col_rd2;   // A blocks (ops + the column op's swapped copy); the column-pair op and its second row, or -1
  int plane_bytes, nq;                 // bytes per 4-channel plane of a ring slot; NCHW4: 4-column quads per row
  int slot_bytes, small_off, ones_off, ring_off, a_small_off, dtab_off;   // smem: [A ops][ring][ones][B descriptors]
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
};

static_assert(sizeof(WGParams) <= 4096, "kernel parameters are limited to 4 KB");

// Diagnostic builds (-DFF_FUSED_A_DIAG; wrong results by design, never the product library), bits of FF_FUSED_A_DIAG_OFF
// (fa_wgmma_kernel): 8 = no copies, 9 = no post-copy pass, 10 = no epilogue, 11 = no per-row barrier / proxy fence,
// 12 = no wgmmas.
#ifdef FF_FUSED_A_DIAG
#define DIAG_OFF(bit) ((p.diag >> (bit)) & 1)
// Per-block timestamps of fa_wgmma_kernel (%globaltimer, ns), read by ff_fused_a_diag_times: 0 entry, 1 setup done,
// 2 first rows landed, 3 line loop done, 4 exit; 5 = SM id, 6 = lines of the block.
#define FA_DIAG_MAXB 4096
__device__ unsigned long long fa_diag_t[FA_DIAG_MAXB][8];
__device__ __forceinline__ void fa_diag_stamp(int i) {
  if (threadIdx.x == 0 && blockIdx.x < FA_DIAG_MAXB) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    fa_diag_t[blockIdx.x][i] = t;
  }
}
#define FA_DIAG_STAMP(i) fa_diag_stamp(i)
#else
#define DIAG_OFF(bit) false
#define FA_DIAG_STAMP(i) ((void)0)
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_HAVE_WGMMA 1
#endif

#ifdef FA_HAVE_WGMMA
// One m64n128 wgmma with both operands from shared-memory descriptors; scale_d == 0 starts a new accumulation.
#define FA_WGMMA_ACC_REGS "{" \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define FA_WGMMA_ACC_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FA_WGMMA_SS(NAME, SHAPE_TYPES, TAIL)                                                          \
  __device__ __forceinline__ void NAME(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                       \
                 "wgmma.mma_async.sync.aligned." SHAPE_TYPES " " FA_WGMMA_ACC_REGS ", %64, %65, p, " TAIL \
                 ";\n}\n"                                                                            \
                 : FA_WGMMA_ACC_OPERANDS                                                            \
                 : "l"(da), "l"(db), "r"(scale_d));                                                 \
  }
FA_WGMMA_SS(wgh_tf32, "m64n128k8.f32.tf32.tf32", "1, 1")
FA_WGMMA_SS(wgh_bf16, "m64n128k16.f32.bf16.bf16", "1, 1, 0, 0")
FA_WGMMA_SS(wgh_f16, "m64n128k16.f32.f16.f16", "1, 1, 0, 0")
#undef FA_WGMMA_SS
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
#endif

__device__ __forceinline__ void cp_wait_n(int n) {   // cp.async.wait_group needs an immediate
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}

template <int DT>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if (DT == FF_BF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Epilogue of one 64 x 128 tile: thread holds channels m0, m0 + 8 at pixels 8i + 2tig + {0,1}; pixels >= qv are
// padding.  Column blocks wholly inside qv (all but the last of a partial tile) skip the mask test; FULL (qv >= 128)
// has none.  NOCLAMP: GELU (erf) through ff_gelu_erf_noclamp (see wg_epi).
template <int ACT, int POOL, bool NOCLAMP, bool FULL>
__device__ __forceinline__ void wg_epi_pass(const float (&acc)[64], float (&red)[2][2], int qv, int tig) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float y[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = NOCLAMP ? ff_gelu_erf_noclamp(acc[4 * i + e]) : ff_activate<ACT>(acc[4 * i + e]);
    if (FULL || 8 * i + 8 <= qv) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& rr = red[e >> 1][e & 1];
        rr = (POOL == FF_POOL_MEAN) ? rr + y[e] : ff_max_nan(rr, y[e]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = 8 * i + 2 * tig + (e & 1) < qv;
        float& rr = red[e >> 1][e & 1];
        if (POOL == FF_POOL_MEAN) rr += ok ? y[e] : 0.0f;
        else if (ok) rr = ff_max_nan(rr, y[e]);
      }
    }
  }
}

// GELU (erf), the hot case: fast = the block has seen only finite, bounded inputs and weights (WGInBound), so every
// conv output is finite and the clamp-free form (9 issue slots per value with the sum instead of 11) is bitwise
// ff_gelu_erf; otherwise (or knob FF_FUSED_A_NOCLAMP = 0) ff_gelu_erf itself.  full: no pixel of the tile is padding
// (a whole 128-pixel tile, or a mean whose padding accumulators were zeroed, wg_epi_any), so the pass runs without the
// per-column-block mask tests: one straight-line block of 64 values.
template <int ACT, int POOL>
__device__ __forceinline__ void wg_epi(const float (&acc)[64], float (&red)[2][2], int qv, int tig, bool fast, bool full) {
  if (ACT == FF_ACT_GELU_ERF && fast) {
    if (full) wg_epi_pass<ACT, POOL, true, true>(acc, red, qv, tig);
    else wg_epi_pass<ACT, POOL, true, false>(acc, red, qv, tig);
  } else if (POOL == FF_POOL_MEAN && full) {
    wg_epi_pass<ACT, POOL, false, true>(acc, red, qv, tig);
  } else {
    wg_epi_pass<ACT, POOL, false, false>(acc, red, qv, tig);
  }
}

template <int POOL>
__device__ __forceinline__ void wg_epi_dispatch(int act, const float (&acc)[64], float (&red)[2][2], int qv, int tig, bool fast,
                                                bool full) {
  switch (act) {
    case FF_ACT_NONE: wg_epi<FF_ACT_NONE, POOL>(acc, red, qv, tig, fast, full); break;
    case FF_ACT_RELU: wg_epi<FF_ACT_RELU, POOL>(acc, red, qv, tig, fast, full); break;
    case FF_ACT_GELU_ERF: wg_epi<FF_ACT_GELU_ERF, POOL>(acc, red, qv, tig, fast, full); break;
    case FF_ACT_GELU_TANH: wg_epi<FF_ACT_GELU_TANH, POOL>(acc, red, qv, tig, fast, full); break;
    default: wg_epi<FF_ACT_SILU, POOL>(acc, red, qv, tig, fast, full); break;
  }
}

// The 16-bit GELU mean epilogue, checked: wg_epi_h2 holds its bound only for conv outputs inside fp16's range, and
// any other (|x| >= 65520 rounds to inf; inf; NaN) turns its pair's g into NaN (nu q = -inf * 0, or NaN in, NaN out;
// finite fp16 x always give a finite g; fp16 partial sums of 4 g that overflow give inf) and with it the quad's row sum
// in dm, which is otherwise finite (a sum of at most ~1e4 tiles of 128 values <= 65504).  So a non-finite dm after the
// tile takes the tile back — dm as before it (dm[1], dm[3] are the same sums as dm[0], dm[2]: every column of the ones
// matrix) — and runs it through the exact GELU (ff_gelu_erf: PyTorch's inf / NaN results) into red instead.  This replaced a guard on the staged inputs, whose running
// bound cost a pass over every row (NOTES run 23): the check costs two compares per tile.
__device__ __forceinline__ void wg_epi_h2_checked(const float (&acc)[64], float (&red)[2][2], float (&dm)[4], int tig) {
  const float d0 = dm[0], d2 = dm[2];
  wg_epi_h2(acc, dm);
  if (!(fabsf(dm[0]) < __int_as_float(0x7f800000) && fabsf(dm[2]) < __int_as_float(0x7f800000))) {   // NaN fails too
    dm[0] = dm[1] = d0;
    dm[2] = dm[3] = d2;
    wg_epi_pass<FF_ACT_GELU_ERF, FF_POOL_MEAN, false, true>(acc, red, WG_NT / 2, tig);
  }
}

// Mean pooling zeroes a partial tile's padding accumulators (pixels >= qv) first: every activation maps 0 to (+-)0, which
// adds nothing to a sum, so the epilogue then runs as for a whole tile — one straight-line block of 64 values, where the
// per-column-block mask tests split it into 16 small blocks (measured: TF32 NCHW / channels_last, NOTES run 18).  Where
// only the last column block is partial (qv > 120: the seed's second half-row has 126 pixels) only its 4 values are
// tested; the general loop, which ptxas predicates whole (2 compares and 4 selects per column block, issued even where
// off: 9 % of the 16-bit kernel's issue at the seed, NOTES run 23), serves the rest.  Max pooling keeps the masks (0 is
// not neutral for a max); 16-bit whole tiles skip them too (knob FF_FUSED_A_FULLTILE).
// ieee (SPLIT) keeps the masked pass as well: its 255-register kernel measured 3 % slower NCHW with this one.
// h2: the half-precision GELU (wg_epi_h2_checked, 16-bit input only) adds into dm[0..3] instead of red.
template <int DT, bool SPLIT>
__device__ __forceinline__ void wg_epi_any(const WGParams& p, float (&acc)[64], float (&red)[2][2], float (&dm)[4], int qv,
                                           int tig, bool fast, bool h2) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
  if (p.pool == FF_POOL_MEAN && !SPLIT) {
    if (qv < WG_NT / 2) {
      if (qv > WG_NT / 2 - 8) {
        const int lim = qv - (WG_NT / 2 - 8) - 2 * tig;   // pixel 120 + 2 tig + (e & 1) is valid iff (e & 1) < lim
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[60 + e] = (e & 1) < lim ? acc[60 + e] : 0.0f;
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (8 * i + 8 > qv) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[4 * i + e] = (8 * i + 2 * tig + (e & 1) < qv) ? acc[4 * i + e] : 0.0f;
          }
      }
    }
    if (DT != FF_F32 && h2) wg_epi_h2_checked(acc, red, dm, tig);
    else wg_epi_dispatch<FF_POOL_MEAN>(p.act, acc, red, WG_NT / 2, tig, fast, true);
  } else {
    // mask-free whole tiles for 16-bit input only (measured: 16-bit channels_last -4 %, TF32 even, ieee +7 %), so the
    // fp32 kernels do not carry that code
    const bool full = DT != FF_F32 && p.fulltile && qv >= WG_NT / 2;
    if (p.pool == FF_POOL_MEAN) wg_epi_dispatch<FF_POOL_MEAN>(p.act, acc, red, qv, tig, fast, full);
    else wg_epi_dispatch<FF_POOL_MAX>(p.act, acc, red, qv, tig, fast, full);
  }
}

// The B descriptor table (low words), entry (rs * 2 + h) * WG_DSTRIDE(NOPS) + j: op j for output-row ring slot rs and
// half h reads ring slot (rs + op_rd[j]) % RB at column h * 128 (the bias op's ones block: op_mask 0, always the same
// address).  Straight-line kernels (NOPS > 0) pack it NOPS ops wide, the general one WG_MAXOPS (wg_plan sizes it the same).
// The column-pair op (col_j >= 0, 16-bit 3x3: WG_COL16_OPS) reads ring slots sl0 = (rs + op_rd) % RB and sl1 = (rs +
// col_rd2) % RB: its entry starts at the lower of the two with LBO = their distance, and entry NOPS holds the low word of
// its A descriptor (block col_j, or block na - 1 = the swapped one where sl1 < sl0).
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
        dtab[i] = sbase16 + p.op_d[j] + (uint32_t)(lo * p.slot16 + half * (WG_NT / 2)) + ((uint32_t)(gap * p.slot16) << 16);
      }
      continue;
    }
    dtab[i] = sbase16 + p.op_d[j] + ((uint32_t)(sl * p.slot16 + half * (WG_NT / 2)) & p.op_mask[j]);
  }
}

// All wgmmas of one half (128 pixels) of output row t, rs = ring slot of the row's first input row.  NOPS > 0 is the op
// count at compile time (straight-line code: ptxas then chains the HGMMAs without a fence or scoreboard wait between
// them); NOPS == 0 reads it at run time (ptxas then fences every HGMMA: correct, slower).  fp32's bias op is the last
// op (it has no ieee small terms); 16-bit carries the bias in a spare chunk or in a last op of its own alike.
// B descriptors' low words come from the table dtab[(rs * 2 + half) * WG_DSTRIDE(NOPS) + j] (wg_dtab_fill): one shared load
// per op instead of ~10 instructions of ring-slot arithmetic.
template <int DT, bool SPLIT, int NOPS>
__device__ __forceinline__ void wg_issue(const WGParams& p, float (&acc)[64], uint32_t sbase16, const uint32_t* dtab, int rs,
                                         int half) {
#ifdef FA_HAVE_WGMMA
  // straight-line kernels read the whole row of descriptor words first, so that the shared-memory latencies overlap
  // (one LDS before each HGMMA made every R2UR wait on its own load: ncu, NOTES run 19); not the ieee kernel (SPLIT),
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
  wg_fence();
#pragma unroll
  for (int j = 0; j < (NOPS > 0 ? NOPS : WG_MAXOPS); ++j) {
    if (NOPS == 0 && j >= p.nops) break;
    const uint64_t desc = (uint64_t)(PRE ? dl[j < NL ? j : 0] : drow[j]) | ((uint64_t)p.op_hi[j] << 32);
    const uint64_t da = (COL && j == WG_COL16_J)
                            ? ((uint64_t)dl[NL - 1] | ((uint64_t)(128 >> 4) << 32))
                            : ((uint64_t)(sbase16 + j * (2048 >> 4)) | ((uint64_t)(1024 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32));
    const bool bias_op = (NOPS > 0) ? (j == NOPS - 1) : (j == p.nops - 1);
    if (DT == FF_BF16) {
      wgh_bf16(acc, da, desc, j > 0);
    } else if (DT == FF_F16) {
      wgh_f16(acc, da, desc, j > 0);
    } else if (SPLIT && !bias_op) {   // x w ~ x_hi w_hi (tf32) + [bf16(x) | bf16(x_lo)] . [bf16(w_lo) | bf16(w)] (k16)
      wgh_bf16(acc, da + (uint64_t)(p.a_small_off >> 4), desc + (uint64_t)(p.small_off >> 4), j > 0);
      wgh_tf32(acc, da, desc, 1);
    } else {
      wgh_tf32(acc, da, desc, j > 0);
    }
  }
  wg_commit();
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
#endif
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t a, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, unsigned parity) {
  asm volatile("{\n.reg .pred P1;\nMBAR_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@!P1 bra MBAR_WAIT;\n}" :: "r"(a), "r"(parity) : "memory");
}
// the mbarrier's single arrival, announcing `bytes` of bulk copies that complete its phase
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(a), "r"(bytes) : "memory");
}
// one TMA box of the tensor map `map` (a __grid_constant__ parameter) at the given coordinates (innermost first) into
// shared memory at dst (128-byte aligned); elements outside the tensor arrive as zeros
__device__ __forceinline__ void tma_load4(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load5(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar) : "memory");
}

// precision ieee, the small part of the ring slot: per 8-channel group two bf16 planes, bf16(x) then bf16(x - x_hi)
// (x_hi = tf32(x)), both 0 where x_hi is not finite (Inf / NaN then reach the result through x_hi w_hi alone, as in
// TF32).  Returns the two bf16 pairs (x of channels c, c + 1 in the low / high half) and the two x_lo pairs.
__device__ __forceinline__ void wg_small_pairs(const float (&x)[4], const uint32_t (&hi)[4], uint32_t (&xb)[2], uint32_t (&xl)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float a[2], l[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float h = __uint_as_float(hi[2 * i + e]);
      const bool fin = isfinite(h);
      a[e] = fin ? x[2 * i + e] : 0.0f;
      l[e] = fin ? x[2 * i + e] - h : 0.0f;
    }
    __nv_bfloat162 pa = __floats2bfloat162_rn(a[0], a[1]), pl = __floats2bfloat162_rn(l[0], l[1]);
    xb[i] = *reinterpret_cast<uint32_t*>(&pa);
    xl[i] = *reinterpret_cast<uint32_t*>(&pl);
  }
}

// Running bound of the magnitudes this thread has staged (input, weights, bias).  With every input and weight
// |v| <= 2^50 (and |bias| <= 2^50) a conv output is a sum of at most 160 products, < 2^108: finite, which is what the
// clamp-free GELU needs (wg_epi).  Inf / NaN fail the test (NaN sticks in the max).  fp32 values and all weights go
// through add (one FMNMX each), 16-bit input through add2 on raw bit pairs (fp16 is always bounded, only Inf / NaN fail).
struct WGInBound {
  float f = 0.0f;       // max |v| of fp32 values
  uint32_t h = 0u;      // per-half max of 16-bit magnitude bits
  __device__ __forceinline__ void add(float v) { f = ff_max_nan(f, fabsf(v)); }
  __device__ __forceinline__ void add2(uint32_t w) { h = __vmaxu2(h, w & 0x7fff7fffu); }
  __device__ __forceinline__ uint32_t m16() const { return max(h & 0xffffu, h >> 16); }   // the larger half's bits
  template <int DT>
  __device__ __forceinline__ bool ok() const {
    const uint32_t m = m16();
    return f <= 0x1p50f && (DT == FF_BF16 ? m <= 0x5880u : DT == FF_F16 ? m < 0x7c00u : true);   // bf16 2^50; fp16 finite
  }
};

// fp32 NCHW loaders: v[e] = 4 columns of channel 4 hp + e -> 4 columns x 4 channels at blk (plane hp), rounded to tf32,
// bounded; ieee also the column's bf16 small part
template <bool SPLIT>
__device__ __forceinline__ void wg_store_cols4(const WGParams& p, uint32_t blk, int hp, const uint32_t (&v)[4][4], WGInBound& bound) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t b[4];
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[e] = __uint_as_float(v[e][i]);
      b[e] = f2tf32(x[e]);
      bound.add(x[e]);
    }
    asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};" :: "r"(blk + i * 16), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]) : "memory");
    if (SPLIT) {   // plane hp = 4 channels = half (hp & 1) of the group's bf16 entries
      uint32_t xb[2], xl[2];
      wg_small_pairs(x, b, xb, xl);
      const uint32_t ds = blk + i * 16 - (hp & 1) * p.plane_bytes + (hp & 1) * 8 + p.small_off;
      asm volatile("st.shared.v2.u32 [%0],{%1,%2};" :: "r"(ds), "r"(xb[0]), "r"(xb[1]) : "memory");
      asm volatile("st.shared.v2.u32 [%0],{%1,%2};" :: "r"(ds + p.plane_bytes), "r"(xl[0]), "r"(xl[1]) : "memory");
    }
  }
}

// TNCHW post-copy pass of one row: the stage holds [channel group][box][8 ch][tma_bc columns] from column wbase - tma_delta
// (TMA, wg_tma_row), which goes to slot position WG_PAD - tma_delta (the slack before the row); task =
// (plane hp, 4-column group j), plane-fastest: the 8 threads of a 16-byte shared-memory phase load 4 groups of each of
// two planes, which lie 16 tma_bc = 64 bytes apart modulo 128 (tma_bc = 4 mod 8): conflict-free; they store into the
// slot's planes 32 bytes apart modulo 128 (2-way, as NCHW4).
template <bool SPLIT>
__device__ __forceinline__ void wg_tnchw_row(const WGParams& p, uint32_t slot, uint32_t stg, WGInBound& bound) {
  const int HP = 2 * p.CG, ng = (p.tma_cols + 3) >> 2;
  for (int task = threadIdx.x; task < HP * ng; task += 128) {
    int hp, j;
    if (p.CG == 1) { hp = task & 1; j = task >> 1; }
    else { j = fdiv(task, p.mHP, p.sHP); hp = task - j * HP; }
    const int c0 = 4 * j, b = fdiv(c0, p.mBC, p.sBC);
    const uint32_t src = stg + (uint32_t)((((hp >> 1) * p.tma_nbox + b) * 8 + (hp & 1) * 4) * p.tma_bc * 4 + (c0 - b * p.tma_bc) * 4);
    uint32_t v[4][4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v[e][0]), "=r"(v[e][1]), "=r"(v[e][2]), "=r"(v[e][3]) : "r"(src + e * p.tma_bc * 4));
    wg_store_cols4<SPLIT>(p, slot + (uint32_t)(hp * p.plane_bytes + (WG_PAD - p.tma_delta + c0) * 16), hp, v, bound);
  }
}

// NCHW8 loader (16-bit; fp32's NCHW4 below is the same with G = 4 and written out: its ieee build measured 5 % slower
// through this helper), one input row: tasks of (plane pl of G channels, G-column group), G = 16 / element size.
// MODE 0 issues a task's G 16-byte copies (chunk e = G columns of channel pl * G + e, zeros outside the input) into
// its G x 16-byte block of the ring slot; MODE 1 reads the landed chunks and hands them to transpose(blk, pl, v),
// which writes the block back as G columns x G channels.  Groups start at multiples of G, so the first one may begin
// up to G - 1 positions before the row (slot slack).  Chunk e of group j lands at position (e + j) mod G of its block:
// the 8 threads of a 16-byte shared-memory phase (consecutive groups, G * 16 bytes apart) then copy into and load
// from 8 different bank groups (else all 8 in one); the stores of the transposed columns keep their conflicts.
template <int G, int MODE, class F>
__device__ __forceinline__ void wg_nchw_row(const WGParams& p, uint32_t slot, long long n, int h, int wbase, F&& transpose) {
  const int wq = (wbase >= 0) ? (wbase & ~(G - 1)) : -((G - 1 - wbase) & ~(G - 1));   // floor(wbase / G) * G
  const int delta = wq - wbase;                                                         // -(G - 1) .. 0 positions
  const bool hok = (h >= 0 && h < p.H);
  const long long plane = (long long)p.H * p.W;
  const long long rowc = ((n * p.C) * p.H + h) * (long long)p.W;   // channel 0, this row, column 0
  auto task_body = [&](int pl, int j) {
    const uint32_t blk = slot + (uint32_t)(pl * p.plane_bytes + (WG_PAD + delta + G * j) * 16);
    if (MODE == 0) {
      const int w0 = wq + G * j;
      const bool wok = hok && w0 >= 0 && w0 < p.W;
      const long long c0 = rowc + pl * G * plane + w0;
#pragma unroll
      for (int e = 0; e < G; ++e) {
        const bool ok = wok && pl * G + e < p.C;
        cp_async16(blk + ((e + j) & (G - 1)) * 16, reinterpret_cast<const char*>(p.x) + (ok ? (c0 + e * plane) * (16 / G) : 0), ok);
      }
    } else {
      uint32_t v[G][4];
#pragma unroll
      for (int e = 0; e < G; ++e)
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v[e][0]), "=r"(v[e][1]), "=r"(v[e][2]), "=r"(v[e][3]) : "r"(blk + ((e + j) & (G - 1)) * 16));
      transpose(blk, pl, v);
    }
  };
  if (p.CG * (8 / G) == 1) {   // one plane (C <= 8, G = 8): task = quad j = tid + 128 k, no division per task
    for (int j = threadIdx.x; j < p.nq; j += 128) task_body(0, j);
  } else {
    for (int task = threadIdx.x; task < p.CG * (8 / G) * p.nq; task += 128) {
      const int pl = fdiv(task, p.mNQ, p.sNQ), j = task - pl * p.nq;
      task_body(pl, j);
    }
  }
}

// One input row (relative row j of the current piece) into its ring slot. MODE 0: issue (cp.async or register
// loads+stores), MODE 1: post-process own chunks after they landed (fp32: round to tf32; ieee: also the small part).
template <int DT, bool SPLIT, int LM, int MODE>
__device__ __forceinline__ void wg_row(const WGParams& p, uint32_t slot, long long n, int h, int wbase, WGInBound& bound) {
  const int tid = threadIdx.x;
  const bool hok = (h >= 0 && h < p.H);
  if (LM == WG_LM_VEC || LM == WG_LM_TVEC) {   // TVEC: MODE 1 only (its copies are wg_tma_row's)
    constexpr int CPP = (DT == FF_F32) ? 2 : 1;
    constexpr int ESZ = (DT == FF_F32) ? 4 : 2;
    // one 16-byte chunk: channels cg * 8 + half * 4 .. (fp32) or cg * 8 .. (16-bit) of column col; src = its element
    // offset in x (used only when ok)
    auto chunk = [&](uint32_t dst, long long src, bool ok, int half) {
      if (MODE == 0) {
        cp_async16(dst, reinterpret_cast<const char*>(p.x) + (ok ? src * ESZ : 0), ok);
      } else if (DT == FF_F32) {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(dst));
        uint4 b = make_uint4(f2tf32(__uint_as_float(v.x)), f2tf32(__uint_as_float(v.y)), f2tf32(__uint_as_float(v.z)),
                             f2tf32(__uint_as_float(v.w)));
        bound.add(__uint_as_float(v.x)); bound.add(__uint_as_float(v.y));
        bound.add(__uint_as_float(v.z)); bound.add(__uint_as_float(v.w));
        asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};" :: "r"(dst), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w) : "memory");
        if (SPLIT) {   // this thread's 4 channels = half of the group's 16-byte bf16 entries
          const float x[4] = {__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w)};
          const uint32_t hi[4] = {b.x, b.y, b.z, b.w};
          uint32_t xb[2], xl[2];
          wg_small_pairs(x, hi, xb, xl);
          const uint32_t ds = dst - half * p.plane_bytes + half * 8 + p.small_off;
          asm volatile("st.shared.v2.u32 [%0],{%1,%2};" :: "r"(ds), "r"(xb[0]), "r"(xb[1]) : "memory");
          asm volatile("st.shared.v2.u32 [%0],{%1,%2};" :: "r"(ds + p.plane_bytes), "r"(xl[0]), "r"(xl[1]) : "memory");
        }
      } else {   // 16-bit: the copies land as they are; MODE 1 only bounds them
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(dst));
        bound.add2(v.x); bound.add2(v.y); bound.add2(v.z); bound.add2(v.w);
      }
    };
    const long long rowoff = ((n * p.H + h) * p.W + wbase) * p.C;   // element offset of column 0 of this row
    if (p.CG == 1) {
      // C == 8: a thread's chunks are every (128 / CPP)-th column at a fixed half, so its destination, source and
      // column advance by constants (the generic loop below spent ~45 instructions per chunk on index arithmetic).
      // TVEC's planes are 128-byte aligned (TMA), so its 8-thread phases take 8 columns of one plane (conflict-free);
      // VEC's alternate the planes, which start 64 bytes apart modulo 128.
      const int half = (CPP == 2) ? (LM == WG_LM_TVEC ? (tid >> 3) & 1 : tid & 1) : 0;
      const int col0 = (CPP == 2) ? (LM == WG_LM_TVEC ? (tid & 7) | ((tid >> 4) << 3) : tid >> 1) : tid;
      constexpr int CSTEP = 128 / CPP;
      uint32_t dst = slot + (uint32_t)(half * p.plane_bytes + (WG_PAD + col0) * 16);
      long long src = rowoff + col0 * 8 + half * 4;
      for (int col = col0; col < p.TWa; col += CSTEP, dst += CSTEP * 16, src += CSTEP * 8) {
        const int w = wbase + col;
        chunk(dst, src, hok && (unsigned)w < (unsigned)p.W, half);
      }
    } else {
      const int nch = p.CG * CPP * p.TWa;
      for (int i = tid; i < nch; i += 128) {
        const int half = (CPP == 2) ? (i & 1) : 0;
        const int rest = (CPP == 2) ? (i >> 1) : i;
        const int col = fdiv(rest, p.mCG, p.sCG), cg = rest - col * p.CG;
        const uint32_t dst = slot + (uint32_t)((cg * CPP + half) * p.plane_bytes + (WG_PAD + col) * 16);
        const int w = wbase + col;
        chunk(dst, rowoff + (long long)col * p.C + cg * 8 + half * 4, hok && w >= 0 && w < p.W, half);
      }
    }
  } else if (LM == WG_LM_NCHW4) {                      // fp32 NCHW, W % 4 == 0: task = (plane hp, 4-column quad j)
    // The 4 channels x 4 columns of a task land as 4 chunks of one channel each in the 64 bytes that will hold the
    // 4 columns x 4 channels afterwards, so the same thread transposes them in place (no other thread touches them).
    // Tasks go plane-fastest (consecutive threads alternate planes, which start 32 bytes apart modulo 128 — wg_plan)
    // and chunk e of quad j lands at position (e + j / 2) mod 4 of its block: the 8 threads of a 16-byte shared-memory
    // phase then copy into and load from 8 bank groups (4-way conflicts before), and store the transposed columns
    // into 4 (2-way; 4-way before).  (Stepping a thread's tasks by constants, as VEC and NCHW8 do for one plane,
    // measured 4.7 % slower here: NOTES run 18 item 7.)
    const int wq = (wbase >= 0) ? (wbase & ~3) : -((3 - wbase) & ~3);   // floor(wbase / 4) * 4
    const int delta = wq - wbase;                                         // -3 .. 0 positions
    const int HP = p.CG * 2;
    for (int task = tid; task < HP * p.nq; task += 128) {
      const int j = fdiv(task, p.mHP, p.sHP), hp = task - j * HP;
      const uint32_t blk = slot + (uint32_t)(hp * p.plane_bytes + (WG_PAD + delta + 4 * j) * 16);
      if (MODE == 0) {
        const int w0 = wq + 4 * j;
        const bool wok = hok && w0 >= 0 && w0 < p.W;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = hp * 4 + e;
          const bool ok = wok && c < p.C;
          const float* src = reinterpret_cast<const float*>(p.x);
          if (ok) src += ((n * p.C + c) * p.H + h) * (long long)p.W + w0;
          cp_async16(blk + ((e + (j >> 1)) & 3) * 16, src, ok);
        }
      } else {
        uint32_t v[4][4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v[e][0]), "=r"(v[e][1]), "=r"(v[e][2]), "=r"(v[e][3]) : "r"(blk + ((e + (j >> 1)) & 3) * 16));
        wg_store_cols4<SPLIT>(p, blk, hp, v, bound);
      }
    }
  } else if (LM == WG_LM_NCHW8) {                      // 16-bit NCHW, W % 8 == 0: task = (channel group, 8 columns)
    // As NCHW4, with 8 channels x 8 columns per task and the [col][8 ch] entries of the 16-bit slot.
    wg_nchw_row<8, MODE>(p, slot, n, h, wbase, [&](uint32_t blk, int, const uint32_t (&v)[8][4]) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {   // column i: channels 2k, 2k + 1 from chunks 2k, 2k + 1
        uint32_t b[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) b[k] = __byte_perm(v[2 * k][i >> 1], v[2 * k + 1][i >> 1], (i & 1) ? 0x7632 : 0x5410);
#pragma unroll
        for (int k = 0; k < 4; ++k) bound.add2(b[k]);
        asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};" :: "r"(blk + i * 16), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]) : "memory");
      }
    });
  } else if (LM == WG_LM_ELEM) {                       // fp32, any layout: 4-byte cp.async, warp = 4 ch x 8 columns
    const int warp = tid >> 5, lane = tid & 31, e = lane & 3, colLo = lane >> 2;
    const int HP = p.CG * 2;
    const int ntask = (p.TWa >> 3) * HP;
    for (int task = warp; task < ntask; task += 4) {
      const int colHi = fdiv(task, p.mHP, p.sHP), hp = task - colHi * HP;
      const int col = colHi * 8 + colLo, c = hp * 4 + e;
      const uint32_t dst = slot + (uint32_t)(hp * p.plane_bytes + (WG_PAD + col) * 16 + e * 4);
      if (MODE == 0) {
        const int w = wbase + col;
        const bool ok = hok && w >= 0 && w < p.W && c < p.C;
        const float* src = reinterpret_cast<const float*>(p.x);
        if (ok) src += p.nhwc ? ((n * p.H + h) * p.W + w) * p.C + c : ((n * p.C + c) * p.H + h) * (long long)p.W + w;
        cp_async4(dst, src, ok);
      } else {
        float v;
        asm volatile("ld.shared.f32 %0,[%1];" : "=f"(v) : "r"(dst));
        const uint32_t b = f2tf32(v);
        bound.add(v);
        asm volatile("st.shared.u32 [%0],%1;" :: "r"(dst), "r"(b) : "memory");
        if (SPLIT) {   // channel 4 (hp & 1) + e of the group's bf16 entries
          const bool fin = isfinite(__uint_as_float(b));
          const __nv_bfloat16 xb = __float2bfloat16_rn(fin ? v : 0.0f), xl = __float2bfloat16_rn(fin ? v - __uint_as_float(b) : 0.0f);
          const uint32_t ds = dst - (hp & 1) * p.plane_bytes - e * 4 + ((hp & 1) * 4 + e) * 2 + p.small_off;
          asm volatile("st.shared.u16 [%0],%1;" :: "r"(ds), "h"(*reinterpret_cast<const unsigned short*>(&xb)) : "memory");
          asm volatile("st.shared.u16 [%0],%1;" :: "r"(ds + p.plane_bytes), "h"(*reinterpret_cast<const unsigned short*>(&xl)) : "memory");
        }
      }
    }
  } else {                                             // 16-bit, any layout: register loads, 8 channels per column
    if (MODE != 0) return;
    const int nit = p.CG * p.TWa;
    constexpr int U = 4;
    for (int base = tid; base < nit; base += U * 128) {
      uint32_t v[U][4];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int i = base + k * 128;
        const int cg = fdiv(i, p.mTWa, p.sTWa), col = i - cg * p.TWa;
        const int w = wbase + col;
        const bool ok = i < nit && hok && w >= 0 && w < p.W;
        uint32_t hv[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int c = cg * 8 + e;
          hv[e] = 0u;
          if (ok && c < p.C) {
            const long long gi = p.nhwc ? ((n * p.H + h) * p.W + w) * p.C + c : ((n * p.C + c) * p.H + h) * (long long)p.W + w;
            hv[e] = load_elem_h<DT>(p.x, gi);
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          v[k][e] = hv[2 * e] | (hv[2 * e + 1] << 16);
          bound.add2(v[k][e]);
        }
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int i = base + k * 128;
        if (i < nit) {
          const int cg = fdiv(i, p.mTWa, p.sTWa), col = i - cg * p.TWa;
          const uint32_t dst = slot + (uint32_t)(cg * p.plane_bytes + (WG_PAD + col) * 16);
          asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};" :: "r"(dst), "r"(v[k][0]), "r"(v[k][1]), "r"(v[k][2]), "r"(v[k][3]) : "memory");
        }
      }
    }
  }
}

// the last input row (relative to the piece) output row t reads: row group t = the rows (hi(t - 1), hi(t)] (group 0
// from row 0), the ones output row t needs first
__device__ __forceinline__ int wg_group_hi(const WGParams& p, int t) { return t * p.sh + (p.R - 1) * p.dh; }
template <int DT, bool SPLIT, int LM, int MODE>
__device__ __forceinline__ void wg_group(const WGParams& p, uint32_t ring, int t, int np, long long n, int hbase, int wbase,
                                         WGInBound& bound) {
  if (t >= np) return;
  const int jlo = (t == 0) ? 0 : wg_group_hi(p, t - 1) + 1, jhi = wg_group_hi(p, t);
  for (int j = jlo; j <= jhi; ++j)
    wg_row<DT, SPLIT, LM, MODE>(p, ring + (uint32_t)((j - p.RB * fdiv(j, p.mRB, p.sRB)) * p.slot_bytes), n, hbase + j, wbase, bound);
}

// TNCHW post-copy pass of one row, 16-bit: the stage holds [channel group][box][8 ch][tma_bc columns] from column
// wbase - tma_delta; each 8 x 8 block (8 channels x 8 columns) becomes 8 slot entries [column][8 ch] through one
// ldmatrix.trans and one stmatrix (x4: a warp moves four blocks per instruction pair, block = column group j x channel
// group cg, cg fastest).  The stage's channel rows lie tma_bc * 2 = 16 bytes modulo 128 apart (tma_bc = 8 mod 64), so the 8
// rows of a block come from 8 bank groups; a block's 8 entries are 128 contiguous bytes of the slot.  The stage is
// complete before anyone reads it (mbarrier), so lanes may read what other lanes' copies brought (NOTES run 17 item 9).
// Block k of a thread's pass (k-th trip of its warp, lane's block clamped to the last): source offset in its stage,
// destination offset in its slot.
struct WGTn16Blk { uint32_t src, dst; };
__device__ __forceinline__ WGTn16Blk wg_tnchw16_blk(const WGParams& p, int b0, int nb, int q, int r) {
  const int blk = min(b0 + q, nb - 1);
  const int j = p.CG == 1 ? blk : fdiv(blk, p.mCG, p.sCG), cg = blk - j * p.CG;
  const int c0 = 8 * j, bx = fdiv(c0, p.mBC, p.sBC);
  return {(uint32_t)(((cg * p.tma_nbox + bx) * 8 + r) * p.tma_bc * 2 + (c0 - bx * p.tma_bc) * 2),
          (uint32_t)(cg * p.plane_bytes + (WG_PAD - p.tma_delta + c0 + r) * 16)};
}
// The pass's offsets are the same for every row: where a warp's blocks take at most WG_TN16_TRIPS trips (nb <= 48: up
// to ~384 columns of 8 channels) and the offsets fit 16 bits, they are worked out once per block, packed src | dst << 16
// (the index arithmetic per row cost ~50 instructions per tile at the seed, NOTES run 23); otherwise per row.
constexpr int WG_TN16_TRIPS = 3;
struct WGTn16 {
  uint32_t off[WG_TN16_TRIPS];
  bool pre;
  // on: allowed at all (the straight-line kernels: the general one, already at 88 bytes of stack, is not given the
  // registers)
  __device__ __forceinline__ WGTn16(const WGParams& p, bool on) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = p.CG * ((p.tma_cols + 7) >> 3);
    pre = on && nb <= 16 * WG_TN16_TRIPS && p.stage_bytes <= 65536 && p.slot_bytes <= 65536;
#pragma unroll
    for (int k = 0; k < WG_TN16_TRIPS; ++k) {
      const WGTn16Blk o = wg_tnchw16_blk(p, 4 * warp + 16 * k, nb, lane >> 3, lane & 7);
      off[k] = o.src | (o.dst << 16);
    }
  }
};
__device__ __forceinline__ void wg_tnchw16_move(uint32_t src, uint32_t dst, bool bnd, WGInBound& bound) {
  uint32_t v[4];
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(src));
  if (bnd) {
#pragma unroll
    for (int k = 0; k < 4; ++k) bound.add2(v[k]);
  }
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};"
               :: "r"(dst), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}
// bnd: the input bound is wanted (not by the 16-bit GELU mean epilogue, which checks its own range)
__device__ __forceinline__ void wg_tnchw16_row(const WGParams& p, uint32_t slot, uint32_t stg, bool bnd, WGInBound& bound,
                                               const WGTn16& tn) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nb = p.CG * ((p.tma_cols + 7) >> 3);
  if (tn.pre) {
#pragma unroll
    for (int k = 0; k < WG_TN16_TRIPS; ++k)
      if (4 * warp + 16 * k < nb) wg_tnchw16_move(stg + (tn.off[k] & 0xffffu), slot + (tn.off[k] >> 16), bnd, bound);
  } else {
    for (int b0 = 4 * warp; b0 < nb; b0 += 16) {   // warp-uniform; lanes past the end repeat the last block (same bytes)
      const WGTn16Blk o = wg_tnchw16_blk(p, b0, nb, lane >> 3, lane & 7);
      wg_tnchw16_move(stg + o.src, slot + o.dst, bnd, bound);
    }
  }
}

// Where the TMA loaders' rows go: input row j of a piece into stage j % NST and (TNCHW, after its pass) ring slot
// j % RB.  The rows are taken in order, so every thread keeps the next one's pair in one register (st | rs << 16), reset
// per piece, instead of two 64-bit multiply-high divisions per row (their chains held ~2 % of the stall samples); the
// row thread 0 issues inside the row loop is always (D - 1) sh rows past the next one to take, so its stage follows from
// that pair (NOTES run 24: counters of their own for both sequences spilled in the 16-bit TNCHW kernel).
__device__ __forceinline__ int wg_stage_of(const WGParams& p, int j) { return j - p.NST * fdiv(j, p.mST, p.sST); }
__device__ __forceinline__ int wg_stage_next(const WGParams& p, int st) { return st + 1 == p.NST ? 0 : st + 1; }
struct WGRowSlot {
  uint32_t v = 0u;
  __device__ __forceinline__ int st() const { return (int)(v & 0xffffu); }
  __device__ __forceinline__ int rs() const { return (int)(v >> 16); }
  __device__ __forceinline__ void step(const WGParams& p) {
    const int s = wg_stage_next(p, st()), r = rs() + 1 == p.RB ? 0 : rs() + 1;
    v = (uint32_t)s | ((uint32_t)r << 16);
  }
};
// TMA loaders (one thread): input row j of the piece (row h of image n from column wbase) into its stage st = j % NST,
// announced on the stage's mbarrier.  TVEC: the stage is ring slot j % RB itself (NST == RB) and each box lands
// 16 bytes of channels (4 fp32 / 8 16-bit) x tma_bc columns where the slot's layout has them; TNCHW: stage st at
// stage_off, [channel group][box][8 ch][tma_bc columns].  Rows, columns and channels outside the input arrive as zeros.
template <int DT, int LM>
__device__ __forceinline__ void wg_tma_row(const WGParams& p, uint32_t ring, uint32_t stage0, uint32_t bar0, int st, long long n,
                                           int h, int wbase) {
  constexpr int ESZ = DT == FF_F32 ? 4 : 2;
  const uint32_t bar = bar0 + 8u * st;
  mbar_expect_tx(bar, (unsigned)p.tma_bytes);
  for (int g = 0; g < (LM == WG_LM_TVEC ? p.CG * (8 / (16 / ESZ)) : p.CG); ++g)
    for (int b = 0; b < p.tma_nbox; ++b) {
      if (LM == WG_LM_TVEC)
        tma_load5(ring + (uint32_t)(st * p.slot_bytes + g * p.plane_bytes + (WG_PAD + b * p.tma_bc) * 16), &p.tmap, bar, 0, g,
                  wbase + b * p.tma_bc, h, (int)n);
      else
        tma_load4(stage0 + (uint32_t)(st * p.stage_bytes + (g * p.tma_nbox + b) * 8 * ESZ * p.tma_bc), &p.tmap, bar,
                  wbase - p.tma_delta + b * p.tma_bc, h, g * 8, (int)n);
    }
}
// All threads: wait for the next row's stage at.st() (tph = the stages' phase bits), then its post-copy pass into ring
// slot at.rs() (16-bit TVEC: only when `post`, i.e. the input bound is wanted; the copies land as they are).
template <int DT, bool SPLIT, int LM>
__device__ __forceinline__ void wg_tma_take(const WGParams& p, uint32_t ring, uint32_t stage0, uint32_t bar0, WGRowSlot& at,
                                            uint32_t& tph, bool post, WGInBound& bound, const WGTn16& tn) {
  const int st = at.st(), rs = at.rs();
  at.step(p);
  mbar_wait(bar0 + 8u * st, (tph >> st) & 1u);
  tph ^= 1u << st;
  if (LM == WG_LM_TVEC) {
    if (DT == FF_F32 || post) wg_row<DT, SPLIT, WG_LM_TVEC, 1>(p, ring + (uint32_t)(st * p.slot_bytes), 0, 0, 0, bound);
  } else {
    if (DT == FF_F32) wg_tnchw_row<SPLIT>(p, ring + (uint32_t)(rs * p.slot_bytes), stage0 + (uint32_t)(st * p.stage_bytes), bound);
    else wg_tnchw16_row(p, ring + (uint32_t)(rs * p.slot_bytes), stage0 + (uint32_t)(st * p.stage_bytes), post, bound, tn);
  }
}

// Block setup of both wgmma kernels, threads tid of nthr: the bias op's ones block (8 rows x 16 B, SBO = LBO = 0;
// A = (b_hi, b_lo, 0...)), the 16-bit ones plane after each ring slot's channel planes (the spare second K chunk: zero
// weights, or the bias in one op; every entry (1, 1, 0, ...) like the ones block),
// and the weights (+ bias op) as K-major core matrices, op j at j * 2 KB, [k chunk][64 ch][16 B]; every weight and
// bias value goes through bound.
template <int DT, bool SPLIT>
__device__ __forceinline__ void wg_setup_operands(const WGParams& p, unsigned char* smem, int tid, int nthr, WGInBound& bound) {
  uint4 o;   // one K-major row of ones: channels 0 and 1 = 1.0, the rest 0
  if (DT == FF_F32) o = make_uint4(0x3f800000u, 0x3f800000u, 0u, 0u);
  else if (DT == FF_BF16) o = make_uint4(0x3f803f80u, 0u, 0u, 0u);
  else o = make_uint4(0x3c003c00u, 0u, 0u, 0u);
  if (tid < 8) *reinterpret_cast<uint4*>(smem + p.ones_off + tid * 16) = o;
  if (DT != FF_F32) {
    for (int r = 0; r < p.RB; ++r)
      for (int q = tid * 16; q < p.plane_bytes; q += nthr * 16)
        *reinterpret_cast<uint4*>(smem + p.ring_off + r * p.slot_bytes + p.CG * p.plane_bytes + q) = o;
  }
  // One 16-byte K chunk per thread and op: thread i of 128 owns row m = i % 64 and chunk h = i / 64 of every op (4 fp32 /
  // 8 16-bit values), whose source the host worked out (op_wo, op_wn: no index arithmetic here).  OB ops' global loads are
  // issued before any is used (in flight together).  Kept small on purpose: this code runs once per block, so its cost
  // is the instruction fetch — the per-value form (a K unit decoded with divisions per value, 28 KB of SASS) took 14-25 us
  // per block before the first row could start (NOTES run 19).
  constexpr int KC = (DT == FF_F32) ? 4 : 8, OB = (DT == FF_F32) ? 4 : 2;
  const int m = tid & 63, h = (tid >> 6) & 1, cs = p.R * p.S;
  const long long mrow = (long long)min(m, p.K - 1) * p.C * cs;
#pragma unroll 1
  for (int j0 = tid >> 7; j0 < p.na; j0 += OB * (nthr >> 7)) {
    float v[OB][KC];
#pragma unroll
    for (int o = 0; o < OB; ++o) {
      const int j = min(j0 + o * (nthr >> 7), WG_MAXOPS - 1);
      const int cnt = (j0 + o * (nthr >> 7) < p.na && m < p.K) ? p.op_wn[h][j] : 0;
      const long long base = mrow + p.op_wo[h][j];
#pragma unroll
      for (int e = 0; e < KC; ++e) v[o][e] = e < cnt ? load_elem_f<DT>(p.w, base + (long long)e * cs) : 0.0f;
      if (cnt < 0 && p.bias != nullptr) {   // the bias pair: b_hi rounded to the operand type, b_lo = the rest
        const float b = __ldg(p.bias + m);
        float bh;
        if (DT == FF_F32) bh = __uint_as_float(f2tf32(b));
        else if (DT == FF_BF16) bh = __bfloat162float(__float2bfloat16_rn(b));
        else bh = __half2float(__float2half_rn(b));
        v[o][0] = bh; v[o][1] = b - bh;
      }
    }
#pragma unroll
    for (int o = 0; o < OB; ++o) {
      const int j = j0 + o * (nthr >> 7);
      if (j >= p.na) break;
      unsigned char* dst = smem + j * 2048 + h * 1024 + m * 16;
#pragma unroll
      for (int e = 0; e < KC; ++e) bound.add(v[o][e]);
      if (DT == FF_F32) {
        uint4 t;
        t.x = f2tf32(v[o][0]); t.y = f2tf32(v[o][1]); t.z = f2tf32(v[o][2]); t.w = f2tf32(v[o][3]);
        *reinterpret_cast<uint4*>(dst) = t;
        if (SPLIT) {   // the small op: K chunk 0 = bf16(w - w_hi), chunk 1 = bf16(w), 8 channels each (see wg_issue)
          unsigned char* sa = smem + p.a_small_off + j * 2048 + m * 16 + h * 8;
          uint2 lo, full;
          lo.x = pack2<FF_BF16>(v[o][0] - __uint_as_float(t.x), v[o][1] - __uint_as_float(t.y));
          lo.y = pack2<FF_BF16>(v[o][2] - __uint_as_float(t.z), v[o][3] - __uint_as_float(t.w));
          full.x = pack2<FF_BF16>(v[o][0], v[o][1]);
          full.y = pack2<FF_BF16>(v[o][2], v[o][3]);
          *reinterpret_cast<uint2*>(sa) = lo;
          *reinterpret_cast<uint2*>(sa + 1024) = full;
        }
      } else {
        uint4 t;
        t.x = pack2<DT>(v[o][0], v[o][1]); t.y = pack2<DT>(v[o][2], v[o][3]);
        t.z = pack2<DT>(v[o][4], v[o][5]); t.w = pack2<DT>(v[o][6], v[o][7]);
        *reinterpret_cast<uint4*>(dst) = t;
      }
    }
  }
}

// A thread's partials of channel m0 + 8h over its pixel pair, reduced over the quad (tig 0..3) that shares the
// channel: every thread of the quad gets the value; the partials restart at init.  mean: sum, else NaN-propagating max.
__device__ __forceinline__ float wg_quad_reduce(float (&r)[2], bool mean, float init) {
  float a = mean ? r[0] + r[1] : ff_max_nan(r[0], r[1]);
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    const float b = __shfl_xor_sync(0xffffffffu, a, o);
    a = mean ? a + b : ff_max_nan(a, b);
  }
  r[0] = r[1] = init;
  return a;
}

// The lines [L0, L1) of a block, walked piece by piece (a piece = consecutive output rows of one image and segment,
// whose input rows, nrows of them, stream through the ring once).
struct WGPiece {
  long long n; int np, qv, hbase, wbase, nrows, nhalf;
  __device__ __forceinline__ WGPiece(const WGParams& p, long long l, long long L1) {
    n = l / p.lines_img;
    const int rem = (int)(l - n * p.lines_img);
    const int seg = rem / p.P, pa = rem - seg * p.P;
    np = (int)min((long long)(p.P - pa), L1 - l);
    const int q0 = seg * WG_NT;
    qv = min(WG_NT, p.Q - q0);
    hbase = pa * p.sh - p.ph;
    wbase = q0 - p.pw;
    nrows = (np - 1) * p.sh + (p.R - 1) * p.dh + 1;
    nhalf = qv > WG_NT / 2 ? 2 : 1;
  }
};

// The lines of block b are [wg_line0(b), wg_line0(b + 1)): equal shares.  (Weighting them per launch wave — the third
// wave's blocks of an SM finished ~8 % after the first's — made the kernel slower: NOTES run 19.)
__device__ __forceinline__ long long wg_line0(const WGParams& p, long long b) { return b * p.L / p.G; }
// the block holding line l: the last b with wg_line0(b) <= l
__device__ __forceinline__ long long wg_block_of(const WGParams& p, long long l) { return ((l + 1) * p.G + p.L - 1) / p.L - 1; }

// Blocks that hold lines of image n (wg_block_of its first and last line), and the work of the last of them to
// flush the image in the deterministic-mean and max modes: out[n, :] from the per-block partials summed in block order
// (mean) or from the ordered-uint maxima, which it re-zeroes with the image's arrival counter (threads t of nthr).
// POOL: the pool code when the caller has it at compile time, -1 to read p.pool.
__device__ __forceinline__ void wg_image_blocks(const WGParams& p, long long n, long long& blo, long long& bhi) {
  const long long la = n * p.lines_img, lb = la + p.lines_img - 1;
  blo = wg_block_of(p, la);
  bhi = wg_block_of(p, lb);
}
// Not inlined: it runs once per image and block at most, and inlined (with its batched loads) it cost the 16-bit
// kernels' main loop 16-40 bytes of stack.
template <int POOL = -1>
__device__ __noinline__ void wg_finish_image(const WGParams& p, long long n, long long blo, long long bhi, int t, int nthr) {
  __threadfence();
  if (POOL >= 0 ? POOL == FF_POOL_MEAN : p.pool == FF_POOL_MEAN) {
    // summed in a fixed order: NS consecutive threads share channel k, thread `slice` sums the blocks blo + slice,
    // blo + slice + NS, ... loading 32 at a time so that their L2 latencies overlap (an image held by hundreds of blocks
    // — small N — made one load after another the kernel's tail: N = 1 took longer than N = 8), then the NS sums are
    // combined by a fixed butterfly.  Block b's partial of image n sits at its slot n - (b's first image); every block
    // after blo starts inside image n (its first line lies in (first line of n, last line of n]), so only blo's slot
    // needs the division.
    constexpr int NS = 4, BATCH = 32;
    const long long jlo = n - wg_line0(p, blo) / p.lines_img;
    const int slice = t % NS;
    for (int k0 = 0; k0 < p.K; k0 += nthr / NS) {          // trip count uniform over the block (the shuffles below)
      const int k = k0 + t / NS;
      const float* part = p.ws_part + min(k, p.K - 1);
      float s = 0.0f;
      for (long long b0 = blo + slice; b0 <= bhi; b0 += NS * BATCH) {
        float v[BATCH];
#pragma unroll
        for (int e = 0; e < BATCH; ++e) {
          const long long b = b0 + (long long)e * NS;
          v[e] = b <= bhi ? __ldcg(part + (b * p.J + (b == blo ? jlo : 0)) * 64) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < BATCH; ++e) s += v[e];
      }
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (slice == 0 && k < p.K) p.out[n * p.K + k] = s * p.inv_pq;
    }
  } else {
    for (int k = t; k < p.K; k += nthr) {
      unsigned* a = p.ws_max + n * p.K + k;
      p.out[n * p.K + k] = dec_max(__ldcg(a));
      *a = 0u;
    }
  }
  if (t == 0) p.ws_cnt[n] = 0;
}

// The 16-bit epilogue's tensor-core sums (dm, already over the quad) join lane tig 0's partials at an image's flush.
__device__ __forceinline__ void wg_h2_fold(float (&red)[2][2], float (&dm)[4], int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) red[h][0] += tig == 0 ? dm[2 * h] : 0.0f;
  dm[0] = dm[1] = dm[2] = dm[3] = 0.0f;
}

// Both wgmma kernels: 16-bit GELU means take the half-precision epilogue (wg_epi_h2_checked), which checks its own
// range, so their rows need no input bound
template <int DT>
__device__ __forceinline__ bool wg_h2_cap(const WGParams& p) {
  return DT != FF_F32 && p.h2 && p.gelu_fast && p.act == FF_ACT_GELU_ERF && p.pool == FF_POOL_MEAN;
}

// MINB = blocks per SM the register budget is cut for (4: 128 registers, 3: 168, 2: 255)
template <int DT, bool SPLIT, int LM, int NOPS, int MINB>
__global__ void __launch_bounds__(128, MINB) fa_wgmma_kernel(const __grid_constant__ WGParams p) {
#ifdef FA_HAVE_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr bool TMA = wg_lm_tma(LM);
  // TMA destinations must be 128-byte aligned; the dynamic shared memory starts after the static (1040 bytes on sm_90),
  // whatever alignment the declaration asks for, so the TMA kernels move their layout up to the next 128 bytes (wg_plan
  // adds them)
  unsigned char* const smem = smem_raw + (TMA ? (128u - ((uint32_t)__cvta_generic_to_shared(smem_raw) & 127u)) & 127u : 0u);
  const uint32_t sbase16 = (uint32_t)__cvta_generic_to_shared(smem) >> 4;
  __shared__ int last_s;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem) + (uint32_t)p.ring_off;
  uint32_t* dtab = reinterpret_cast<uint32_t*>(smem + p.dtab_off);
  FA_DIAG_STAMP(0);
  const long long L0 = wg_line0(p, blockIdx.x), L1 = wg_line0(p, blockIdx.x + 1);
  // GELU (erf) in its clamp-free form while every staged input, weight and bias is bounded (WGInBound, wg_epi)
  const bool gelu_fast = p.gelu_fast && p.act == FF_ACT_GELU_ERF;
  const bool h2_cap = wg_h2_cap<DT>(p);
  // the post-copy pass of 16-bit channels_last rows (the bound: its only work there) only when the bound is used; 16-bit
  // TNCHW skips the bound then
  const bool tpost = DT == FF_F32 || (gelu_fast && !h2_cap);
  WGInBound bound;
  const WGTn16 tn(p, NOPS > 0);   // (16-bit TNCHW only; dead code elsewhere)
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
      for (int s = 0; s < p.NST; ++s) mbar_init(bar0 + 8u * s, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    if (L0 < L1) {
      const WGPiece pc(p, L0, L1);
      pre = min(p.NST, wg_group_hi(p, min(p.D, pc.np) - 1) + 1);
      if (tid == 0)
        for (int j = 0; j < pre; ++j) wg_tma_row<DT, LM>(p, ring, stage0, bar0, j, pc.n, pc.hbase + j, pc.wbase);   // (pre <= NST)
    }
  } else if (LM != WG_LM_REG && L0 < L1) {
    const WGPiece pc(p, L0, L1);
    for (int t = 0; t < p.D; ++t) {
      if (!DIAG_OFF(8)) wg_group<DT, SPLIT, LM, 0>(p, ring, t, pc.np, pc.n, pc.hbase, pc.wbase, bound);
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
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
#ifdef FF_FUSED_A_DIAG
  __syncthreads();
  FA_DIAG_STAMP(1);
  bool first_rows = true;
  if (threadIdx.x == 0 && blockIdx.x < FA_DIAG_MAXB) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    fa_diag_t[blockIdx.x][5] = smid;
    fa_diag_t[blockIdx.x][6] = (unsigned long long)(L1 - L0);
  }
#endif

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
    if (last_s) wg_finish_image(p, n, blo, bhi, tid, 128);
    __syncthreads();
  };

  for (long long l = L0; l < L1;) {
    const WGPiece pc(p, l, L1);
    const long long n = pc.n;
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
              wg_tma_row<DT, LM>(p, ring, stage0, bar0, wg_stage_of(p, r), n, hbase + r, wbase);
          issued = want;
        }
        wg_tma_take<DT, SPLIT, LM>(p, ring, stage0, bar0, tak, tph, tpost, bound, tn);
      }
      if (issued < nahead) {
        __syncthreads();
        if (tid == 0)
          for (int r = issued; r < nahead; ++r)
            wg_tma_row<DT, LM>(p, ring, stage0, bar0, wg_stage_of(p, r), n, hbase + r, wbase);
      }
    } else if (LM != WG_LM_REG) {
      for (int t = 0; t < p.D && l != L0; ++t) {                // (the first piece's went out before the setup)
        if (!DIAG_OFF(8)) wg_group<DT, SPLIT, LM, 0>(p, ring, t, np, n, hbase, wbase, bound);
        asm volatile("cp.async.commit_group;" ::: "memory");
      }
    } else {
      wg_group<DT, SPLIT, LM, 0>(p, ring, 0, np, n, hbase, wbase, bound);
    }
    // post-copy pass (MODE 1: tf32 rounding, NCHW transposes, the input bound) of row group t + 1 and the copies of
    // group t + D run while row t's wgmmas do: only the barrier stays between rows
    const bool mode1 = LM != WG_LM_REG && (tpost || LM == WG_LM_NCHW8);
    if (LM != WG_LM_REG && !TMA) {
      cp_wait_n(p.D - 1);
#ifdef FF_FUSED_A_DIAG
      if (first_rows) { FA_DIAG_STAMP(2); first_rows = false; }
#endif
      if (mode1 && !DIAG_OFF(9)) wg_group<DT, SPLIT, LM, 1>(p, ring, 0, np, n, hbase, wbase, bound);
    }
    int rs = 0;                                                  // ring slot of input row t*sh
    for (int t = 0; t < np; ++t) {
      if (!DIAG_OFF(11)) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      // the rows of output row t are in (and bounded, where the epilogue needs to know?)  (DIAG_OFF 11: this thread's
      // view, no barrier)
      bool in_ok = true;
      if (h2_cap) {
        if (!DIAG_OFF(11)) __syncthreads();
      } else {
        in_ok = DIAG_OFF(11) ? bound.ok<DT>() : __syncthreads_and(bound.ok<DT>()) != 0;
      }
      const bool fast = gelu_fast && in_ok;
      // ---- row t as two 64 x 128 halves (64 accumulator registers: the other blocks on the SM hide each other's
      //      MMA and epilogue latencies) ----
#pragma unroll 1
      for (int half = 0; half < pc.nhalf; ++half) {
        if (!DIAG_OFF(12)) wg_issue<DT, SPLIT, NOPS>(p, acc, sbase16, dtab, rs, half);
        if constexpr (TMA) {
          if (half == 0 && tid == 0 && t + p.D < np) {   // group t + D (TVEC: into the ring slots row t - 1 left)
            // its first row is (D - 1) sh rows past the next to take, wg_group_hi(t) + 1 (< NST rows: one wrap at most)
            int st = tak.st() + (p.D - 1) * p.sh;
            st -= st >= p.NST ? p.NST : 0;
            for (int r = wg_group_hi(p, t + p.D - 1) + 1; r <= wg_group_hi(p, t + p.D); ++r) {
              wg_tma_row<DT, LM>(p, ring, stage0, bar0, st, n, hbase + r, wbase);
              st = wg_stage_next(p, st);
            }
          }
          if (half == pc.nhalf - 1 && t + 1 < np)      // group t + 1: wait, post-copy pass
            for (int r = wg_group_hi(p, t) + 1; r <= wg_group_hi(p, t + 1); ++r)
              wg_tma_take<DT, SPLIT, LM>(p, ring, stage0, bar0, tak, tph, tpost, bound, tn);
        } else {
          if (half == 0) {   // group t + D into the ring slots row t - 1 left (not read by row t's wgmmas)
            if (!DIAG_OFF(8)) wg_group<DT, SPLIT, LM, 0>(p, ring, LM == WG_LM_REG ? t + 1 : t + p.D, np, n, hbase, wbase, bound);
            if (LM != WG_LM_REG) asm volatile("cp.async.commit_group;" ::: "memory");
          }
          if (LM != WG_LM_REG && half == pc.nhalf - 1) {   // group t + 1's copies (committed D groups ago) have landed
            cp_wait_n(p.D - 1);
            if (mode1 && !DIAG_OFF(9)) wg_group<DT, SPLIT, LM, 1>(p, ring, t + 1, np, n, hbase, wbase, bound);
          }
        }
        if (!DIAG_OFF(12)) wg_wait0();
        if (!DIAG_OFF(10)) wg_epi_any<DT, SPLIT>(p, acc, red, dm, qv - half * (WG_NT / 2), tig, fast, h2_cap);
      }
      rs += p.sh;
      rs -= (rs >= p.RB) ? p.RB : 0;
    }
    if (LM != WG_LM_REG && !TMA) asm volatile("cp.async.wait_all;" ::: "memory");
    l += np;
  }
  FA_DIAG_STAMP(3);
  flush(cur_n);
  FA_DIAG_STAMP(4);
#else
  __trap();
#endif
}

// --------------------------------------------------------------------------------------------------------------
// Host side
namespace {
struct Plan {
  const char* why;       // the call is invalid or has nothing to compute: no kernel serves it
  const char* mma_why;   // why the mma.sync kernel cannot serve it (the sm_90 wgmma kernel may; see choose)
  int P, Q, CG, nu, BR, QS, nbands, nseg, nksl, TR, TWa, NW, MT, PIXB;
  size_t smem, ws_cnt_bytes, ws_bytes;
};

// Tuning knobs, read once per process. They never affect correctness (every setting passes the same checks); they can
// change the summation order, so deterministic mode is bitwise reproducible for a fixed setting: FF_FUSED_A_IMPL = 0 auto (wgmma on sm_90 where supported), 1 mma.sync path only;
// FF_FUSED_A_WG16 = 0 keeps 16-bit inputs on the mma.sync kernel; FF_FUSED_A_NCHW4 = 0 reads NCHW fp32 with 4-byte copies instead of 16-byte ones; FF_FUSED_A_RB = max ring slots (2..16, default 8); FF_FUSED_A_BPS = blocks per SM for the wgmma path (1..4, default 3: the 168-register build measured
// 0.584 / 0.743 ms NHWC / NCHW TF32 at the seed against 0.674 / 0.847 for 4 blocks of 128 registers; 3xTF32 uses at most 2);
// FF_FUSED_A_VEC16 = 0 reads 16-bit input with register loads (REG) instead of 16-byte copies (VEC, NCHW8).
// FF_FUSED_A_PAIR16 = 0 gives each 16-bit k16 op one tap (8 channels + 8 zero-weight columns) instead of two;
// FF_FUSED_A_COL16 = 0 keeps taps (0, 2) and (1, 2) of a 16-bit 3x3 filter in ops of their own (6 ops, the general kernel).
// FF_FUSED_A_NOCLAMP = 0 evaluates GELU (erf) with ff_gelu_erf everywhere instead of the clamp-free form (wg_epi);
// FF_FUSED_A_FULLTILE = 0 keeps the per-column-block mask tests in whole 16-bit tiles too (fp32 always has them).
// FF_FUSED_A_TMA = 0 keeps the input on the per-thread 16-byte copies (VEC / NCHW4 / NCHW8) instead of the TMA loaders.
// FF_FUSED_A_MINBPS = fewest blocks per SM the wgmma kernel may shrink to when a large filter's ring needs the room
// (default 2; a shape that fits only one block per SM runs the fallback, measured faster there).
struct Knobs { int impl, rb, bps, nchw4, wg16, vec16, pair16, noclamp, fulltile, minbps, tma, h2, col16; };
const Knobs& knobs() {
  static const Knobs k = [] {
    auto get = [](const char* name, int dflt) { const char* s = getenv(name); return s ? atoi(s) : dflt; };
    Knobs r{get("FF_FUSED_A_IMPL", 0), get("FF_FUSED_A_RB", 8), get("FF_FUSED_A_BPS", 3), get("FF_FUSED_A_NCHW4", 1), get("FF_FUSED_A_WG16", 1),
            get("FF_FUSED_A_VEC16", 1), get("FF_FUSED_A_PAIR16", 1), get("FF_FUSED_A_NOCLAMP", 1), get("FF_FUSED_A_FULLTILE", 1),
            get("FF_FUSED_A_MINBPS", 2), get("FF_FUSED_A_TMA", 1), get("FF_FUSED_A_H2", 1), get("FF_FUSED_A_COL16", 1)};
    if (r.rb < 2 || r.rb > 16) r.rb = 8;
    if (r.bps < 1 || r.bps > 4) r.bps = 3;
    if (r.minbps < 1 || r.minbps > 4) r.minbps = 2;
    return r;
  }();
  return k;
}
struct DevInfo { int major, minor, nsm; };
DevInfo dev_info() {
  static DevInfo cache[64];
  static bool have[64];
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (!have[dev]) {
    DevInfo d{0, 0, 1};
    cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&d.nsm, cudaDevAttrMultiProcessorCount, dev);
    if (d.nsm < 1) d.nsm = 1;
    cache[dev] = d;
    have[dev] = true;
  }
  return cache[dev];
}

Plan make_plan(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw,
               int ph, int pw, int dh, int dw, int activation, int pool, int precision, int deterministic) {
  Plan pl{};
  pl.why = pl.mma_why = nullptr;
  if (dtype < 0 || dtype > 2) { pl.why = "fused_conv_act_pool: dtype must be 0 (fp32), 1 (bf16) or 2 (fp16)"; return pl; }
  if (activation < 0 || activation > 4) { pl.why = "fused_conv_act_pool: unknown activation code"; return pl; }
  if (pool < 0 || pool > 1) { pl.why = "fused_conv_act_pool: pool must be 0 (mean) or 1 (max)"; return pl; }
  if (precision < 0 || precision > 1) { pl.why = "fused_conv_act_pool: precision must be 0 (tf32) or 1 (ieee)"; return pl; }
  if (channels_last < 0 || channels_last > 1) { pl.why = "fused_conv_act_pool: channels_last must be 0 or 1"; return pl; }
  if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || K <= 0 || R <= 0 || S <= 0) { pl.why = "fused_conv_act_pool: empty or negative extent"; return pl; }
  if (sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 || ph < 0 || pw < 0) { pl.why = "fused_conv_act_pool: stride/dilation must be >= 1 and padding >= 0"; return pl; }
  long long P = ((long long)H + 2LL * ph - (long long)dh * (R - 1) - 1) / sh + 1;
  long long Q = ((long long)W + 2LL * pw - (long long)dw * (S - 1) - 1) / sw + 1;
  if ((long long)H + 2LL * ph < (long long)dh * (R - 1) + 1 || (long long)W + 2LL * pw < (long long)dw * (S - 1) + 1 || P <= 0 || Q <= 0) {
    pl.why = "fused_conv_act_pool: the convolution output is empty (kernel larger than the padded input)"; return pl;
  }
  if (P > (1 << 30) || Q > (1 << 30)) { pl.why = "fused_conv_act_pool: output extent too large"; return pl; }
  pl.P = (int)P; pl.Q = (int)Q;
  pl.CG = (C + 7) / 8;
  long long nu = (long long)R * S * pl.CG;
  if (nu > NU_MAX) {
    pl.mma_why = "fused_conv_act_pool: R*S*ceil(C/8) > 9 K units of 8 input channels: beyond the mma.sync kernel (9, "
                 "register-resident weights); the sm_90 wgmma kernel takes up to 64 with stride-1 columns, <= 64 output "
                 "channels and a ring of input rows that fits in shared memory";
    return pl;
  }
  pl.nu = (int)nu;
  pl.PIXB = (dtype == FF_F32) ? 32 : 16;
  const bool split = (dtype == FF_F32 && precision == FF_PREC_IEEE);
  pl.MT = split ? 2 : 4;
  pl.NW = 4;
  // measured on H200 (seed): fp32 2 blocks x 100 KB (255 regs); 16-bit 3 blocks x 72 KB (168 regs)
  const int kb_default = pl.NW == 8 ? 200 : (pl.NW == 4 ? (dtype == FF_F32 ? 100 : 72) : 50);
  const long long budget = kb_default * 1024LL;
  const int brcap = 64;
  // width segment: full output width if a 1-row band fits, else the widest multiple of 16 that fits
  auto tw_of = [&](long long qs) { return ((qs + 15) / 16 * 16 - 1) * sw + (long long)(S - 1) * dw + 1; };
  const long long trmin = (long long)(R - 1) * dh + 1;
  long long QS = Q;
  if (pl.CG * tw_of(QS) * pl.PIXB * trmin > budget) {
    QS = 16;
    if (pl.CG * tw_of(QS) * pl.PIXB * trmin > budget) {
      pl.mma_why = "fused_conv_act_pool: the input tile with its halo for one row of 16 output pixels does not fit in shared memory";
      return pl;
    }
    while (pl.CG * tw_of(QS + 16) * pl.PIXB * trmin <= budget && QS + 16 < Q) QS += 16;
  }
  long long rowbytes = pl.CG * tw_of(QS) * pl.PIXB;
  long long trmax = budget / rowbytes;
  long long BR = (trmax - trmin) / sh + 1;
  if (BR > brcap) BR = brcap;
  if (BR > P) BR = P;
  if (BR < 1) BR = 1;
  long long nb = (P + BR - 1) / BR;
  BR = (P + nb - 1) / nb;                                 // even out the bands
  pl.BR = (int)BR; pl.QS = (int)QS;
  pl.nbands = (int)nb; pl.nseg = (int)((Q + QS - 1) / QS); pl.nksl = (K + 63) / 64;
  pl.TR = (int)((BR - 1) * sh + trmin);
  pl.TWa = (int)tw_of(QS);
  pl.smem = (size_t)pl.CG * pl.TR * pl.TWa * pl.PIXB;
  long long blocks = N * pl.nksl * pl.nbands * pl.nseg;
  if (blocks > 0x7fffffffLL) { pl.mma_why = "fused_conv_act_pool: too many blocks (N too large)"; return pl; }
  const bool need_ws = (pool == FF_POOL_MAX) || deterministic;
  pl.ws_cnt_bytes = need_ws ? (size_t)((N * 4 + 255) / 256 * 256) : 0;
  if (!need_ws) pl.ws_bytes = 0;
  else if (pool == FF_POOL_MAX) pl.ws_bytes = pl.ws_cnt_bytes + (size_t)N * K * 4;
  else pl.ws_bytes = pl.ws_cnt_bytes + (size_t)N * pl.nksl * pl.nbands * pl.nseg * 64 * 4;
  return pl;
}

template <int DT, bool SPLIT, int MT, int NW, bool FULL>
int launch_t(const FAParams& prm, const Plan& pl, long long blocks, cudaStream_t stream) {
  auto kern = fused_conv_act_pool_kernel<DT, SPLIT, MT, NW, FULL>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem);
  if (e != cudaSuccess) return (int)e;
  long long grid = blocks;
  {
    int dev = 0, nsm = 0, occ = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, NW * 32, pl.smem);
    if (occ < 1) occ = 1;
    if ((long long)occ * nsm < grid) grid = (long long)occ * nsm;
  }
  kern<<<(unsigned)grid, NW * 32, pl.smem, stream>>>(prm);
  return (int)cudaGetLastError();
}

template <int DT, bool SPLIT, int MT>
int launch_nw(const FAParams& prm, const Plan& pl, long long blocks, cudaStream_t stream) {
  const bool full = (pl.nu == NU_MAX);
  return full ? launch_t<DT, SPLIT, MT, 4, true>(prm, pl, blocks, stream) : launch_t<DT, SPLIT, MT, 4, false>(prm, pl, blocks, stream);
}

// ---- wgmma path plan (sm_90 only; shapes with stride-1 columns, K <= 64, a ring that fits) ----
struct WGPlan {
  bool ok;
  int lm, bps;   // the input loader (WG_LM_*) the layout is for; blocks per SM
  const char* why;   // set when the shape is beyond this kernel's capacity (for the user's message)
  WGParams prm;
  size_t smem, ws_cnt_bytes, ws_bytes;
};

// The op count a straight-line kernel (wgmma issue without a fence per op) exists for, else 0: fp32 3x3 over <= 8
// channels (9 taps + bias) and 16-bit 3x3 over <= 8 channels with the column pair (5, col).  Others (another 16-bit
// filter of 5 ops too) take the general kernel.
int wg_straight_ops(int dtype, int nops, bool col) {
  return (dtype == FF_F32 ? nops == WG_OPS3X3 : col && nops == WG_COL16_OPS) ? nops : 0;
}

WGPlan wg_plan_lm(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
                  int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, const Plan& base, int lm) {
  WGPlan w{};
  w.ok = false;
  w.why = nullptr;
  w.lm = lm;
  const bool tvec = lm == WG_LM_TVEC, tnchw = lm == WG_LM_TNCHW, tma = tvec || tnchw;
  if (base.why || knobs().impl != 0) return w;
  const DevInfo di = dev_info();
  if (!(di.major == 9 && di.minor == 0)) return w;
  if (sw != 1 || K > 64) return w;
  // 16-bit inputs: k16 ops = 8 channels + 8 more columns (FF_FUSED_A_WG16=0: mma.sync path)
  if (dtype != FF_F32 && !knobs().wg16) return w;
  const bool split = (dtype == FF_F32 && precision == FF_PREC_IEEE);
  WGParams& p = w.prm;
  p.N = (int)N; p.C = C; p.H = H; p.W = W; p.K = K; p.R = R; p.S = S; p.sh = sh; p.ph = ph; p.pw = pw; p.dh = dh; p.dw = dw;
  p.P = base.P; p.Q = base.Q; p.act = activation; p.pool = pool; p.det = deterministic ? 1 : 0;
  p.CG = base.CG;
  p.nseg = (p.Q + WG_NT - 1) / WG_NT;
  long long twa = ((long long)WG_NT + (long long)(S - 1) * dw + 7) / 8 * 8;
  if (twa > 4096) return w;
  p.TWa = (int)twa;
  // TMA boxes of at most 256 columns: TVEC's tma_bc % 8 == 0 (each box lands 128-byte aligned in its plane); TNCHW fp32
  // tma_bc % 8 == 4 (the stage's two 4-channel halves 64 bytes apart modulo 128, wg_tnchw_row), 16-bit tma_bc % 64 == 8
  // (channel rows 16 bytes apart modulo 128, wg_tnchw16_row)
  const int cpb = dtype == FF_F32 ? 4 : 8;   // columns per 16 bytes of NCHW input: TNCHW boxes start at a multiple
  const int tdelta = tnchw ? ((-pw) % cpb + cpb) % cpb : 0;   // wbase mod cpb (segments start at multiples of 256 columns)
  const long long cols = (long long)WG_NT + (long long)(S - 1) * dw + tdelta;   // the columns a row's ops read (+ delta)
  int nbox = 0, bc = 0;
  if (tma) {
    for (nbox = (int)((cols + 255) / 256);; ++nbox) {
      bc = (int)((cols + nbox - 1) / nbox);
      bc = tvec ? (bc + 7) / 8 * 8 : dtype == FF_F32 ? (bc + 3) / 8 * 8 + 4 : (bc + 55) / 64 * 64 + 8;
      if (bc <= 256) break;
    }
  }
  // a channel plane: slack both sides (NCHW4 / NCHW8 groups overhang), then fp32 planes start 64 (channels_last: the
  // 16-byte copies alternate planes, 8 threads -> 8 bank groups) or 32 bytes (NCHW4: see there) apart modulo 128;
  // TVEC: 128-byte aligned planes of the slack and the TMA boxes
  const long long plane = tvec ? ((long long)WG_PAD + (long long)nbox * bc) * 16
                               : ((long long)p.TWa + 2 * WG_PAD) * 16 + (dtype != FF_F32 ? 0 : channels_last ? 64 : 32);
  p.plane_bytes = (int)plane;
  p.nq = dtype == FF_F32 ? (p.TWa + 3) / 4 + 1 : (p.TWa + 7) / 8 + 1;   // NCHW4 / NCHW8 column groups per row
  const long long big = (dtype == FF_F32) ? p.CG * 2 * plane : (p.CG + 1) * plane;   // 16-bit: + the ones plane
  const long long slot = split ? 2 * big : big;
  p.small_off = (int)big;
  // 16-bit, one channel group: two taps per k16 op (see the ops below)
  const int step_s = (dtype != FF_F32 && p.CG == 1 && knobs().pair16) ? 2 : 1;
  const long long span = (long long)(R - 1) * dh;
  // 16-bit: the bias rides in a spare K chunk (an op with one tap) when there is one, else in an op of its own
  const bool bias_spare = dtype != FF_F32 && (step_s == 1 || S % 2 == 1);
  // 16-bit 3x3, one channel group: taps (0, 2) and (1, 2) in one op (WG_COL16_OPS)
  const bool col16 = step_s == 2 && R == 3 && S == 3 && knobs().col16;
  const long long nops_pred = (long long)R * ((S + step_s - 1) / step_s) * p.CG + (bias_spare ? 0 : 1) - (col16 ? 1 : 0);
  if (nops_pred > WG_MAXOPS) {
    w.why = "fused_conv_act_pool: more than 64 K units of 8 input channels (R*S*ceil(C/8), + bias) for the sm_90 kernel";
    return w;
  }
  const long long na = nops_pred + (col16 ? 1 : 0);              // A blocks: + the column op's swapped copy
  const long long abytes = na * 2048 * (split ? 2 : 1);   // A operands: 2 KB per op (+ the ieee small ops)
  p.lines_img = (long long)p.nseg * p.P;
  p.L = N * p.lines_img;
  const int nops_line = wg_straight_ops(dtype, (int)nops_pred, col16);   // > 0: a straight-line kernel serves it
#ifdef FF_FUSED_A_DIAG
  p.diag = getenv("FF_FUSED_A_DIAG_OFF") ? atoi(getenv("FF_FUSED_A_DIAG_OFF")) : 0;
#endif
  const long long need = (long long)sh + span + 1;     // ring slots: the rows of one output row + the next row's first
  constexpr long long ONES = 128;                     // the bias op's ones block (8 rows x 16 B)
  auto dtab_bytes = [&](long long slots) { return slots * 2 * WG_DSTRIDE(nops_line) * 4; };   // B descriptor table (wg_dtab_fill)
  // TMA: TNCHW's stages (D = 2 row groups in flight, sh rows each) and the stages' mbarriers (TVEC: one per ring slot),
  // + 2 x 128 bytes to align the stages and the whole layout (fa_wgmma_kernel)
  const int tnchw_d = 2;
  const long long stage_bytes = tnchw ? (long long)p.CG * nbox * 8 * bc * (dtype == FF_F32 ? 4 : 2) : 0;
  const long long nst_tnchw = (long long)tnchw_d * sh;
  auto tma_bytes = [&](long long slots) {
    return !tma ? 0LL : tvec ? 8 * slots + 256 : nst_tnchw * (stage_bytes + 8) + 256;
  };
  // blocks per SM: the knob (3xTF32: at most 2), fewer when the ring of a large filter / many channels needs it;
  // 227 KB per SM, 1 KB reserved per block
  int bps = split ? (knobs().bps < 2 ? knobs().bps : 2) : knobs().bps;
  auto budget_of = [&](int b) { return 232448LL / b - 1024 - 64 - abytes; };
  const int bps_asked = bps;
  while (bps > 1 && need * slot + ONES + dtab_bytes(need) + tma_bytes(need) > budget_of(bps)) --bps;
  // one block per SM, no other block to fill its MMA and epilogue gaps: measured slower than cuDNN + the fused
  // epilogue kernel (benchmarks/NOTES.md run 17: 3x3 over 24 / 32 channels), so such shapes run the fallback
  if (bps < std::min(bps_asked, knobs().minbps)) {
    w.why = "fused_conv_act_pool: the sm_90 kernel's weights and ring of input rows leave room for one block per SM "
            "(filter height x channels x 256 columns): slower than the fallback (knob FF_FUSED_A_MINBPS=1 allows it)";
    return w;
  }
  const long long budget = budget_of(bps);
  long long rb = need;                                // any slot count: the kernel indexes the ring modulo RB
  if (rb * slot + ONES + dtab_bytes(rb) + tma_bytes(rb) > budget || rb > 64) {
    w.why = "fused_conv_act_pool: the sm_90 kernel's weights and ring of input rows (filter height x channels x 256 "
            "columns) do not fit in shared memory";
    return w;
  }
  while (!tnchw && rb + 1 <= knobs().rb && (rb + 1) * slot + ONES + dtab_bytes(rb + 1) + tma_bytes(rb + 1) <= budget) ++rb;
  p.RB = (int)rb;
  if (tnchw) {
    p.D = tnchw_d;
  } else {
    p.D = (int)((rb - 1 - span) / sh);
    if (p.D > 8) p.D = 8;
  }
  if (p.D < 1) return w;
  w.bps = bps;
  p.slot_bytes = (int)slot;
  p.a_small_off = (int)(nops_pred * 2048);
  p.ring_off = (int)abytes;
  p.ones_off = (int)(abytes + rb * slot);
  p.dtab_off = (int)(abytes + rb * slot + ONES);
  w.smem = (size_t)(abytes + rb * slot + ONES + dtab_bytes(rb));
  if (tma) {   // [stages][mbarriers] after the descriptor table
    p.NST = tvec ? (int)rb : (int)nst_tnchw;
    p.stage_off = (int)((w.smem + 127) / 128 * 128);
    p.stage_bytes = (int)stage_bytes;
    p.bar_off = p.stage_off + p.NST * p.stage_bytes;
    w.smem = (size_t)p.bar_off + 8 * (size_t)p.NST + 128;   // + the kernel's alignment of its layout to 128 bytes
    p.tma_nbox = nbox; p.tma_bc = bc; p.tma_cols = (int)cols; p.tma_delta = tdelta;
    p.tma_bytes = tvec ? p.CG * (dtype == FF_F32 ? 2 : 1) * nbox * bc * 16 : (int)stage_bytes;
  }
  // ops
  int nops = 0;
  for (int j = 0; j < WG_MAXOPS; ++j) {
    p.op_u0[j] = p.op_u1[j] = WG_UNIT_NONE;
    p.op_d[j] = p.op_mask[j] = p.op_hi[j] = 0u; p.op_rd[j] = 0;
  }
  // 16-bit, one channel group (step_s 2): the two 8-column K chunks of a k16 op are taps (r, s) and (r, s + 1) — the
  // second tap's pixels are the first's shifted by dw columns, i.e. LBO = dw positions — so a row of S taps takes
  // ceil(S / 2) ops instead of S (FF_FUSED_A_PAIR16 = 0: one tap per op, the second chunk zero weights on the ones plane)
  // ring operand: K-major core matrices, SBO = 8 pixels (128 B), LBO = to the next K chunk (fp32: the second 4-channel
  // plane; 16-bit: the next tap's pixels, or the slot's ones plane, read by 8 zero-weight columns or by the bias; the
  // column pair: 0 here, the ring slots' distance from the descriptor table)
  auto add_op = [&](int u0, int u1, long long off, long long lbo, int rd) {
    p.op_u0[nops] = u0; p.op_u1[nops] = u1;
    p.op_d[nops] = (unsigned)((p.ring_off + off) >> 4) | ((unsigned)(lbo >> 4) << 16);
    p.op_mask[nops] = 0xFFFFFFFFu; p.op_hi[nops] = 128 >> 4; p.op_rd[nops] = rd;
    ++nops;
  };
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; s += step_s)
      for (int cg = 0; cg < p.CG; ++cg) {
        if (col16 && s == S - 1 && r < 2) continue;   // (0, 2) and (1, 2): the column pair below
        const long long off = (dtype == FF_F32 ? cg * 2 * plane : cg * plane) + (WG_PAD + (long long)s * dw) * 16;
        const bool pair = step_s == 2 && s + 1 < S;
        const long long lbo = dtype == FF_F32 ? plane : pair ? (long long)dw * 16 : (p.CG - cg) * plane;
        add_op((r * S + s) * p.CG + cg, pair ? (r * S + s + 1) * p.CG + cg : WG_UNIT_NONE, off, lbo, r * dh);
      }
  // the column pair (WG_COL16_OPS, one channel group): op WG_COL16_J after (2, 0) + (2, 1) and (2, 2); its LBO and, where
  // the rows' slots are in the other order, its swapped A block (block WG_COL16_OPS, not issued) come from the
  // descriptor table (wg_dtab_fill)
  if (col16) {
    const int tap02 = 2, tap12 = S + 2;
    add_op(tap02, tap12, (WG_PAD + 2LL * dw) * 16, 0, 0);
    p.op_u0[nops] = tap12; p.op_u1[nops] = tap02;
  }
  p.col_j = col16 ? WG_COL16_J : -1;
  p.col_rd2 = dh;   // the column op's second row: tap row 1
  // bias: 16-bit, the second K chunk of the first op with one tap (it reads the ones plane); else an op of its own on
  // the ones block, every row and K chunk the same 16 bytes (LBO = SBO = 0)
  int spare = -1;
  if (dtype != FF_F32)
    for (int j = 0; j < nops && spare < 0; ++j)
      if (p.op_u1[j] == WG_UNIT_NONE) spare = j;
  if ((spare >= 0) != bias_spare) return w;   // the prediction above (nops_pred) and the ops agree
  if (spare >= 0) {
    p.op_u1[spare] = WG_UNIT_BIAS;
  } else {
    p.op_u0[nops] = WG_UNIT_BIAS;
    p.op_d[nops] = (unsigned)(p.ones_off >> 4); p.op_mask[nops] = 0u; p.op_hi[nops] = 0u; p.op_rd[nops] = 0;
    ++nops;
  }
  p.nops = nops;
  p.na = nops + (col16 ? 1 : 0);
  if (nops != nops_pred) return w;
  for (int j = 0; j < WG_MAXOPS; ++j)
    for (int h = 0; h < 2; ++h) {
      const int u = (dtype != FF_F32 && h) ? p.op_u1[j] : p.op_u0[j], k0 = dtype == FF_F32 ? 4 * h : 0;
      const int kc = dtype == FF_F32 ? 4 : 8;
      p.op_wo[h][j] = 0; p.op_wn[h][j] = 0;
      if (j >= p.na || u == WG_UNIT_NONE) continue;
      if (u == WG_UNIT_BIAS) { p.op_wn[h][j] = k0 == 0 ? -1 : 0; continue; }
      const int t = u / p.CG, cg = u % p.CG, r = t / S, s = t % S, c0 = cg * 8 + k0;
      p.op_wn[h][j] = std::max(0, std::min(kc, C - c0));
      p.op_wo[h][j] = (c0 * R + r) * S + s;
    }
  p.slot16 = (int)(slot >> 4);
  auto magic = [](int d, unsigned long long& m, int& s) {
    int l = 0; while ((1LL << l) < d) ++l;
    s = 31 + l; m = ((1ULL << s) + (unsigned long long)d - 1) / (unsigned long long)d;
  };
  magic(p.CG, p.mCG, p.sCG);
  magic(p.TWa, p.mTWa, p.sTWa);
  magic(p.CG * 2, p.mHP, p.sHP);
  magic(p.nq, p.mNQ, p.sNQ);
  magic(p.RB, p.mRB, p.sRB);
  if (tma) {
    magic(p.NST, p.mST, p.sST);
    magic(p.tma_bc, p.mBC, p.sBC);
  }
  long long G = (long long)bps * di.nsm;
  if (G > p.L) G = p.L;
  p.G = (int)G;
  const long long per = (p.L + G - 1) / G;
  p.J = (int)((per + p.lines_img - 1) / p.lines_img + 1);
  p.inv_pq = (float)(1.0 / ((double)p.P * (double)p.Q));
  const bool need_ws = (pool == FF_POOL_MAX) || deterministic;
  w.ws_cnt_bytes = need_ws ? (size_t)((N * 4 + 255) / 256 * 256) : 0;
  if (!need_ws) w.ws_bytes = 0;
  else if (pool == FF_POOL_MAX) w.ws_bytes = w.ws_cnt_bytes + (size_t)N * K * 4;
  else w.ws_bytes = w.ws_cnt_bytes + (size_t)G * p.J * 64 * 4;
  w.ok = true;
  return w;
}

// The plan for loader lm; a TMA loader only where its layout keeps the blocks per SM (and so the workspace) of the
// loader it replaces, else that one (VEC / NCHW4 / NCHW8).
WGPlan wg_plan(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
               int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, const Plan& base, int lm) {
  auto plan = [&](int l) {
    return wg_plan_lm(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                      deterministic, base, l);
  };
  if (!wg_lm_tma(lm)) return plan(lm);
  const WGPlan a = plan(lm == WG_LM_TVEC ? WG_LM_VEC : dtype == FF_F32 ? WG_LM_NCHW4 : WG_LM_NCHW8);
  if (!a.ok) return a;
  const WGPlan t = plan(lm);
  return (t.ok && t.bps == a.bps && t.prm.G == a.prm.G && t.prm.J == a.prm.J) ? t : a;
}

template <int DT, bool SPLIT, int LM>
int wg_launch_t(const WGParams& prm, size_t smem, cudaStream_t stream) {
  // 3x3 filters over <= 8 input channels (fp32: 9 taps + bias = 10 ops; 16-bit: two taps per op and the column pair,
  // 5) get the
  // straight-line issue (wg_straight_ops); the rest the general one.  Register budget: 3xTF32 2 blocks per SM; TF32 4
  // (128 registers) or, when the knob asks for fewer blocks (default 3), the 168-register build of the 3x3 kernel;
  // 16-bit only the 168-register build.  (wg_plan may run fewer blocks per SM than a build allows.)
  constexpr int MINB = SPLIT ? 2 : (DT == FF_F32 ? 4 : 3);
  constexpr int MINB_FEW = SPLIT ? 2 : 3;
  constexpr int NOPS_LINE = DT == FF_F32 ? WG_OPS3X3 : WG_COL16_OPS;
  auto kern = wg_straight_ops(DT, prm.nops, prm.col_j >= 0) == 0 ? fa_wgmma_kernel<DT, SPLIT, LM, 0, MINB>
              : (DT != FF_F32 || knobs().bps < 4) ? fa_wgmma_kernel<DT, SPLIT, LM, NOPS_LINE, MINB_FEW>
                                                  : fa_wgmma_kernel<DT, SPLIT, LM, NOPS_LINE, MINB>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return (int)e;
  kern<<<(unsigned)prm.G, 128, smem, stream>>>(prm);
  return (int)cudaGetLastError();
}

// One kernel per (dtype, precision, loader); the loader was picked for this dtype (wg_loader).
template <int DT, bool SPLIT>
int wg_launch_dt(int lm, const WGParams& prm, size_t smem, cudaStream_t stream) {
  constexpr int LM_COLS = DT == FF_F32 ? WG_LM_NCHW4 : WG_LM_NCHW8, LM_ANY = DT == FF_F32 ? WG_LM_ELEM : WG_LM_REG;
  if (lm == WG_LM_TVEC) return wg_launch_t<DT, SPLIT, WG_LM_TVEC>(prm, smem, stream);
  if (lm == WG_LM_TNCHW) return wg_launch_t<DT, SPLIT, WG_LM_TNCHW>(prm, smem, stream);
  if (lm == WG_LM_VEC) return wg_launch_t<DT, SPLIT, WG_LM_VEC>(prm, smem, stream);
  if (lm == LM_COLS) return wg_launch_t<DT, SPLIT, LM_COLS>(prm, smem, stream);
  return wg_launch_t<DT, SPLIT, LM_ANY>(prm, smem, stream);
}

int wg_launch(int dtype, int precision, int lm, const WGParams& prm, size_t smem, cudaStream_t stream) {
  if (dtype == FF_BF16) return wg_launch_dt<FF_BF16, false>(lm, prm, smem, stream);
  if (dtype == FF_F16) return wg_launch_dt<FF_F16, false>(lm, prm, smem, stream);
  return precision == FF_PREC_IEEE ? wg_launch_dt<FF_F32, true>(lm, prm, smem, stream)
                                   : wg_launch_dt<FF_F32, false>(lm, prm, smem, stream);
}

// Input loader: channels_last with C % 8 == 0 -> TVEC (knob off: VEC); NCHW with W % 4 (fp32) / 8 (16-bit) == 0 ->
// TNCHW (knob off: NCHW4 / NCHW8); else ELEM (fp32) / REG (16-bit).  The 16-byte and TMA loaders need a 16-byte-aligned
// input; knobs switch them off.  (wg_plan may still turn a TMA loader into the one it replaces.)
int wg_loader(int dtype, int channels_last, int C, int W, const void* x) {
  const bool f32 = dtype == FF_F32, aligned = ((uintptr_t)x & 15) == 0;
  if (aligned && knobs().tma && (f32 || knobs().vec16)) {
    if (channels_last && C % 8 == 0) return WG_LM_TVEC;
    if (!channels_last && W % (f32 ? 4 : 8) == 0 && (!f32 || knobs().nchw4)) return WG_LM_TNCHW;
  }
  if (channels_last && C % 8 == 0 && aligned && (f32 || knobs().vec16)) return WG_LM_VEC;
  if (!channels_last && W % (f32 ? 4 : 8) == 0 && aligned && (f32 ? knobs().nchw4 : knobs().vec16))
    return f32 ? WG_LM_NCHW4 : WG_LM_NCHW8;
  return f32 ? WG_LM_ELEM : WG_LM_REG;
}
// The TMA loaders' tensor map of input x (wg_tma_row), through the driver's cuTensorMapEncodeTiled looked up at run
// time; false if it is not there or refuses (the caller then plans the copy loader).  TVEC: NHWC as (16 bytes of
// channels, C / that, W, H, N), box 16 bytes x 1 x tma_bc; TNCHW: NCHW as (W, H, C, N), box tma_bc x 1 x 8 channels
// (channels >= C read as zeros).  16-bit input moves as uint16.
bool wg_encode_tmap(WGParams& q, int lm, int dtype, const void* x) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                              const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult qr;
#if CUDART_VERSION >= 12050   // the versioned lookup (the unversioned one is deprecated from CUDA 12.5 on)
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &qr);
#else                         // CUDA 12.0 - 12.4 (the README's nvcc >= 12)
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &qr);
#endif
    if (e != cudaSuccess || qr != cudaDriverEntryPointSuccess) fn = nullptr;
    return reinterpret_cast<Encode>(fn);
  }();
  if (!encode) return false;
  const cuuint64_t W = (cuuint64_t)q.W, H = (cuuint64_t)q.H, C = (cuuint64_t)q.C, N = (cuuint64_t)q.N;
  const cuuint64_t es = dtype == FF_F32 ? 4 : 2, cq = 16 / es;
  const CUtensorMapDataType ty = dtype == FF_F32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
  const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
  CUresult r;
  if (lm == WG_LM_TVEC) {
    const cuuint64_t dims[5] = {cq, C / cq, W, H, N};
    const cuuint64_t strides[4] = {16, C * es, W * C * es, H * W * C * es};
    const cuuint32_t box[5] = {(cuuint32_t)cq, 1, (cuuint32_t)q.tma_bc, 1, 1};
    r = encode(&q.tmap, ty, 5, const_cast<void*>(x), dims, strides, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else {
    const cuuint64_t dims[4] = {W, H, C, N};
    const cuuint64_t strides[3] = {W * es, H * W * es, C * H * W * es};
    const cuuint32_t box[4] = {(cuuint32_t)q.tma_bc, 1, 8, 1};
    r = encode(&q.tmap, ty, 4, const_cast<void*>(x), dims, strides, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  return r == CUDA_SUCCESS;
}

// Which kernel serves a call: the sm_90 wgmma plan when it can, else the mma.sync plan; why = the reason neither can
// (invalid call, or beyond both kernels: then the wgmma kernel's capacity message where it had one).
struct Choice { Plan pl; WGPlan wp; const char* why; };
Choice choose(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
              int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, int lm) {
  Choice c{};
  c.pl = make_plan(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                   deterministic);
  c.why = c.pl.why;
  if (c.why) return c;
  c.wp = wg_plan(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                 deterministic, c.pl, lm);
  if (!c.wp.ok && c.pl.mma_why) c.why = c.wp.why ? c.wp.why : c.pl.mma_why;
  return c;
}
}  // namespace

extern "C" {

const char* ff_fused_conv_act_pool_unsupported(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R,
                                               int S, int sh, int sw, int ph, int pw, int dh, int dw, int activation,
                                               int pool, int precision, int deterministic) {
  return choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                deterministic, wg_loader(dtype, channels_last, C, W, nullptr)).why;
}

size_t ff_fused_conv_act_pool_workspace_bytes(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R,
                                              int S, int sh, int sw, int ph, int pw, int dh, int dw, int activation,
                                              int pool, int precision, int deterministic) {
  const Choice c = choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                          deterministic, wg_loader(dtype, channels_last, C, W, nullptr));
  return c.why ? 0 : c.wp.ok ? c.wp.ws_bytes : c.pl.ws_bytes;
}

int ff_fused_conv_act_pool(const void* x, const void* weight, const float* bias, float* out, int dtype, int channels_last,
                           long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph, int pw, int dh,
                           int dw, int activation, int pool, int precision, int deterministic, void* workspace,
                           cudaStream_t stream) {
  Choice c = choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                    deterministic, wg_loader(dtype, channels_last, C, W, x));
  if (c.wp.ok && wg_lm_tma(c.wp.lm) && !wg_encode_tmap(c.wp.prm, c.wp.lm, dtype, x))   // no TMA after all: the copy loader
    c = choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision, deterministic,
               c.wp.lm == WG_LM_TVEC ? WG_LM_VEC : dtype == FF_F32 ? WG_LM_NCHW4 : WG_LM_NCHW8);
  if (c.why) return (int)cudaErrorNotSupported;
  const Plan& pl = c.pl;
  {
    WGPlan& wp = c.wp;
    if (wp.ok) {
      if (wp.ws_bytes && !workspace) return (int)cudaErrorInvalidValue;
      WGParams& q = wp.prm;
      q.x = x; q.w = weight; q.bias = bias; q.out = out; q.nhwc = channels_last;
      char* ws = (char*)workspace;
      q.ws_cnt = wp.ws_bytes ? (int*)ws : nullptr;
      q.ws_part = (wp.ws_bytes && pool == FF_POOL_MEAN) ? (float*)(ws + wp.ws_cnt_bytes) : nullptr;
      q.ws_max = (wp.ws_bytes && pool == FF_POOL_MAX) ? (unsigned*)(ws + wp.ws_cnt_bytes) : nullptr;
      q.gelu_fast = knobs().noclamp;
      q.fulltile = knobs().fulltile;
      q.h2 = dtype != FF_F32 && activation == FF_ACT_GELU_ERF && pool == FF_POOL_MEAN && knobs().h2 ? 1 : 0;
      return wg_launch(dtype, precision, wp.lm, q, wp.smem, stream);
    }
  }
  if (pl.ws_bytes && !workspace) return (int)cudaErrorInvalidValue;
  FAParams prm{};
  prm.x = x; prm.w = weight; prm.bias = bias; prm.out = out;
  prm.N = N; prm.C = C; prm.H = H; prm.W = W; prm.K = K; prm.R = R; prm.S = S;
  prm.sh = sh; prm.sw = sw; prm.ph = ph; prm.pw = pw; prm.dh = dh; prm.dw = dw;
  prm.P = pl.P; prm.Q = pl.Q; prm.act = activation; prm.pool = pool; prm.det = deterministic ? 1 : 0;
  prm.nhwc = channels_last;
  prm.vec_ok = (channels_last && C % 8 == 0 && ((uintptr_t)x & 15) == 0) ? 1 : 0;
  prm.CG = pl.CG; prm.nu = pl.nu; prm.BR = pl.BR; prm.QS = pl.QS; prm.nbands = pl.nbands; prm.nseg = pl.nseg;
  prm.nksl = pl.nksl; prm.TR = pl.TR; prm.TWa = pl.TWa;
  auto magic = [](int d, unsigned long long& m, int& sh) {
    int l = 0; while ((1LL << l) < d) ++l;
    sh = 31 + l; m = ((1ULL << sh) + (unsigned long long)d - 1) / (unsigned long long)d;
  };
  magic(pl.TWa, prm.mTWa, prm.sTWa);
  magic(pl.TR, prm.mTR, prm.sTR);
  prm.nitems_total = N * pl.nksl * pl.nbands * pl.nseg;
  prm.inv_pq = (float)(1.0 / ((double)pl.P * (double)pl.Q));
  char* ws = (char*)workspace;
  prm.ws_cnt = pl.ws_bytes ? (int*)ws : nullptr;
  prm.ws_part = (pl.ws_bytes && pool == FF_POOL_MEAN) ? (float*)(ws + pl.ws_cnt_bytes) : nullptr;
  prm.ws_max = (pl.ws_bytes && pool == FF_POOL_MAX) ? (unsigned*)(ws + pl.ws_cnt_bytes) : nullptr;
  long long blocks = N * pl.nksl * pl.nbands * pl.nseg;
  if (dtype == FF_F32) {
    if (precision == FF_PREC_IEEE) return launch_nw<FF_F32, true, 2>(prm, pl, blocks, stream);
    return launch_nw<FF_F32, false, 4>(prm, pl, blocks, stream);
  }
  if (dtype == FF_BF16) return launch_nw<FF_BF16, false, 4>(prm, pl, blocks, stream);
  return launch_nw<FF_F16, false, 4>(prm, pl, blocks, stream);
}

#ifdef FF_FUSED_A_DIAG
// diagnostic builds only: copy the per-block timestamps of the last fa_wgmma_kernel launches (fa_diag_t) to host memory
int ff_fused_a_diag_times(void* host_dst, int nblocks) {
  const int n = nblocks < FA_DIAG_MAXB ? nblocks : FA_DIAG_MAXB;
  return (int)cudaMemcpyFromSymbol(host_dst, fa_diag_t, (size_t)n * 8 * sizeof(unsigned long long));
}
#endif

}  // extern "C"
