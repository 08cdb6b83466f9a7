// Microbenchmark: family A's per-tile work without loads or barriers, to price epilogue designs against the MMAs in
// the shape of fa_wgmma_kernel (one warpgroup per block, 3 blocks per SM, 64 accumulators: per 128-pixel tile a chain
// of wgmmas, wait, epilogue, next tile).  Reduces, per block and output channel, the activation over every tile's
// pixels — the fused kernel's sum — so each variant's result can be compared with the fp32 GELU's.
// Question it answers: how much of the kernel's time per tile (docs/design.md: bf16 1682, 'none' 1046 cycles per SM)
// is the MMA + epilogue alternation itself, and what an epilogue without FP32-pipe work (half2 GELU, sums in half2 or
// by a reduction wgmma against a ones matrix) would cost there; since run 22 also the kernel's own 16-bit epilogue
// (csrc/gelu_h2.cuh) beside the variants of its GELU that gelu_h2_variants.cuh collects, each with the MMAs and alone.
//
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Ibenchmarks -o /tmp/pe
//          benchmarks/probe_epilogue_a.cu
// Run:   /tmp/pe    (one H100 / H200: cycles per tile per SM at the nominal clock, and each variant's relative
//                    difference of the per-channel sums from the fp32 GELU's)
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include "activation.cuh"

#include "wgmma_ss.cuh"
#include "gelu_h2_variants.cuh"

// reduction wgmma: D (64 x 8) += A (64 x 16 fp16, registers) . ones (16 x 8): every column = the row sums of A
__device__ __forceinline__ void rs_sum_f16(float (&r)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;\n"
               : "+f"(r[0]), "+f"(r[1]), "+f"(r[2]), "+f"(r[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b));
}

// operands: A block of op j at A_OFF + j * 2 KB (64 rows x 2 chunks, LBO 1 KB, SBO 128 B); B = a 16-byte-per-pixel
// plane of 3 slots (rows) x 272 pixels, op j reads slot j % 3 shifted by j / 3 pixels with LBO = 16 B (16-bit: the
// second K chunk = the next tap, as the two-tap ops) or the next plane (tf32); ONES = 256 B of fp16 ones
constexpr int A_OFF = 0, B_OFF = 10 * 2048, SLOTB = 272 * 16, PLANE = 3 * SLOTB, ONES_OFF = B_OFF + 2 * PLANE;
constexpr int SMEM = ONES_OFF + 256;
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
         (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
}

enum { E_NOTHING = 0, E_NONE = 1, E_F32 = 2, E_H2TREE = 3, E_H2MMA = 4, E_F32_BRANCH = 5, E_F32_SELECT = 6,
       E_H2VAR = 16, E_H2DEFER = 40 };
// E_H2DEFER: the kernel's 16-bit epilogue with its two sum mma.syncs deferred to after the next tile's wgmma issue (the
// legacy tensor op then queues behind this block's own chain, which the block waits for anyway, instead of stalling
// the epilogue behind another block's chain)
// E_H2VAR + V: the fused kernel's 16-bit epilogue with GELU variant V (gelu_h2_variants.cuh; V 0 = csrc/gelu_h2.cuh's
// wg_epi_h2 itself), sums by mma.sync against ones
// E_F32_BRANCH: the fused kernel's masking source (every other tile has 126 valid pixels, as the seed's second
// half-row):
// per column block of 8 pixels a uniform test, the partial block masked per value (ptxas predicates these tests here,
// where the fused kernel keeps them as branches); E_F32_SELECT: the same tiles, all 64 values straight-line and the
// partial tiles' sums through a select per value

// Phi(-u) polynomial of ff_phi_neg in half2 (u = min(|h|, 16)); g = relu(h) - u * 2^P5(u)
__device__ __forceinline__ __half2 gelu_h2(__half2 h) {
  const __half2 c5 = __float2half2_rn(-0x1.05cf34p-11f), c4 = __float2half2_rn(0x1.db850ap-8f),
                c3 = __float2half2_rn(-0x1.abd318p-5f), c2 = __float2half2_rn(-0x1.d6a0a2p-2f),
                c1 = __float2half2_rn(-0x1.26a4a0p+0f), c0 = __float2half2_rn(-0x1.000120p+0f);
  const __half2 u = __hmin2(__habs2(h), __float2half2_rn(16.0f));
  __half2 r = __hfma2(c5, u, c4);
  r = __hfma2(r, u, c3); r = __hfma2(r, u, c2); r = __hfma2(r, u, c1); r = __hfma2(r, u, c0);
  __half2 q;   // ex2.approx.f16x2: two MUFU.EX2.F16 + PRMT (cuda_fp16's h2exp2 goes through fp32: 2 more conversions)
  asm("ex2.approx.f16x2 %0, %1;" : "=r"(*reinterpret_cast<uint32_t*>(&q))
      : "r"(*reinterpret_cast<const uint32_t*>(&r)));
  return __hfma2(__hneg2(u), q, __hmax2(h, __float2half2_rn(0.0f)));
}
__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

