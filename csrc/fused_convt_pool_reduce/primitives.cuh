// Family B fused kernel: the device primitives it is built from -- ordered-uint encoding of floats for the window
// maxima, TF32 rounding, asynchronous copies, the m64n96 wgmma forms, and the run-time activation switch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "device_std.h"
#include "codes.h"
#include "activation.cuh"
#include "fused_convt_pool_reduce/params.cuh"

// Window maxima are kept as ordered uints so that atomicMax on them is a float max: fb_enc is monotone, NaN encodes
// above everything (NaN-propagating max) and 0 is below every encoded value (an untouched window).
__device__ __forceinline__ unsigned fb_enc(float f) {
  if (f != f) return 0xFFFFFFFFu;
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float fb_dec(unsigned e) {
  if (e == 0xFFFFFFFFu) return __uint_as_float(0x7FC00000u);
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7FFFFFFFu) : ~e);
}
__device__ __forceinline__ uint32_t fb_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0,%1;" : "=r"(r) : "f"(f));
  return r;
}
// Runtime activation for the (rarely used) activated kernels: one switch per value, uniform across the block.
__device__ __forceinline__ float fb_act(int act, float v) {
  switch (act) {
    case FF_ACT_RELU: return ff_activate<FF_ACT_RELU>(v);
    case FF_ACT_GELU_ERF: return ff_activate<FF_ACT_GELU_ERF>(v);
    case FF_ACT_GELU_TANH: return ff_activate<FF_ACT_GELU_TANH>(v);
    case FF_ACT_SILU: return ff_activate<FF_ACT_SILU>(v);
    default: return v;
  }
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FB_HAVE_WGMMA 1
// D (64 x 96 fp32, 48 registers per thread) += A (64 x k, descriptor) * B (k x 96, descriptor): k = 8 tf32 (fp32
// input) or 16 bf16 / fp16, both operands K-major in shared memory.
#define FB_WGMMA_N96(NAME, SHAPE_TYPES, TAIL)                                                                    \
  __device__ __forceinline__ void NAME(float (&d)[48], uint64_t da, uint64_t db, int scale_d) {                  \
    asm volatile(                                                                                                 \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"                                                            \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES " "                                                          \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
        "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, p, " TAIL   \
        ";\n}\n"                                                                                                 \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]) \
        : "l"(da), "l"(db), "r"(scale_d));                                                                       \
  }
FB_WGMMA_N96(fb_wgmma_tf32, "m64n96k8.f32.tf32.tf32", "1, 1")
FB_WGMMA_N96(fb_wgmma_bf16, "m64n96k16.f32.bf16.bf16", "1, 1, 0, 0")
FB_WGMMA_N96(fb_wgmma_f16, "m64n96k16.f32.f16.f16", "1, 1, 0, 0")
#undef FB_WGMMA_N96
template <int DT>
__device__ __forceinline__ void fb_wgmma(float (&d)[48], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (DT == FF_F32) fb_wgmma_tf32(d, da, db, scale_d);
  else if constexpr (DT == FF_BF16) fb_wgmma_bf16(d, da, db, scale_d);
  else fb_wgmma_f16(d, da, db, scale_d);
}
#endif

__device__ __forceinline__ void fb_cp16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void fb_cp4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
