// Family A, fused, sm_90a: the input loaders that stream rows into the shared-memory ring (per-thread copies or TMA)
// and their post-copy passes (tf32 rounding, the ieee small part, NCHW transposes, the input bound).
#pragma once
#include "activation.cuh"
#include "fused_conv_act_pool/wgmma_params.cuh"
#include "arch_sm90.cuh"

// precision ieee, the small part of the ring slot: per 8-channel group two bf16 planes, bf16(x) then bf16(x - x_hi)
// (x_hi = tf32(x)), both 0 where x_hi is not finite (Inf / NaN then reach the result through x_hi w_hi alone, as in
// TF32).  Returns the two bf16 pairs (x of channels c, c + 1 in the low / high half) and the two x_lo pairs.
__device__ __forceinline__ void wg_small_pairs(const float (&x)[4], const uint32_t (&hi)[4], uint32_t (&xb)[2],
                                               uint32_t (&xl)[2]) {
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
// through add (one FMNMX each), 16-bit input through add2 on raw bit pairs (fp16 is always bounded, only Inf / NaN
// fail).
struct WGInBound {
  float f = 0.0f;       // max |v| of fp32 values
  uint32_t h = 0u;      // per-half max of 16-bit magnitude bits
  __device__ __forceinline__ void add(float v) { f = ff_max_nan(f, fabsf(v)); }
  __device__ __forceinline__ void add2(uint32_t w) { h = __vmaxu2(h, w & 0x7fff7fffu); }
  __device__ __forceinline__ uint32_t m16() const { return max(h & 0xffffu, h >> 16); }   // the larger half's bits
  template <int DT>
  __device__ __forceinline__ bool ok() const {
    const uint32_t m = m16();
    // bf16 2^50; fp16 finite
    return f <= 0x1p50f && (DT == FF_BF16 ? m <= 0x5880u : DT == FF_F16 ? m < 0x7c00u : true);
  }
};

// A Conv3d's element (channel c, row h, column w) of loader image n: where it lies in x (off) and whether it is inside
// x (else it reads as zero).  Image n / vDout at output depth n % vDout, channel c / vT at depth tap c % vT, i.e.
// depth slice z = d vsd - vpd + t vdd, inside when 0 <= z < vD (WGParams vT).  The loaders that serve a Conv3d —
// ELEM, REG and, for NCDHW, NCHW4 / NCHW8 — call it where their template parameter VOL is set; their Conv2d code is
// left as it was (the Conv2d kernels' SASS is unchanged).
__device__ __forceinline__ bool wg_x_at_vol(const WGParams& p, long long n, int c, int h, int w, long long& off) {
  const long long ni = n / p.vDout;
  const int d = (int)(n - ni * p.vDout), ci = c / p.vT, t = c - ci * p.vT, z = d * p.vsd - p.vpd + t * p.vdd;
  off = p.nhwc ? (((ni * p.vD + z) * p.H + h) * p.W + w) * p.vC + ci
               : (((ni * p.vC + ci) * p.vD + z) * p.H + h) * (long long)p.W + w;
  return z >= 0 && z < p.vD;
}

// fp32 NCHW loaders: v[e] = 4 columns of channel 4 hp + e -> column i's 4 channels at at(i) (plane hp), rounded to
// tf32, bounded; ieee also the column's bf16 small part
template <bool SPLIT, class At>
__device__ __forceinline__ void wg_store_cols4(const WGParams& p, At&& at, int hp, const uint32_t (&v)[4][4],
                                               WGInBound& bound) {
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
    const uint32_t dst = at(i);
    asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};" :: "r"(dst), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3])
                 : "memory");
    if (SPLIT) {   // plane hp = 4 channels = half (hp & 1) of the group's bf16 entries
      uint32_t xb[2], xl[2];
      wg_small_pairs(x, b, xb, xl);
      const uint32_t ds = dst - (hp & 1) * p.plane_bytes + (hp & 1) * 8 + p.small_off;
      asm volatile("st.shared.v2.u32 [%0],{%1,%2};" :: "r"(ds), "r"(xb[0]), "r"(xb[1]) : "memory");
      asm volatile("st.shared.v2.u32 [%0],{%1,%2};" :: "r"(ds + p.plane_bytes), "r"(xl[0]), "r"(xl[1]) : "memory");
    }
  }
}

