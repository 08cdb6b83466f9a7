// Family B's weight packing as a kernel of its own: it runs before a fused kernel whose grid has more than one wave
// (that kernel launched with a programmatic dependency on it), and for tests and probes (fullfuse/fused/
// convt_pool_reduce.py packed_weights, against the torch reference pack_weights).  The in-kernel packing of one-wave
// grids (fused_convt_pool_reduce/weight_pack.cuh) writes the same bytes through pack_items.
// A block packs one tile: TILE_ROWS (c, k) rows — G input channels (one channel group of a slice) x TILE_ROWS / G
// output channels — over up to TILE_TAPS taps.  It reads the rows' taps in the weight's own order (contiguous for a
// contiguous filter: taps innermost, then k), into shared memory, then writes each tap's TILE_ROWS items, which lie
// together in the tap's slice.  Both sides coalesce where gathering one slice at a time read every value from a
// different sector (at the seed's 125-value tap stride).
// Launch: grid (pack_tiles(g)) (convt_pool_reduce_plan.packing_grid), PACK_THREADS threads, no dynamic shared memory.
#pragma once
#include "fused_convt_pack.cuh"

namespace fb_pack {

constexpr int PACK_THREADS = 256;
constexpr int TILE_ROWS = 16;                                // (c, k) rows per tile; G (4 or 8) divides it
constexpr int TILE_TAPS = 128;
constexpr int TILE_LOADS = TILE_ROWS * TILE_TAPS / PACK_THREADS;   // loads per thread, in flight together
constexpr int TILE_PITCH = TILE_TAPS + 2;                    // a row's pitch in shared memory: the 16 rows of one tap
                                                             // fall into distinct banks

// the slice that holds tap (td, th, tw): slice_tap_bits' inverse (classes in (rd, rh, rw) order, taps md-major)
__device__ __noinline__ int tap_slice(int td, int th, int tw, int T0, int T1, int T2, int s0, int s1, int s2) {
  const int cd = td % s0, ch = th % s1, cw = tw % s2;
  int base = 0;
  for (int rd = 0; rd < s0; ++rd)
    for (int rh = 0; rh < s1; ++rh)
      for (int rw = 0; rw < s2; ++rw) {
        const int nd = taps(T0, s0, rd), nh = taps(T1, s1, rh), nw = taps(T2, s2, rw);
        if (rd == cd && rh == ch && rw == cw) return base + ((td / s0) * nh + th / s1) * nw + tw / s2;
        base += nd * nh * nw;
      }
  return 0;
}

// tiles of one part of the packing: a slice's items [ebase, ebase + cpad * 64) as [cpad / G][64][G]
__device__ __forceinline__ int part_tiles(int cpad, int G, int nchunks) {
  return cpad / G * (64 * G / TILE_ROWS) * nchunks;
}

struct TileSmem {
  uint32_t vals[TILE_ROWS * TILE_PITCH];   // the tile's values, a row per (c, k)
  long long tap_off[TILE_TAPS];            // a tap's offset in the weight
  int tap_at[TILE_TAPS];                   // its slice
};

template <int OP>
__device__ __forceinline__ void pack_tile(const void* __restrict__ w, void* __restrict__ out, const Geometry& g,
                                          TileSmem& sm) {
  uint32_t* vals = sm.vals;
  long long* tap_off = sm.tap_off;
  int* tap_at = sm.tap_at;
  const int ntaps = g.nslices, nchunks = (ntaps + TILE_TAPS - 1) / TILE_TAPS;
  // part 0: G = 8 (16-bit) or 4 (tf32; ieee's (hi, lo) pairs) over cpad; ieee's part 1: its bf16 values, G = 8 over
  // cpad16, after part 0's items in each slice
  int G = OP == COPY16 ? 8 : 4, cpad = g.cpad, ebase = 0;
  int tile = blockIdx.x;
  const int tiles0 = part_tiles(cpad, G, nchunks);
  if (tile >= tiles0) {
    tile -= tiles0;
    G = 8;
    cpad = g.cpad16;
    ebase = g.cpad * 64;
  }
  const int kper = TILE_ROWS / G, chunk = tile % nchunks;
  tile /= nchunks;
  const int k0 = tile % (64 / kper) * kper, c0 = tile / (64 / kper) * G;
  const int tap0 = chunk * TILE_TAPS, nt = min(TILE_TAPS, ntaps - tap0);
  const int tid = threadIdx.x;
  if (tid < nt) {
    const int tap = tap0 + tid, td = tap / (g.T[1] * g.T[2]), th = tap / g.T[2] % g.T[1], tw = tap % g.T[2];
    tap_off[tid] = td * g.ws[2] + th * g.ws[3] + tw * g.ws[4];
    tap_at[tid] = tap_slice(td, th, tw, g.T[0], g.T[1], g.T[2], g.s[0], g.s[1], g.s[2]);
  }
  __syncthreads();
  // row r = (channel c0 + r / kper, output channel k0 + r % kper): consecutive threads read one row's taps, and a
  // channel's rows follow each other in a contiguous filter
  uint32_t v[TILE_LOADS];
#pragma unroll
  for (int i = 0; i < TILE_LOADS; ++i) {
    const int idx = tid + i * PACK_THREADS, r = idx / nt, t = idx - r * nt;
    const int c = c0 + r / kper, k = k0 + r % kper;
    v[i] = 0u;
    if (r < TILE_ROWS && c < g.C && k < g.K)
      v[i] = pack_load<OP>(w, c * g.ws[0] + k * g.ws[1] + tap_off[t]);
  }
#pragma unroll
  for (int i = 0; i < TILE_LOADS; ++i) {
    const int idx = tid + i * PACK_THREADS, r = idx / nt;
    if (r < TILE_ROWS) vals[r * TILE_PITCH + idx - r * nt] = v[i];
  }
  __syncthreads();
  // item q of a tap: output channel k0 + q / G, channel c0 + q % G, at e = ebase + ((c0 / G) * 64 + k0) * G + q
  const int per = slice_items(g), e0 = ebase + (c0 / G * 64 + k0) * G;
#pragma unroll
  for (int i = 0; i < TILE_LOADS; ++i) {
    const int idx = tid + i * PACK_THREADS, t = idx / TILE_ROWS, q = idx % TILE_ROWS;
    if (t < nt) pack_store<OP>(out, g, tap_at[t], e0 + q, per, vals[(q % G * kper + q / G) * TILE_PITCH + t]);
  }
}

__global__ void __launch_bounds__(PACK_THREADS) pack_kernel(const void* __restrict__ w, void* __restrict__ out,
                                                            const Geometry g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // the fused kernel that reads `out` may start now (launched with a programmatic dependency on this grid, it waits
  // for this grid's completion before its first read: griddepcontrol.wait)
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  __shared__ TileSmem sm;
  if (g.op == COPY16) pack_tile<COPY16>(w, out, g, sm);
  else if (g.op == TF32) pack_tile<TF32>(w, out, g, sm);
  else pack_tile<IEEE>(w, out, g, sm);
}

}  // namespace fb_pack
