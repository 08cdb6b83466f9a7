// Family A, fused, sm_90a: what leaves the chip — a block's lines (pieces of output rows), the quad reduction of the
// per-thread partials, and the per-image flush (atomics, or per-block partials summed in a fixed order by the last
// block of the image: the deterministic mode and max pooling).
#pragma once
#include "fused_conv_act_pool/wgmma_epilogue.cuh"

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
// whose input rows, nrows of them, stream through the ring once).  n = the image (what the pool reduces over), nx =
// the loaders' image: n, or for a Conv3d (image, output depth) as wg_x_at_vol reads it (an image's lines: its output
// depths one after another, lines_d each; VOL: the kernel serves Conv3d).  SW2 (stride-2 columns, WG_NT2): segments of
// WG_NT2 output pixels, one half each, that read input columns from 2 q0 - pw.
template <bool VOL, bool SW2 = false>
struct WGPiece {
  long long n, nx; int np, qv, hbase, wbase, nrows, nhalf;
  __device__ __forceinline__ WGPiece(const WGParams& p, long long l, long long L1) {
    n = l / p.lines_img;
    int rem = (int)(l - n * p.lines_img);
    nx = n;
    if (VOL) {
      const int d = rem / p.lines_d;
      rem -= d * p.lines_d;
      nx = n * p.vDout + d;
    }
    const int seg = rem / p.P, pa = rem - seg * p.P;
    np = (int)min((long long)(p.P - pa), L1 - l);
    constexpr int NT = SW2 ? WG_NT2 : WG_NT;
    const int q0 = seg * NT;
    qv = min(NT, p.Q - q0);
    hbase = pa * p.sh - p.ph;
    wbase = (SW2 ? 2 * q0 : q0) - p.pw;
    nrows = (np - 1) * p.sh + (p.R - 1) * p.dh + 1;
    nhalf = SW2 ? 1 : qv > WG_NT / 2 ? 2 : 1;
  }
};

// The lines of block b are [wg_line0(b), wg_line0(b + 1)): equal shares.  (Weighting them per launch wave — the third
// wave's blocks of an SM finished ~8 % after the first's — made the kernel slower: docs/design.md.)
__device__ __forceinline__ long long wg_line0(const WGParams& p, long long b) { return b * p.L / p.G; }
// the block holding line l: the last b with wg_line0(b) <= l
__device__ __forceinline__ long long wg_block_of(const WGParams& p, long long l) {
  return ((l + 1) * p.G + p.L - 1) / p.L - 1;
}

// Blocks that hold lines of image n (wg_block_of its first and last line), and the work of the last of them to
// flush the image in the deterministic-mean and max modes: out[n, :] from the per-block partials summed in block order
// (mean) or from the ordered-uint maxima, which it re-zeroes with the image's arrival counter (threads t of nthr),
// written in the output dtype DT (ff_store_f; the non-deterministic mean's float atomics add into a float32 out,
// which the host converts).
// POOL: the pool code when the caller has it at compile time, -1 to read p.pool.
__device__ __forceinline__ void wg_image_blocks(const WGParams& p, long long n, long long& blo, long long& bhi) {
  const long long la = n * p.lines_img, lb = la + p.lines_img - 1;
  blo = wg_block_of(p, la);
  bhi = wg_block_of(p, lb);
}
// Not inlined: it runs once per image and block at most, and inlined (with its batched loads) it cost the 16-bit
// kernels' main loop 16-40 bytes of stack.
template <int DT, int POOL = -1>
__device__ __noinline__ void wg_finish_image(const WGParams& p, long long n, long long blo, long long bhi, int t,
                                             int nthr) {
  __threadfence();
  if (POOL >= 0 ? POOL == FF_POOL_MEAN : p.pool == FF_POOL_MEAN) {
    // summed in a fixed order: NS consecutive threads share channel k, thread `slice` sums the blocks blo + slice,
    // blo + slice + NS, ... loading 32 at a time so that their L2 latencies overlap (an image held by hundreds of
    // blocks — small N — made one load after another the kernel's tail: N = 1 took longer than N = 8), then the NS
    // sums are combined by a fixed butterfly.  Block b's partial of image n sits at its slot n - (b's first image);
    // every block after blo starts inside image n (its first line lies in (first line of n, last line of n]), so only
    // blo's slot needs the division.
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
      if (slice == 0 && k < p.K) ff_store_f<DT>(p.out, n * p.K + k, s * p.inv_pq);
    }
  } else {
    for (int k = t; k < p.K; k += nthr) {
      unsigned* a = p.ws_max + n * p.K + k;
      ff_store_f<DT>(p.out, n * p.K + k, dec_max(__ldcg(a)));
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
