// Family B's weight packing on the GPU in every call, before the fused kernel's first weight read (by its own blocks,
// fused_convt_pool_reduce/weight_pack.cuh, or by the packing kernel just before it, fused_convt_pack_kernel.cuh), so
// the packed copy is never stale, never crosses streams, and is part of a captured CUDA graph: the ConvTranspose weight
// (C, K, Td, Th, Tw), any strides, into the layout fb_kernel streams (fused_convt_pool_reduce/kernel.cuh): per residue
// class (rd, rh, rw), per tap (td, th, tw) = (rd + sd md, rh + sh mh, rw + sw mw) (md outermost), one slice
// [C_pad / G][64][G] with G = 4 fp32 (TF32-rounded) or 8 16-bit values, input channels zero-padded to C_pad, output
// channels to 64.
// "ieee" (fp32 at fp32 accuracy): per tap [w_hi = tf32(w) | tf32(w - w_hi) | bf16(w) with C padded as for 16-bit];
// a weight whose w_hi is not finite has 0 in the other two parts.
// fullfuse/fused/convt_pool_reduce.py holds the same layout in torch ops (pack_weights), against which the packing
// kernel (fused_convt_pack_kernel.cuh, the same pack_load / pack_store) is tested; Geometry is mirrored by
// cutlass_ops/convt_pool_reduce.py PackGeometry.
#pragma once
#include <cuda_bf16.h>
#include "device_std.h"

