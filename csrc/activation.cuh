// Device helpers shared by the fullfuse CUDA kernels (the fallback epilogues and the fused kernels); run-time codes are
// in codes.h.  Accuracy, one line per function:
//   ff_activate<FF_ACT_NONE>       x, exact.
//   ff_activate<FF_ACT_RELU>       max(x, 0), exact; relu(NaN) = NaN like torch.relu.
//   ff_activate<FF_ACT_GELU_ERF>   relu(x) - u*2^P5(u), u = |x| (fast_gelu.md): abs err <= 3.1e-7*max(1,|x|) vs exact
//                                  erf GELU; specials as PyTorch: -inf -> NaN, -0 -> -0, +inf -> +inf, NaN -> NaN,
//                                  x < ~-11 -> -0.
//   ff_gelu_erf_noclamp            ff_gelu_erf bit for bit, except +inf -> NaN; 3 issue slots fewer (see there).
//   ff_activate<FF_ACT_GELU_TANH>  0.5*x*(1 + tanhf(sqrt(2/pi)*(x + 0.044715*x^3))) in PyTorch's operation order,
//                                  libdevice tanhf (2 ulp); -inf -> NaN (-inf*0) like PyTorch.
//   ff_activate<FF_ACT_SILU>       x*sigmoid(x) as n/(1+t), t = expf(-|x|) (2 ulp), rcp + residual step: <= ~4 ulp
//                                  relative; -inf -> NaN like PyTorch's x/(1+exp(-x)) (= x*(1/(1+e^-x)) there);
//                                  +inf -> +inf; x < -87 gives a denormal (~x*e^x) where PyTorch gives -0.
//   ff_max_nan(a, b)               exact max; NaN if either is NaN (torch max_pool / amax semantics).
//   ff_f16_sat(x)                  +-inf for |x| >= 65520 (fp16's overflow), else x: an fp16 conv output as PyTorch
//                                  rounds it, for the fused fp16 epilogues.
//   ff_load<T, V>(p, o)            exact fp32 / bf16 / fp16 -> fp32; V == 1 scalar, else ONE 16-byte load (V*sizeof(T)
//                                  == 16, p 16-byte aligned); streaming (.cs) cache hint: data is read once.
//                                  = ff_convert(ff_load_raw(p)); ff_load1(p) is the scalar form.  T = ff_f16_range:
//                                  float storage, loaded as float.
//   ff_in_range<T>(x)              ff_f16_sat(x) for T = ff_f16_range, else x, exact.
#pragma once
#include "device_std.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "codes.h"

__device__ __forceinline__ float ff_max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// An fp16 conv's output as PyTorch sees it past fp16's range: |x| >= 65520 (what rounds to +-inf in fp16) becomes
// +-inf, NaN stays NaN, everything else is kept in fp32.  The fused kernels' fp16 epilogues apply it before the
// activation, so GELU / SiLU / the pools give PyTorch's inf / NaN where its fp16 conv output overflowed.
__device__ __forceinline__ float ff_f16_sat(float x) {
  return fabsf(x) >= 65520.0f ? copysignf(__int_as_float(0x7f800000), x) : x;
}

// r ~ log2(Phi(-u)) for u >= 0: the degree-5 Horner polynomial of fast_gelu.md (5 FFMA)
__device__ __forceinline__ float ff_phi_neg_log2(float u) {
  float r = fmaf(-0x1.05cf34p-11f, u, 0x1.db850ap-8f);
  r = fmaf(r, u, -0x1.abd318p-5f);
  r = fmaf(r, u, -0x1.d6a0a2p-2f);
  r = fmaf(r, u, -0x1.26a4a0p+0f);
  return fmaf(r, u, -0x1.000120p+0f);
}
// Phi(-u) for u >= 0 (or NaN): 2^ff_phi_neg_log2(u), one MUFU.EX2 (flushes to 0 below 2^-126).  Shared by both GELU
// forms below.
__device__ __forceinline__ float ff_phi_neg(float u) {
  const float r = ff_phi_neg_log2(u);
  float q;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q) : "f"(r));
  return q;
}

__device__ __forceinline__ float ff_gelu_erf(float x) {
  float u;  // u = min(|x|, 16), NaN kept; the clamp keeps the polynomial finite
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(u) : "f"(fabsf(x)), "f"(16.0f));
  const float q = ff_phi_neg(u);
  // m = min(x, -u) is -u for x > 0 (x - u*q) and x for x <= 0 (x*Phi(x) + (-0) = x*q - 0), one FMNMX instead of a
  // compare + select: -inf -> -inf*0 = NaN, -0 -> -0, underflow -> -0 (as PyTorch); NaN: u = NaN, so m = NaN.
  const float m = fminf(x, -u);
  return fmaf(m, q, fmaxf(x, -0.0f));
}

// ff_gelu_erf without the clamp of u: bitwise the same for every x except +inf, where it gives NaN (|x| * 0) instead of
// +inf; -inf and NaN give NaN as there.  (For finite |x| > 16 the fp32 Horner value is <= -399 all the way to FLT_MAX
// and -inf at inf, checked over every float in [16, 4096] and a log sweep above, so ex2 flushes q to 0 as at the
// clamp.)  5 FFMA taking |x| as an operand modifier + MUFU + FMNMX + FFMA: 3 issue slots fewer than ff_gelu_erf.  For
// hot loops whose inputs are known finite (the fused A wgmma kernel takes it while a block's inputs are bounded).
__device__ __forceinline__ float ff_gelu_erf_noclamp(float x) {
  const float u = fabsf(x);
  return fmaf(-u, ff_phi_neg(u), fmaxf(x, -0.0f));
}

