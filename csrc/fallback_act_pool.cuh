// Family A fallback epilogue, after cuDNN's conv: out[n,k] = pool over the spatial positions s of
// act(y[n,k,s] + bias[k]) (global mean / max pool), reading y (the bias-free conv output) exactly once, in a fixed
// order (deterministic, no float atomics).  Device code only: the host side (plan, grid, workspace layout, which
// instantiation) is fullfuse/fallback/epilogue_plan.py, the instantiations cutlass_ops/fallback.py.
//
// Contract of both kernels (one launch per call, kThreads threads a block, no dynamic shared memory):
//  - y: N images x K channels x S positions, T in {float, __nv_bfloat16, __half, ff_f16_range}, element-aligned;
//    pool_planes reads layout 0, y[(n*K+k)*S + s] (NCHW / NCDHW contiguous), pool_rows layout 1, y[(n*S+s)*K + k]
//    (NHWC / NDHWC contiguous).  bias: K floats or NULL.  out: N*K floats, out[n*K+k].  N*K < 2^31.
//  - MAX: NaN-propagating max; else the sum times `scale` (1/S, the mean).
//  - Work is split into items (a plane's chunk of `len` elements, or an image's chunk of `rows` rows); where an
//    item count C > 1 splits a plane (layout 0) or an image (layout 1), items write partials to `part` and bump
//    an int counter in `cnt` (one per plane / image); the last item to finish (__threadfence + atomicAdd) sums the
//    partials in index order and sets the counter back to zero: the counters are zero at launch and at exit (the
//    caller keeps one workspace per stream, zeroed once).
//  - pool_rows<V>: V > 1 reads 16 bytes a load (K % V == 0, y 16-byte aligned); V == 1 one element a load.
#pragma once
#include "activation.cuh"

