// Family A, fused: device helpers both kernels use — fp32 -> tf32 rounding, 16-bit element loads, the ordered-uint
// max encoding (atomicMax on floats, NaN-propagating), exact division by magic numbers, 16-bit pair packing.
#pragma once
#include "device_std.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "codes.h"
#include "activation.cuh"

// fp32 -> tf32 (low 13 bits 0), round to nearest: sm_90 has it as one instruction (F2FP.TF32, ties to even); sm_80's
// cvt.rna (ties away) compiles to 3-4 instructions.  Inf / NaN stay Inf / NaN.
__device__ __forceinline__ uint32_t f2tf32(float f) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0,%1;" : "=r"(r) : "f"(f));
#else
  asm("cvt.rna.tf32.f32 %0,%1;" : "=r"(r) : "f"(f));
#endif
  return r;
}

template <int DT> __device__ __forceinline__ uint16_t load_elem_h(const void* x, long long i) {
  return __ldg(reinterpret_cast<const unsigned short*>(x) + i);
}

__device__ __forceinline__ unsigned enc_max(float f) {
  if (f != f) return 0xFFFFFFFFu;
  unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float dec_max(unsigned e) {
  if (e == 0xFFFFFFFFu) return __uint_as_float(0x7FC00000u);
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7FFFFFFFu) : ~e);
}

// exact n / d for 0 <= n < 2^31: (n * m) >> s with m = ceil(2^s / d), s = 31 + ceil(log2 d)
__device__ __forceinline__ int fdiv(int n, unsigned long long m, int s) {
  return (int)(((unsigned long long)(unsigned)n * m) >> s);
}

template <int DT>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if (DT == FF_BF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}