__device__ __forceinline__ float pe_rnd(uint32_t i) {   // uniform in [-0.5, 0.5)
  i = i * 2654435761u + 0x9e3779b9u; i ^= i >> 15; i *= 0x85ebca6bu; i ^= i >> 13;
  return (i & 0xffffff) / 16777216.0f - 0.5f;
}
// the operands of every variant (DT 1: bf16, else tf32-exact fp32), written by warpgroup 0
template <int DT>
__device__ __forceinline__ void fill_operands(unsigned char* sm, int tid, int wg) {
  // A: weights ~ U(-1/sqrt(72), 1/sqrt(72)) as nn.Conv2d's default init; B: inputs ~ U(-1.7, 1.7) (unit variance)
  for (int i = tid + (wg ? B_OFF : 0); i < B_OFF / 2; i += 128) {   // (warpgroup 0 writes the operands)
    const float v = pe_rnd(i) * 2.0f * 0.1179f;
    if (DT == 1) reinterpret_cast<__nv_bfloat16*>(sm)[i] = __float2bfloat16(v);
    else if (i < B_OFF / 4) reinterpret_cast<float*>(sm)[i] = v;
  }
  for (int i = tid + (wg ? 2 * PLANE : 0); i < 2 * PLANE / 4; i += 128) {
    const float v = pe_rnd(i + 777777) * 2.0f * 1.7f;
    if (DT == 1) { reinterpret_cast<__nv_bfloat16*>(sm + B_OFF)[2 * i] = __float2bfloat16(v);
                   reinterpret_cast<__nv_bfloat16*>(sm + B_OFF)[2 * i + 1] = __float2bfloat16(pe_rnd(i + 999) * 3.4f); }
    else reinterpret_cast<float*>(sm + B_OFF)[i] = __uint_as_float(__float_as_uint(v) & 0xffffe000u);
  }
  for (int i = tid; i < 128; i += 128) reinterpret_cast<__half*>(sm + ONES_OFF)[i] = __float2half(1.0f);
}
// DT 2 / 3: the bias of channels m0, m0 + 8 as the accumulators' start values (DT 2: one PRMT per accumulator with a
// run-time selector, an ALU op ptxas cannot fold into a move; DT 3: plain assignments, ptxas's choice of MOV /
// IMAD.MOV)
template <int DT>
__device__ __forceinline__ void bias_start(float (&acc)[64], int warp, int g, uint32_t qsel) {
  const float b0 = 0.01f * (warp + 1), b1 = -0.02f * (g + 1);
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const float b = (i & 2) ? b1 : b0;
    if (DT == 2) asm volatile("prmt.b32 %0, %1, 0, %2;" : "=r"(*reinterpret_cast<uint32_t*>(&acc[i]))
                              : "r"(__float_as_uint(b)), "r"(qsel));
    else acc[i] = b;
  }
}

