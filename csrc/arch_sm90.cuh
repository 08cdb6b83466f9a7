// The sm_90a instructions both fused kernels issue (family A's fa_wgmma_kernel, family B's fb_kernel), one wrapper
// each: wgmma (SS) and its fence / commit / wait through CuTe, the rest (cp.async, mbarriers, TMA tensor loads, the
// async-proxy fences, ldmatrix / stmatrix) as our own inline PTX.  Shared-memory operands are 32-bit shared-window
// addresses (__cvta_generic_to_shared).  benchmarks/probes/cutlass_nvrtc_probe.py measured each choice below
// (NVRTC 13.0, sm_90a): a CuTe / CUTLASS wrapper is taken only where its SASS is byte-identical to ours and its
// header is cheap.
#pragma once
#include "device_std.h"   // first: its uintptr_t is CCCL's (unsigned long long), so the two typedefs agree
#include "codes.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FF_HAVE_WGMMA 1
#endif

// ---- wgmma and wgmma.fence / commit_group / wait_group: CuTe (cute/arch/mma_sm90_gmma.hpp, CUTLASS >= 4.2 with the
// CCCL headers on the include path; cutlass_ops/nvrtc.py adds both).  Why CuTe: SASS byte-identical to our former
// hand-written PTX, ~0.08 s more compile per unit, and CuTe maintains the 32- to 64-register operand lists.
#include <cute/arch/mma_sm90_gmma.hpp>

#ifdef FF_HAVE_WGMMA
#define FF_D8(i) d[i], d[i + 1], d[i + 2], d[i + 3], d[i + 4], d[i + 5], d[i + 6], d[i + 7]
#define FF_D32 FF_D8(0), FF_D8(8), FF_D8(16), FF_D8(24)
#define FF_D48 FF_D32, FF_D8(32), FF_D8(40)
#define FF_D64 FF_D48, FF_D8(48), FF_D8(56)
// D (64 x N fp32: N / 2 registers per thread at d) += A (64 x k) * B (k x N), both from shared-memory descriptors,
// both K-major, unscaled; k = 8 tf32 (DT FF_F32) or 16 bf16 / fp16.  scale_d == 0 starts a new sum (D ignored).
// N: 128 and 64 (family A's tile and its two-rows-per-tile halves), 96 (family B's tile).
template <int N, int DT>
__device__ __forceinline__ void ff_wgmma(float* d, uint64_t da, uint64_t db, int scale_d) {
  namespace G = cute::SM90::GMMA;
  constexpr G::Major K = G::Major::K;
  const G::ScaleOut sc = static_cast<G::ScaleOut>(scale_d);   // CuTe tests it != 0 like our PTX did
  static_assert(N == 64 || N == 96 || N == 128, "wgmma shapes in use: m64n64, m64n96, m64n128");
  static_assert(DT == FF_F32 || DT == FF_BF16 || DT == FF_F16, "dtype code");
  if constexpr (N == 128) {
    if constexpr (DT == FF_F32) G::MMA_64x128x8_F32TF32TF32_SS_TN<>::fma(da, db, FF_D64, sc);
    else if constexpr (DT == FF_BF16) G::MMA_64x128x16_F32BF16BF16_SS<K, K>::fma(da, db, FF_D64, sc);
    else G::MMA_64x128x16_F32F16F16_SS<K, K>::fma(da, db, FF_D64, sc);
  } else if constexpr (N == 96) {
    if constexpr (DT == FF_F32) G::MMA_64x96x8_F32TF32TF32_SS_TN<>::fma(da, db, FF_D48, sc);
    else if constexpr (DT == FF_BF16) G::MMA_64x96x16_F32BF16BF16_SS<K, K>::fma(da, db, FF_D48, sc);
    else G::MMA_64x96x16_F32F16F16_SS<K, K>::fma(da, db, FF_D48, sc);
  } else {
    if constexpr (DT == FF_F32) G::MMA_64x64x8_F32TF32TF32_SS_TN<>::fma(da, db, FF_D32, sc);
    else if constexpr (DT == FF_BF16) G::MMA_64x64x16_F32BF16BF16_SS<K, K>::fma(da, db, FF_D32, sc);
    else G::MMA_64x64x16_F32F16F16_SS<K, K>::fma(da, db, FF_D32, sc);
  }
}
#undef FF_D64
#undef FF_D48
#undef FF_D32
#undef FF_D8
// wgmma.fence before a warpgroup's first wgmma that reads registers / shared memory written since; commit_group
// closes the wgmmas issued since into one group; wait_group<N> returns when at most N groups are in flight.  All three
// clobber "memory" (as ours did), so no shared-memory access moves across them.
__device__ __forceinline__ void ff_wg_fence() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void ff_wg_commit() { cute::warpgroup_commit_batch(); }
template <int N> __device__ __forceinline__ void ff_wg_wait() { cute::warpgroup_wait<N>(); }
#endif

