// Family A, fully fused: out[n,k] = pool_{p,q} act(conv2d(x, w)[n,k,p,q] + b[k]), one kernel, conv output never stored.
// Reduces, per (image, output channel), over all output pixels (p,q) (a global average/max pool), so the conv output
// can stay in registers: each block reduces its rows in registers and only 64 partials per image piece leave the chip.
// A Conv3d runs as the Conv2d over (image, output depth) and (input channel, depth tap) pairs (Vol below; sm_90 wgmma
// kernel, per-element loaders), its pool over every output depth of an image.
//
// Two implementations, chosen per call by the host side below (the kernels live in fused_conv_act_pool/, one
// concept per header, included in dependency order):
//   * sm_90 (H100/H200), any dtype (TF32 / ieee / bf16 / fp16), stride-1 columns (stride 2 through the TMA loaders, each
//     row's even columns apart from its odd ones: WG_NT2): wgmma path
//     (fa_wgmma_kernel, wgmma_kernel.cuh) - weights (A) and input rows (B, a shared-memory ring with the halo) both fed to the
//     tensor cores by descriptors; one launch per 64 output channels (WGPlan).
//     ieee there: x w ~ x_hi w_hi (tf32) + bf16(x) bf16(w_lo) + bf16(x_lo) bf16(w)
//     (x_hi = tf32(x), x_lo = x - x_hi, w likewise): the two small terms are ONE bf16 k16 wgmma whose K chunks are the
//     (x, w_lo) and (x_lo, w) pairs, so a tap costs two wgmmas instead of 3xTF32's three; each bf16 rounding is 2^-9
//     of a term already 2^-11 of x w, i.e. <= 2^-18 |x w| per product (3xTF32: ~2^-21), well inside ieee's 1e-5.
//   * otherwise (sm_80, column strides > 2, output rows of <= 48 / 64 pixels, ...; mma_sync_kernel.cuh): implicit GEMM
//     on mma.sync (TF32 m16n8k8; 3xTF32 for precision=ieee; bf16/fp16 m16n8k16 + k8). GEMM M = output channels (A = weights, register-resident: K-dim <= 9
//     "units"), GEMM N = output pixels (B = im2col straight from a shared-memory input tile with its halo), K-dim unit
//     = one filter tap (r,s) x 8 input channels; tile [chgroup][row][col][8 ch]; epilogue per 64ch x 16px tile.
#include <cuda.h>   // CUtensorMap (the driver function that fills it is looked up at run time: no libcuda link)
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include "codes.h"
#include "activation.cuh"
#include "smem_optin.h"
#include "gelu_h2.cuh"   // wg_epi_h2: the 16-bit GELU + mean epilogue
#include "fused_conv_act_pool/device_common.cuh"
#include "fused_conv_act_pool/mma_sync_kernel.cuh"
#include "fused_conv_act_pool/wgmma_params.cuh"
#include "fused_conv_act_pool/sm90_ptx.cuh"
#include "fused_conv_act_pool/wgmma_epilogue.cuh"
#include "fused_conv_act_pool/wgmma_issue.cuh"
#include "fused_conv_act_pool/ring_loaders.cuh"
#include "fused_conv_act_pool/wgmma_block_setup.cuh"
#include "fused_conv_act_pool/wgmma_reduce.cuh"
#include "fused_conv_act_pool/wgmma_kernel.cuh"

// --------------------------------------------------------------------------------------------------------------
// Host side
namespace {
struct Plan {
  const char* why;       // the call is invalid or has nothing to compute: no kernel serves it
  const char* mma_why;   // why the mma.sync kernel cannot serve it (the sm_90 wgmma kernel may; see choose)
  int P, Q, CG, nu, BR, QS, nbands, nseg, nksl, TR, TWa, NW, MT, PIXB;
  size_t smem, ws_cnt_bytes, ws_bytes;
};

// Tuning knobs, read once per process. They never affect correctness (every setting passes the same checks); they can
// change the summation order, so deterministic mode is bitwise reproducible for a fixed setting: FF_FUSED_A_IMPL = 0 auto (wgmma on sm_90 where supported), 1 mma.sync path only;
// FF_FUSED_A_WG16 = 0 keeps 16-bit inputs on the mma.sync kernel; FF_FUSED_A_NCHW4 = 0 reads NCHW fp32 with 4-byte copies instead of 16-byte ones; FF_FUSED_A_RB = max ring slots (2..16, default 8); FF_FUSED_A_BPS = blocks per SM for the wgmma path (1..4, default 3: the 168-register build measured
// 0.584 / 0.743 ms NHWC / NCHW TF32 at the seed against 0.674 / 0.847 for 4 blocks of 128 registers; 3xTF32 uses at most 2);
// FF_FUSED_A_VEC16 = 0 reads 16-bit input with register loads (REG) instead of 16-byte copies (VEC, NCHW8).
// FF_FUSED_A_PAIR16 = 0 gives each 16-bit k16 op one tap of one channel group (8 channels + 8 zero-weight columns)
// instead of two taps (one group) or two channel groups (more);
// FF_FUSED_A_COL16 = 0 keeps taps (0, 2) and (1, 2) of a 16-bit 3x3 filter in ops of their own (6 ops, the general kernel).
// FF_FUSED_A_NOCLAMP = 0 evaluates GELU (erf) with ff_gelu_erf everywhere instead of the clamp-free form (wg_epi);
// FF_FUSED_A_FULLTILE = 0 keeps the per-column-block mask tests in whole 16-bit tiles too (fp32 always has them).
// FF_FUSED_A_TMA = 0 keeps the input on the per-thread 16-byte copies (VEC / NCHW4 / NCHW8) instead of the TMA loaders.
// FF_FUSED_A_MINBPS = fewest blocks per SM the wgmma kernel may shrink to when a large filter's ring needs the room
// (default 2; a shape that fits only one block per SM runs the fallback, measured faster there).
// FF_FUSED_A_NARROW = 0 keeps narrow output rows on the wgmma kernel (choose; the tests run it that way too).
// FF_FUSED_A_R2 = 0 gives rows of 8..64 output pixels one row per wgmma tile instead of two (WG_NT_R2).
// FF_FUSED_A_LINE_C16 = 0 issues op lists as long as a 3x3 filter's over 9..16 channels (wg_ops_c16) through the general
// chain (a fence per wgmma) instead of their straight-line kernels; FF_FUSED_A_HALFSPAN = 0 sizes the ring slots of rows of
// <= 128 output pixels for 256 columns (+ halo) as those of wider rows.
struct Knobs { int impl, rb, bps, nchw4, wg16, vec16, pair16, noclamp, fulltile, minbps, tma, h2, col16, narrow, r2, line_c16, halfspan; };
const Knobs& knobs() {
  static const Knobs k = [] {
    auto get = [](const char* name, int dflt) { const char* s = getenv(name); return s ? atoi(s) : dflt; };
    Knobs r{get("FF_FUSED_A_IMPL", 0), get("FF_FUSED_A_RB", 8), get("FF_FUSED_A_BPS", 3), get("FF_FUSED_A_NCHW4", 1), get("FF_FUSED_A_WG16", 1),
            get("FF_FUSED_A_VEC16", 1), get("FF_FUSED_A_PAIR16", 1), get("FF_FUSED_A_NOCLAMP", 1), get("FF_FUSED_A_FULLTILE", 1),
            get("FF_FUSED_A_MINBPS", 2), get("FF_FUSED_A_TMA", 1), get("FF_FUSED_A_H2", 1), get("FF_FUSED_A_COL16", 1),
            get("FF_FUSED_A_NARROW", 1), get("FF_FUSED_A_R2", 1), get("FF_FUSED_A_LINE_C16", 1), get("FF_FUSED_A_HALFSPAN", 1)};
    if (r.rb < 2 || r.rb > 16) r.rb = 8;
    if (r.bps < 1 || r.bps > 4) r.bps = 3;
    if (r.minbps < 1 || r.minbps > 4) r.minbps = 2;
    return r;
  }();
  return k;
}
struct DevInfo { int major, minor, nsm; };
// FF_FUSED_A_PLAN_AS_SM90 = n (n > 0): where the process sees no CUDA device, plan as on an sm_90 GPU of n SMs, so that
// the planner's choices (ff_fused_conv_act_pool_kernel / _unsupported) are testable without a GPU (tests/test_plan_cpu.py);
// ignored wherever a device is present, so it never changes a launch.
DevInfo dev_info() {
  static DevInfo cache[64];
  static bool have[64];
  int dev = 0;
  const bool no_device = cudaGetDevice(&dev) != cudaSuccess;
  if (dev < 0 || dev >= 64) dev = 0;
  if (!have[dev]) {
    DevInfo d{0, 0, 1};
    const char* as90 = no_device ? getenv("FF_FUSED_A_PLAN_AS_SM90") : nullptr;
    if (as90 && atoi(as90) > 0) {
      d = DevInfo{9, 0, atoi(as90)};
    } else {
      cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
      cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev);
      cudaDeviceGetAttribute(&d.nsm, cudaDevAttrMultiProcessorCount, dev);
    }
    if (d.nsm < 1) d.nsm = 1;
    cache[dev] = d;
    have[dev] = true;
  }
  return cache[dev];
}