// DT 0: tf32 (10 ops), 1: bf16 (6 ops), 2 / 3: tf32 (9 ops + bias_start); BAR: a block barrier every 2 tiles (a row).
// NWG: warpgroups per block (3 blocks
// of 1 per SM, or 1 block of 3 sharing the operands), each running the whole tile loop of one block slot; PP (NWG > 1):
// FA3's ping-pong, the warpgroups issue their wgmma chains in turn (named barrier 1 + w: warpgroup w waits for w - 1's
// issue), so that one runs its MMAs while the others run their epilogues
template <int DT, int EPI, bool MMA, bool BAR = false, int NWG = 1, bool PP = false>
__global__ void __launch_bounds__(128 * NWG, 3 / NWG) tiles(float* out, int ntiles, int qodd,
                                                             uint32_t qsel) {   // qodd: valid pixels of odd tiles (126)
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
  const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2,
            tig = lane & 3;
  fill_operands<DT>(sm, tid, wg);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  // DT 2 / 3: tf32 with 9 ops, the bias in the accumulators before the chain (bias_start) instead of a 10th op
  constexpr int NOPS = DT == 1 ? 6 : DT == 0 ? 10 : 9;
  uint64_t da[NOPS], db[NOPS];
#pragma unroll
  for (int j = 0; j < NOPS; ++j) {
    da[j] = desc(base + A_OFF + j * 2048, 1024, 128);
    db[j] = desc(base + B_OFF + (j % 3) * SLOTB + (j / 3) * 16, DT == 1 ? 16 : PLANE, 128);
  }
  const uint64_t dones = desc(base + ONES_OFF, 128, 256);
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  if (!MMA) {   // epilogue alone: the accumulators of one real chain, reused every tile
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = pe_rnd(tid * 64 + i) * 2.0f;
  }
  float red[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  float rsum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float dm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint32_t gk[32];
  uint32_t fr[H2_SUM_GROUPS][4];   // E_H2DEFER: the last tile's sum fragments, not yet added
  auto add_fr = [&]() {
#pragma unroll
    for (int gi = 0; gi < H2_SUM_GROUPS; ++gi) wg_h2_mma(dm, fr[gi]);
  };
  if (PP && wg == NWG - 1) asm volatile("bar.arrive 1, 256;" ::: "memory");   // warpgroup 0 issues first
  for (int t = 0; t < ntiles; ++t) {
    if (BAR && (t & 1) == 0) __syncthreads();
    if (MMA) {
#pragma unroll
      for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
      if (PP) asm volatile("bar.sync %0, 256;" :: "r"(1 + wg) : "memory");
      if (DT >= 2) bias_start<DT>(acc, warp, g, qsel);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int j = 0; j < NOPS; ++j) {
        if (DT == 1) ss_bf16(acc, da[j], db[j], j > 0);
        else ss_tf32(acc, da[j], db[j], DT >= 2 || j > 0);
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if (EPI == E_H2DEFER && t > 0) add_fr();
      if (PP && !(wg == NWG - 1 && t == ntiles - 1))   // (the last turn has no taker)
        asm volatile("bar.arrive %0, 256;" :: "r"(1 + (wg + 1) % NWG) : "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    if (!MMA) {   // epilogue alone: one LOP3 per value makes every tile's accumulators new (nothing to hoist)
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = __int_as_float(__float_as_int(acc[i]) ^ (t & 1));
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
    if (EPI == E_H2DEFER) {
#pragma unroll
      for (int gi = 0; gi < H2_SUM_GROUPS; ++gi)
        wg_h2_frag(acc, gi, fr[gi], [](int, float lo, float hi) { return h2_gelu2(lo, hi); });
      if (!MMA) add_fr();
    } else if (EPI == E_H2VAR) {
      wg_epi_h2(acc, dm);
    } else if (EPI > E_H2VAR) {
      h2_var_epi<EPI - E_H2VAR>(acc, dm);
    } else if (EPI == E_NOTHING) {   // one value read, so that ptxas cannot drop the chain as dead (it does otherwise)
      red[0][0] += acc[0];
    } else if (EPI == E_F32_BRANCH) {
      const int qv = (t & 1) ? qodd : 128;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float y[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) y[e] = ff_gelu_erf_noclamp(acc[4 * i + e]);
        if (8 * i + 8 <= qv) {
#pragma unroll
          for (int e = 0; e < 4; ++e) red[e >> 1][e & 1] += y[e];
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) red[e >> 1][e & 1] += (8 * i + 2 * tig + (e & 1) < qv) ? y[e] : 0.0f;
        }
      }
    } else if (EPI == E_F32_SELECT) {
      const int qv = (t & 1) ? qodd : 128;
      if (qv >= 128) {
#pragma unroll
        for (int i = 0; i < 64; ++i) red[(i >> 1) & 1][i & 1] += ff_gelu_erf_noclamp(acc[i]);
      } else {
        const int lim = qv - 2 * tig;   // value (i, e) is pixel 8i + 2 tig + (e & 1): valid iff 8i + (e & 1) < lim
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const float y = ff_gelu_erf_noclamp(acc[i]);
          red[(i >> 1) & 1][i & 1] += (8 * (i >> 2) + (i & 1) < lim) ? y : 0.0f;
        }
      }
    } else if (EPI == E_NONE || EPI == E_F32) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const float y = EPI == E_F32 ? ff_gelu_erf_noclamp(acc[i]) : acc[i];
        red[(i >> 1) & 1][i & 1] += y;
      }
    } else if (EPI == E_H2TREE) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        __half2 s[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) s[i] = gelu_h2(__floats2half2_rn(acc[4 * i + 2 * hh], acc[4 * i + 2 * hh + 1]));
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] = __hadd2(s[i], s[i + 8]);
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] = __hadd2(s[i], s[i + 4]);
        s[0] = __hadd2(s[0], s[2]);
        s[1] = __hadd2(s[1], s[3]);
        s[0] = __hadd2(s[0], s[1]);
        const float2 f = __half22float2(s[0]);
        red[hh][0] += f.x;
        red[hh][1] += f.y;
      }
    } else if (EPI == E_H2MMA) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          gk[2 * i + hh] = h2u(gelu_h2(__floats2half2_rn(acc[4 * i + 2 * hh], acc[4 * i + 2 * hh + 1])));
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int c = 0; c < 8; ++c) rs_sum_f16(rsum, gk[4 * c], gk[4 * c + 1], gk[4 * c + 2], gk[4 * c + 3], dones);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if (!MMA) asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  if (EPI == E_H2DEFER && MMA && ntiles > 0) add_fr();
  float v[2];
  if (EPI >= E_H2VAR) {
    v[0] = tig == 0 ? dm[0] : 0.0f;
    v[1] = tig == 0 ? dm[2] : 0.0f;
  } else if (EPI == E_H2MMA) {
    v[0] = tig == 0 ? rsum[0] : 0.0f;   // every column of the reduction holds the row's sum: one quad lane reports it
    v[1] = tig == 0 ? rsum[2] : 0.0f;
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) v[h] = red[h][0] + red[h][1];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) v[h] += __shfl_xor_sync(0xffffffffu, v[h], o);
  if (tig == 0) {
    out[(blockIdx.x * NWG + wg) * 64 + 16 * warp + g] = v[0];
    out[(blockIdx.x * NWG + wg) * 64 + 16 * warp + g + 8] = v[1];
  }
}