// TNCHW post-copy pass of one row: the stage holds [channel group][box][8 ch][tma_bc columns] from column
// wbase - tma_delta (TMA, wg_tma_row), which goes to slot position WG_PAD - tma_delta (the slack before the row);
// task = (plane hp, 4-column group j), plane-fastest: the 8 threads of a 16-byte shared-memory phase load 4 groups of
// each of two planes, which lie 16 tma_bc = 64 bytes apart modulo 128 (tma_bc = 4 mod 8): conflict-free; they store
// into the slot's planes 32 bytes apart modulo 128 (2-way, as NCHW4).  SW2: each column to its parity's position
// (wg_pos).
template <bool SPLIT, bool SW2 = false>
__device__ __forceinline__ void wg_tnchw_row(const WGParams& p, uint32_t slot, uint32_t stg, WGInBound& bound) {
  const int HP = 2 * p.CG, ng = (p.tma_cols + 3) >> 2;
  for (int task = threadIdx.x; task < HP * ng; task += 128) {
    int hp, j;
    if (p.CG == 1) { hp = task & 1; j = task >> 1; }
    else { j = fdiv(task, p.mHP, p.sHP); hp = task - j * HP; }
    const int c0 = 4 * j, b = fdiv(c0, p.mBC, p.sBC);
    const uint32_t src = stg + (uint32_t)((((hp >> 1) * p.tma_nbox + b) * 8 + (hp & 1) * 4) * p.tma_bc * 4
                                          + (c0 - b * p.tma_bc) * 4);
    uint32_t v[4][4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v[e][0]), "=r"(v[e][1]), "=r"(v[e][2]), "=r"(v[e][3])
                   : "r"(src + e * p.tma_bc * 4));
    if (SW2) {
      const uint32_t pl = slot + (uint32_t)(hp * p.plane_bytes);
      wg_store_cols4<SPLIT>(p, [&](int i) { return pl + (uint32_t)(wg_pos<true>(p, c0 + i - p.tma_delta) * 16); },
                            hp, v, bound);
    } else {
      const uint32_t blk = slot + (uint32_t)(hp * p.plane_bytes + (WG_PAD - p.tma_delta + c0) * 16);
      wg_store_cols4<SPLIT>(p, [&](int i) { return blk + i * 16; }, hp, v, bound);
    }
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
template <int G, int MODE, bool VOL, class F>
__device__ __forceinline__ void wg_nchw_row(const WGParams& p, uint32_t slot, long long n, int h, int wbase,
                                            F&& transpose) {
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
        long long off = 0;
        const bool ok = wok && pl * G + e < p.C && (!VOL || wg_x_at_vol(p, n, pl * G + e, h, w0, off));
        ff_cp_async16(blk + ((e + j) & (G - 1)) * 16,
                      reinterpret_cast<const char*>(p.x) + (ok ? (VOL ? off : c0 + e * plane) * (16 / G) : 0), ok);
      }
    } else {
      uint32_t v[G][4];
#pragma unroll
      for (int e = 0; e < G; ++e)
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v[e][0]), "=r"(v[e][1]), "=r"(v[e][2]), "=r"(v[e][3])
                     : "r"(blk + ((e + j) & (G - 1)) * 16));
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
template <int DT, bool SPLIT, int LM, int MODE, bool VOL = false>
__device__ __forceinline__ void wg_row(const WGParams& p, uint32_t slot, long long n, int h, int wbase,
                                       WGInBound& bound) {
  const int tid = threadIdx.x;
  const bool hok = (h >= 0 && h < p.H);
  if (LM == WG_LM_VEC || LM == WG_LM_TVEC) {   // TVEC: MODE 1 only (its copies are wg_tma_row's)
    constexpr int CPP = (DT == FF_F32) ? 2 : 1;
    constexpr int ESZ = (DT == FF_F32) ? 4 : 2;
    // one 16-byte chunk: channels cg * 8 + half * 4 .. (fp32) or cg * 8 .. (16-bit) of column col; src = its element
    // offset in x (used only when ok)
    auto chunk = [&](uint32_t dst, long long src, bool ok, int half) {
      if (MODE == 0) {
        ff_cp_async16(dst, reinterpret_cast<const char*>(p.x) + (ok ? src * ESZ : 0), ok);
      } else if (DT == FF_F32) {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(dst));
        uint4 b = make_uint4(f2tf32(__uint_as_float(v.x)), f2tf32(__uint_as_float(v.y)), f2tf32(__uint_as_float(v.z)),
                             f2tf32(__uint_as_float(v.w)));
        bound.add(__uint_as_float(v.x)); bound.add(__uint_as_float(v.y));
        bound.add(__uint_as_float(v.z)); bound.add(__uint_as_float(v.w));
        asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};" :: "r"(dst), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w)
                     : "memory");
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
    // measured 4.7 % slower here: docs/design.md.)
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
          long long off = 0;
          const bool ok = wok && c < p.C && (!VOL || wg_x_at_vol(p, n, c, h, w0, off));
          const float* src = reinterpret_cast<const float*>(p.x);
          if (ok) src += VOL ? off : ((n * p.C + c) * p.H + h) * (long long)p.W + w0;
          ff_cp_async16(blk + ((e + (j >> 1)) & 3) * 16, src, ok);
        }
      } else {
        uint32_t v[4][4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3},[%4];"
                       : "=r"(v[e][0]), "=r"(v[e][1]), "=r"(v[e][2]), "=r"(v[e][3])
                       : "r"(blk + ((e + (j >> 1)) & 3) * 16));
        wg_store_cols4<SPLIT>(p, [&](int i) { return blk + i * 16; }, hp, v, bound);
      }
    }
  } else if (LM == WG_LM_NCHW8) {                      // 16-bit NCHW, W % 8 == 0: task = (channel group, 8 columns)
    // As NCHW4, with 8 channels x 8 columns per task and the [col][8 ch] entries of the 16-bit slot.
    wg_nchw_row<8, MODE, VOL>(p, slot, n, h, wbase, [&](uint32_t blk, int, const uint32_t (&v)[8][4]) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {   // column i: channels 2k, 2k + 1 from chunks 2k, 2k + 1
        uint32_t b[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) b[k] = __byte_perm(v[2 * k][i >> 1], v[2 * k + 1][i >> 1],
                                                       (i & 1) ? 0x7632 : 0x5410);
#pragma unroll
        for (int k = 0; k < 4; ++k) bound.add2(b[k]);
        asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};"
                     :: "r"(blk + i * 16), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]) : "memory");
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
        long long off = 0;
        const bool ok = hok && w >= 0 && w < p.W && c < p.C && (!VOL || wg_x_at_vol(p, n, c, h, w, off));
        const float* src = reinterpret_cast<const float*>(p.x);
        if (ok) src += VOL ? off : p.nhwc ? ((n * p.H + h) * p.W + w) * p.C + c
                                          : ((n * p.C + c) * p.H + h) * (long long)p.W + w;
        ff_cp_async4(dst, src, ok);
      } else {
        float v;
        asm volatile("ld.shared.f32 %0,[%1];" : "=f"(v) : "r"(dst));
        const uint32_t b = f2tf32(v);
        bound.add(v);
        asm volatile("st.shared.u32 [%0],%1;" :: "r"(dst), "r"(b) : "memory");
        if (SPLIT) {   // channel 4 (hp & 1) + e of the group's bf16 entries
          const bool fin = isfinite(__uint_as_float(b));
          const __nv_bfloat16 xb = __float2bfloat16_rn(fin ? v : 0.0f),
                              xl = __float2bfloat16_rn(fin ? v - __uint_as_float(b) : 0.0f);
          const uint32_t ds = dst - (hp & 1) * p.plane_bytes - e * 4 + ((hp & 1) * 4 + e) * 2 + p.small_off;
          asm volatile("st.shared.u16 [%0],%1;" :: "r"(ds), "h"(*reinterpret_cast<const unsigned short*>(&xb))
                       : "memory");
          asm volatile("st.shared.u16 [%0],%1;"
                       :: "r"(ds + p.plane_bytes), "h"(*reinterpret_cast<const unsigned short*>(&xl)) : "memory");
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
          long long gi = 0;
          if (ok && c < p.C && (!VOL || wg_x_at_vol(p, n, c, h, w, gi))) {
            if (!VOL) gi = p.nhwc ? ((n * p.H + h) * p.W + w) * p.C + c
                                  : ((n * p.C + c) * p.H + h) * (long long)p.W + w;
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
          asm volatile("st.shared.v4.u32 [%0],{%1,%2,%3,%4};"
                       :: "r"(dst), "r"(v[k][0]), "r"(v[k][1]), "r"(v[k][2]), "r"(v[k][3]) : "memory");
        }
      }
    }
  }
}

