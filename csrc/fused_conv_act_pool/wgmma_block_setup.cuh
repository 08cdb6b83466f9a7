// Family A, fused, sm_90a: a block's one-time setup — the weights (+ bias) as the wgmmas' A operands, the ones block
// and the 16-bit ones plane.
#pragma once
#include "fused_conv_act_pool/ring_loaders.cuh"

// Block setup of the wgmma kernel, threads tid of nthr: the bias op's ones block (8 rows x 16 B, SBO = LBO = 0;
// A = (b_hi, b_lo, 0...)), the 16-bit ones plane after each ring slot's channel planes (the spare second K chunk: zero
// weights, or the bias in one op; every entry (1, 1, 0, ...) like the ones block),
// and the weights (+ bias op) as K-major core matrices, op j at j * 2 KB, [k chunk][64 ch][16 B]; every weight and
// bias value goes through bound.
template <int DT, bool SPLIT>
__device__ __forceinline__ void wg_setup_operands(const WGParams& p, unsigned char* smem, int tid, int nthr,
                                                  WGInBound& bound) {
  uint4 o;   // one K-major row of ones: channels 0 and 1 = 1.0, the rest 0
  if (DT == FF_F32) o = make_uint4(0x3f800000u, 0x3f800000u, 0u, 0u);
  else if (DT == FF_BF16) o = make_uint4(0x3f803f80u, 0u, 0u, 0u);
  else o = make_uint4(0x3c003c00u, 0u, 0u, 0u);
  if (tid < 8) *reinterpret_cast<uint4*>(smem + p.ones_off + tid * 16) = o;
  if (DT != FF_F32) {
    for (int r = 0; r < p.RB; ++r)
      for (int q = tid * 16; q < p.plane_bytes; q += nthr * 16)
        *reinterpret_cast<uint4*>(smem + p.ring_off + r * p.slot_bytes + p.CG * p.plane_bytes + q) = o;
  }
  // One 16-byte K chunk per thread and op: thread i of 128 owns row m = i % 64 and chunk h = i / 64 of every op (4
  // fp32 / 8 16-bit values), whose source the host worked out (op_wo, op_wn: no index arithmetic here).  OB ops' global
  // loads are issued before any is used (in flight together).  Kept small on purpose: this code runs once per block, so
  // its cost is the instruction fetch — the per-value form (a K unit decoded with divisions per value, 28 KB of SASS)
  // took 14-25 us per block before the first row could start (docs/design.md).
  constexpr int KC = (DT == FF_F32) ? 4 : 8, OB = (DT == FF_F32) ? 4 : 2;
  const int m = tid & 63, h = (tid >> 6) & 1, cs = p.wsc;
  const long long mrow = (long long)min(m, p.K - 1) * p.wsk;
#pragma unroll 1
  for (int j0 = tid >> 7; j0 < p.na; j0 += OB * (nthr >> 7)) {
    float v[OB][KC];
#pragma unroll
    for (int o = 0; o < OB; ++o) {
      const int j = min(j0 + o * (nthr >> 7), WG_MAXOPS - 1);
      const int cnt = (j0 + o * (nthr >> 7) < p.na && m < p.K) ? p.op_wn[h][j] : 0;
      const long long base = mrow + p.op_wo[h][j];
#pragma unroll
      for (int e = 0; e < KC; ++e) v[o][e] = e < cnt ? ff_elem_f<DT>(p.w, base + (long long)e * cs) : 0.0f;
      if (cnt < 0 && p.bias != nullptr) {   // the bias pair: b_hi rounded to the operand type, b_lo = the rest
        // (0 where b_hi is not finite: b = +-inf would give Inf - Inf = NaN, and conv + inf must be inf)
        const float b = ff_elem_f<DT>(p.bias, m);
        float bh;
        if (DT == FF_F32) bh = __uint_as_float(f2tf32(b));
        else if (DT == FF_BF16) bh = __bfloat162float(__float2bfloat16_rn(b));
        else bh = __half2float(__float2half_rn(b));
        v[o][0] = bh; v[o][1] = isfinite(bh) ? b - bh : 0.0f;
      }
    }
#pragma unroll
    for (int o = 0; o < OB; ++o) {
      const int j = j0 + o * (nthr >> 7);
      if (j >= p.na) break;
      unsigned char* dst = smem + j * 2048 + h * 1024 + m * 16;
#pragma unroll
      for (int e = 0; e < KC; ++e) bound.add(v[o][e]);
      if (DT == FF_F32) {
        uint4 t;
        t.x = f2tf32(v[o][0]); t.y = f2tf32(v[o][1]); t.z = f2tf32(v[o][2]); t.w = f2tf32(v[o][3]);
        *reinterpret_cast<uint4*>(dst) = t;
        if (SPLIT) {   // the small op: K chunk 0 = bf16(w - w_hi), chunk 1 = bf16(w), 8 channels each (see wg_issue);
          // both 0 where w_hi is not finite (as the input's, wg_small_pairs): Inf / NaN reach the result through
          // w_hi x_hi alone, where Inf - Inf = NaN or inf * (x_lo = 0) would turn PyTorch's +-inf into NaN
          unsigned char* sa = smem + p.a_small_off + j * 2048 + m * 16 + h * 8;
          const uint32_t hb[4] = {t.x, t.y, t.z, t.w};
          float l[4], f[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float hf = __uint_as_float(hb[e]);
            const bool fin = isfinite(hf);
            l[e] = fin ? v[o][e] - hf : 0.0f;
            f[e] = fin ? v[o][e] : 0.0f;
          }
          uint2 lo, full;
          lo.x = pack2<FF_BF16>(l[0], l[1]);
          lo.y = pack2<FF_BF16>(l[2], l[3]);
          full.x = pack2<FF_BF16>(f[0], f[1]);
          full.y = pack2<FF_BF16>(f[2], f[3]);
          *reinterpret_cast<uint2*>(sa) = lo;
          *reinterpret_cast<uint2*>(sa + 1024) = full;
        }
      } else {
        uint4 t;
        t.x = pack2<DT>(v[o][0], v[o][1]); t.y = pack2<DT>(v[o][2], v[o][3]);
        t.z = pack2<DT>(v[o][4], v[o][5]); t.w = pack2<DT>(v[o][6], v[o][7]);
        *reinterpret_cast<uint4*>(dst) = t;
      }
    }
  }
}