namespace fb_pack {

enum Op { COPY16 = 0, TF32 = 1, IEEE = 2 };

struct Geometry {
  int op, C, K, cpad, cpad16;        // cpad16: the bf16 part's C_pad (IEEE only)
  int T[3], s[3];
  long long ws[5];                   // the weight's strides in elements (C, K, Td, Th, Tw)
  int nslices;
};

// tf32 to nearest, ties away from zero (cvt.rna.tf32.f32), as bits: inf / NaN keep their class
__device__ __forceinline__ uint32_t tf32_rna(uint32_t bits) { return (bits + 0x1000u) & ~0x1fffu; }

// Slice order: classes (rd, rh, rw) = tap % stride in (rd, rh, rw) order, taps (md, mh, mw) = tap / stride md-major
// inside a class.  Along one axis of T taps at stride s, with q = T / s and m = T % s, classes c < m hold q + 1 taps
// and the others q.

// taps t < T with t % s < c (before) and with t % s == c (in), c < s: q c + min(m, c) and q + (c < m)
__device__ __forceinline__ void class_taps(int T, int s, int c, int& before, int& in) {
  const int q = T / s, m = T - q * s;
  before = q * c + min(m, c);
  in = q + (c < m);
}

// the class of the u-th tap (u < T) when one axis's taps are ordered by class: class_taps' inverse
__device__ __forceinline__ int tap_class(int T, int s, int u) {
  const int q = T / s, m = T - q * s, big = m * (q + 1);   // taps of the m classes of q + 1; q > 0 where u >= big
  return u < big ? u / (q + 1) : m + (u - big) / q;
}

// slice j -> its tap (td, th, tw) as td | th << 10 | tw << 20 (each < 1024), in closed form (no loop over the
// classes): the classes rd' < rd hold A_d T1 T2 slices and class rd N_d T1 T2, so j / (T1 T2) is a d-tap index whose
// class is rd; inside it, the classes rh' < rh hold N_d A_h T2 slices, and inside (rd, rh) the classes rw' < rw hold
// N_d N_h A_w (A: class_taps' before, N: its in).  Out of line, on scalars (no stack): the unrolled pack_items calls
// it from several places, rarely.
__device__ __noinline__ int slice_tap_bits(int j, int T0, int T1, int T2, int s0, int s1, int s2) {
  int ad, nd, ah, nh, aw, nw;
  const int rd = tap_class(T0, s0, j / (T1 * T2));
  class_taps(T0, s0, rd, ad, nd);
  j -= ad * T1 * T2;
  const int rh = tap_class(T1, s1, j / (nd * T2));
  class_taps(T1, s1, rh, ah, nh);
  j -= nd * ah * T2;
  const int rw = tap_class(T2, s2, j / (nd * nh));
  class_taps(T2, s2, rw, aw, nw);
  j -= nd * nh * aw;
  return (rd + s0 * (j / (nh * nw))) | (rh + s1 * ((j / nw) % nh)) << 10 | (rw + s2 * (j % nw)) << 20;
}

// the slice that holds tap (td, th, tw): slice_tap_bits' inverse (the slices before class (cd, ch, cw) as there), for
// the packing kernel (fused_convt_pack_kernel.cuh)
__device__ __forceinline__ int tap_slice(int td, int th, int tw, const Geometry& g) {
  const int md = td / g.s[0], mh = th / g.s[1], mw = tw / g.s[2];
  int ad, nd, ah, nh, aw, nw;
  class_taps(g.T[0], g.s[0], td - md * g.s[0], ad, nd);
  class_taps(g.T[1], g.s[1], th - mh * g.s[1], ah, nh);
  class_taps(g.T[2], g.s[2], tw - mw * g.s[2], aw, nw);
  return (ad * g.T[1] + nd * ah) * g.T[2] + nd * nh * aw + (md * nh + mh) * nw + mw;
}

__device__ __forceinline__ void slice_tap(const Geometry& g, int j, int (&t)[3]) {
  const int b = slice_tap_bits(j, g.T[0], g.T[1], g.T[2], g.s[0], g.s[1], g.s[2]);
  t[0] = b & 1023;
  t[1] = (b >> 10) & 1023;
  t[2] = b >> 20;
}

// element e of a [cpad / G][64][G] slice -> the weight's offset, or -1 for padding
__device__ __forceinline__ long long source(const Geometry& g, const int (&t)[3], int e, int G) {
  const int gi = e % G, k = (e / G) % 64, c = (e / (64 * G)) * G + gi;
  if (c >= g.C || k >= g.K) return -1;
  return c * g.ws[0] + k * g.ws[1] + t[0] * g.ws[2] + t[1] * g.ws[3] + t[2] * g.ws[4];
}

__device__ __forceinline__ int slice_items(const Geometry& g) {   // items per slice
  return g.cpad * 64 + (g.op == IEEE ? g.cpad16 * 64 : 0);
}

// the weight element item e of a slice of tap t reads (its offset; -1: padding, which packs as 0), for op OP (g.op)
template <int OP>
__device__ __forceinline__ long long pack_source(const Geometry& g, const int (&t)[3], int e) {
  if (OP == COPY16) return source(g, t, e, 8);
  if (OP == TF32) return source(g, t, e, 4);
  return e < g.cpad * 64 ? source(g, t, e, 4) : source(g, t, e - g.cpad * 64, 8);   // IEEE: (hi, lo), then bf16
}

// the weight element at offset src (>= 0) as bits: fp32, or a 16-bit value (COPY16)
template <int OP>
__device__ __forceinline__ uint32_t pack_load(const void* __restrict__ w, long long src) {
  return OP == COPY16 ? static_cast<const uint16_t*>(w)[src] : static_cast<const uint32_t*>(w)[src];
}

// item e of slice j into out, from its weight element's bits v (0 for padding)
template <int OP>
__device__ __forceinline__ void pack_store(void* __restrict__ out, const Geometry& g, int j, int e, int per,
                                           uint32_t v) {
  const long long i = (long long)j * per + e;
  if (OP == COPY16) {
    static_cast<uint16_t*>(out)[i] = (uint16_t)v;
  } else if (OP == TF32) {
    static_cast<uint32_t*>(out)[i] = tf32_rna(v);
  } else {   // IEEE: a slice is cpad * 64 * 8 bytes of (hi, lo) then cpad16 * 64 * 2 of bf16
    char* slice = static_cast<char*>(out) + (long long)j * (g.cpad * 64 * 8 + g.cpad16 * 64 * 2);
    const uint32_t hi = tf32_rna(v);
    // a non-finite weight goes into w_hi alone (w_lo = bf16 part = 0), as fb_kernel puts a non-finite input into
    // x_lo alone: Inf / NaN then meet finite factors only, never Inf - Inf or inf * 0 from the split
    const bool fin = isfinite(__uint_as_float(hi));
    if (e < g.cpad * 64) {
      reinterpret_cast<uint32_t*>(slice)[e] = hi;
      const uint32_t lo = fin ? tf32_rna(__float_as_uint(__uint_as_float(v) - __uint_as_float(hi))) : 0u;
      reinterpret_cast<uint32_t*>(slice + g.cpad * 64 * 4)[e] = lo;
    } else {
      reinterpret_cast<__nv_bfloat16*>(slice + g.cpad * 64 * 8)[e - g.cpad * 64] =
          __float2bfloat16_rn(fin ? __uint_as_float(v) : 0.0f);
    }
  }
}

// items first + k * stride (k < N) of the whole packing (slice-major) below end: the fused kernel's share of a
// chunk (fused_convt_pool_reduce/weight_pack.cuh).  Every source offset first, then all N loads, then the stores,
// so that the N loads are in flight together; a slice's tap is worked out once per slice entered.
template <int OP, int N>
__device__ __forceinline__ void pack_items(const void* __restrict__ w, void* __restrict__ out, const Geometry& g,
                                           long long first, long long end, int stride) {
  const int per = slice_items(g);
  long long src[N];
  int jk[N], ek[N];
  int j = -1, t[3] = {0, 0, 0};
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const long long i = first + (long long)k * stride;
    jk[k] = -1;
    src[k] = -1;
    if (i < end) {
      const int js = (int)(i / per);
      if (js != j) {
        j = js;
        slice_tap(g, j, t);
      }
      jk[k] = j;
      ek[k] = (int)(i - (long long)j * per);
      src[k] = pack_source<OP>(g, t, ek[k]);
    }
  }
  uint32_t v[N];
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = src[k] >= 0 ? pack_load<OP>(w, src[k]) : 0u;
#pragma unroll
  for (int k = 0; k < N; ++k)
    if (jk[k] >= 0) pack_store<OP>(out, g, jk[k], ek[k], per, v[k]);
}

}  // namespace fb_pack
