// Family A, fused: the sm_90a instructions the wgmma kernel issues, one inline-PTX wrapper each — wgmma (SS, TF32 /
// bf16 / fp16), its fences, cp.async, mbarriers and TMA tensor copies.
#pragma once
#include "device_std.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_HAVE_WGMMA 1
#endif

#ifdef FA_HAVE_WGMMA
// One m64nN wgmma with both operands from shared-memory descriptors into the N / 2 accumulators at d (N = 128: 64;
// N = 64, two output rows per tile: the first 32, the n128 layout's first 8 column blocks); scale_d == 0 starts a new
// accumulation.
#define FA_ACC_REGS_LO \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define FA_ACC_REGS_HI \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define FA_ACC_OPS_LO \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FA_ACC_OPS_HI \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
// REGS: the accumulator list; IA, IB, IS: the operand numbers of the two descriptors and scale_d after it
#define FA_WGMMA_SS(NAME, REGS, IA, IB, IS, SHAPE_TYPES, TAIL, ...)                                           \
  __device__ __forceinline__ void NAME(float* d, uint64_t da, uint64_t db, int scale_d) {                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IS ", 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {" REGS "}, " IA ", " IB ", p, " TAIL ";\n}\n"  \
                 : __VA_ARGS__                                                                                \
                 : "l"(da), "l"(db), "r"(scale_d));                                                           \
  }
#define FA_N128 FA_ACC_REGS_LO "," FA_ACC_REGS_HI, "%64", "%65", "%66"
#define FA_N64 FA_ACC_REGS_LO, "%32", "%33", "%34"
#define FA_WGMMA_SS_X(...) FA_WGMMA_SS(__VA_ARGS__)   // (expands FA_N128 / FA_N64 into their four arguments first)
FA_WGMMA_SS_X(wgh_tf32, FA_N128, "m64n128k8.f32.tf32.tf32", "1, 1", FA_ACC_OPS_LO, FA_ACC_OPS_HI)
FA_WGMMA_SS_X(wgh_bf16, FA_N128, "m64n128k16.f32.bf16.bf16", "1, 1, 0, 0", FA_ACC_OPS_LO, FA_ACC_OPS_HI)
FA_WGMMA_SS_X(wgh_f16, FA_N128, "m64n128k16.f32.f16.f16", "1, 1, 0, 0", FA_ACC_OPS_LO, FA_ACC_OPS_HI)
FA_WGMMA_SS_X(wgh_tf32_n64, FA_N64, "m64n64k8.f32.tf32.tf32", "1, 1", FA_ACC_OPS_LO)
FA_WGMMA_SS_X(wgh_bf16_n64, FA_N64, "m64n64k16.f32.bf16.bf16", "1, 1, 0, 0", FA_ACC_OPS_LO)
FA_WGMMA_SS_X(wgh_f16_n64, FA_N64, "m64n64k16.f32.f16.f16", "1, 1, 0, 0", FA_ACC_OPS_LO)
#undef FA_WGMMA_SS_X
#undef FA_WGMMA_SS
#undef FA_N128
#undef FA_N64
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
#endif

__device__ __forceinline__ void cp_wait_n(int n) {   // cp.async.wait_group needs an immediate
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

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t a, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, unsigned parity) {
  asm volatile("{\n.reg .pred P1;\nMBAR_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@!P1 bra MBAR_WAIT;\n}" :: "r"(a), "r"(parity) : "memory");
}
// the mbarrier's single arrival, announcing `bytes` of bulk copies that complete its phase
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(a), "r"(bytes) : "memory");
}
// one TMA box of the tensor map `map` (a __grid_constant__ parameter) at the given coordinates (innermost first) into
// shared memory at dst (128-byte aligned); elements outside the tensor arrive as zeros
__device__ __forceinline__ void tma_load4(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load5(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar) : "memory");
}