// ---- cp.async and its commit / wait: ours.  Why: CuTe's change the SASS (its copies add the .L2::128B prefetch,
// LDGSTS.LTC128B; its cp_async_wait<0> is wait_all, one more LDGDEPBAR).  ok == false zero-fills the destination
// (src-size 0; src must still be a valid address).  Every one clobbers "memory".
__device__ __forceinline__ void ff_cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void ff_cp_async4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void ff_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void ff_cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// at most N groups of this thread still in flight (N: an immediate, 0..7)
template <int N> __device__ __forceinline__ void ff_cp_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void ff_cp_wait_n(int n) {   // a run-time n: cp.async.wait_group needs an immediate
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}
// generic-proxy writes to shared memory (st.shared, cp.async) become visible to the async proxy (wgmma, TMA) that
// reads / overwrites them after the next barrier
__device__ __forceinline__ void ff_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- programmatic dependent launch: ours.  Why: CUTLASS's (cutlass/arch/grid_dependency_control.h) emits the same
// instruction, but that header pulls in the GEMM and conv dispatch policies.  Waits until the grids this one depends
// on have completed and their memory is visible (a no-op in a grid launched without a programmatic dependency).
__device__ __forceinline__ void ff_grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---- mbarrier init / expect_tx: ours.  Why: CUTLASS's (cutlass/arch/barrier.h) give identical SASS, but that header
// costs +1.1 s per unit (~45 %) and its asm drops our "memory" clobbers.
__device__ __forceinline__ void ff_mbar_init(uint32_t a, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(a), "r"(count) : "memory");
}
// after the inits, before the barriers' first use by another thread or by TMA
__device__ __forceinline__ void ff_fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// the mbarrier's single arrival, announcing `bytes` of bulk copies that complete its phase
__device__ __forceinline__ void ff_mbar_expect_tx(uint32_t a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(a), "r"(bytes) : "memory");
}
// ---- mbarrier wait: ours.  Why: CUTLASS's / CuTe's change the SASS (ClusterBarrier::wait backs off with NANOSLEEP,
// cute::wait_barrier loops differently).  Spins until the phase with the given parity has completed.
__device__ __forceinline__ void ff_mbar_wait(uint32_t a, unsigned parity) {
  asm volatile("{\n.reg .pred P1;\nMBAR_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@!P1 bra MBAR_WAIT;\n}" :: "r"(a), "r"(parity) : "memory");
}

// ---- TMA tensor loads: ours.  Why: CuTe's SM90_TMA_LOAD_4D / 5D change the SASS (an L2 cache-hint operand).  One
// box of the tensor map `map` (a __grid_constant__ parameter) at the given coordinates (innermost first) into shared
// memory at dst (128-byte aligned), completing `bytes` on the mbarrier bar; elements outside the tensor arrive as 0.
__device__ __forceinline__ void ff_tma_load4(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2,
                                             int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5}], [%6];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
__device__ __forceinline__ void ff_tma_load5(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2,
                                             int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar) : "memory");
}

// ---- ldmatrix / stmatrix (four 8 x 8 b16 matrices; the load transposed): ours.  Why: CuTe's give identical SASS, but
// their headers (copy_sm75 / copy_sm90_tma) cost ~+1 s per unit and CuTe's stmatrix has no "memory" clobber.  The
// load has none, as before.
__device__ __forceinline__ void ff_ldsm_x4_trans(uint32_t src, uint32_t (&v)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(src));
}
__device__ __forceinline__ void ff_stsm_x4(uint32_t dst, const uint32_t (&v)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};"
               :: "r"(dst), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}