Plan make_plan(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw,
               int ph, int pw, int dh, int dw, int activation, int pool, int precision, int deterministic) {
  Plan pl{};
  pl.why = pl.mma_why = nullptr;
  if (dtype < 0 || dtype > 2) { pl.why = "fused_conv_act_pool: dtype must be 0 (fp32), 1 (bf16) or 2 (fp16)"; return pl; }
  if (activation < 0 || activation > 4) { pl.why = "fused_conv_act_pool: unknown activation code"; return pl; }
  if (pool < 0 || pool > 1) { pl.why = "fused_conv_act_pool: pool must be 0 (mean) or 1 (max)"; return pl; }
  if (precision < 0 || precision > 1) { pl.why = "fused_conv_act_pool: precision must be 0 (tf32) or 1 (ieee)"; return pl; }
  if (channels_last < 0 || channels_last > 1) { pl.why = "fused_conv_act_pool: channels_last must be 0 or 1"; return pl; }
  if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || K <= 0 || R <= 0 || S <= 0) { pl.why = "fused_conv_act_pool: empty or negative extent"; return pl; }
  if (sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 || ph < 0 || pw < 0) { pl.why = "fused_conv_act_pool: stride/dilation must be >= 1 and padding >= 0"; return pl; }
  long long P = ((long long)H + 2LL * ph - (long long)dh * (R - 1) - 1) / sh + 1;
  long long Q = ((long long)W + 2LL * pw - (long long)dw * (S - 1) - 1) / sw + 1;
  if ((long long)H + 2LL * ph < (long long)dh * (R - 1) + 1 || (long long)W + 2LL * pw < (long long)dw * (S - 1) + 1 || P <= 0 || Q <= 0) {
    pl.why = "fused_conv_act_pool: the convolution output is empty (kernel larger than the padded input)"; return pl;
  }
  if (P > (1 << 30) || Q > (1 << 30)) { pl.why = "fused_conv_act_pool: output extent too large"; return pl; }
  pl.P = (int)P; pl.Q = (int)Q;
  pl.CG = (C + 7) / 8;
  long long nu = (long long)R * S * pl.CG;
  if (nu > NU_MAX) {
    pl.mma_why = "fused_conv_act_pool: R*S*ceil(C/8) > 9 K units of 8 input channels: beyond the mma.sync kernel (9, "
                 "register-resident weights); the sm_90 wgmma kernel takes up to 64 with stride-1 columns (stride 2 "
                 "with TMA rows) and a ring of input rows that fits in shared memory";
    return pl;
  }
  pl.nu = (int)nu;
  pl.PIXB = (dtype == FF_F32) ? 32 : 16;
  const bool split = (dtype == FF_F32 && precision == FF_PREC_IEEE);
  pl.MT = split ? 2 : 4;
  pl.NW = 4;
  // measured on H200 (seed): fp32 2 blocks x 100 KB (255 regs); 16-bit 3 blocks x 72 KB (168 regs)
  const int kb_default = pl.NW == 8 ? 200 : (pl.NW == 4 ? (dtype == FF_F32 ? 100 : 72) : 50);
  const long long budget = kb_default * 1024LL;
  const int brcap = 64;
  // width segment: full output width if a 1-row band fits, else the widest multiple of 16 that fits
  auto tw_of = [&](long long qs) { return ((qs + 15) / 16 * 16 - 1) * sw + (long long)(S - 1) * dw + 1; };
  const long long trmin = (long long)(R - 1) * dh + 1;
  long long QS = Q;
  if (pl.CG * tw_of(QS) * pl.PIXB * trmin > budget) {
    QS = 16;
    if (pl.CG * tw_of(QS) * pl.PIXB * trmin > budget) {
      pl.mma_why = "fused_conv_act_pool: the input tile with its halo for one row of 16 output pixels does not fit in shared memory";
      return pl;
    }
    while (pl.CG * tw_of(QS + 16) * pl.PIXB * trmin <= budget && QS + 16 < Q) QS += 16;
  }
  long long rowbytes = pl.CG * tw_of(QS) * pl.PIXB;
  long long trmax = budget / rowbytes;
  long long BR = (trmax - trmin) / sh + 1;
  if (BR > brcap) BR = brcap;
  if (BR > P) BR = P;
  if (BR < 1) BR = 1;
  long long nb = (P + BR - 1) / BR;
  BR = (P + nb - 1) / nb;                                 // even out the bands
  pl.BR = (int)BR; pl.QS = (int)QS;
  pl.nbands = (int)nb; pl.nseg = (int)((Q + QS - 1) / QS); pl.nksl = (K + 63) / 64;
  pl.TR = (int)((BR - 1) * sh + trmin);
  pl.TWa = (int)tw_of(QS);
  pl.smem = (size_t)pl.CG * pl.TR * pl.TWa * pl.PIXB;
  long long blocks = N * pl.nksl * pl.nbands * pl.nseg;
  if (blocks > 0x7fffffffLL) { pl.mma_why = "fused_conv_act_pool: too many blocks (N too large)"; return pl; }
  const bool need_ws = (pool == FF_POOL_MAX) || deterministic;
  pl.ws_cnt_bytes = need_ws ? (size_t)((N * 4 + 255) / 256 * 256) : 0;
  if (!need_ws) pl.ws_bytes = 0;
  else if (pool == FF_POOL_MAX) pl.ws_bytes = pl.ws_cnt_bytes + (size_t)N * K * 4;
  else pl.ws_bytes = pl.ws_cnt_bytes + (size_t)N * pl.nksl * pl.nbands * pl.nseg * 64 * 4;
  return pl;
}

template <int DT, bool SPLIT, int MT, int NW, bool FULL>
int launch_t(const FAParams& prm, const Plan& pl, long long blocks, cudaStream_t stream) {
  auto kern = fused_conv_act_pool_kernel<DT, SPLIT, MT, NW, FULL>;
  cudaError_t e = ff_smem_optin(reinterpret_cast<const void*>(kern));   // the device's maximum (thread-safe)
  if (e != cudaSuccess) return (int)e;
  long long grid = blocks;
  {
    int dev = 0, nsm = 0, occ = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, NW * 32, pl.smem);
    if (occ < 1) occ = 1;
    if ((long long)occ * nsm < grid) grid = (long long)occ * nsm;
  }
  kern<<<(unsigned)grid, NW * 32, pl.smem, stream>>>(prm);
  return (int)cudaGetLastError();
}

template <int DT, bool SPLIT, int MT>
int launch_nw(const FAParams& prm, const Plan& pl, long long blocks, cudaStream_t stream) {
  const bool full = (pl.nu == NU_MAX);
  return full ? launch_t<DT, SPLIT, MT, 4, true>(prm, pl, blocks, stream) : launch_t<DT, SPLIT, MT, 4, false>(prm, pl, blocks, stream);
}

// A Conv3d's depth: D input slices (0: the call is a Conv2d), kernel depth T, stride sd, padding pd, dilation dd;
// Dout output depths.  The kernels see the Conv2d over C x T channels (WGParams vT).
struct Vol { int D, T, sd, pd, dd, Dout; };
Vol make_vol(int D, int T, int sd, int pd, int dd) {
  Vol v{D, T, sd, pd, dd, 1};
  if (D > 0 && T > 0 && sd > 0 && dd > 0 && pd >= 0) {
    const long long span = (long long)dd * (T - 1) + 1, padded = (long long)D + 2LL * pd;
    v.Dout = padded < span ? 0 : (int)std::min<long long>((padded - span) / sd + 1, 1LL << 30);
  }
  return v;
}
// Why no kernel serves this Conv3d depth (nullptr: a Conv2d, or a valid depth)
const char* vol_why(const Vol& v, int C) {
  if (v.D == 0) return nullptr;
  if (v.D < 0 || v.T <= 0 || v.sd <= 0 || v.dd <= 0 || v.pd < 0)
    return "fused_conv_act_pool: Conv3d depth extent, stride, dilation must be >= 1 and padding >= 0";
  if (v.Dout <= 0) return "fused_conv_act_pool: the convolution output is empty (kernel deeper than the padded input)";
  if ((long long)C * v.T > 4096) return "fused_conv_act_pool: Conv3d with C_in x kernel depth > 4096";
  return nullptr;
}