namespace ff_act_pool {

constexpr int kThreads = 256, kWarps = kThreads / 32;

template <bool MAX>
__device__ __forceinline__ float finish(float v, float scale) { return MAX ? v : v * scale; }

// act(x + b) folded into one lane's V accumulators (x + b through ff_in_range: fp16's overflow for ff_f16_range).
template <typename T, int ACT, bool MAX, int V>
__device__ __forceinline__ void fold(float (&acc)[V], const float (&x)[V], const float (&b)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = ff_red<MAX>::op(acc[e], ff_activate<ACT>(ff_in_range<T>(x[e] + b[e])));
}

template <bool MAX>
__device__ __forceinline__ float warp_all(float v) {  // xor butterfly: every lane ends with the same bits
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = ff_red<MAX>::op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- layout 0: y[(n*K+k)*S + s]. One warp per item = a contiguous range of one plane: warp w of block
// (x, c) handles plane p = 8x + w, chunk c; grid (ceil(P / kWarps), C), P = N*K planes, C <= 4096 items of `len`
// elements a plane.  (No 64-bit divisions: they compile to calls.) ----
template <typename T, int ACT, bool MAX>
__global__ void __launch_bounds__(kThreads, 4) pool_planes(const T* __restrict__ y, const float* __restrict__ bias,
                                                         float* __restrict__ out, unsigned P, unsigned K,
                                                         long long S, int C, long long len, float scale,
                                                         int* __restrict__ cnt, float* __restrict__ part) {
  constexpr int V = ff_vec_width<T>::value, U = 4;
  using R = ff_red<MAX>;
  const int lane = threadIdx.x & 31;
  const unsigned p = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (p >= P) return;
  const long long lo = blockIdx.y * len, item = (long long)p * C + blockIdx.y;
  const long long n_el = min(len, S - lo);
  const T* src = y + p * S + lo;
  const float b1 = bias ? bias[p % K] : -0.0f;  // -0: y + (-0) == y bit for bit
  float b[V], acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) b[e] = b1, acc[e] = R::identity();

  // scalar head up to 16-byte alignment, 16-byte vectors, scalar tail
  const long long head = min((long long)((16 - ((uintptr_t)src & 15)) & 15) / (long long)sizeof(T), n_el);
  if (lane < head) acc[0] = R::op(acc[0], ff_activate<ACT>(ff_in_range<T>(ff_load1(src + lane) + b1)));
  const T* vsrc = src + head;
  const long long nv = (n_el - head) / V;
  long long i = lane;
  for (; i + 32 * (U - 1) < nv; i += 32 * U) {
    float x[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) ff_load<T, V>(vsrc + (i + 32 * u) * V, x[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) fold<T, ACT, MAX, V>(acc, x[u], b);
  }
  for (; i < nv; i += 32) {
    float x[V];
    ff_load<T, V>(vsrc + i * V, x);
    fold<T, ACT, MAX, V>(acc, x, b);
  }
  const long long tail = n_el - head - nv * V;
  if (lane < tail) {
    acc[V - 1] = R::op(acc[V - 1], ff_activate<ACT>(ff_in_range<T>(ff_load1(vsrc + nv * V + lane) + b1)));
  }

  float v = warp_all<MAX>(R::template all<V>(acc));
  if (C == 1) {
    if (lane == 0) out[p] = finish<MAX>(v, scale);
    return;
  }
  int last = 0;
  if (lane == 0) {
    part[item] = v;
    __threadfence();
    last = atomicAdd(&cnt[p], 1) == C - 1;
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  if (lane == 0) cnt[p] = 0;   // every item of the plane has counted: zero again for the next launch
  v = R::identity();
#pragma unroll 8
  for (int c = lane; c < C; c += 32) v = R::op(v, __ldcg(part + (long long)p * C + c));
  v = warp_all<MAX>(v);
  if (lane == 0) out[p] = finish<MAX>(v, scale);
}

// ---- layout 1: y[(n*S+s)*K + k]. One block per item = (image n, row chunk c, column block b): N*C*B blocks. ----
// Thread t owns vector column b*Cw + t%Cw and rows t/Cw + R*j of the chunk (R = kThreads / Cw); rows are combined in
// smem in fixed order.
template <typename T, int ACT, bool MAX, int V>
__global__ void __launch_bounds__(kThreads, 4) pool_rows(const T* __restrict__ y, const float* __restrict__ bias,
                                                       float* __restrict__ out, long long K, long long S, int C,
                                                       long long rows, int B, int Cw, int R, float scale,
                                                       int* __restrict__ cnt, float* __restrict__ part) {
  constexpr int U = V == 1 ? 8 : 4;
  using Op = ff_red<MAX>;
  __shared__ float red[kThreads * V];
  __shared__ int last;
  const int t = threadIdx.x;
  const long long Kv = K / V;
  const int b = (int)(blockIdx.x % (unsigned)B);  // 32-bit divisions (blockIdx.x < 2^31)
  const unsigned nc = blockIdx.x / (unsigned)B, n = nc / (unsigned)C, c = nc - n * C;
  const long long col = (long long)b * Cw + t % Cw, r0 = c * rows, r1 = min(S, r0 + rows);
  const int rl = t / Cw;

  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = Op::identity();
  if (rl < R && col < Kv) {
    float bv[V];
#pragma unroll
    for (int e = 0; e < V; ++e) bv[e] = bias ? bias[col * V + e] : -0.0f;
    const T* base = y + n * S * K + col * V;
    long long r = r0 + rl;
    for (; r + (long long)R * (U - 1) < r1; r += (long long)R * U) {
      float x[U][V];
#pragma unroll
      for (int u = 0; u < U; ++u) ff_load<T, V>(base + (r + (long long)R * u) * K, x[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) fold<T, ACT, MAX, V>(acc, x[u], bv);
    }
    for (; r < r1; r += R) {
      float x[V];
      ff_load<T, V>(base + r * K, x);
      fold<T, ACT, MAX, V>(acc, x, bv);
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) red[t * V + e] = acc[e];
  __syncthreads();
  for (int q = t; q < Cw * V; q += kThreads) {  // q = (column in block, component)
    const long long k = ((long long)b * Cw) * V + q;
    if (k >= K) break;
    float v = red[q];
    for (int j = 1; j < R; ++j) v = Op::op(v, red[j * Cw * V + q]);
    if (C == 1) out[n * K + k] = finish<MAX>(v, scale);
    else part[((long long)n * C + c) * K + k] = v;
  }
  if (C == 1) return;
  __threadfence();
  __syncthreads();
  if (t == 0) last = atomicAdd(&cnt[n], 1) == C * B - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (t == 0) cnt[n] = 0;   // every item of the image has counted: zero again for the next launch
  // finalize image n: channel k's C partials summed in index order, split into Pp contiguous runs when K is small
  const float* pn = part + (long long)n * C * K;
  if (2 * K <= kThreads) {
    const int Kt = (int)K, Pp = min(kThreads / Kt, C), run = (C + Pp - 1) / Pp;
    float v = Op::identity();
    if (t < Kt * Pp) {
      const int k = t % Kt, c0 = (t / Kt) * run, c1 = min(C, c0 + run);
#pragma unroll 8  // loads issued ahead, adds in order
      for (int cc = c0; cc < c1; ++cc) v = Op::op(v, __ldcg(pn + (long long)cc * K + k));
    }
    red[t] = v;  // every read of red above happened before the previous __syncthreads
    __syncthreads();
    if (t < K) {
      v = red[t];
      for (int j = 1; j < Pp; ++j) v = Op::op(v, red[j * K + t]);
      out[n * K + t] = finish<MAX>(v, scale);
    }
  } else {
    for (long long k = t; k < K; k += kThreads) {
      float v = Op::identity();
#pragma unroll 8
      for (int cc = 0; cc < C; ++cc) v = Op::op(v, __ldcg(pn + (long long)cc * K + k));
      out[n * K + k] = finish<MAX>(v, scale);
    }
  }
}

}  // namespace ff_act_pool