// launch(ntiles): one warm-up with `warm` tiles, then the median of 15 timed launches of `full`; cycles per tile per SM
// (tiles_sm per SM); the first nout sums against ref (where given), kept in *keep (where given)
template <class L>
void time_report(const char* name, L&& launch, int warm, int full, double tiles_sm, int nout, float* dout,
                 std::vector<float>* keep, const std::vector<float>* ref) {
  launch(warm);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 15; ++r) {
    cudaEventRecord(e0);
    launch(full);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float m = 0; cudaEventElapsedTime(&m, e0, e1);
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  const float med = ms[ms.size() / 2];
  std::vector<float> h(nout);
  cudaMemcpy(h.data(), dout, h.size() * 4, cudaMemcpyDeviceToHost);
  double num = 0, den = 0;
  if (ref) for (size_t i = 0; i < h.size(); ++i) {
    num += (h[i] - (*ref)[i]) * (double)(h[i] - (*ref)[i]); den += (double)(*ref)[i] * (*ref)[i];
  }
  if (keep) *keep = h;
  printf("%-28s %7.3f ms  %6.0f cycles per tile per SM at 1.98 GHz%s", name, med, med * 1e-3 * 1.98e9 / tiles_sm,
         ref ? "" : "\n");
  if (ref) printf("   sums vs fp32 GELU: rel %.2e\n", sqrt(num / den));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) printf("  error: %s\n", cudaGetErrorString(e));
}

template <int DT, int EPI, bool MMA, bool BAR = false, int NWG = 1, bool PP = false>
void run(const char* name, int nsm, float* dout, std::vector<float>* keep, const std::vector<float>* ref) {
  auto k = tiles<DT, EPI, MMA, BAR, NWG, PP>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  const int nblk = nsm * 3 / NWG;
  time_report(name, [&](int nt) { k<<<nblk, 128 * NWG, SMEM>>>(dout, nt, 126, 0x3210u); }, 8, 492, 3 * 492.0, nblk * 64,
              dout, keep, ref);
}

