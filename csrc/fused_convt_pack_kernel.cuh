// Family B's weight packing as a kernel of its own, the same pack_item as the fused kernel's in-kernel packing
// (fused_convt_pool_reduce/weight_pack.cuh).  It runs before a fused kernel whose grid has more than one wave (that
// kernel launched with a programmatic dependency on it), and for tests and probes (fullfuse/fused/convt_pool_reduce.py
// packed_weights, against the torch reference pack_weights).
// Launch: grid (ceil(items per slice / 1024), slices) (convt_pool_reduce_plan.packing_grid), 256 threads.
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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // the fused kernel that reads `out` may start now (launched with a programmatic dependency on this grid, it waits
  // for this grid's completion before its first read: griddepcontrol.wait)
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  if (g.op == COPY16) pack_slice_part<COPY16>(w, out, g);
  else if (g.op == TF32) pack_slice_part<TF32>(w, out, g);
  else pack_slice_part<IEEE>(w, out, g);
}

}  // namespace fb_pack