// the last input row (relative to the piece) output row t reads: row group t = the rows (hi(t - 1), hi(t)] (group 0
// from row 0), the ones output row t needs first
__device__ __forceinline__ int wg_group_hi(const WGParams& p, int t) { return t * p.sh + (p.R - 1) * p.dh; }
template <int DT, bool SPLIT, int LM, int MODE, bool VOL>
__device__ __forceinline__ void wg_group(const WGParams& p, uint32_t ring, int t, int np, long long n, int hbase,
                                         int wbase, WGInBound& bound) {
  if (t >= np) return;
  const int jlo = (t == 0) ? 0 : wg_group_hi(p, t - 1) + 1, jhi = wg_group_hi(p, t);
  for (int j = jlo; j <= jhi; ++j)
    wg_row<DT, SPLIT, LM, MODE, VOL>(p, ring + (uint32_t)((j - p.RB * fdiv(j, p.mRB, p.sRB)) * p.slot_bytes), n,
                                     hbase + j, wbase, bound);
}

// TNCHW post-copy pass of one row, 16-bit: the stage holds [channel group][box][8 ch][tma_bc columns] from column
// wbase - tma_delta; each 8 x 8 block (8 channels x 8 columns) becomes 8 slot entries [column][8 ch] through one
// ldmatrix.trans and one stmatrix (x4: a warp moves four blocks per instruction pair, block = column group j x channel
// group cg, cg fastest).  The stage's channel rows lie tma_bc * 2 = 16 bytes modulo 128 apart (tma_bc = 8 mod 64), so
// the 8 rows of a block come from 8 bank groups; a block's 8 entries are 128 contiguous bytes of the slot.  The stage
// is complete before anyone reads it (mbarrier), so lanes may read what other lanes' copies brought (docs/design.md).
// Block k of a thread's pass (k-th trip of its warp, lane's block clamped to the last): source offset in its stage,
// destination offset in its slot.
// (SW2: each column's entry at its parity's position, wg_pos: stmatrix takes one address per lane and row.)
struct WGTn16Blk { uint32_t src, dst; };
template <bool SW2 = false>
__device__ __forceinline__ WGTn16Blk wg_tnchw16_blk(const WGParams& p, int b0, int nb, int q, int r) {
  const int blk = min(b0 + q, nb - 1);
  const int j = p.CG == 1 ? blk : fdiv(blk, p.mCG, p.sCG), cg = blk - j * p.CG;
  const int c0 = 8 * j, bx = fdiv(c0, p.mBC, p.sBC);
  return {(uint32_t)(((cg * p.tma_nbox + bx) * 8 + r) * p.tma_bc * 2 + (c0 - bx * p.tma_bc) * 2),
          (uint32_t)(cg * p.plane_bytes
                     + (SW2 ? wg_pos<true>(p, c0 + r - p.tma_delta) : WG_PAD - p.tma_delta + c0 + r) * 16)};
}
// The pass's offsets are the same for every row: where a warp's blocks take at most WG_TN16_TRIPS trips (nb <= 48: up
// to ~384 columns of 8 channels) and the offsets fit 16 bits, they are worked out once per block, packed
// src | dst << 16 (the index arithmetic per row cost ~50 instructions per tile at the seed, docs/design.md); otherwise
// per row.
constexpr int WG_TN16_TRIPS = 3;
template <bool SW2 = false>
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
      const WGTn16Blk o = wg_tnchw16_blk<SW2>(p, 4 * warp + 16 * k, nb, lane >> 3, lane & 7);
      off[k] = o.src | (o.dst << 16);
    }
  }
};
__device__ __forceinline__ void wg_tnchw16_move(uint32_t src, uint32_t dst, bool bnd, WGInBound& bound) {
  uint32_t v[4];
  ff_ldsm_x4_trans(src, v);
  if (bnd) {
#pragma unroll
    for (int k = 0; k < 4; ++k) bound.add2(v[k]);
  }
  ff_stsm_x4(dst, v);
}
// bnd: the input bound is wanted (not by the 16-bit GELU mean epilogue, which checks its own range)
template <bool SW2>
__device__ __forceinline__ void wg_tnchw16_row(const WGParams& p, uint32_t slot, uint32_t stg, bool bnd,
                                               WGInBound& bound, const WGTn16<SW2>& tn) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nb = p.CG * ((p.tma_cols + 7) >> 3);
  if (tn.pre) {
#pragma unroll
    for (int k = 0; k < WG_TN16_TRIPS; ++k)
      if (4 * warp + 16 * k < nb) wg_tnchw16_move(stg + (tn.off[k] & 0xffffu), slot + (tn.off[k] >> 16), bnd, bound);
  } else {
    // warp-uniform; lanes past the end repeat the last block (same bytes)
    for (int b0 = 4 * warp; b0 < nb; b0 += 16) {
      const WGTn16Blk o = wg_tnchw16_blk<SW2>(p, b0, nb, lane >> 3, lane & 7);
      wg_tnchw16_move(stg + o.src, slot + o.dst, bnd, bound);
    }
  }
}

