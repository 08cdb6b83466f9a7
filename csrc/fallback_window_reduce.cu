// Family B epilogue: out[n,dp,hp,wp] = reduce over channels k of (max over one non-overlapping (wd,wh,ww) window of
// act(y + bias[k])): composed max pools then a channel sum/mean/max after a transposed conv, reading y once.
//
// One warp per output position.  Lane = (channel slot cs, position slot ps): the lane keeps a running max of its
// channel (vector) over window positions ps, ps+PL, ...; a shuffle tree over the PL position slots gives the window
// max, then a shuffle tree over the CL channel slots reduces the channels; passes loop over channel chunks.
//  - channel-fast (sK == 1): lanes along channels, 16-byte loads when K, strides and y allow it;
//  - position-fast (otherwise, e.g. NCDHW): lanes along window positions (w fastest), one channel per slot.
// Fixed shuffle trees and pass order: deterministic.
#include <algorithm>
#include <cstdlib>
#include "activation.cuh"

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kTabMax = 8192;

struct Geo {          // everything the kernel needs besides pointers
  long long K, sN, sK, sD, sH, sW;
  unsigned Dp, Hp, Wp, n_out;  // n_out < 2^31: 32-bit divisions (64-bit ones compile to calls)
  int wd, wh, ww, P;  // window, P = wd*wh*ww positions
  int CL, PL;         // channel slots, position slots (CL*PL <= 32)
  int cs_stride, ps_stride;  // lane distance between consecutive channel / position slots
  int use_tab;        // window offsets from a shared-memory table (int32) instead of divisions
  float scale;        // 1/K for the mean
};

__device__ __forceinline__ long long window_offset(const Geo& g, int p) {
  const int pw = p % g.ww, q = p / g.ww;
  return (long long)(q / g.wh) * g.sD + (long long)(q % g.wh) * g.sH + (long long)pw * g.sW;
}

// m[e] = max of act(x + b[e]) (ACT != NONE) or of x (NONE) over window positions p = ps, ps+PL, ... of channel(s) at src
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

}  // namespace

extern "C" int ff_window_reduce(const void* y, int dtype, const float* bias, float* out, long long N, long long K,
                                long long D, long long H, long long W, long long sN, long long sK, long long sD,
                                long long sH, long long sW, int wd, int wh, int ww, int activation, int reduction,
                                cudaStream_t stream) {
  if (N < 0 || D < 0 || H < 0 || W < 0 || wd < 1 || wh < 1 || ww < 1) return (int)cudaErrorInvalidValue;
  const long long n_out = N * (D / wd) * (H / wh) * (W / ww);
  if (n_out == 0) return (int)cudaSuccess;  // empty output: nothing to do
  if (K < 1 || !y || !out || reduction < FF_RED_SUM || reduction > FF_RED_MAX ||
      (long long)wd * wh * ww > 0x7fffffffLL || n_out > 0x7fffffffLL)
    return (int)cudaErrorInvalidValue;
  Geo g;
  g.Dp = (unsigned)(D / wd), g.Hp = (unsigned)(H / wh), g.Wp = (unsigned)(W / ww), g.K = K;
  g.n_out = (unsigned)n_out;
  if (K == 1) sK = 1;  // a size-1 dim's stride is irrelevant
  g.sN = sN, g.sK = sK, g.sD = sD, g.sH = sH, g.sW = sW;
  g.wd = wd, g.wh = wh, g.ww = ww, g.P = wd * wh * ww;
  g.scale = (float)(1.0 / (double)K);
  const long long span = (wd - 1) * llabs(sD) + (wh - 1) * llabs(sH) + (ww - 1) * llabs(sW);
  g.use_tab = g.P <= kTabMax && span <= 0x7fffffffLL;
  const size_t smem = g.use_tab ? (size_t)g.P * sizeof(int) : 0;

  return ff_dispatch_dtype(dtype, [&](auto tt) {
    using T = typename decltype(tt)::type;
    constexpr int VW = ff_vec_width<T>::value;
    if ((uintptr_t)y % sizeof(T)) return (int)cudaErrorInvalidValue;
    const bool vec = sK == 1 && K % VW == 0 && (uintptr_t)y % 16 == 0 && sN % VW == 0 && sD % VW == 0 &&
                     sH % VW == 0 && sW % VW == 0;
    if (sK == 1) {  // channel-fast
      const long long Kv = vec ? K / VW : K, passes = ff_ceil_div(Kv, 32);
      g.CL = (int)ff_ceil_div(Kv, passes);
      g.PL = (int)std::min<long long>(32 / g.CL, g.P);
      g.cs_stride = 1, g.ps_stride = g.CL;
    } else {  // position-fast
      g.PL = std::min(g.P, 32);
      g.CL = (int)std::min<long long>(32 / g.PL, K);
      g.ps_stride = 1, g.cs_stride = g.PL;
    }
    const unsigned blocks = (unsigned)ff_ceil_div(g.n_out, kWarps);
    return ff_dispatch_act(activation, [&](auto act) {
      constexpr int ACT = decltype(act)::value;
      const T* yt = static_cast<const T*>(y);
      auto launch = [&](auto red) {
        constexpr int RED = decltype(red)::value;
        if (vec) window_reduce<T, ACT, RED, VW><<<blocks, kThreads, smem, stream>>>(yt, bias, out, g);
        else window_reduce<T, ACT, RED, 1><<<blocks, kThreads, smem, stream>>>(yt, bias, out, g);
        return (int)cudaGetLastError();
      };
      switch (reduction) {
        case FF_RED_SUM: return launch(ff_int<FF_RED_SUM>{});
        case FF_RED_MEAN: return launch(ff_int<FF_RED_MEAN>{});
        default: return launch(ff_int<FF_RED_MAX>{});
      }
    });
  });
}
