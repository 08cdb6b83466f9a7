// Family B fused kernel: its weights packed by its own blocks in every launch, before the first weight read.
// The packing (fused_convt_pack.cuh) is cut into pack_chunks chunks of pack_chunk items that blocks claim as they
// start (counter pack_cnt[0] in the zeroed workspace).  A block packs every chunk it claimed before it waits for all
// of them (pack_cnt[1]), so the wait always ends: each claimed chunk is held by a running block, whatever the order and
// number of resident blocks.  Blocks past the compute grid (blockIdx.x >= nblocks) only pack, so that a small grid
// still spreads the packing over the SMs.  Every block counts itself once it no longer touches the counters
// (pack_cnt[2]); the last one sets all three back to zero (the workspace invariant, fullfuse/workspace.py).
// Ordering: a chunk's writes, a barrier, then thread 0's fence and count; the waiting thread 0's acquire load, a
// fence, then a barrier before any thread reads the packed weights.
#pragma once
#include "fused_convt_pack.cuh"
#include "fused_convt_pool_reduce/params.cuh"

template <int DT>   // the packing op of kernel variant DT
constexpr int fb_pack_op() { return DT == FB_X3 ? fb_pack::IEEE : DT == FF_F32 ? fb_pack::TF32 : fb_pack::COPY16; }

// claim and pack chunks until none is left (every thread of the block; s_claim: a shared int); OP: the packing of the
// kernel variant (fb_pack::Op, p.pg.op)
template <int NTHR, int OP>
__device__ __forceinline__ void fb_pack_claimed(const FBParams& p, int& s_claim) {
  for (;;) {
    if (threadIdx.x == 0) s_claim = atomicAdd(p.pack_cnt, 1);
    __syncthreads();
    const int c = s_claim;
    __syncthreads();   // s_claim is written again in the next round
    if (c >= p.pack_chunks) return;
    const long long first = (long long)c * p.pack_chunk;
    fb_pack::pack_items<OP>(p.w, const_cast<void*>(p.wp), p.pg, first + threadIdx.x,
                        min(first + p.pack_chunk, p.pack_total), NTHR);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(p.pack_cnt + 1, 1);
    }
  }
}

// until every chunk is packed (every thread of the block)
__device__ __forceinline__ void fb_pack_wait(const FBParams& p) {
  if (threadIdx.x == 0) {
    for (;;) {
      int done;
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(p.pack_cnt + 1) : "memory");
      if (done >= p.pack_chunks) break;
      __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// the block is done with the counters (thread 0 alone touches them: callable by all threads at any point after that)
__device__ __forceinline__ void fb_pack_exit(const FBParams& p) {
  if (threadIdx.x == 0 && atomicAdd(p.pack_cnt + 2, 1) == (int)gridDim.x - 1) {
    p.pack_cnt[0] = 0;
    p.pack_cnt[1] = 0;
    p.pack_cnt[2] = 0;
  }
}