// ---- wgmma path plan (sm_90 only; shapes with stride-1 columns — stride 2 through the TMA loaders, WG_NT2 — and a
//      ring that fits) ----
// The kernel covers 64 output channels (its A operand, one m64 wgmma row block); K > 64 runs nkb = ceil(K / 64)
// launches in stream order, launch kb with channels 64 kb .. (prm.K of them), each into an (N, its K) block of the
// workspace's tmp that a 2-d copy then puts into out's columns (the counters and partials serve them in turn: each
// launch leaves them zeroed).
struct WGPlan {
  bool ok;
  int lm, bps;   // the input loader (WG_LM_*) the layout is for; blocks per SM
  int nkb;       // launches of 64 output channels
  const char* why;   // set when the shape is beyond this kernel's capacity (for the user's message)
  WGParams prm;      // (prm.K: the first launch's channels, min(K, 64))
  size_t smem, ws_cnt_bytes, ws_tmp_off, ws_bytes;
};

// The op count a straight-line kernel (wgmma issue without a fence per op) exists for, else 0: fp32 3x3 over <= 8
// channels (9 taps + bias) and 16-bit 3x3 over <= 8 channels with the column pair (5, col), for every loader; op lists
// as long as a 3x3 filter's over 9..16 channels (wg_ops_c16: fp32 18 + the bias op, 16-bit 9 channel-group pairs + the
// bias op; 16-bit 5x3 over <= 8 too) for a Conv2d whose rows come by TMA or NCHW's 16-byte copies (wg_lm_c16), one row
// per tile, stride-1 columns, not ieee.
// Others (another 16-bit filter of 5 ops too) take the general kernel, which fences every wgmma.
constexpr int wg_ops_c16(int dtype) { return dtype == FF_F32 ? 19 : 10; }
constexpr bool wg_lm_c16(int lm) { return wg_lm_tma(lm) || lm == WG_LM_NCHW4 || lm == WG_LM_NCHW8; }
int wg_straight_ops(int dtype, int nops, bool col, int lm, bool sw2, bool r2, bool vol, bool split) {
  if (dtype == FF_F32 && nops == WG_OPS3X3) return nops;
  if (col) return nops == WG_COL16_OPS ? nops : 0;
  return nops == wg_ops_c16(dtype) && wg_lm_c16(lm) && !sw2 && !r2 && !vol && !split && knobs().line_c16 ? nops : 0;
}
// ... of a plan's parameters
int wg_straight_ops(int dtype, int precision, int lm, const WGParams& p) {
  return wg_straight_ops(dtype, p.nops, p.col_j >= 0, lm, p.sw2_sub > 0, p.r2 != 0, p.vT > 0,
                         dtype == FF_F32 && precision == FF_PREC_IEEE);
}

// Two output rows per tile (WG_NT_R2) can serve the call: rows of 8 .. 64 output pixels (one segment) through the TMA
// loaders, Conv2d, not ieee (knob FF_FUSED_A_R2 = 0: one row per tile)
bool wg_r2_applies(int lm, bool split, const Vol& v, long long Q) {
  return knobs().r2 && wg_lm_tma(lm) && !split && v.D == 0 && Q >= 8 && Q <= WG_NT_R2;
}