template <int ACT>
__device__ __forceinline__ float ff_activate(float x) {
  if constexpr (ACT == FF_ACT_NONE) {
    return x;
  } else if constexpr (ACT == FF_ACT_RELU) {
    return ff_max_nan(x, 0.0f);
  } else if constexpr (ACT == FF_ACT_GELU_ERF) {
    return ff_gelu_erf(x);
  } else if constexpr (ACT == FF_ACT_GELU_TANH) {
    const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2/pi), as PyTorch's float constants
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else {
    static_assert(ACT == FF_ACT_SILU, "unknown activation code");
    // x*sigmoid(x) = n/d with t = e^-|x|, d = 1 + t in [1,2], n = x (x >= 0) or x*t (x < 0): no overflow, so the
    // division is rcp + one residual step (no IEEE-division slow-path call).  -inf: n = -inf*0 = NaN as PyTorch.
    const float t = expf(-fabsf(x)), d = 1.0f + t, n = x >= 0.0f ? x : x * t;
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    const float q = n * r, e = fmaf(-d, q, n);
    return fabsf(e) > 0.0f ? fmaf(e, r, q) : q;  // e == 0: q exact (keeps -0); e NaN: n = +-inf or NaN, q = n
  }
}

// Reduction operator: sum (also used for means, scaled afterwards) or NaN-propagating max.
template <bool IS_MAX>
struct ff_red {
  static __device__ __forceinline__ float identity() { return IS_MAX ? -INFINITY : 0.0f; }
  static __device__ __forceinline__ float op(float a, float b) { return IS_MAX ? ff_max_nan(a, b) : a + b; }
  template <int V>  // fixed pairwise order over a small register array
  static __device__ __forceinline__ float all(const float (&a)[V]) {
    if constexpr (V == 1) {
      return a[0];
    } else {
      float h[V / 2];
#pragma unroll
      for (int i = 0; i < V / 2; ++i) h[i] = op(a[2 * i], a[2 * i + 1]);
      return all<V / 2>(h);
    }
  }
};

// ---- loads: T in {float, __nv_bfloat16, __half, ff_f16_range} -> float ----

// An fp16 model's conv output stored as float32 (the family-A fallback asks cuDNN for float32 output where the input
// is fp16: some of its fp16-output engines give finite values where the sum overflows fp16).  Loaded as float;
// ff_in_range gives conv + bias fp16's overflow, as PyTorch's fp16 conv output has it.
struct ff_f16_range {
  float v;
};

template <typename T>
__device__ __forceinline__ float ff_in_range(float x) {
  if constexpr (std::is_same_v<T, ff_f16_range>) return ff_f16_sat(x);
  else return x;
}

template <typename T>
struct ff_vec_width { static constexpr int value = 16 / (int)sizeof(T); };

// Raw bits of one load (V == 1: the element; else 16 bytes), so hot loops can keep U loads in flight in few registers
template <typename T, int V>
using ff_raw_t = std::conditional_t<V == 1, std::conditional_t<sizeof(T) == 4, float, unsigned short>, uint4>;

template <typename T, int V>
__device__ __forceinline__ ff_raw_t<T, V> ff_load_raw(const T* p) {
  static_assert(V == 1 || V * sizeof(T) == 16, "vector loads are 16 bytes");
  return __ldcs(reinterpret_cast<const ff_raw_t<T, V>*>(p));
}

template <typename T, int V>
__device__ __forceinline__ void ff_convert(const ff_raw_t<T, V>& r, float (&o)[V]) {
  if constexpr (V == 1) {
    if constexpr (sizeof(T) == 4) o[0] = r;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) o[0] = __uint_as_float((unsigned)r << 16);
    else o[0] = __half2float(__ushort_as_half(r));
  } else {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        o[i] = __uint_as_float(w[i]);
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        o[2 * i] = __uint_as_float(w[i] << 16);
        o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      } else {
        __half2 h;
        memcpy(&h, &w[i], 4);
        const float2 f = __half22float2(h);
        o[2 * i] = f.x;
        o[2 * i + 1] = f.y;
      }
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ void ff_load(const T* p, float (&o)[V]) {
  ff_convert<T, V>(ff_load_raw<T, V>(p), o);
}

template <typename T>
__device__ __forceinline__ float ff_load1(const T* p) {
  float o[1];
  ff_load<T, 1>(p, o);
  return o[0];
}

// Element i of a tensor of dtype code DT (codes.h: FF_F32, FF_BF16, FF_F16) as float (exact).
template <int DT> __device__ __forceinline__ float ff_elem_f(const void* x, long long i) {
  static_assert(DT == FF_F32 || DT == FF_BF16 || DT == FF_F16, "an input dtype code (codes.h), not a kernel variant");
  if (DT == FF_F32) return __ldg(reinterpret_cast<const float*>(x) + i);
  if (DT == FF_BF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(x)[i]);
  return __half2float(reinterpret_cast<const __half*>(x)[i]);
}

// out[i] = v stored as dtype code DT, rounded to nearest for bf16 / fp16 (as torch's float -> 16-bit conversion).
template <int DT> __device__ __forceinline__ void ff_store_f(void* out, long long i, float v) {
  static_assert(DT == FF_F32 || DT == FF_BF16 || DT == FF_F16, "an output dtype code (codes.h), not a kernel variant");
  if constexpr (DT == FF_F32) static_cast<float*>(out)[i] = v;
  else if constexpr (DT == FF_BF16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(out)[i] = __float2half_rn(v);
}

__host__ __device__ inline long long ff_ceil_div(long long a, long long b) { return (a + b - 1) / b; }
