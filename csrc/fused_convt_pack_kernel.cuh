// Family B's weight packing alone, as a kernel of its own: the fused kernel packs its weights itself
// (fused_convt_pool_reduce/weight_pack.cuh); this kernel runs the same pack_item for tests and probes
// (fullfuse/fused/convt_pool_reduce.py packed_weights, against the torch reference pack_weights).
// Launch: grid (ceil(items per slice / 1024), slices), 256 threads.
#pragma once
#include "fused_convt_pack.cuh"

namespace fb_pack {

// one slice per blockIdx.y (its tap worked out once per thread), its items over blockIdx.x and the threads
template <int OP>
__device__ __forceinline__ void pack_slice_part(const void* __restrict__ w, void* __restrict__ out, const Geometry& g) {
  const int j = blockIdx.y;
  const int per = slice_items(g);
  int t[3];
  slice_tap(g, j, t);
#pragma unroll 4
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < per; e += gridDim.x * blockDim.x)
    pack_item<OP>(w, out, g, j, t, e, per);
}

__global__ void pack_kernel(const void* __restrict__ w, void* __restrict__ out, const Geometry g) {
  if (g.op == COPY16) pack_slice_part<COPY16>(w, out, g);
  else if (g.op == TF32) pack_slice_part<TF32>(w, out, g);
  else pack_slice_part<IEEE>(w, out, g);
}

}  // namespace fb_pack