// (For a Conv3d, C = the input channels x the kernel depth: see Vol.)
WGPlan wg_plan_lm(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
                  int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, const Plan& base, int lm,
                  const Vol& v, bool want_r2) {
  WGPlan w{};
  w.ok = false;
  w.why = nullptr;
  w.lm = lm;
  const bool tvec = lm == WG_LM_TVEC, tnchw = lm == WG_LM_TNCHW, tma = tvec || tnchw;
  if (base.why || knobs().impl != 0) return w;
  const DevInfo di = dev_info();
  if (!(di.major == 9 && di.minor == 0)) return w;
  // stride-2 columns: a Conv2d through the TMA loaders, each plane's even columns then its odd ones (WG_NT2)
  const bool sw2 = sw == 2;
  if (sw != 1 && !(sw2 && tma && v.D == 0)) return w;
  w.nkb = (K + 63) / 64;
  K = K < 64 ? K : 64;   // per launch
  // 16-bit inputs: k16 ops = 8 channels + 8 more columns (FF_FUSED_A_WG16=0: mma.sync path)
  if (dtype != FF_F32 && !knobs().wg16) return w;
  const bool split = (dtype == FF_F32 && precision == FF_PREC_IEEE);
  WGParams& p = w.prm;
  p.N = (int)N; p.C = C; p.H = H; p.W = W; p.K = K; p.R = R; p.S = S; p.sh = sh; p.ph = ph; p.pw = pw; p.dh = dh; p.dw = dw;
  p.P = base.P; p.Q = base.Q; p.act = activation; p.pool = pool; p.det = deterministic ? 1 : 0;
  p.CG = base.CG;
  const int nt = sw2 ? WG_NT2 : WG_NT;   // output pixels per segment
  p.nseg = (p.Q + nt - 1) / nt;
  const bool r2 = want_r2 && wg_r2_applies(lm, split, v, p.Q);
  p.r2 = r2 ? 1 : 0;
  // the input columns a segment's ops read, from its first (SW2: 2 (nt - 1) + (S - 1) dw + 1, half of them per parity);
  // R2: the m64n64 ops read WG_NT_R2 output pixels of the segment; a stride-1 row of <= 128 output pixels is one
  // segment of one half (WGPiece: nhalf 1), whose n128 ops read 128 pixels, so its slots need no more (half the ring:
  // more blocks per SM where a large filter's or many channels' ring was the limit)
  const int nts = r2 ? WG_NT_R2 : (!sw2 && p.Q <= WG_NT / 2 && knobs().halfspan) ? WG_NT / 2 : nt;
  const long long span_c = sw2 ? 2LL * (nts - 1) + (long long)(S - 1) * dw + 1 : (long long)nts + (long long)(S - 1) * dw;
  long long twa = sw2 ? 2 * (((span_c + 1) / 2 + 7) / 8 * 8) : (span_c + 7) / 8 * 8;
  if (twa > 4096) return w;
  p.TWa = (int)twa;
  // TMA boxes of at most 256 columns: TVEC's tma_bc % 8 == 0 (each box lands 128-byte aligned in its plane); TNCHW fp32
  // tma_bc % 8 == 4 (the stage's two 4-channel halves 64 bytes apart modulo 128, wg_tnchw_row), 16-bit tma_bc % 64 == 8
  // (channel rows 16 bytes apart modulo 128, wg_tnchw16_row)
  const int cpb = dtype == FF_F32 ? 4 : 8;   // columns per 16 bytes of NCHW input: TNCHW boxes start at a multiple
  const int tdelta = tnchw ? ((-pw) % cpb + cpb) % cpb : 0;   // wbase mod cpb (segments start at multiples of 256 columns)
  const long long cols = span_c + tdelta;   // the columns a row's ops read (+ delta)
  // SW2, TVEC: boxes of every other column, per parity (a box spans 2 tma_bc <= 256 columns)
  const long long box_cols = sw2 && tvec ? (span_c + 1) / 2 : cols;
  const int bmax = sw2 && tvec ? 128 : 256;
  int nbox = 0, bc = 0;
  if (tma) {
    for (nbox = (int)((box_cols + bmax - 1) / bmax);; ++nbox) {
      bc = (int)((box_cols + nbox - 1) / nbox);
      bc = tvec ? (bc + 7) / 8 * 8 : dtype == FF_F32 ? (bc + 3) / 8 * 8 + 4 : (bc + 55) / 64 * 64 + 8;
      if (bc <= bmax) break;
    }
  }
  // SW2: positions per parity, and from a plane's even half to its odd one (TVEC: right after it, 128-byte aligned for
  // the boxes; TNCHW: after WG_PAD more of slack, which its pass's columns before the segment and past its end use)
  const long long twh = !sw2 ? 0 : tvec ? (long long)nbox * bc : twa / 2;
  if (sw2 && tvec) p.TWa = (int)(2 * twh);
  p.sw2_sub = !sw2 ? 0 : (int)(tvec ? twh : twh + WG_PAD);
  auto posr = [&](long long c) { return (long long)(sw2 ? wg_pos<true>(p, (int)c) : wg_pos<false>(p, (int)c)) - WG_PAD; };
  // a channel plane: slack both sides (NCHW4 / NCHW8 groups overhang), then fp32 planes start 64 (channels_last: the
  // 16-byte copies alternate planes, 8 threads -> 8 bank groups) or 32 bytes (NCHW4: see there) apart modulo 128;
  // TVEC: 128-byte aligned planes of the slack and the TMA boxes
  const long long plane = tvec ? ((long long)WG_PAD + (sw2 ? 2 * twh : (long long)nbox * bc)) * 16
                               : ((long long)p.TWa + (sw2 ? 3 : 2) * WG_PAD) * 16 + (dtype != FF_F32 ? 0 : channels_last ? 64 : 32);
  p.plane_bytes = (int)plane;
  p.nq = dtype == FF_F32 ? (p.TWa + 3) / 4 + 1 : (p.TWa + 7) / 8 + 1;   // NCHW4 / NCHW8 column groups per row
  const long long big = (dtype == FF_F32) ? p.CG * 2 * plane : (p.CG + 1) * plane;   // 16-bit: + the ones plane
  const long long slot = split ? 2 * big : big;
  p.small_off = (int)big;
  // 16-bit, one channel group: two taps per k16 op; more groups: two channel groups per k16 op (see the ops below)
  const int step_s = (dtype != FF_F32 && p.CG == 1 && knobs().pair16) ? 2 : 1;
  const int step_g = (dtype != FF_F32 && p.CG > 1 && knobs().pair16) ? 2 : 1;
  const long long span = (long long)(R - 1) * dh;
  // 16-bit: the bias rides in a spare K chunk (an op with one tap / one channel group) when there is one, else in an
  // op of its own
  const bool bias_spare = dtype != FF_F32 && (step_s == 2 ? S % 2 == 1 : step_g == 1 || p.CG % 2 == 1);
  // 16-bit 3x3, one channel group: taps (0, 2) and (1, 2) in one op (WG_COL16_OPS)
  const bool col16 = step_s == 2 && R == 3 && S == 3 && knobs().col16;
  const long long nops_pred =
      (long long)R * ((S + step_s - 1) / step_s) * ((p.CG + step_g - 1) / step_g) + (bias_spare ? 0 : 1) - (col16 ? 1 : 0);
  if (nops_pred > WG_MAXOPS) {
    w.why = "fused_conv_act_pool: more than 64 K units of 8 input channels (R*S*ceil(C/8), + bias) for the sm_90 kernel";
    return w;
  }
  const long long na = nops_pred + (col16 ? 1 : 0);              // A blocks: + the column op's swapped copy
  const long long abytes = na * 2048 * (split ? 2 : 1);   // A operands: 2 KB per op (+ the ieee small ops)
  // an image's lines: (output depth,) segment, output row
  const long long lines_d = (long long)p.nseg * p.P;
  p.lines_img = lines_d * v.Dout;
  if (v.D > 0 && p.lines_img > 0x7fffffffLL) return w;   // (WGPiece's line arithmetic in int)
  p.lines_d = (int)std::min(lines_d, 0x7fffffffLL);
  p.vT = v.D > 0 ? v.T : 0;
  p.vC = v.D > 0 ? C / v.T : 0;
  p.vD = v.D; p.vDout = v.Dout; p.vsd = v.sd; p.vpd = v.pd; p.vdd = v.dd;
  p.L = N * p.lines_img;
  const int nops_line = wg_straight_ops(dtype, (int)nops_pred, col16, lm, sw2, r2, v.D > 0, split);   // > 0: a straight-line kernel serves it
#ifdef FF_FUSED_A_DIAG
  p.diag = getenv("FF_FUSED_A_DIAG_OFF") ? atoi(getenv("FF_FUSED_A_DIAG_OFF")) : 0;
#endif
  // ring slots: the rows of one output row + the next row's first; R2: + sh, as row t - 1's chain is still in flight
  // while row t + 1's rows land
  const long long need = (long long)sh + span + 1 + (r2 ? sh : 0);
  constexpr long long ONES = 128;                     // the bias op's ones block (8 rows x 16 B)
  auto dtab_bytes = [&](long long slots) { return slots * 2 * WG_DSTRIDE(nops_line) * 4; };   // B descriptor table (wg_dtab_fill)
  // TMA: TNCHW's stages (D = 2 row groups in flight, sh rows each) and the stages' mbarriers (TVEC: one per ring slot),
  // + 2 x 128 bytes to align the stages and the whole layout (fa_wgmma_kernel)
  const int tnchw_d = 2;
  const long long stage_bytes = tnchw ? (long long)p.CG * nbox * 8 * bc * (dtype == FF_F32 ? 4 : 2) : 0;
  const long long nst_tnchw = (long long)tnchw_d * sh;
  auto tma_bytes = [&](long long slots) {
    return !tma ? 0LL : tvec ? 8 * slots + 256 : nst_tnchw * (stage_bytes + 8) + 256;
  };
  // blocks per SM: the knob (3xTF32: at most 2), fewer when the ring of a large filter / many channels needs it;
  // 227 KB per SM, 1 KB reserved per block
  int bps = split ? (knobs().bps < 2 ? knobs().bps : 2) : knobs().bps;
  auto budget_of = [&](int b) { return 232448LL / b - 1024 - 64 - abytes; };
  const int bps_asked = bps;
  while (bps > 1 && need * slot + ONES + dtab_bytes(need) + tma_bytes(need) > budget_of(bps)) --bps;
  // one block per SM, no other block to fill its MMA and epilogue gaps: measured slower than cuDNN + the fused
  // epilogue kernel (benchmarks/NOTES.md run 17: 3x3 over 24 / 32 channels), so such shapes run the fallback
  if (bps < std::min(bps_asked, knobs().minbps)) {
    w.why = "fused_conv_act_pool: the sm_90 kernel's weights and ring of input rows leave room for one block per SM "
            "(filter height x channels x the row's columns): slower than the fallback (knob FF_FUSED_A_MINBPS=1 allows it)";
    return w;
  }
  const long long budget = budget_of(bps);
  long long rb = need;                                // any slot count: the kernel indexes the ring modulo RB
  if (rb * slot + ONES + dtab_bytes(rb) + tma_bytes(rb) > budget || rb > 64) {
    w.why = "fused_conv_act_pool: the sm_90 kernel's weights and ring of input rows (filter height x channels x the "
            "row's columns) do not fit in shared memory";
    return w;
  }
  while (!tnchw && rb + 1 <= knobs().rb && (rb + 1) * slot + ONES + dtab_bytes(rb + 1) + tma_bytes(rb + 1) <= budget) ++rb;
  p.RB = (int)rb;
  if (tnchw) {
    p.D = tnchw_d;
  } else {
    // group t + D's rows must miss row t's slots (R2: row t - 1's too)
    p.D = (int)((rb - 1 - span) / sh) - (r2 ? 1 : 0);
    if (p.D > 8) p.D = 8;
  }
  if (p.D < 1) return w;
  w.bps = bps;
  p.slot_bytes = (int)slot;
  p.a_small_off = (int)(nops_pred * 2048);
  // [A ops][ones block][ring][descriptor table]: the bias op's B descriptor (SBO = LBO = 0) reads only the 128-byte ones
  // block, but a checker sizes a wgmma B read as N x K elements from its start (n128: 4 KB, n64: 2 KB; compute-sanitizer
  // memcheck: "Invalid __shared__ read of size 4096" past the allocation when the block sat after the ring), so it lies
  // before the ring, whose bytes cover that extent; same total, so RB, D and blocks per SM are unchanged
  p.ones_off = (int)abytes;
  p.ring_off = (int)(abytes + ONES);
  p.dtab_off = (int)(abytes + ONES + rb * slot);
  w.smem = (size_t)(abytes + ONES + rb * slot + dtab_bytes(rb));
  if (rb * slot < 4096 - ONES) w.smem = std::max(w.smem, (size_t)(abytes + 4096));   // (never: a ring is larger)
  if (tma) {   // [stages][mbarriers] after the descriptor table
    p.NST = tvec ? (int)rb : (int)nst_tnchw;
    p.stage_off = (int)((w.smem + 127) / 128 * 128);
    p.stage_bytes = (int)stage_bytes;
    p.bar_off = p.stage_off + p.NST * p.stage_bytes;
    w.smem = (size_t)p.bar_off + 8 * (size_t)p.NST + 128;   // + the kernel's alignment of its layout to 128 bytes
    p.tma_nbox = nbox; p.tma_bc = bc; p.tma_cols = (int)cols; p.tma_delta = tdelta;
    // (a Conv3d's boxes land C x T of the group's 8 channel rows: wg_tma_row)
    p.tma_bytes = tvec ? p.CG * (dtype == FF_F32 ? 2 : 1) * (sw2 ? 2 : 1) * nbox * bc * 16
                : v.D > 0 ? nbox * C * bc * (dtype == FF_F32 ? 4 : 2) : (int)stage_bytes;
    if (v.D > 0 && (tvec || p.CG != 1)) return w;
  }
  // ops
  int nops = 0;
  for (int j = 0; j < WG_MAXOPS; ++j) {
    p.op_u0[j] = p.op_u1[j] = WG_UNIT_NONE;
    p.op_d[j] = p.op_mask[j] = p.op_hi[j] = 0u; p.op_rd[j] = 0;
  }
  // 16-bit, one channel group (step_s 2): the two 8-column K chunks of a k16 op are taps (r, s) and (r, s + 1) — the
  // second tap's pixels are the first's shifted by dw columns, i.e. LBO = dw positions — so a row of S taps takes
  // ceil(S / 2) ops instead of S; more channel groups (step_g 2): the chunks are groups cg and cg + 1 of one tap — the
  // next group's plane, LBO = one plane — so a tap takes ceil(CG / 2) ops instead of CG (FF_FUSED_A_PAIR16 = 0: one
  // tap and group per op, the second chunk zero weights on the ones plane)
  // ring operand: K-major core matrices, SBO = 8 pixels (128 B), LBO = to the next K chunk (fp32: the second 4-channel
  // plane; 16-bit: the next tap's pixels, or the slot's ones plane, read by 8 zero-weight columns or by the bias; the
  // column pair: 0 here, the ring slots' distance from the descriptor table)
  auto add_op = [&](int u0, int u1, long long off, long long lbo, int rd) {
    p.op_u0[nops] = u0; p.op_u1[nops] = u1;
    p.op_d[nops] = (unsigned)((p.ring_off + off) >> 4) | ((unsigned)(lbo >> 4) << 16);
    p.op_mask[nops] = 0xFFFFFFFFu; p.op_hi[nops] = 128 >> 4; p.op_rd[nops] = rd;
    ++nops;
  };
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; s += step_s)
      for (int cg = 0; cg < p.CG; cg += step_g) {
        if (col16 && s == S - 1 && r < 2) continue;   // (0, 2) and (1, 2): the column pair below
        const long long off = (dtype == FF_F32 ? cg * 2 * plane : cg * plane) + (WG_PAD + posr((long long)s * dw)) * 16;
        const bool pair = step_s == 2 && s + 1 < S, gpair = step_g == 2 && cg + 1 < p.CG;
        // (a pair's taps: s even, so SW2 puts tap s + 1 in the odd half or further on in the even one: lbo > 0)
        const long long lbo = dtype == FF_F32 ? plane
                              : pair ? (posr((long long)(s + 1) * dw) - posr((long long)s * dw)) * 16
                              : gpair ? plane : (p.CG - cg) * plane;
        const int u0 = (r * S + s) * p.CG + cg;
        add_op(u0, pair ? (r * S + s + 1) * p.CG + cg : gpair ? u0 + 1 : WG_UNIT_NONE, off, lbo, r * dh);
      }
  // the column pair (WG_COL16_OPS, one channel group): op WG_COL16_J after (2, 0) + (2, 1) and (2, 2); its LBO and, where
  // the rows' slots are in the other order, its swapped A block (block WG_COL16_OPS, not issued) come from the
  // descriptor table (wg_dtab_fill)
  if (col16) {
    const int tap02 = 2, tap12 = S + 2;
    add_op(tap02, tap12, (WG_PAD + posr(2LL * dw)) * 16, 0, 0);
    p.op_u0[nops] = tap12; p.op_u1[nops] = tap02;
  }
  p.col_j = col16 ? WG_COL16_J : -1;
  p.col_rd2 = dh;   // the column op's second row: tap row 1
  // bias: 16-bit, the second K chunk of the first op with one tap (it reads the ones plane); else an op of its own on
  // the ones block, every row and K chunk the same 16 bytes (LBO = SBO = 0)
  int spare = -1;
  if (dtype != FF_F32)
    for (int j = 0; j < nops && spare < 0; ++j)
      if (p.op_u1[j] == WG_UNIT_NONE) spare = j;
  if ((spare >= 0) != bias_spare) return w;   // the prediction above (nops_pred) and the ops agree
  if (spare >= 0) {
    p.op_u1[spare] = WG_UNIT_BIAS;
  } else {
    p.op_u0[nops] = WG_UNIT_BIAS;
    p.op_d[nops] = (unsigned)(p.ones_off >> 4); p.op_mask[nops] = 0u; p.op_hi[nops] = 0u; p.op_rd[nops] = 0;
    ++nops;
  }
  p.nops = nops;
  p.na = nops + (col16 ? 1 : 0);
  if (nops != nops_pred) return w;
  for (int j = 0; j < WG_MAXOPS; ++j)
    for (int h = 0; h < 2; ++h) {
      const int u = (dtype != FF_F32 && h) ? p.op_u1[j] : p.op_u0[j], k0 = dtype == FF_F32 ? 4 * h : 0;
      const int kc = dtype == FF_F32 ? 4 : 8;
      p.op_wo[h][j] = 0; p.op_wn[h][j] = 0;
      if (j >= p.na || u == WG_UNIT_NONE) continue;
      if (u == WG_UNIT_BIAS) { p.op_wn[h][j] = k0 == 0 ? -1 : 0; continue; }
      const int t = u / p.CG, cg = u % p.CG, r = t / S, s = t % S, c0 = cg * 8 + k0;
      p.op_wn[h][j] = std::max(0, std::min(kc, C - c0));
      p.op_wo[h][j] = (c0 * R + r) * S + s;
    }
  p.slot16 = (int)(slot >> 4);
  auto magic = [](int d, unsigned long long& m, int& s) {
    int l = 0; while ((1LL << l) < d) ++l;
    s = 31 + l; m = ((1ULL << s) + (unsigned long long)d - 1) / (unsigned long long)d;
  };
  magic(p.CG, p.mCG, p.sCG);
  magic(p.TWa, p.mTWa, p.sTWa);
  magic(p.CG * 2, p.mHP, p.sHP);
  magic(p.nq, p.mNQ, p.sNQ);
  magic(p.RB, p.mRB, p.sRB);
  if (tma) {
    magic(p.NST, p.mST, p.sST);
    magic(p.tma_bc, p.mBC, p.sBC);
  }
  long long G = (long long)bps * di.nsm;
  if (G > p.L) G = p.L;
  p.G = (int)G;
  const long long per = (p.L + G - 1) / G;
  p.J = (int)((per + p.lines_img - 1) / p.lines_img + 1);
  p.inv_pq = (float)(1.0 / ((double)v.Dout * (double)p.P * (double)p.Q));
  const bool need_ws = (pool == FF_POOL_MAX) || deterministic;
  w.ws_cnt_bytes = need_ws ? (size_t)((N * 4 + 255) / 256 * 256) : 0;
  if (!need_ws) w.ws_bytes = 0;
  else if (pool == FF_POOL_MAX) w.ws_bytes = w.ws_cnt_bytes + (size_t)N * K * 4;
  else w.ws_bytes = w.ws_cnt_bytes + (size_t)G * p.J * 64 * 4;
  w.ws_tmp_off = (w.ws_bytes + 255) / 256 * 256;
  if (w.nkb > 1) w.ws_bytes = w.ws_tmp_off + (size_t)N * w.nkb * 64 * 4;
  w.ok = true;
  return w;
}