// ---- split: NM MMA warpgroups hand each tile's accumulators (as f16x2, 16 KB) to NE epilogue warpgroups through NB
// shared-memory buffers (mbarriers full / empty per buffer), one block of (NM + NE) x 128 threads per SM; the epilogue
// warpgroups run the kernel's 16-bit GELU + mean (P3, MUFU, mma.sync sums) on the handed-over pairs.  Question: does
// taking the epilogue off the MMA warpgroups (the MMAs of one tile beside the epilogues of earlier ones, without a
// second
// accumulator set) beat the kernel's three blocks of one warpgroup (docs/design.md)?
// SPLIT_NB (6) is a multiple of NM and NE: every buffer then has one producer and one consumer warpgroup, in tile order
// (the parity waits need that)
constexpr int SPLIT_BUF_OFF = (SMEM + 1023) / 1024 * 1024, SPLIT_BUF = 16384, SPLIT_NB = 6;
constexpr int SPLIT_BAR_OFF = SPLIT_BUF_OFF + SPLIT_NB * SPLIT_BUF, SPLIT_SMEM = SPLIT_BAR_OFF + 2 * SPLIT_NB * 8;
__device__ __forceinline__ void sp_init(uint32_t a, unsigned n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void sp_arrive(uint32_t a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(a) : "memory");
}
__device__ __forceinline__ void sp_wait(uint32_t a, unsigned par) {
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n"
               :: "r"(a), "r"(par) : "memory");
}
template <int NM, int NE>
__global__ void __launch_bounds__(128 * (NM + NE), 1) split_tiles(float* out, int ntiles) {   // ntiles per SM
  static_assert(SPLIT_NB % NM == 0 && SPLIT_NB % NE == 0, "one producer and one consumer per buffer");
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
  const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2,
            tig = lane & 3;
  for (int i = threadIdx.x; i < B_OFF / 2; i += blockDim.x)
    reinterpret_cast<__nv_bfloat16*>(sm)[i] = __float2bfloat16(pe_rnd(i) * 2.0f * 0.1179f);
  for (int i = threadIdx.x; i < 2 * PLANE / 4; i += blockDim.x) {
    reinterpret_cast<__nv_bfloat16*>(sm + B_OFF)[2 * i] = __float2bfloat16(pe_rnd(i + 777777) * 2.0f * 1.7f);
    reinterpret_cast<__nv_bfloat16*>(sm + B_OFF)[2 * i + 1] = __float2bfloat16(pe_rnd(i + 999) * 3.4f);
  }
  if (threadIdx.x < SPLIT_NB) {
    sp_init(base + SPLIT_BAR_OFF + 8 * threadIdx.x, 128);
    sp_init(base + SPLIT_BAR_OFF + 8 * (SPLIT_NB + threadIdx.x), 128);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t full0 = base + SPLIT_BAR_OFF, empty0 = full0 + 8 * SPLIT_NB;
  if (wg < NM) {   // MMA warpgroup: tiles wg, wg + NM, ...
    uint64_t da[6], db[6];
#pragma unroll
    for (int j = 0; j < 6; ++j) {
      da[j] = desc(base + A_OFF + j * 2048, 1024, 128);
      db[j] = desc(base + B_OFF + (j % 3) * SLOTB + (j / 3) * 16, 16, 128);
    }
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int t = wg; t < ntiles; t += NM) {
#pragma unroll
      for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int j = 0; j < 6; ++j) ss_bf16(acc, da[j], db[j], j > 0);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
      for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
      const int b = t % SPLIT_NB, k = t / SPLIT_NB;
      if (k > 0) sp_wait(empty0 + 8 * b, (k - 1) & 1);
      const uint32_t buf = base + SPLIT_BUF_OFF + b * SPLIT_BUF;
#pragma unroll
      for (int c = 0; c < 8; ++c) {   // pairs 4c .. 4c + 3 (pair 2i + hh = acc[4i + 2hh], acc[4i + 2hh + 1])
        uint32_t v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pr = 4 * c + e, i = pr >> 1, hh = pr & 1;
          asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v[e]) : "f"(acc[4 * i + 2 * hh + 1]), "f"(acc[4 * i + 2 * hh]));
        }
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" :: "r"(buf + (c * 128 + tid) * 16), "r"(v[0]), "r"(v[1]),
                     "r"(v[2]), "r"(v[3]) : "memory");
      }
      sp_arrive(full0 + 8 * b);
    }
  } else {         // epilogue warpgroup e: tiles e, e + NE, ...
    const int e = wg - NM;
    float dm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int cnt = 0;
    for (int t = e; t < ntiles; t += NE, ++cnt) {
      const int b = t % SPLIT_NB, k = t / SPLIT_NB;
      sp_wait(full0 + 8 * b, k & 1);
      const uint32_t buf = base + SPLIT_BUF_OFF + b * SPLIT_BUF;
      uint32_t hx[32];
#pragma unroll
      for (int c = 0; c < 8; ++c)
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(hx[4 * c]), "=r"(hx[4 * c + 1]), "=r"(hx[4 * c + 2]), "=r"(hx[4 * c + 3])
                     : "r"(buf + (c * 128 + tid) * 16) : "memory");
      sp_arrive(empty0 + 8 * b);
      // wg_epi_h2_with's sums: 4 pixel blocks added in fp16 per mma.sync, 2 mma.sync per tile
#pragma unroll
      for (int gi = 0; gi < 2; ++gi) {
        uint32_t a[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          uint32_t v[4];
#pragma unroll
          for (int tt = 0; tt < 4; ++tt) {
            const int i = 2 * (gi + 2 * tt) + (f >> 1); v[tt] = h2_gelu2_pair(hx[2 * i + (f & 1)]);
          }
          asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v[0]) : "r"(v[2]));
          asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v[1]) : "r"(v[3]));
          asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v[0]) : "r"(v[1]));
          a[f] = v[0];
        }
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
                     : "+f"(dm[0]), "+f"(dm[1]), "+f"(dm[2]), "+f"(dm[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(0x3c003c00u));
      }
    }
    // per block slot of 492 tiles, as the other variants: this warpgroup's sums scaled to 492 tiles
    const float sc = cnt ? 492.0f / cnt : 0.0f;
    if (tig == 0 && e < 3) {
      out[(blockIdx.x * 3 + e) * 64 + 16 * warp + g] = dm[0] * sc;
      out[(blockIdx.x * 3 + e) * 64 + 16 * warp + g + 8] = dm[2] * sc;
      if (NE == 2 && e == 1) {   // slot 2 gets warpgroup 1's sums too, so every slot has a value to compare
        out[(blockIdx.x * 3 + 2) * 64 + 16 * warp + g] = dm[0] * sc;
        out[(blockIdx.x * 3 + 2) * 64 + 16 * warp + g + 8] = dm[2] * sc;
      }
    }
  }
}
template <int NM, int NE>
void run_split(const char* name, int nsm, float* dout, const std::vector<float>* ref) {
  auto k = split_tiles<NM, NE>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SPLIT_SMEM);
  // the work of 3 block slots of 492 tiles per SM
  time_report(name, [&](int nt) { k<<<nsm, 128 * (NM + NE), SPLIT_SMEM>>>(dout, nt); }, 24, 3 * 492, 3 * 492.0,
              nsm * 3 * 64, dout,
              nullptr, ref);
}

