// Family B fused kernel: the block's input tile in shared memory, [2 KS planes of CPL channels][nd x nh rows][32
// columns][16 B] (CPL = 4 fp32 or 8 16-bit channels per 16-byte entry), zero outside the input, then (fp32) rounded to
// TF32 -- or, for the "ieee" variant, split into x_hi = tf32(x) in place and x_lo = bf16(x - x_hi) in a second tile.
#pragma once
#include "fused_convt_pool_reduce/primitives.cuh"

// Issues the tile's copies (cp.async, one commit group) and zeroes its slack; the caller waits for them.
// (id_lo, ih_lo, iw_lo): the input position of tile row 0, column 0 (may lie outside the input).
template <int KS, int DT>
__device__ __forceinline__ void fb_load_tile(const FBParams& p, unsigned char* tile, uint32_t tile_s, long long n,
                                             int id_lo, int ih_lo, int iw_lo) {
  constexpr bool X3 = DT == FB_X3;
  constexpr int NTHR = 128 * fb_nwg(DT);
  constexpr int ES = DT == FF_F32 || X3 ? 4 : 2;   // bytes per input element
  constexpr int CPL = 16 / ES;                      // channels per 16-byte plane entry
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int CP = 2 * KS;
  const int rows = p.nd * p.nh;
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
        ff_cp_async16(tile_s + cp * p.plane_bytes + row * FB_ROW_BYTES + col * 16, src, ok);
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
                                 reinterpret_cast<const uint32_t*>(&v[u][2 * k + 1])[j >> 1],
                                 (j & 1) ? 0x7632 : 0x5410);
          }
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                       :: "r"(tile_s + rowoff[u] + col * 16), "r"(e[0]), "r"(e[1]),
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
        ff_cp_async4(dst, static_cast<const float*>(p.x) + e, ok);
      } else {                   // no 2-byte cp.async: a plain load and store
        const unsigned short v = ok ? __ldg(static_cast<const unsigned short*>(p.x) + e) : (unsigned short)0;
        asm volatile("st.shared.u16 [%0], %1;" :: "r"(dst), "h"(v) : "memory");
      }
    }
  }
  for (int i = p.tile_bytes / 16 + tid; i < p.tile_alloc / 16; i += NTHR)
    *reinterpret_cast<uint4*>(tile + i * 16) = make_uint4(0, 0, 0, 0);
  ff_cp_commit();
}

// After the copies landed (and a barrier): fp32 rounded to tf32 in place (the 16-byte NCDHW loader rounded already;
// the slack is zeros); 16-bit input is used as it is.
template <int KS, int DT>
__device__ __forceinline__ void fb_round_tile(const FBParams& p, unsigned char* tile) {
  constexpr bool X3 = DT == FB_X3;
  constexpr int NTHR = 128 * fb_nwg(DT);
  const int tid = threadIdx.x;
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
}