// Where the TMA loaders' rows go: input row j of a piece into stage j % NST and (TNCHW, after its pass) ring slot
// j % RB.  The rows are taken in order, so every thread keeps the next one's pair in one register (st | rs << 16),
// reset per piece, instead of two 64-bit multiply-high divisions per row (their chains held ~2 % of the stall samples);
// the row thread 0 issues inside the row loop is always (D - 1) sh rows past the next one to take, so its stage follows
// from that pair (docs/design.md: counters of their own for both sequences spilled in the 16-bit TNCHW kernel).
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
// A Conv3d (VOL, TNCHW with C x T <= 8: one channel group): the map is NCDHW's 5-d one and each box (tma_bc columns, 1
// row, T depth slices from the loader image's first, C channels) lands the group's (c, t) channels in order, c T + t,
// its C x T rows of the 8 (the rest stay zero: wg_tma_zero_vol).
// SW2, TVEC: two boxes per box range, every other column (the map's element stride 2 along W): the even columns from
// wbase into the plane's first half, the odd ones from wbase + 1 into its second (sw2_sub positions on; TNCHW: as
// stride 1, its pass sorts the columns).
template <int DT, int LM, bool VOL = false, bool SW2 = false>
__device__ __forceinline__ void wg_tma_row(const WGParams& p, uint32_t ring, uint32_t stage0, uint32_t bar0, int st,
                                           long long n, int h, int wbase) {
  constexpr int ESZ = DT == FF_F32 ? 4 : 2;
  const uint32_t bar = bar0 + 8u * st;
  ff_mbar_expect_tx(bar, (unsigned)p.tma_bytes);
  if (VOL) {
    const long long ni = n / p.vDout;
    const int z0 = (int)(n - ni * p.vDout) * p.vsd - p.vpd;
    for (int b = 0; b < p.tma_nbox; ++b)
      ff_tma_load5(stage0 + (uint32_t)(st * p.stage_bytes + b * 8 * ESZ * p.tma_bc), &p.tmap, bar,
                   wbase - p.tma_delta + b * p.tma_bc, h, z0, 0, (int)ni);
    return;
  }
  for (int g = 0; g < (LM == WG_LM_TVEC ? p.CG * (8 / (16 / ESZ)) : p.CG); ++g)
    for (int b = 0; b < p.tma_nbox; ++b) {
      if (LM == WG_LM_TVEC && SW2) {
#pragma unroll
        for (int par = 0; par < 2; ++par)
          ff_tma_load5(
              ring + (uint32_t)(st * p.slot_bytes + g * p.plane_bytes + (WG_PAD + par * p.sw2_sub + b * p.tma_bc) * 16),
              &p.tmap, bar, 0, g, wbase + par + 2 * b * p.tma_bc, h, (int)n);
      } else if (LM == WG_LM_TVEC)
        ff_tma_load5(ring + (uint32_t)(st * p.slot_bytes + g * p.plane_bytes + (WG_PAD + b * p.tma_bc) * 16), &p.tmap,
                     bar, 0, g, wbase + b * p.tma_bc, h, (int)n);
      else
        ff_tma_load4(stage0 + (uint32_t)(st * p.stage_bytes + (g * p.tma_nbox + b) * 8 * ESZ * p.tma_bc), &p.tmap, bar,
                     wbase - p.tma_delta + b * p.tma_bc, h, g * 8, (int)n);
    }
}
// A Conv3d's TNCHW stages (wg_tma_row): the rows C x T .. 7 of every box, which its boxes never write, zeroed once per
// block (threads tid of nthr; before the first post-copy pass reads them)
template <int DT>
__device__ __forceinline__ void wg_tma_zero_vol(const WGParams& p, unsigned char* stages, int tid, int nthr) {
  constexpr int ESZ = DT == FF_F32 ? 4 : 2;
  const int rowb = p.tma_bc * ESZ, pad = (8 - p.C) * rowb;   // bytes per channel row, unwritten bytes per box
  for (int i = tid * 4; i < p.NST * p.tma_nbox * pad; i += nthr * 4) {
    const int box = i / pad, off = i - box * pad;
    *reinterpret_cast<uint32_t*>(stages + (long long)box * 8 * rowb + p.C * rowb + off) = 0u;
  }
}
// All threads: wait for the next row's stage at.st() (tph = the stages' phase bits), then its post-copy pass into ring
// slot at.rs() (16-bit TVEC: only when `post`, i.e. the input bound is wanted; the copies land as they are).  SW2:
// TVEC's pass as stride 1's (in place over every position, even then odd: TWa = both halves), TNCHW's sorts columns.
template <int DT, bool SPLIT, int LM, bool SW2 = false>
__device__ __forceinline__ void wg_tma_take(const WGParams& p, uint32_t ring, uint32_t stage0, uint32_t bar0,
                                            WGRowSlot& at, uint32_t& tph, bool post, WGInBound& bound,
                                            const WGTn16<SW2>& tn) {
  const int st = at.st(), rs = at.rs();
  at.step(p);
  ff_mbar_wait(bar0 + 8u * st, (tph >> st) & 1u);
  tph ^= 1u << st;
  if (LM == WG_LM_TVEC) {
    if (DT == FF_F32 || post) wg_row<DT, SPLIT, WG_LM_TVEC, 1>(p, ring + (uint32_t)(st * p.slot_bytes), 0, 0, 0, bound);
  } else {
    if (DT == FF_F32) wg_tnchw_row<SPLIT, SW2>(p, ring + (uint32_t)(rs * p.slot_bytes),
                                               stage0 + (uint32_t)(st * p.stage_bytes), bound);
    else wg_tnchw16_row(p, ring + (uint32_t)(rs * p.slot_bytes), stage0 + (uint32_t)(st * p.stage_bytes),
                        post, bound, tn);
  }
}
