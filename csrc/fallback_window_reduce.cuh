// Family B fallback epilogue, after cuDNN's transposed conv: out[n,dp,hp,wp] = reduce over channels k of (max over
// one non-overlapping (wd,wh,ww) window of act(y + bias[k])): composed max pools then a channel sum / mean / max,
// reading y once.  Device code only: the host side (Geo's values, grid, which instantiation) is
// fullfuse/fallback/epilogue_plan.py, the instantiations cutlass_ops/fallback.py.
//
// Contract (one launch per call, kThreads threads a block, ceil(n_out / kWarps) blocks, P * 4 bytes of dynamic
// shared memory where use_tab, else none):
//  - y: N x K x D x H x W with element strides (sN, sK, sD, sH, sW), T in {float, __nv_bfloat16, __half},
//    element-aligned; 2-D problems pass D = 1, wd = 1.  Window (wd, wh, ww), kernel == stride:
//    Dp = D/wd, Hp = H/wh, Wp = W/ww (floor; trailing rows are not read).  n_out = N*Dp*Hp*Wp < 2^31.
//  - out: fp32 contiguous (N, Dp, Hp, Wp).  v_k = max_window(y[n,k,.]) + bias[k] when ACT == NONE (the bias
//    commutes with the max), else v_k = max_window(act(y + bias[k])); out = sum / mean (sum * scale, scale = 1/K) /
//    max over k.  Maxima propagate NaN.  bias may be NULL.  No workspace.
//  - V > 1 (16-byte loads): sK == 1, K, sN, sD, sH, sW multiples of V, y 16-byte aligned.
//
// One warp per output position.  Lane = (channel slot cs, position slot ps): the lane keeps a running max of its
// channel (vector) over window positions ps, ps+PL, ...; a shuffle tree over the PL position slots gives the window
// max, then a shuffle tree over the CL channel slots reduces the channels; passes loop over channel chunks.
//  - channel-fast (sK == 1): lanes along channels, 16-byte loads when K, strides and y allow it;
//  - position-fast (otherwise, e.g. NCDHW): lanes along window positions (w fastest), one channel per slot.
// Fixed shuffle trees and pass order: deterministic.
#pragma once
#include "activation.cuh"

namespace ff_window_reduce {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// Everything the kernel needs besides pointers; mirrored by cutlass_ops/fallback.py (Geo), whose layout each
// instantiation's compile unit checks.
struct Geo {
  long long K, sN, sK, sD, sH, sW;
  unsigned Dp, Hp, Wp, n_out;  // n_out < 2^31: 32-bit divisions (64-bit ones compile to calls)
  int wd, wh, ww, P;  // window, P = wd*wh*ww positions
  int CL, PL;         // channel slots, position slots (CL*PL <= 32)
  int cs_stride, ps_stride;  // lane distance between consecutive channel / position slots
  int use_tab;        // window offsets from a shared-memory table (int32) instead of divisions: the host sets it
                      // where P <= 8192 (32 KB, under the default dynamic limit) and every offset fits in int32
  float scale;        // 1/K for the mean
};

__device__ __forceinline__ long long window_offset(const Geo& g, int p) {
  const int pw = p % g.ww, q = p / g.ww;
  return (long long)(q / g.wh) * g.sD + (long long)(q % g.wh) * g.sH + (long long)pw * g.sW;
}

// m[e] = max of act(x + b[e]) (ACT != NONE) or of x (NONE) over window positions p = ps, ps+PL, ... of the
// channel(s) at src
template <typename T, int ACT, int V, bool TAB>
__device__ __forceinline__ void window_max(const T* src, const Geo& g, const int* tab, int ps, float (&m)[V],
                                           const float (&b)[V]) {
  constexpr int U = V == 1 ? 8 : 4;
  using Win = ff_red<true>;
  auto off = [&](int p) -> long long { return TAB ? (long long)tab[p] : window_offset(g, p); };
  for (int p = ps; p < g.P; p += g.PL * U) {  // predicated, so a short window still has U loads in flight
    ff_raw_t<T, V> r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (p + g.PL * u < g.P) r[u] = ff_load_raw<T, V>(src + off(p + g.PL * u));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (p + g.PL * u >= g.P) break;
      float x[V];
      ff_convert<T, V>(r[u], x);
#pragma unroll
      for (int e = 0; e < V; ++e) m[e] = Win::op(m[e], ACT == FF_ACT_NONE ? x[e] : ff_activate<ACT>(x[e] + b[e]));
    }
  }
}

