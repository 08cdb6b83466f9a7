// Family B fused kernel: its weights packed by its own blocks in every launch, before the first weight read.
// The packing (fused_convt_pack.cuh) is cut into pack_chunks chunks of FB_PACK_PER_THREAD items per thread that
// blocks claim as they start (counter pack_cnt[0] in the zeroed workspace).  A block packs every chunk it claimed
// before it waits for all of them (pack_cnt[1]), so the wait always ends: each claimed chunk is held by a running
// block, whatever the order and number of resident blocks.  Blocks past the compute grid (blockIdx.x >= nblocks)
// only pack, so that a small grid still spreads the packing over the SMs.  Every block counts itself once it no
// longer touches the counters (pack_cnt[2]); the last one sets all three back to zero at its end (the workspace
// invariant, fullfuse/workspace.py).
// A block that computes makes its round trips to these counters before it waits for its input tile (kernel.cuh), and
// its count of pack_cnt[2] is read only at its end; later waves find the packing done with one load.
// pack_chunks == 0: nothing here (the packing kernel ran before this grid; the kernel waits for it, kernel.cuh); no
// block touches the counters.
// Ordering (as CUTLASS's generic barrier): a chunk's writes, a barrier, then thread 0's count with release semantics;
// thread 0's acquire load that sees every chunk counted, then a barrier before any thread reads the packed weights.
#pragma once
#include "fused_convt_pack.cuh"
#include "fused_convt_pool_reduce/params.cuh"

template <int DT>   // the packing op of kernel variant DT
constexpr int fb_pack_op() { return DT == FB_X3 ? fb_pack::IEEE : DT == FF_F32 ? fb_pack::TF32 : fb_pack::COPY16; }

// thread 0: every chunk is packed (an acquire load: the block's barrier after it orders every thread's reads of the
// packed weights after the packing; no fence, which would wait for thread 0's own tile loads)
__device__ __forceinline__ bool fb_packed(const FBParams& p) {
  int done;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(p.pack_cnt + 1) : "memory");
  return done >= p.pack_chunks;
}

// this block's share of the packing (every thread of the block; s_claim: a shared int; OP: the packing of the kernel
// variant, fb_pack::Op): nothing where the packing is done already (one load: the later waves), else claim and pack
// chunks until none is left, then (WAIT) wait until every chunk is packed
template <int NTHR, int OP, bool WAIT>
__device__ __forceinline__ void fb_pack_share(const FBParams& p, int& s_claim) {
  if (p.pack_chunks == 0) return;
  if (threadIdx.x == 0) s_claim = fb_packed(p) ? -1 : atomicAdd(p.pack_cnt, 1);
  __syncthreads();
  int c = s_claim;
  __syncthreads();   // s_claim is written again below
  if (c < 0) return;
  constexpr int CHUNK = FB_PACK_PER_THREAD * NTHR;
  while (c < p.pack_chunks) {
    const long long first = (long long)c * CHUNK;
    fb_pack::pack_items<OP, FB_PACK_PER_THREAD>(p.w, const_cast<void*>(p.wp), p.pg, first + threadIdx.x,
                                                min(first + CHUNK, p.pack_total), NTHR);
    __syncthreads();
    if (threadIdx.x == 0) {   // the chunk counted with release semantics, after the barrier above
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(p.pack_cnt + 1) : "memory");
      s_claim = atomicAdd(p.pack_cnt, 1);
    }
    __syncthreads();
    c = s_claim;
    __syncthreads();
  }
  if (WAIT) {
    if (threadIdx.x == 0)
      while (!fb_packed(p)) __nanosleep(32);
    __syncthreads();
  }
}

// the block is done with the counters (thread 0 alone touches them; callable by all threads at any point after that):
// its count, issued now, read by fb_pack_reset_if_last at the block's end, so that no thread waits for it here
__device__ __forceinline__ int fb_pack_done(const FBParams& p) {
  return threadIdx.x == 0 && p.pack_chunks ? atomicAdd(p.pack_cnt + 2, 1) : 0;
}

// at the block's end, with fb_pack_done's count: the last block sets the three counters back to zero
__device__ __forceinline__ void fb_pack_reset_if_last(const FBParams& p, int done) {
  if (threadIdx.x == 0 && p.pack_chunks && done == (int)gridDim.x - 1) {
    p.pack_cnt[0] = 0;
    p.pack_cnt[1] = 0;
    p.pack_cnt[2] = 0;
  }
}
