// Family B fused kernel: the device primitives it is built from -- ordered-uint encoding of floats for the window
// maxima, TF32 rounding and the run-time activation switch; the sm_90a instructions (cp.async, the m64n96 wgmma forms,
// fences) are arch_sm90.cuh's, shared with family A.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "device_std.h"
#include "codes.h"
#include "activation.cuh"
#include "arch_sm90.cuh"
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
// Runtime activation, one switch per value (uniform across the block): for the few values of windows no tap reaches
// (fb_channel_reduce); a tile's values take one switch per tile (fb_activate_tile).
__device__ __forceinline__ float fb_act(int act, float v) {
  switch (act) {
    case FF_ACT_RELU: return ff_activate<FF_ACT_RELU>(v);
    case FF_ACT_GELU_ERF: return ff_activate<FF_ACT_GELU_ERF>(v);
    case FF_ACT_GELU_TANH: return ff_activate<FF_ACT_GELU_TANH>(v);
    case FF_ACT_SILU: return ff_activate<FF_ACT_SILU>(v);
    default: return v;
  }
}