// max over slots s, s+1, .. < count of v (slots `stride` lanes apart); slot 0 ends with the full result.
// The tree is fixed, so sums are deterministic too.  All 32 lanes must call it.
template <bool MAX>
__device__ __forceinline__ float slot_tree(float v, int slot, int count, int stride) {
  for (int s = 1; s < count; s <<= 1) {
    const float o = __shfl_down_sync(0xffffffffu, v, s * stride);
    if (slot + s < count) v = ff_red<MAX>::op(v, o);
  }
  return v;
}

template <typename T, int ACT, int RED, int V>
__global__ void __launch_bounds__(kThreads, 4) window_reduce(const T* __restrict__ y, const float* __restrict__ bias,
                                                             float* __restrict__ out, const Geo g) {
  constexpr bool MAX = RED == FF_RED_MAX;
  using Win = ff_red<true>;
  using Red = ff_red<MAX>;
  extern __shared__ int tab[];
  if (g.use_tab) {
    for (int p = threadIdx.x; p < g.P; p += kThreads) tab[p] = (int)window_offset(g, p);
    __syncthreads();
  }
  const unsigned o = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (o >= g.n_out) return;  // whole warps only: the shuffles below stay full-warp
  const int lane = threadIdx.x & 31;
  const int cs = (lane / g.cs_stride) % g.CL, ps = (lane / g.ps_stride) % g.PL;
  const bool active = lane < g.CL * g.PL;

  unsigned t = o;
  const unsigned wp = t % g.Wp; t /= g.Wp;
  const unsigned hp = t % g.Hp; t /= g.Hp;
  const unsigned dp = t % g.Dp, n = t / g.Dp;
  const T* base = y + n * g.sN + (long long)dp * g.wd * g.sD + (long long)hp * g.wh * g.sH +
                   (long long)wp * g.ww * g.sW;

  float acc = Red::identity();
  for (long long k0 = 0; k0 < g.K; k0 += (long long)g.CL * V) {
    const long long k = k0 + (long long)cs * V;
    float m[V], b[V];
#pragma unroll
    for (int e = 0; e < V; ++e) m[e] = Win::identity(), b[e] = -0.0f;  // -0: y + (-0) == y bit for bit
    if (active && k < g.K) {  // K % V == 0 when V > 1
      if (bias) {
#pragma unroll
        for (int e = 0; e < V; ++e) b[e] = bias[k + e];
      }
      if (g.use_tab) window_max<T, ACT, V, true>(base + k * g.sK, g, tab, ps, m, b);
      else window_max<T, ACT, V, false>(base + k * g.sK, g, tab, ps, m, b);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
      m[e] = slot_tree<true>(m[e], ps, g.PL, g.ps_stride);  // window max, in slot ps == 0
      if (ACT == FF_ACT_NONE) m[e] += b[e];                 // the bias commutes with the max
    }
    float v = (active && k < g.K) ? Red::template all<V>(m) : Red::identity();
    v = slot_tree<MAX>(v, cs, g.CL, g.cs_stride);  // channels of this pass, in lane 0
    acc = Red::op(acc, v);
  }
  if (lane == 0) out[o] = RED == FF_RED_MEAN ? acc * g.scale : acc;
}

}  // namespace ff_window_reduce