// The copy loader that replaces TMA loader lm (where its layout does not fit or its tensor map cannot be made)
int wg_copy_loader(int lm, int dtype) { return lm == WG_LM_TVEC ? WG_LM_VEC : dtype == FF_F32 ? WG_LM_NCHW4 : WG_LM_NCHW8; }

// The plan for loader lm; a TMA loader only where its layout keeps at least the blocks per SM of the loader it
// replaces, else that one (VEC / NCHW4 / NCHW8).  (The workspace query takes the larger of the two plans' needs.)  Stride-2 columns have only the TMA loaders (the caller sizes
// the workspace for the mma.sync kernel too, which serves them where the tensor map cannot be made).
// Two output rows per tile (R2, TMA loaders only) where that plan keeps the blocks per SM of the one-row plan chosen so.
WGPlan wg_plan(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
               int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, const Plan& base, int lm,
               const Vol& v) {
  auto plan = [&](int l, bool r2) {
    return wg_plan_lm(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                      deterministic, base, l, v, r2);
  };
  WGPlan one{};
  if (!wg_lm_tma(lm) || sw == 2) {
    one = plan(lm, false);
  } else {
    const WGPlan a = plan(wg_copy_loader(lm, dtype), false);
    if (!a.ok) return a;
    const WGPlan t = plan(lm, false);
    one = (t.ok && t.bps >= a.bps) ? t : a;
  }
  if (!wg_r2_applies(lm, dtype == FF_F32 && precision == FF_PREC_IEEE, v, base.Q)) return one;
  const WGPlan two = plan(lm, true);
  return (two.ok && (!one.ok || two.bps >= one.bps)) ? two : one;
}

