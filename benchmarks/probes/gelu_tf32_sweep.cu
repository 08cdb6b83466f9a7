// Exhaustive accuracy of the fused A kernel's GELU (erf) forms on the GPU itself: every finite fp32 x (both signs,
// 2^32 - 2^24 values), each form's worst |y - gelu(x)| / max(1, |x|) against float64 (0.5 x erfc(-x / sqrt 2)), where
// it occurs, and whether any finite x gave a non-finite y.  Forms: the product's (csrc/activation.cuh)
// ff_gelu_erf_noclamp (the kernel's fast form) and ff_gelu_erf (exact specials), and the TF32-mode candidates of
// gelu_tf32_variants.cuh: ff_gelu_erf_tf32x2 (part in f16x2), ff_gelu_erf_cubic, ff_gelu_erf_tf32 (degree 4).
// Complements the CPU emulation (gelu_tf32_split.py) with the hardware's own ex2.approx, F2FP and HFMA2 rounding.
//
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Ibenchmarks/probes -o /tmp/gs \
//          benchmarks/probes/gelu_tf32_sweep.cu
// Run:   /tmp/gs     (one GPU; ~1 s)
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include "gelu_tf32_variants.cuh"

constexpr int FORMS = 5;
struct Worst {
  unsigned long long err[FORMS];   // the error's float64 bits (non-negative: ordered as integers)
  unsigned int at[FORMS];          // an x bit pattern where it occurs
  unsigned int nonfinite[FORMS];   // finite x with a non-finite y
};

__device__ void note(Worst* w, int f, double e, unsigned int bits, float y) {
  if (!isfinite(y)) atomicAdd(&w->nonfinite[f], 1u);
  const unsigned long long b = (unsigned long long)__double_as_longlong(isfinite(y) ? e : 1e300);
  const unsigned long long old = atomicMax(&w->err[f], b);
  if (b > old) w->at[f] = bits;   // (racy where two threads tie: any of them is a valid witness)
}

// thread handles the pair of bit patterns (2 t, 2 t + 1) + base (finite magnitudes), each with both signs
__global__ void sweep(unsigned int base, unsigned int count, Worst* w) {
  const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (2u * t >= count) return;
  double worst[FORMS] = {};
  unsigned int wat[FORMS] = {};
  for (int s = 0; s < 2; ++s) {
    const unsigned int b0 = base + 2u * t, b1 = b0 + 1u, sign = s ? 0x80000000u : 0u;
    const float x0 = __uint_as_float(b0 | sign), x1 = __uint_as_float(b1 | sign);
    float y[FORMS][2];
    ff_gelu_erf_tf32x2(x0, x1, y[0][0], y[0][1]);
    y[1][0] = ff_gelu_erf_noclamp(x0), y[1][1] = ff_gelu_erf_noclamp(x1);
    y[2][0] = ff_gelu_erf(x0), y[2][1] = ff_gelu_erf(x1);
    y[3][0] = ff_gelu_erf_cubic(x0), y[3][1] = ff_gelu_erf_cubic(x1);
    y[4][0] = ff_gelu_erf_tf32(x0), y[4][1] = ff_gelu_erf_tf32(x1);
    const float xs[2] = {x0, x1};
    for (int k = 0; k < 2; ++k) {
      if (base + 2u * t + k >= 0x7f800000u) continue;
      const double x = xs[k], ref = 0.5 * x * erfc(-x * 0.70710678118654752440);
      for (int f = 0; f < FORMS; ++f) {
        const double e = fabs((double)y[f][k] - ref) / fmax(1.0, fabs(x));
        if (!isfinite(y[f][k]) || e > worst[f]) {
          if (!isfinite(y[f][k])) note(w, f, e, __float_as_uint(xs[k]), y[f][k]);
          else worst[f] = e, wat[f] = __float_as_uint(xs[k]);
        }
      }
    }
  }
  for (int f = 0; f < FORMS; ++f)
    if (worst[f] > 0.0) note(w, f, worst[f], wat[f], 0.0f);
}

int main() {
  Worst* d;
  cudaMalloc(&d, sizeof(Worst));
  cudaMemset(d, 0, sizeof(Worst));
  const unsigned int chunk = 1u << 28;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (unsigned long long base = 0; base < 0x7f800000ull; base += chunk) {
    const unsigned int n = (unsigned int)std::min<unsigned long long>(chunk, 0x7f800000ull - base);
    sweep<<<(n / 2 + 255) / 256, 256>>>((unsigned int)base, n, d);
  }
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  Worst h;
  cudaMemcpy(&h, d, sizeof(Worst), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) { printf("CUDA error %s\n", cudaGetErrorString(err)); return 1; }
  const char* names[FORMS] = {"ff_gelu_erf_tf32x2 (split)", "ff_gelu_erf_noclamp (fp32)", "ff_gelu_erf (exact)",
                              "ff_gelu_erf_cubic", "ff_gelu_erf_tf32 (degree 4)"};
  printf("every finite fp32 x, both signs (%.0f ms); max |y - gelu(x)| / max(1, |x|) vs float64:\n", ms);
  for (int f = 0; f < FORMS; ++f) {
    double e;
    memcpy(&e, &h.err[f], 8);
    float at;
    memcpy(&at, &h.at[f], 4);
    printf("  %-32s %.3e  (%.3f of 2^-15) at x = %.9g; non-finite y from finite x: %u\n", names[f], e,
           e / 3.0517578125e-05, at, h.nonfinite[f]);
  }
  return 0;
}
