// Family B's weight packing as a kernel of its own: it runs before a fused kernel whose grid has more than one wave
// (that kernel launched with a programmatic dependency on it), and for tests and probes (fullfuse/fused/
// convt_pool_reduce.py packed_weights, against the torch reference pack_weights).  The in-kernel packing of one-wave
// grids (fused_convt_pool_reduce/weight_pack.cuh) writes the same bytes through pack_items.
// A block packs one tile: TILE_ROWS (c, k) rows — G input channels (one channel group of a slice) x TILE_ROWS / G
// output channels — over up to TILE_TAPS taps.  Each thread reads one tap of TILE_ROWS / ROW_STEP rows (consecutive
// threads: consecutive taps of a row, contiguous in a contiguous filter) into shared memory; then each tap's
// TILE_ROWS items, which lie together in the tap's slice, are written by consecutive threads.  Both sides coalesce,
// where gathering one slice per block read every value from a different sector (the seed's taps lie 125 values apart).
// No integer division but by the taps' geometry, once per thread: the block's time is mostly its one round of loads.
// Launch: grid (tiles) (convt_pool_reduce_plan.packing_grid), PACK_THREADS threads, no dynamic shared memory.
#pragma once
#include "fused_convt_pack.cuh"

namespace fb_pack {

constexpr int PACK_THREADS = 256;
constexpr int TILE_ROWS = 16;                                  // (c, k) rows per tile; G (4 or 8) divides it
constexpr int TILE_TAPS = 128;
constexpr int ROW_STEP = PACK_THREADS / TILE_TAPS;             // a thread reads rows r0, r0 + ROW_STEP, ... at one tap
constexpr int TILE_PITCH = TILE_TAPS + 2;                      // a row's pitch in shared memory: the 16 rows of one tap
                                                               // fall into distinct banks
static_assert(PACK_THREADS % TILE_TAPS == 0 && TILE_ROWS % ROW_STEP == 0, "a tile's reads: whole rows per thread");

// tiles of one part of the packing: a slice's items [ebase, ebase + cpad * 64) as [cpad / G][64][G], in taps chunks
__device__ __forceinline__ int part_tiles(int cpad, int G, int nchunks) {
  return cpad / G * (64 * G / TILE_ROWS) * nchunks;
}

struct TileSmem {
  uint32_t vals[TILE_ROWS * TILE_PITCH];   // the tile's values, a row per (c, k)
  int tap_at[TILE_TAPS];                   // each tap's slice
};

// tile number `tile` of the part with channel groups of G over cpad channels, items from ebase in each slice
template <int OP, int G>
__device__ __forceinline__ void pack_tile(const void* __restrict__ w, void* __restrict__ out, const Geometry& g,
                                          int tile, int ebase, TileSmem& sm) {
  constexpr int KPER = TILE_ROWS / G;   // output channels per tile
  const int ntaps = g.nslices, nchunks = (ntaps + TILE_TAPS - 1) / TILE_TAPS;
  const int chunk = tile % nchunks;
  tile /= nchunks;
  const int k0 = tile % (64 / KPER) * KPER, c0 = tile / (64 / KPER) * G;
  const int tap0 = chunk * TILE_TAPS, nt = min(TILE_TAPS, ntaps - tap0);
  // reads: the thread's tap t, rows r0 + ROW_STEP i; row r = (channel c0 + r / KPER, output channel k0 + r % KPER):
  // consecutive threads read one row's consecutive taps, and a channel's rows follow each other in a contiguous filter
  const int t = threadIdx.x % TILE_TAPS, r0 = threadIdx.x / TILE_TAPS;
  if (t < nt) {
    const int tap = tap0 + t;
    const int td = tap / (g.T[1] * g.T[2]), th = tap / g.T[2] % g.T[1], tw = tap % g.T[2];
    const long long off = td * g.ws[2] + th * g.ws[3] + tw * g.ws[4];
    uint32_t v[TILE_ROWS / ROW_STEP];
#pragma unroll
    for (int i = 0; i < TILE_ROWS / ROW_STEP; ++i) {
      const int r = r0 + ROW_STEP * i, c = c0 + r / KPER, k = k0 + r % KPER;
      v[i] = c < g.C && k < g.K ? pack_load<OP>(w, c * g.ws[0] + k * g.ws[1] + off) : 0u;
    }
    if (r0 == 0) sm.tap_at[t] = tap_slice(td, th, tw, g);
#pragma unroll
    for (int i = 0; i < TILE_ROWS / ROW_STEP; ++i) sm.vals[(r0 + ROW_STEP * i) * TILE_PITCH + t] = v[i];
  }
  __syncthreads();
  // writes: item q of a tap (output channel k0 + q / G, channel c0 + q % G) at e = ebase + (c0 / G * 64 + k0) * G + q
  // of the tap's slice: a tap's TILE_ROWS items lie together
  const int per = slice_items(g), e0 = ebase + (c0 / G * 64 + k0) * G;
#pragma unroll
  for (int i = 0; i < TILE_ROWS * TILE_TAPS / PACK_THREADS; ++i) {
    const int idx = threadIdx.x + i * PACK_THREADS, tt = idx / TILE_ROWS, q = idx % TILE_ROWS;
    if (tt < nt) pack_store<OP>(out, g, sm.tap_at[tt], e0 + q, per, sm.vals[(q % G * KPER + q / G) * TILE_PITCH + tt]);
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
  // part 0: G = 8 (16-bit) or 4 (tf32; ieee's (hi, lo) pairs) over cpad; ieee's part 1: its bf16 values, G = 8 over
  // cpad16, after part 0's items in each slice
  const int tiles0 = part_tiles(g.cpad, g.op == COPY16 ? 8 : 4, (g.nslices + TILE_TAPS - 1) / TILE_TAPS);
  const int tile = blockIdx.x;
  if (g.op == COPY16) pack_tile<COPY16, 8>(w, out, g, tile, 0, sm);
  else if (g.op == TF32) pack_tile<TF32, 4>(w, out, g, tile, 0, sm);
  else if (tile < tiles0) pack_tile<IEEE, 4>(w, out, g, tile, 0, sm);
  else pack_tile<IEEE, 8>(w, out, g, tile - tiles0, g.cpad * 64, sm);
}

}  // namespace fb_pack