template <int DT, bool SPLIT, int LM, bool VOL = false, bool SW2 = false>
int wg_launch_t(const WGParams& prm, size_t smem, cudaStream_t stream) {
  // 3x3 filters over <= 8 input channels (fp32: 9 taps + bias = 10 ops; 16-bit: two taps per op and the column pair,
  // 5) and op lists as long as a 3x3 filter's over 9..16 channels (wg_ops_c16; TMA or NCHW 16-byte rows, one row per
  // tile) get the
  // straight-line issue
  // (wg_straight_ops); the rest the general one.  Register budget: 3xTF32 2 blocks per SM; TF32 4
  // (128 registers) or, when the knob asks for fewer blocks (default 3), the 168-register build of the 3x3 kernel;
  // 16-bit only the 168-register build; a Conv3d (VOL) only the 168-register one too.  (wg_plan may run fewer blocks per
  // SM than a build allows.)  Stride-2 columns (SW2) and two rows per tile (R2): the MINB_FEW builds only (straight-line
  // and general).
  constexpr int MINB = SPLIT ? 2 : (DT == FF_F32 && !VOL ? 4 : 3);
  constexpr int MINB_FEW = SPLIT ? 2 : 3;
  constexpr int NOPS_LINE = DT == FF_F32 ? WG_OPS3X3 : WG_COL16_OPS;
  constexpr int NOPS_C16 = wg_ops_c16(DT);
  const int line_ops = wg_straight_ops(DT, SPLIT ? FF_PREC_IEEE : FF_PREC_TF32, LM, prm);
  const bool line = line_ops == NOPS_LINE;   // (the kernels below; NOPS_C16: its own)
  void (*kern)(WGParams) = nullptr;
  if constexpr (!SPLIT && wg_lm_c16(LM) && !VOL && !SW2)   // op lists as long as a 3x3 filter's over 9..16 channels
    if (line_ops == NOPS_C16) kern = fa_wgmma_kernel<DT, SPLIT, LM, NOPS_C16, MINB_FEW, VOL>;
  if constexpr (wg_lm_tma(LM) && !SPLIT && !VOL)   // two output rows per tile (R2): the MINB_FEW builds
    if (prm.r2)
      kern = line ? fa_wgmma_kernel<DT, SPLIT, LM, NOPS_LINE, MINB_FEW, VOL, SW2, true>
                  : fa_wgmma_kernel<DT, SPLIT, LM, 0, MINB_FEW, VOL, SW2, true>;
  if (!kern) {
    if constexpr (SW2)
      kern = line ? fa_wgmma_kernel<DT, SPLIT, LM, NOPS_LINE, MINB_FEW, VOL, SW2> : fa_wgmma_kernel<DT, SPLIT, LM, 0, MINB_FEW, VOL, SW2>;
    else
      kern = !line ? fa_wgmma_kernel<DT, SPLIT, LM, 0, MINB, VOL>
             : (DT != FF_F32 || knobs().bps < 4) ? fa_wgmma_kernel<DT, SPLIT, LM, NOPS_LINE, MINB_FEW, VOL>
                                                 : fa_wgmma_kernel<DT, SPLIT, LM, NOPS_LINE, MINB, VOL>;
  }
  cudaError_t e = ff_smem_optin(reinterpret_cast<const void*>(kern));   // the device's maximum (thread-safe)
  if (e != cudaSuccess) return (int)e;
  kern<<<(unsigned)prm.G, 128, smem, stream>>>(prm);
  return (int)cudaGetLastError();
}

// One kernel per (dtype, precision, loader); the loader was picked for this dtype (wg_loader).  A Conv3d (prm.vT),
// stride-2 columns (prm.sw2_sub): the kernels built for them.
template <int DT, bool SPLIT>
int wg_launch_dt(int lm, const WGParams& prm, size_t smem, cudaStream_t stream) {
  constexpr int LM_COLS = DT == FF_F32 ? WG_LM_NCHW4 : WG_LM_NCHW8, LM_ANY = DT == FF_F32 ? WG_LM_ELEM : WG_LM_REG;
  if (prm.vT > 0)
    return lm == WG_LM_TNCHW ? wg_launch_t<DT, SPLIT, WG_LM_TNCHW, true>(prm, smem, stream)
           : lm == LM_COLS   ? wg_launch_t<DT, SPLIT, LM_COLS, true>(prm, smem, stream)
                             : wg_launch_t<DT, SPLIT, LM_ANY, true>(prm, smem, stream);
  if (prm.sw2_sub > 0)
    return lm == WG_LM_TVEC ? wg_launch_t<DT, SPLIT, WG_LM_TVEC, false, true>(prm, smem, stream)
                            : wg_launch_t<DT, SPLIT, WG_LM_TNCHW, false, true>(prm, smem, stream);
  if (lm == WG_LM_TVEC) return wg_launch_t<DT, SPLIT, WG_LM_TVEC>(prm, smem, stream);
  if (lm == WG_LM_TNCHW) return wg_launch_t<DT, SPLIT, WG_LM_TNCHW>(prm, smem, stream);
  if (lm == WG_LM_VEC) return wg_launch_t<DT, SPLIT, WG_LM_VEC>(prm, smem, stream);
  if (lm == LM_COLS) return wg_launch_t<DT, SPLIT, LM_COLS>(prm, smem, stream);
  return wg_launch_t<DT, SPLIT, LM_ANY>(prm, smem, stream);
}

int wg_launch(int dtype, int precision, int lm, const WGParams& prm, size_t smem, cudaStream_t stream) {
  if (dtype == FF_BF16) return wg_launch_dt<FF_BF16, false>(lm, prm, smem, stream);
  if (dtype == FF_F16) return wg_launch_dt<FF_F16, false>(lm, prm, smem, stream);
  return precision == FF_PREC_IEEE ? wg_launch_dt<FF_F32, true>(lm, prm, smem, stream)
                                   : wg_launch_dt<FF_F32, false>(lm, prm, smem, stream);
}