// ---- pipe: the tf32 fp32 GELU split across tiles, two accumulator sets (NB blocks of one warpgroup per SM).
// After tile
// t's chain: the FMA-pipe work (combine + sum of tile t - 1, then the Horner polynomial of tile t); during tile t + 1's
// chain: the MUFU.EX2 of tile t's 64 values.  Question: FP32 FMA-pipe work does not run beside wgmma but MUFU does
// (docs/design.md 3.1) — does taking the ex2s out of the FMA phase bring the tile to tensor + FMA (~1170 cycles)
// from the 1369 of one accumulator set?  PIPE false: the same kernel with the whole GELU after each chain (the 2-block
// baseline).
template <int DT, int NB, bool PIPE>
__global__ void __launch_bounds__(128, NB) pipe_tiles(float* out, int ntiles, uint32_t qsel) {   // ntiles even
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  fill_operands<0>(sm, tid, 0);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  constexpr int NOPS = DT == 0 ? 10 : 9;
  uint64_t da[NOPS], db[NOPS];
#pragma unroll
  for (int j = 0; j < NOPS; ++j) {
    da[j] = desc(base + A_OFF + j * 2048, 1024, 128);
    db[j] = desc(base + B_OFF + (j % 3) * SLOTB + (j / 3) * 16, PLANE, 128);
  }
  float acc[2][64], r[64];
  float red[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
  for (int i = 0; i < 64; ++i) { acc[0][i] = acc[1][i] = 0.0f; r[i] = 0.0f; }
  auto step = [&](float (&an)[64], float (&ap)[64], bool first) {   // an: this tile's chain; ap: the last tile's values
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(an[i]) :: "memory");
    if (DT >= 2) bias_start<DT>(an, warp, g, qsel);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int j = 0; j < NOPS; ++j) ss_tf32(an, da[j], db[j], DT >= 2 || j > 0);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    if (PIPE && !first) {
#pragma unroll
      for (int i = 0; i < 64; ++i) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(r[i]));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(an[i]) :: "memory");
    if (PIPE) {
      if (!first) {
#pragma unroll
        for (int i = 0; i < 64; ++i) red[(i >> 1) & 1][i & 1] += fmaf(-fabsf(ap[i]), r[i], fmaxf(ap[i], -0.0f));
      }
#pragma unroll
      for (int i = 0; i < 64; ++i) r[i] = ff_phi_neg_log2(fabsf(an[i]));   // (ff_phi_neg without its ex2)
    } else {
#pragma unroll
      for (int i = 0; i < 64; ++i) red[(i >> 1) & 1][i & 1] += ff_gelu_erf_noclamp(an[i]);
    }
  };
  for (int t = 0; t < ntiles; t += 2) {
    step(acc[0], acc[1], t == 0);
    step(acc[1], acc[0], false);
  }
  if (PIPE && ntiles > 0) {   // the last tile's ex2 and combine
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      float q;
      asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q) : "f"(r[i]));
      red[(i >> 1) & 1][i & 1] += fmaf(-fabsf(acc[1][i]), q, fmaxf(acc[1][i], -0.0f));
    }
  }
  float v[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    v[h] = red[h][0] + red[h][1];
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) v[h] += __shfl_xor_sync(0xffffffffu, v[h], o);
  }
  if (tig == 0) {
    out[blockIdx.x * 64 + 16 * warp + g] = v[0];
    out[blockIdx.x * 64 + 16 * warp + g + 8] = v[1];
  }
}
template <int DT, int NB, bool PIPE>
void run_pipe(const char* name, int nsm, float* dout, std::vector<float>* keep, const std::vector<float>* ref) {
  auto k = pipe_tiles<DT, NB, PIPE>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  // the work of 3 block slots of 492 tiles per SM, in NB blocks per SM
  const int nt = 3 * 492 / NB / 2 * 2;
  time_report(name, [&](int n) { k<<<nsm * NB, 128, SMEM>>>(dout, n, 0x3210u); }, 8, nt, (double)nt * NB, nsm * NB * 64,
              dout,
              keep, ref);
}