// Input loader: channels_last with C % 8 == 0 -> TVEC (knob off: VEC); NCHW with W % 4 (fp32) / 8 (16-bit) == 0 ->
// TNCHW (knob off: NCHW4 / NCHW8); else ELEM (fp32) / REG (16-bit).  The 16-byte and TMA loaders need a 16-byte-aligned
// input; knobs switch them off.  (wg_plan may still turn a TMA loader into the one it replaces.)
// A Conv3d (wg_x_at_vol): NCDHW as NCHW — TNCHW when C x T <= 8 (one channel group), else NCHW4 / NCHW8 — other
// layouts ELEM / REG.
int wg_loader(int dtype, int channels_last, int C, int W, const void* x, const Vol& v) {
  const bool f32 = dtype == FF_F32, aligned = ((uintptr_t)x & 15) == 0;
  // NCHW (NCDHW) rows that the 16-byte loaders and TNCHW take: W % 4 (fp32) / 8 (16-bit) == 0, their knob on
  const bool cols = !channels_last && W % (f32 ? 4 : 8) == 0 && aligned && (f32 ? knobs().nchw4 : knobs().vec16);
  if (v.D > 0) {
    // TMA rows where one box per column range brings every (c, t) channel: C x T <= 8, T dd depth slices per box
    if (cols && knobs().tma && (long long)C * v.T <= 8 && (long long)v.T * v.dd <= 256 && v.dd <= 8)   // (TMA: element strides <= 8)
      return WG_LM_TNCHW;
  } else {
    const bool vec = channels_last && C % 8 == 0 && aligned && (f32 || knobs().vec16);
    if (knobs().tma && (vec || cols)) return vec ? WG_LM_TVEC : WG_LM_TNCHW;
    if (vec) return WG_LM_VEC;
  }
  if (cols) return f32 ? WG_LM_NCHW4 : WG_LM_NCHW8;
  return f32 ? WG_LM_ELEM : WG_LM_REG;
}
// The TMA loaders' tensor map of input x (wg_tma_row), through the driver's cuTensorMapEncodeTiled looked up at run
// time; false if it is not there or refuses (the caller then plans the copy loader).  TVEC: NHWC as (16 bytes of
// channels, C / that, W, H, N), box 16 bytes x 1 x tma_bc (stride-2 columns: x 2 tma_bc, every other column); TNCHW:
// NCHW as (W, H, C, N), box tma_bc x 1 x 8 channels (channels >= C read as zeros).  16-bit input moves as uint16.
bool wg_encode_tmap(WGParams& q, int lm, int dtype, const void* x) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                              const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult qr;
#if CUDART_VERSION >= 12050   // the versioned lookup (the unversioned one is deprecated from CUDA 12.5 on)
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &qr);
#else                         // CUDA 12.0 - 12.4 (the README's nvcc >= 12)
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &qr);
#endif
    if (e != cudaSuccess || qr != cudaDriverEntryPointSuccess) fn = nullptr;
    return reinterpret_cast<Encode>(fn);
  }();
  if (!encode) return false;
  const cuuint64_t W = (cuuint64_t)q.W, H = (cuuint64_t)q.H, C = (cuuint64_t)q.C, N = (cuuint64_t)q.N;
  const cuuint64_t es = dtype == FF_F32 ? 4 : 2, cq = 16 / es;
  const CUtensorMapDataType ty = dtype == FF_F32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
  const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
  CUresult r;
  if (q.vT > 0) {   // a Conv3d, TNCHW: NCDHW as (W, H, D, C, N), box tma_bc x 1 x T dd slices (every dd-th) x C channels
    const cuuint64_t D = (cuuint64_t)q.vD, Ci = (cuuint64_t)q.vC;
    const cuuint64_t dims[5] = {W, H, D, Ci, N};
    const cuuint64_t strides[4] = {W * es, H * W * es, D * H * W * es, Ci * D * H * W * es};
    const cuuint32_t box[5] = {(cuuint32_t)q.tma_bc, 1, (cuuint32_t)(q.vT * q.vdd), (cuuint32_t)q.vC, 1};
    const cuuint32_t estr[5] = {1, 1, (cuuint32_t)q.vdd, 1, 1};
    r = encode(&q.tmap, ty, 5, const_cast<void*>(x), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else if (lm == WG_LM_TVEC) {
    const cuuint64_t dims[5] = {cq, C / cq, W, H, N};
    const cuuint64_t strides[4] = {16, C * es, W * C * es, H * W * C * es};
    const cuuint32_t ew = q.sw2_sub > 0 ? 2 : 1;
    const cuuint32_t box[5] = {(cuuint32_t)cq, 1, ew * (cuuint32_t)q.tma_bc, 1, 1}, estr[5] = {1, 1, ew, 1, 1};
    r = encode(&q.tmap, ty, 5, const_cast<void*>(x), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else {
    const cuuint64_t dims[4] = {W, H, C, N};
    const cuuint64_t strides[3] = {W * es, H * W * es, C * H * W * es};
    const cuuint32_t box[4] = {(cuuint32_t)q.tma_bc, 1, 8, 1};
    r = encode(&q.tmap, ty, 4, const_cast<void*>(x), dims, strides, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  return r == CUDA_SUCCESS;
}

// Which kernel serves a call: the sm_90 wgmma plan when it can, else the mma.sync plan; why = the reason neither can
// (invalid call, or beyond both kernels: then the wgmma kernel's capacity message where it had one).
// A Conv3d (v.D > 0) only on the wgmma kernel, as the Conv2d over C x T channels (Vol).
struct Choice { Plan pl; WGPlan wp; const char* why; };
constexpr int R2_NARROW = 32;   // rows of <= this many output pixels: the mma.sync kernel even with two rows per tile
Choice choose(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
              int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, int lm, const Vol& v) {
  Choice c{};
  c.why = vol_why(v, C);
  if (c.why) return c;
  const int Cx = v.D > 0 ? C * v.T : C;
  c.pl = make_plan(dtype, channels_last, N, Cx, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                   deterministic);
  c.why = c.pl.why;
  if (c.why) return c;
  if (v.D > 0)
    c.pl.mma_why = "fused_conv_act_pool: a Conv3d needs the sm_90 wgmma kernel (stride-1 columns, "
                   "C_in x kernel depth x R x S / 8 <= 64 K units, a ring of input rows that fits); the mma.sync kernel "
                   "covers Conv2d only";
  c.wp = wg_plan(dtype, channels_last, N, Cx, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                 deterministic, c.pl, lm, v);
  // Narrow output rows: a wgmma tile is 128 pixels of one output row, so a row of Q pixels fills Q / 128 of it, and
  // the mma.sync kernel's 16-pixel tiles are faster below: measured at Q = 30 (1.8-2.6x faster in every mode) and
  // 62 (ieee 1.2-1.3x, TF32 channels_last 1.3x faster; TF32 NCHW and 16-bit 6-18 % slower), NOTES run 29; the
  // thresholds between come from time ~ 1 / Q (wgmma) vs ~ ceil(Q / 16) / Q (mma.sync) per output.  Two rows per
  // tile (R2) fill 2 Q / 128 of a tile: it keeps rows of more than R2_NARROW pixels (NOTES run 31).
  const int q_narrow = c.wp.prm.r2 ? R2_NARROW : precision == FF_PREC_IEEE || (dtype == FF_F32 && channels_last) ? 64 : 48;
  if (c.wp.ok && !c.pl.mma_why && knobs().narrow && c.pl.Q <= q_narrow) c.wp.ok = false;
  if (!c.wp.ok && c.pl.mma_why) c.why = c.wp.why ? c.wp.why : c.pl.mma_why;
  return c;
}
// choose() for a call of the C API below: a Conv3d's depth (D > 0) from its arguments, the loader for input x (null:
// the loader an aligned x gets, as the workspace query and the plan's description assume)
Choice choose_call(const void* x, int dtype, int channels_last, long long N, int C, int H, int W, int K, int R, int S, int sh,
                   int sw, int ph, int pw, int dh, int dw, int activation, int pool, int precision, int deterministic, int D,
                   int T, int sd, int pd, int dd) {
  const Vol v = make_vol(D, T, sd, pd, dd);
  return choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                deterministic, wg_loader(dtype, channels_last, C, W, x, v), v);
}
}  // namespace

extern "C" {

// The problem, every function: x (N, C, H, W) — a Conv3d's (N, C, D, H, W) with D > 0 and the depth's kernel extent T,
// stride sd, padding pd, dilation dd (a Conv2d: D = 0, the rest ignored) — in layout NCHW / NCDHW or channels_last
// (_3d), weights (K, C, [T,] R, S) contiguous, bias (K) fp32 or null; out (N, K) fp32.
const char* ff_fused_conv_act_pool_unsupported(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R,
                                               int S, int sh, int sw, int ph, int pw, int dh, int dw, int activation,
                                               int pool, int precision, int deterministic, int D, int T, int sd, int pd,
                                               int dd) {
  return choose_call(nullptr, dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                     deterministic, D, T, sd, pd, dd).why;
}

// Which kernel serves the call, in words (shown in the fused model's `.plans`); null where none does.
const char* ff_fused_conv_act_pool_kernel(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R,
                                          int S, int sh, int sw, int ph, int pw, int dh, int dw, int activation, int pool,
                                          int precision, int deterministic, int D, int T, int sd, int pd, int dd) {
  const Choice c = choose_call(nullptr, dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool,
                               precision, deterministic, D, T, sd, pd, dd);
  if (c.why) return nullptr;
  static thread_local char text[256];
  if (!c.wp.ok) {
    snprintf(text, sizeof text, "mma.sync kernel, %s", dtype != FF_F32 ? "16-bit MMAs" : precision == FF_PREC_IEEE ? "3xTF32" : "TF32");
    return text;
  }
  static const char* const rows[] = {"channels_last rows by 16-byte copies", "rows per element", "rows per element",
                                     "NCHW rows by 16-byte copies", "NCHW rows by 16-byte copies", "channels_last rows by TMA",
                                     "NCHW rows by TMA"};
  const bool line = wg_straight_ops(dtype, precision, c.wp.lm, c.wp.prm) > 0;
  snprintf(text, sizeof text, "sm_90 wgmma kernel%s, %s%s%s, %d ops per tile (%s), %d blocks per SM",
           D > 0 ? " (Conv3d)" : "", rows[c.wp.lm], c.wp.prm.sw2_sub > 0 ? " split into even / odd columns (stride 2)" : "",
           c.wp.prm.r2 ? ", two output rows per tile" : "", c.wp.prm.nops, line ? "straight-line" : "general chain", c.wp.bps);
  return text;
}

size_t ff_fused_conv_act_pool_workspace_bytes(int dtype, int channels_last, long long N, int C, int H, int W, int K, int R,
                                              int S, int sh, int sw, int ph, int pw, int dh, int dw, int activation,
                                              int pool, int precision, int deterministic, int D, int T, int sd, int pd,
                                              int dd) {
  const Choice c = choose_call(nullptr, dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool,
                               precision, deterministic, D, T, sd, pd, dd);
  if (c.why) return 0;
  // the largest of the plans a call of this problem may take (ff_fused_conv_act_pool): the aligned input's loader, the
  // copy loader that replaces a TMA loader whose tensor map cannot be made (no stride 2, no two rows per tile: the
  // mma.sync kernel may serve instead), the loader of an input that is not 16-byte aligned
  const Vol v = make_vol(D, T, sd, pd, dd);
  const int lm = wg_loader(dtype, channels_last, C, W, nullptr, v);
  size_t ws = 0;
  const int lms[3] = {lm, wg_lm_tma(lm) ? wg_copy_loader(lm, dtype) : -1, wg_loader(dtype, channels_last, C, W, (const void*)1, v)};
  for (int i = 0; i < 3; ++i) {
    const int l = lms[i];
    if (l < 0 || (i == 2 && (l == lms[0] || l == lms[1]))) continue;   // (each loader planned once)
    const Choice f = choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                            deterministic, l, v);
    if (!f.why) ws = std::max(ws, f.wp.ok ? f.wp.ws_bytes : f.pl.ws_bytes);
  }
  return ws;
}

int ff_fused_conv_act_pool(const void* x, const void* weight, const float* bias, float* out, int dtype, int channels_last,
                           long long N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph, int pw, int dh,
                           int dw, int activation, int pool, int precision, int deterministic, int D, int T, int sd,
                           int pd, int dd, void* workspace, cudaStream_t stream) {
  const Vol v = make_vol(D, T, sd, pd, dd);
  Choice c = choose_call(x, dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision,
                         deterministic, D, T, sd, pd, dd);
  // no TMA after all: the copy loader (stride-2 columns: none, so the mma.sync kernel)
  if (c.wp.ok && wg_lm_tma(c.wp.lm) && !wg_encode_tmap(c.wp.prm, c.wp.lm, dtype, x))
    c = choose(dtype, channels_last, N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, activation, pool, precision, deterministic,
               wg_copy_loader(c.wp.lm, dtype), v);
  if (c.why) return (int)cudaErrorNotSupported;
  const Plan& pl = c.pl;
  {
    WGPlan& wp = c.wp;
    if (wp.ok) {
      if (wp.ws_bytes && !workspace) return (int)cudaErrorInvalidValue;
      WGParams& q = wp.prm;
      q.x = x; q.w = weight; q.bias = bias; q.out = out; q.nhwc = channels_last;
      char* ws = (char*)workspace;
      q.ws_cnt = wp.ws_bytes ? (int*)ws : nullptr;
      q.ws_part = (wp.ws_bytes && pool == FF_POOL_MEAN) ? (float*)(ws + wp.ws_cnt_bytes) : nullptr;
      q.ws_max = (wp.ws_bytes && pool == FF_POOL_MAX) ? (unsigned*)(ws + wp.ws_cnt_bytes) : nullptr;
      q.gelu_fast = knobs().noclamp;
      q.fulltile = knobs().fulltile;
      q.h2 = dtype != FF_F32 && activation == FF_ACT_GELU_ERF && pool == FF_POOL_MEAN && knobs().h2 ? 1 : 0;
      if (wp.nkb == 1) return wg_launch(dtype, precision, wp.lm, q, wp.smem, stream);
      // K > 64: one launch per 64 channels (WGPlan), launch kb's (N, K_kb) block of tmp copied into out's columns
      const bool atomic_mean = pool == FF_POOL_MEAN && !deterministic;
      const size_t wrow = (size_t)q.C * R * S * (dtype == FF_F32 ? 4 : 2);   // bytes of one output channel's weights
      float* const tmp = (float*)(ws + wp.ws_tmp_off);
      for (int kb = 0; kb < wp.nkb; ++kb) {
        WGParams qk = q;
        const int k0 = 64 * kb;
        qk.K = K - k0 < 64 ? K - k0 : 64;
        qk.w = (const char*)weight + (size_t)k0 * wrow;
        qk.bias = bias ? bias + k0 : nullptr;
        qk.out = tmp + (size_t)N * k0;
        cudaError_t e = atomic_mean ? cudaMemsetAsync(qk.out, 0, (size_t)N * qk.K * 4, stream) : cudaSuccess;
        if (e != cudaSuccess) return (int)e;
        const int r = wg_launch(dtype, precision, wp.lm, qk, wp.smem, stream);
        if (r) return r;
        e = cudaMemcpy2DAsync(out + k0, (size_t)K * 4, qk.out, (size_t)qk.K * 4, (size_t)qk.K * 4, (size_t)N,
                              cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess) return (int)e;
      }
      return 0;
    }
  }
  if (pl.ws_bytes && !workspace) return (int)cudaErrorInvalidValue;
  FAParams prm{};
  prm.x = x; prm.w = weight; prm.bias = bias; prm.out = out;
  prm.N = N; prm.C = C; prm.H = H; prm.W = W; prm.K = K; prm.R = R; prm.S = S;
  prm.sh = sh; prm.sw = sw; prm.ph = ph; prm.pw = pw; prm.dh = dh; prm.dw = dw;
  prm.P = pl.P; prm.Q = pl.Q; prm.act = activation; prm.pool = pool; prm.det = deterministic ? 1 : 0;
  prm.nhwc = channels_last;
  prm.vec_ok = (channels_last && C % 8 == 0 && ((uintptr_t)x & 15) == 0) ? 1 : 0;
  prm.CG = pl.CG; prm.nu = pl.nu; prm.BR = pl.BR; prm.QS = pl.QS; prm.nbands = pl.nbands; prm.nseg = pl.nseg;
  prm.nksl = pl.nksl; prm.TR = pl.TR; prm.TWa = pl.TWa;
  auto magic = [](int d, unsigned long long& m, int& sh) {
    int l = 0; while ((1LL << l) < d) ++l;
    sh = 31 + l; m = ((1ULL << sh) + (unsigned long long)d - 1) / (unsigned long long)d;
  };
  magic(pl.TWa, prm.mTWa, prm.sTWa);
  magic(pl.TR, prm.mTR, prm.sTR);
  prm.nitems_total = N * pl.nksl * pl.nbands * pl.nseg;
  prm.inv_pq = (float)(1.0 / ((double)pl.P * (double)pl.Q));
  char* ws = (char*)workspace;
  prm.ws_cnt = pl.ws_bytes ? (int*)ws : nullptr;
  prm.ws_part = (pl.ws_bytes && pool == FF_POOL_MEAN) ? (float*)(ws + pl.ws_cnt_bytes) : nullptr;
  prm.ws_max = (pl.ws_bytes && pool == FF_POOL_MAX) ? (unsigned*)(ws + pl.ws_cnt_bytes) : nullptr;
  long long blocks = N * pl.nksl * pl.nbands * pl.nseg;
  if (dtype == FF_F32) {
    if (precision == FF_PREC_IEEE) return launch_nw<FF_F32, true, 2>(prm, pl, blocks, stream);
    return launch_nw<FF_F32, false, 4>(prm, pl, blocks, stream);
  }
  if (dtype == FF_BF16) return launch_nw<FF_BF16, false, 4>(prm, pl, blocks, stream);
  return launch_nw<FF_F16, false, 4>(prm, pl, blocks, stream);
}

#ifdef FF_FUSED_A_DIAG
// diagnostic builds only: copy the per-block timestamps of the last fa_wgmma_kernel launches (fa_diag_t) to host memory
int ff_fused_a_diag_times(void* host_dst, int nblocks) {
  const int n = nblocks < FA_DIAG_MAXB ? nblocks : FA_DIAG_MAXB;
  return (int)cudaMemcpyFromSymbol(host_dst, fa_diag_t, (size_t)n * 8 * sizeof(unsigned long long));
}
#endif

}  // extern "C"