int main() {
  int nsm = 0;
  cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
  float* dout;
  cudaMalloc(&dout, nsm * 3 * 64 * 4);
  printf("seed-shaped work: 492 tiles of 64 channels x 128 pixels per block-slot, 3 blocks of 128 threads per SM, "
         "%d SMs\n", nsm);
  std::vector<float> ref16, ref32;
  run<1, E_NOTHING, true>("bf16 MMA only (6 ops)", nsm, dout, nullptr, nullptr);
  run<1, E_NONE, true>("bf16 MMA + sum ('none')", nsm, dout, nullptr, nullptr);
  run<1, E_NONE, true, true>("bf16 'none' + row barrier", nsm, dout, nullptr, nullptr);
  run<1, E_F32, true>("bf16 MMA + fp32 GELU", nsm, dout, &ref16, nullptr);
  run<1, E_F32, true, true>("bf16 fp32 GELU + row barrier", nsm, dout, nullptr, nullptr);
  run<1, E_F32_BRANCH, true>("bf16 fp32 GELU, masks: branch", nsm, dout, nullptr, nullptr);
  run<1, E_F32_SELECT, true>("bf16 fp32 GELU, masks: select", nsm, dout, nullptr, nullptr);
  run<1, E_H2TREE, true>("bf16 MMA + half2 GELU, tree", nsm, dout, nullptr, &ref16);
  run<1, E_H2MMA, true>("bf16 MMA + half2 GELU, wgmma", nsm, dout, nullptr, &ref16);
  // the 16-bit epilogue's GELU variants (gelu_h2_variants.cuh), with the MMAs and alone
  const char* vn[] = {"kernel (P3, relu max)", "V1 (P5, relu cvt)", "no MUFU (poly 2^x)", "P5, relu max",
                      "P5, relu PRMT",
                      "P3, relu cvt", "half V1, half poly", "no MUFU P6(v), relu", "no MUFU 2g = x + |x| Q6",
                      "half kernel, half P6", "3/4 kernel, 1/4 P6"};
  char nm[64];
#define H2V(V)                                                                                   \
  snprintf(nm, sizeof nm, "bf16 MMA + h2 %s", vn[V]); run<1, E_H2VAR + V, true>(nm, nsm, dout, nullptr, &ref16); \
  snprintf(nm, sizeof nm, "h2 %s, alone", vn[V]); run<1, E_H2VAR + V, false>(nm, nsm, dout, nullptr, nullptr);
  if (getenv("PE_TF32_BIAS")) {   // the tf32 bias as accumulator start values instead of a 10th op
    run<0, E_NOTHING, true>("tf32 MMA only (10 ops)", nsm, dout, nullptr, nullptr);
    run<2, E_NOTHING, true>("tf32 MMA only (9, bias PRMT)", nsm, dout, nullptr, nullptr);
    run<3, E_NOTHING, true>("tf32 MMA only (9, bias MOV)", nsm, dout, nullptr, nullptr);
    run<0, E_F32, true>("tf32 MMA + fp32 GELU (10 ops)", nsm, dout, nullptr, nullptr);
    run<2, E_F32, true>("tf32 9 + PRMT bias + fp32 GELU", nsm, dout, nullptr, nullptr);
    run<3, E_F32, true>("tf32 9 + MOV bias + fp32 GELU", nsm, dout, nullptr, nullptr);
    run<0, E_F32, true, true>("tf32 10 ops GELU + row barrier", nsm, dout, nullptr, nullptr);
    run<2, E_F32, true, true>("tf32 9 PRMT GELU + row barrier", nsm, dout, nullptr, nullptr);
    run<0, E_F32, true>("tf32 MMA + fp32 GELU (10 ops)", nsm, dout, nullptr, nullptr);
    run<2, E_F32, true>("tf32 9 + PRMT bias + fp32 GELU", nsm, dout, nullptr, nullptr);
    std::vector<float> refp;
    run_pipe<0, 2, false>("tf32 2 blocks, 2 acc sets", nsm, dout, &refp, nullptr);
    run_pipe<0, 2, true>("tf32 2 blocks, ex2 under chain", nsm, dout, nullptr, &refp);
    run_pipe<2, 2, false>("tf32 9 PRMT, 2 blocks, 2 sets", nsm, dout, nullptr, nullptr);
    run_pipe<2, 2, true>("tf32 9 PRMT, ex2 under chain", nsm, dout, nullptr, nullptr);
    run_pipe<0, 1, true>("tf32 1 block, ex2 under chain", nsm, dout, nullptr, nullptr);   // (other grid: no ref)
    run_pipe<0, 2, true>("tf32 2 blocks, ex2 under chain", nsm, dout, nullptr, &refp);
    return 0;
  }
  if (getenv("PE_H2_ONLY")) {   // only the kernel's epilogue and the MUFU-free variants
    H2V(0)
    run<1, E_H2DEFER, true>("bf16 MMA + h2 kernel, sums deferred", nsm, dout, nullptr, &ref16);
    run<1, E_H2DEFER, true, true>("bf16 h2 deferred + row barrier", nsm, dout, nullptr, &ref16);
    run<1, E_H2VAR, true, true>("bf16 kernel h2 + row barrier", nsm, dout, nullptr, &ref16);
    run<1, E_NOTHING, true>("bf16 MMA only (6 ops)", nsm, dout, nullptr, nullptr);
    return 0;
  }
  H2V(0) H2V(1) H2V(2) H2V(3) H2V(4) H2V(5) H2V(6) H2V(7) H2V(8) H2V(9) H2V(10)
#undef H2V
  run<1, E_H2VAR, true, true>("bf16 kernel h2 + row barrier", nsm, dout, nullptr, nullptr);
  // the epilogue on warpgroups of its own (split_tiles): MMA warpgroups + epilogue warpgroups, f16x2 hand-over
  run_split<1, 3>("split 1 MMA WG + 3 epi WG", nsm, dout, &ref16);
  run_split<2, 2>("split 2 MMA WG + 2 epi WG", nsm, dout, &ref16);
  run_split<1, 2>("split 1 MMA WG + 2 epi WG", nsm, dout, &ref16);
  run_split<2, 3>("split 2 MMA WG + 3 epi WG", nsm, dout, &ref16);
  // one block of 3 warpgroups per SM, without and with the ping-pong of their wgmma issue
  run<1, E_H2VAR, true, false, 3, false>("bf16 kernel h2, 1 block x 3 WG", nsm, dout, nullptr, &ref16);
  run<1, E_H2VAR, true, false, 3, true>("bf16 kernel h2, 3 WG ping-pong", nsm, dout, nullptr, &ref16);
  run<1, E_NONE, true, false, 3, true>("bf16 'none', 3 WG ping-pong", nsm, dout, nullptr, nullptr);
  run<1, E_F32, true, false, 3, false>("bf16 fp32 GELU, 1 block x 3 WG", nsm, dout, nullptr, nullptr);
  run<1, E_F32, true, false, 3, true>("bf16 fp32 GELU, 3 WG ping-pong", nsm, dout, nullptr, nullptr);
  run<1, E_NONE, false>("sum alone", nsm, dout, nullptr, nullptr);
  run<1, E_F32, false>("fp32 GELU alone", nsm, dout, nullptr, nullptr);
  run<1, E_H2TREE, false>("half2 GELU, tree, alone", nsm, dout, nullptr, nullptr);
  run<1, E_H2MMA, false>("half2 GELU, wgmma, alone", nsm, dout, nullptr, nullptr);
  run<0, E_NOTHING, true>("tf32 MMA only (10 ops)", nsm, dout, nullptr, nullptr);
  run<0, E_NONE, true>("tf32 MMA + sum ('none')", nsm, dout, nullptr, nullptr);
  run<0, E_F32, true>("tf32 MMA + fp32 GELU", nsm, dout, &ref32, nullptr);
  run<0, E_F32, true, false, 3, true>("tf32 fp32 GELU, 3 WG ping-pong", nsm, dout, nullptr, &ref32);
  run<0, E_F32_BRANCH, true>("tf32 fp32 GELU, masks: branch", nsm, dout, nullptr, nullptr);
  run<0, E_F32_SELECT, true>("tf32 fp32 GELU, masks: select", nsm, dout, nullptr, nullptr);
  run<0, E_H2TREE, true>("tf32 MMA + half2 GELU, tree", nsm, dout, nullptr, &ref32);
  run<0, E_H2MMA, true>("tf32 MMA + half2 GELU, wgmma", nsm, dout, nullptr, &ref32);
  return 0;
}
