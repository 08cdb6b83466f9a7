"""Family A fused kernels' host planner: which kernel serves a problem and with which parameters, or why none does.
A pure function of the problem and the device's properties (runtime.DeviceProps); no GPU needed.

out[n, k] = pool_{p,q} act(conv2d(x, w)[n, k, p, q] + b[k]), one kernel, the conv output never stored.  Two kernels
(csrc/fused_conv_act_pool/, the design in their headers):
  * sm_90 (H100 / H200), any dtype (TF32 / ieee / bf16 / fp16), stride-1 columns (stride 2 through the TMA loaders,
    each row's even columns apart from its odd ones: WG_NT2): fa_wgmma_kernel — weights (A) and input rows (B, a
    shared-memory ring with the halo) both fed to the tensor cores by descriptors; one launch per 64 output channels
    (WGPlan).  ieee there: x w ~ x_hi w_hi (tf32) + bf16(x) bf16(w_lo) + bf16(x_lo) bf16(w) (x_hi = tf32(x),
    x_lo = x - x_hi, w likewise): the two small terms are ONE bf16 k16 wgmma whose K chunks are the (x, w_lo) and
    (x_lo, w) pairs, so a tap costs two wgmmas instead of 3xTF32's three; each bf16 rounding is 2^-9 of a term already
    2^-11 of x w, i.e. <= 2^-18 |x w| per product (3xTF32: ~2^-21), well inside ieee's 1e-5.
  * otherwise (sm_80, column strides > 2, narrow output rows, ...): fused_conv_act_pool_kernel, implicit GEMM on
    mma.sync (TF32 m16n8k8; 3xTF32 for ieee; bf16 / fp16 m16n8k16 + k8).  GEMM M = output channels (A = weights,
    register-resident: K-dim <= 9 "units"), GEMM N = output pixels (B = im2col straight from a shared-memory input
    tile with its halo), K-dim unit = one filter tap (r, s) x 8 input channels; tile [chgroup][row][col][8 ch].
A Conv3d runs on the wgmma kernel as the Conv2d over (image, output depth) and (input channel, depth tap) pairs (Vol).

C-style integer arithmetic is kept where it matters: ``_tdiv`` truncates toward zero as C++ does, and the ctypes
fields wrap as the C++ int casts do; the magic-number divisors are bit-identical to the kernels' expectations.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Optional

from cutlass_ops import conv_act_pool as abi
from cutlass_ops.conv_act_pool import (F32, PREC_IEEE, WG_COL16_J, WG_LM_ELEM, WG_LM_NCHW4, WG_LM_NCHW8, WG_LM_REG,
                                       WG_LM_TNCHW, WG_LM_TVEC, WG_LM_VEC, WG_MAXOPS, WG_NT, WG_NT2, WG_NT_R2, WG_PAD,
                                       WG_UNIT_BIAS, WG_UNIT_NONE, plan_straight_ops, wg_lm_tma, wg_straight_ops)
from fullfuse.codes import ACTIVATIONS, POOLS

POOL_MEAN, POOL_MAX = POOLS["mean"], POOLS["max"]
ACT_GELU_ERF = ACTIVATIONS["gelu_erf"]
_PREFIX = "fused_conv_act_pool: "
_STRIDE_WHY = _PREFIX + "column stride "   # (the wgmma kernel's reason that the input's layout or stride gives)


@dataclass(frozen=True)
class Problem:
    """A call's integers, as the kernels see them: x (N, C, H, W) — a Conv3d's (N, C, D, H, W) with D > 0 and the
    depth's kernel extent T, stride sd, padding pd, dilation dd (a Conv2d: D = 0, the rest ignored) — in layout NCHW /
    NCDHW (channels_last 0) or channels_last(_3d) (1), weights (K, C, [T,] R, S) contiguous; dtype, activation, pool,
    precision: codes.h."""
    dtype: int
    channels_last: int
    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    activation: int
    pool: int
    precision: int
    deterministic: int
    D: int = 0
    T: int = 1
    sd: int = 1
    pd: int = 0
    dd: int = 1


def _tdiv(a: int, b: int) -> int:
    """C's integer division (toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _reduce_workspace(pb, N: int, K: int, partials: int):
    """(counter bytes, total bytes) of the per-image reduction's workspace: none for the atomic mean; max pooling:
    one counter per image + N x K ordered-uint maxima; the deterministic mean: the counters + ``partials`` blocks of
    64 float partials, summed in a fixed order by each image's last block."""
    if not (pb.pool == POOL_MAX or pb.deterministic):
        return 0, 0
    counters = (N * 4 + 255) // 256 * 256
    return counters, counters + (N * K * 4 if pb.pool == POOL_MAX else partials * 64 * 4)


def _magic(d: int):
    """(m, s) with n / d == (n * m) >> s for 0 <= n < 2^31: s = 31 + ceil(log2 d), m = ceil(2^s / d) (fdiv)."""
    l = 0
    while (1 << l) < d:
        l += 1
    s = 31 + l
    return ((1 << s) + d - 1) // d, s


def _f32(x: float) -> float:
    return ctypes.c_float(x).value


# ---- the mma.sync kernel's plan ----
@dataclass
class MmaPlan:
    why: Optional[str] = None       # the call is invalid or has nothing to compute: no kernel serves it
    mma_why: Optional[str] = None   # why the mma.sync kernel cannot serve it (the sm_90 wgmma kernel may; choose)
    P: int = 0
    Q: int = 0
    CG: int = 0
    nu: int = 0
    BR: int = 0
    QS: int = 0
    nbands: int = 0
    nseg: int = 0
    nksl: int = 0
    TR: int = 0
    TWa: int = 0
    NW: int = 0
    MT: int = 0
    PIXB: int = 0
    smem: int = 0
    ws_cnt_bytes: int = 0
    ws_bytes: int = 0


def make_plan(pb: Problem, C: int, smem_optin: int) -> MmaPlan:
    """The mma.sync kernel's tiling (C: the channels the Conv2d reads: a Conv3d's C x T).  Bands of BR output rows x
    segments of QS output columns per block, so that the input tile with its halo fits the shared-memory budget."""
    dtype, N, H, W, K, R, S = pb.dtype, pb.N, pb.H, pb.W, pb.K, pb.R, pb.S
    sh, sw, ph, pw, dh, dw = pb.sh, pb.sw, pb.ph, pb.pw, pb.dh, pb.dw
    pl = MmaPlan()
    if not 0 <= dtype <= 2:
        pl.why = _PREFIX + "dtype must be 0 (fp32), 1 (bf16) or 2 (fp16)"
    elif not 0 <= pb.activation <= 4:
        pl.why = _PREFIX + "unknown activation code"
    elif not 0 <= pb.pool <= 1:
        pl.why = _PREFIX + "pool must be 0 (mean) or 1 (max)"
    elif not 0 <= pb.precision <= 1:
        pl.why = _PREFIX + "precision must be 0 (tf32) or 1 (ieee)"
    elif not 0 <= pb.channels_last <= 1:
        pl.why = _PREFIX + "channels_last must be 0 or 1"
    elif N <= 0 or C <= 0 or H <= 0 or W <= 0 or K <= 0 or R <= 0 or S <= 0:
        pl.why = _PREFIX + "empty or negative extent"
    elif sh <= 0 or sw <= 0 or dh <= 0 or dw <= 0 or ph < 0 or pw < 0:
        pl.why = _PREFIX + "stride/dilation must be >= 1 and padding >= 0"
    if pl.why:
        return pl
    P = _tdiv(H + 2 * ph - dh * (R - 1) - 1, sh) + 1
    Q = _tdiv(W + 2 * pw - dw * (S - 1) - 1, sw) + 1
    if H + 2 * ph < dh * (R - 1) + 1 or W + 2 * pw < dw * (S - 1) + 1 or P <= 0 or Q <= 0:
        pl.why = _PREFIX + "the convolution output is empty (kernel larger than the padded input)"
        return pl
    if P > (1 << 30) or Q > (1 << 30):
        pl.why = _PREFIX + "output extent too large"
        return pl
    pl.P, pl.Q = P, Q
    pl.CG = (C + 7) // 8
    nu = R * S * pl.CG
    if nu > abi.NU_MAX:
        pl.mma_why = (_PREFIX + "R*S*ceil(C/8) > 9 K units of 8 input channels: beyond the mma.sync kernel (9, "
                      "register-resident weights); the sm_90 wgmma kernel takes up to 64 with stride-1 columns "
                      "(stride 2 with TMA rows) and a ring of input rows that fits in shared memory")
        return pl
    pl.nu = nu
    pl.PIXB = 32 if dtype == F32 else 16
    split = dtype == F32 and pb.precision == PREC_IEEE
    pl.MT = 2 if split else 4
    pl.NW = 4
    # measured on H200 (seed): fp32 2 blocks x 100 KB (255 regs); 16-bit 3 blocks x 72 KB (168 regs); never more than
    # a block may have on the device
    budget = min((100 if dtype == F32 else 72) * 1024, smem_optin)
    brcap = 64

    def tw_of(qs):   # input columns of a segment of qs output columns (rounded up to whole 16-pixel tiles)
        return ((qs + 15) // 16 * 16 - 1) * sw + (S - 1) * dw + 1

    trmin = (R - 1) * dh + 1
    # width segment: the full output width if a 1-row band fits, else the widest multiple of 16 that fits
    QS = Q
    if pl.CG * tw_of(QS) * pl.PIXB * trmin > budget:
        QS = 16
        if pl.CG * tw_of(QS) * pl.PIXB * trmin > budget:
            pl.mma_why = (_PREFIX + "the input tile with its halo for one row of 16 output pixels does not fit in "
                          "shared memory")
            return pl
        while pl.CG * tw_of(QS + 16) * pl.PIXB * trmin <= budget and QS + 16 < Q:
            QS += 16
    rowbytes = pl.CG * tw_of(QS) * pl.PIXB
    trmax = budget // rowbytes
    BR = max(1, min(_tdiv(trmax - trmin, sh) + 1, brcap, P))
    nb = (P + BR - 1) // BR
    BR = (P + nb - 1) // nb                                # even out the bands
    pl.BR, pl.QS = BR, QS
    pl.nbands, pl.nseg, pl.nksl = nb, (Q + QS - 1) // QS, (K + 63) // 64
    pl.TR = (BR - 1) * sh + trmin
    pl.TWa = tw_of(QS)
    pl.smem = pl.CG * pl.TR * pl.TWa * pl.PIXB
    if N * pl.nksl * pl.nbands * pl.nseg > 0x7fffffff:
        pl.mma_why = _PREFIX + "too many blocks (N too large)"
        return pl
    pl.ws_cnt_bytes, pl.ws_bytes = _reduce_workspace(pb, N, K, N * pl.nksl * pl.nbands * pl.nseg)
    return pl


def mma_params(pb: Problem, pl: MmaPlan, aligned: bool) -> abi.FAParams:
    """The mma.sync kernel's parameters but for the pointers (x, w, bias, out, the workspace's)."""
    p = abi.FAParams()
    p.N, p.C, p.H, p.W, p.K, p.R, p.S = pb.N, pb.C, pb.H, pb.W, pb.K, pb.R, pb.S
    p.sh, p.sw, p.ph, p.pw, p.dh, p.dw = pb.sh, pb.sw, pb.ph, pb.pw, pb.dh, pb.dw
    p.P, p.Q, p.act, p.pool, p.det = pl.P, pl.Q, pb.activation, pb.pool, 1 if pb.deterministic else 0
    p.nhwc = pb.channels_last
    p.vec_ok = 1 if pb.channels_last and pb.C % 8 == 0 and aligned else 0
    p.CG, p.nu, p.BR, p.QS, p.nbands, p.nseg, p.nksl = pl.CG, pl.nu, pl.BR, pl.QS, pl.nbands, pl.nseg, pl.nksl
    p.TR, p.TWa = pl.TR, pl.TWa
    p.mTWa, p.sTWa = _magic(pl.TWa)
    p.mTR, p.sTR = _magic(pl.TR)
    p.nitems_total = pb.N * pl.nksl * pl.nbands * pl.nseg
    p.inv_pq = _f32(1.0 / (float(pl.P) * float(pl.Q)))
    p.wsk, p.wsc, p.wsr, p.wss = pb.C * pb.R * pb.S, pb.R * pb.S, pb.S, 1   # a contiguous weight's
    return p


# ---- a Conv3d's depth ----
@dataclass(frozen=True)
class Vol:
    """D input slices (0: the call is a Conv2d), kernel depth T, stride sd, padding pd, dilation dd; Dout output
    depths.  The kernels see the Conv2d over C x T channels (WGParams vT)."""
    D: int
    T: int
    sd: int
    pd: int
    dd: int
    Dout: int


def make_vol(D: int, T: int, sd: int, pd: int, dd: int) -> Vol:
    dout = 1
    if D > 0 and T > 0 and sd > 0 and dd > 0 and pd >= 0:
        span, padded = dd * (T - 1) + 1, D + 2 * pd
        dout = 0 if padded < span else min((padded - span) // sd + 1, 1 << 30)
    return Vol(D, T, sd, pd, dd, dout)


def vol_why(v: Vol, C: int) -> Optional[str]:
    """Why no kernel serves this Conv3d depth (None: a Conv2d, or a valid depth)."""
    if v.D == 0:
        return None
    if v.D < 0 or v.T <= 0 or v.sd <= 0 or v.dd <= 0 or v.pd < 0:
        return _PREFIX + "Conv3d depth extent, stride, dilation must be >= 1 and padding >= 0"
    if v.Dout <= 0:
        return _PREFIX + "the convolution output is empty (kernel deeper than the padded input)"
    if C * v.T > 4096:
        return _PREFIX + "Conv3d with C_in x kernel depth > 4096"
    return None


# ---- the wgmma kernel's plan (sm_90 only) ----
# The kernel covers 64 output channels (its A operand, one m64 wgmma row block); K > 64 runs nkb = ceil(K / 64)
# launches in stream order, launch kb with channels 64 kb .. (prm.K of them), each into an (N, its K) block of the
# workspace's tmp that a 2-d copy then puts into out's columns (the counters and partials serve them in turn: each
# launch leaves them zeroed).
@dataclass
class WGPlan:
    ok: bool = False
    lm: int = 0                     # the input loader (WG_LM_*) the layout is for
    bps: int = 0                    # blocks per SM
    nkb: int = 0                    # launches of 64 output channels
    why: Optional[str] = None       # set when the shape is beyond this kernel's capacity (for the user's message)
    prm: abi.WGParams = field(default_factory=abi.WGParams)   # (prm.K: the first launch's channels, min(K, 64))
    smem: int = 0
    ws_cnt_bytes: int = 0
    ws_bytes: int = 0


# Blocks per SM the wgmma kernel is planned for: 3 (the 168-register builds: 0.584 / 0.743 ms NHWC / NCHW TF32 at the
# seed against 0.674 / 0.847 for 4 blocks of 128 registers); 3xTF32 at most 2.  Fewer where a large filter's ring needs
# the room, but never fewer than MIN_BPS: one block per SM, no other block to fill its MMA and epilogue gaps, measured
# slower than cuDNN + the fused epilogue kernel (docs/design.md: 3x3 over 24 / 32 channels) — where the grid has more
# blocks than SMs; a grid of at most one block per SM runs so whatever the plan.
BPS, MIN_BPS = 3, 2
MAX_RING = 8   # ring slots beyond the ones a row needs, where shared memory allows


def wg_r2_applies(lm: int, split: bool, v: Vol, Q: int) -> bool:
    """Two output rows per tile (WG_NT_R2) can serve the call: rows of 8 .. 64 output pixels (one segment) through
    the TMA loaders, Conv2d, not ieee."""
    return wg_lm_tma(lm) and not split and v.D == 0 and 8 <= Q <= WG_NT_R2


def wg_plan_lm(pb: Problem, C: int, base: MmaPlan, lm: int, v: Vol, want_r2: bool, props) -> WGPlan:
    """The wgmma plan for input loader lm (C: the Conv2d's channels, a Conv3d's C x T: see Vol)."""
    dtype, N, K, R, S = pb.dtype, pb.N, pb.K, pb.R, pb.S
    sh, sw, pw, dh, dw = pb.sh, pb.sw, pb.pw, pb.dh, pb.dw
    w = WGPlan(lm=lm)
    tvec, tnchw = lm == WG_LM_TVEC, lm == WG_LM_TNCHW
    tma = tvec or tnchw
    f32 = dtype == F32
    if base.why or not props.is_sm90:
        return w
    # stride-2 columns: a Conv2d through the TMA loaders, each plane's even columns then its odd ones (WG_NT2)
    sw2 = sw == 2
    if sw != 1 and not (sw2 and tma and v.D == 0):
        w.why = _STRIDE_WHY + (f"{sw}: the sm_90 kernel takes 1 or 2" if not sw2 else
                               "2: the sm_90 kernel takes it in a Conv2d only" if v.D > 0 else
                               "2: the sm_90 kernel reads it through TMA rows, which need a 16-byte-aligned input, "
                               "NCHW with rows of whole 16 bytes (W % " + ("4" if f32 else "8") + " == 0) or "
                               "channels_last with C % 8 == 0")
        return w
    w.nkb = (K + 63) // 64
    K = min(K, 64)   # per launch
    split = f32 and pb.precision == PREC_IEEE
    p = w.prm
    p.N, p.C, p.H, p.W, p.K, p.R, p.S = N, C, pb.H, pb.W, K, R, S
    p.sh, p.ph, p.pw, p.dh, p.dw = sh, pb.ph, pw, dh, dw
    p.P, p.Q, p.act, p.pool, p.det = base.P, base.Q, pb.activation, pb.pool, 1 if pb.deterministic else 0
    p.CG = base.CG
    nt = WG_NT2 if sw2 else WG_NT   # output pixels per segment
    p.nseg = (p.Q + nt - 1) // nt
    r2 = want_r2 and wg_r2_applies(lm, split, v, p.Q)
    p.r2 = 1 if r2 else 0
    # the input columns a segment's ops read, from its first (SW2: 2 (nt - 1) + (S - 1) dw + 1, half of them per
    # parity); R2: the m64n64 ops read WG_NT_R2 output pixels of the segment; a stride-1 row of <= 128 output pixels is
    # one segment of one half (WGPiece: nhalf 1), whose n128 ops read 128 pixels, so its slots need no more (half the
    # ring: more blocks per SM where a large filter's or many channels' ring was the limit)
    nts = WG_NT_R2 if r2 else WG_NT // 2 if (not sw2 and p.Q <= WG_NT // 2) else nt
    span_c = 2 * (nts - 1) + (S - 1) * dw + 1 if sw2 else nts + (S - 1) * dw
    twa = 2 * (((span_c + 1) // 2 + 7) // 8 * 8) if sw2 else (span_c + 7) // 8 * 8
    if twa > 4096:
        return w
    p.TWa = twa
    # TMA boxes of at most 256 columns: TVEC's tma_bc % 8 == 0 (each box lands 128-byte aligned in its plane); TNCHW
    # fp32 tma_bc % 8 == 4 (the stage's two 4-channel halves 64 bytes apart modulo 128, wg_tnchw_row), 16-bit
    # tma_bc % 64 == 8 (channel rows 16 bytes apart modulo 128, wg_tnchw16_row)
    cpb = 4 if f32 else 8                                  # columns per 16 bytes of NCHW input: TNCHW boxes start
    tdelta = (-pw) % cpb if tnchw else 0                   # at a multiple; wbase mod cpb (segments start at multiples
    cols = span_c + tdelta                                 # of 256 columns); the columns a row's ops read (+ delta)
    # SW2, TVEC: boxes of every other column, per parity (a box spans 2 tma_bc <= 256 columns)
    box_cols = (span_c + 1) // 2 if sw2 and tvec else cols
    bmax = 128 if sw2 and tvec else 256
    nbox = bc = 0
    if tma:
        nbox = (box_cols + bmax - 1) // bmax
        while True:
            bc = (box_cols + nbox - 1) // nbox
            bc = (bc + 7) // 8 * 8 if tvec else (bc + 3) // 8 * 8 + 4 if f32 else (bc + 55) // 64 * 64 + 8
            if bc <= bmax:
                break
            nbox += 1
    # SW2: positions per parity, and from a plane's even half to its odd one (TVEC: right after it, 128-byte aligned
    # for the boxes; TNCHW: after WG_PAD more of slack, which its pass's columns before the segment and past its end
    # use)
    twh = 0 if not sw2 else nbox * bc if tvec else twa // 2
    if sw2 and tvec:
        p.TWa = 2 * twh
    p.sw2_sub = 0 if not sw2 else twh if tvec else twh + WG_PAD

    def posr(c):   # slot position of input column c relative to the segment's first, less the slack (wg_pos)
        return ((c & 1) * p.sw2_sub + (c >> 1)) if sw2 else c

    # a channel plane: slack both sides (NCHW4 / NCHW8 groups overhang), then fp32 planes start 64 (channels_last: the
    # 16-byte copies alternate planes, 8 threads -> 8 bank groups) or 32 bytes (NCHW4: see there) apart modulo 128;
    # TVEC: 128-byte aligned planes of the slack and the TMA boxes
    if tvec:
        plane = (WG_PAD + (2 * twh if sw2 else nbox * bc)) * 16
    else:
        plane = (p.TWa + (3 if sw2 else 2) * WG_PAD) * 16 + (0 if not f32 else 64 if pb.channels_last else 32)
    p.plane_bytes = plane
    p.nq = (p.TWa + 3) // 4 + 1 if f32 else (p.TWa + 7) // 8 + 1   # NCHW4 / NCHW8 column groups per row
    big = p.CG * 2 * plane if f32 else (p.CG + 1) * plane           # 16-bit: + the ones plane
    slot = 2 * big if split else big
    p.small_off = big
    # 16-bit, one channel group: two taps per k16 op; more groups: two channel groups per k16 op (see the ops below)
    step_s = 2 if not f32 and p.CG == 1 else 1
    step_g = 2 if not f32 and p.CG > 1 else 1
    span = (R - 1) * dh
    # 16-bit: the bias rides in a spare K chunk (an op with one tap / one channel group) when there is one, else in
    # an op of its own
    bias_spare = not f32 and (S % 2 == 1 if step_s == 2 else step_g == 1 or p.CG % 2 == 1)
    # 16-bit 3x3, one channel group: taps (0, 2) and (1, 2) in one op (WG_COL16_OPS)
    col16 = step_s == 2 and R == 3 and S == 3
    nops_pred = (R * ((S + step_s - 1) // step_s) * ((p.CG + step_g - 1) // step_g) + (0 if bias_spare else 1)
                 - (1 if col16 else 0))
    if nops_pred > WG_MAXOPS:
        w.why = _PREFIX + "more than 64 K units of 8 input channels (R*S*ceil(C/8), + bias) for the sm_90 kernel"
        return w
    na = nops_pred + (1 if col16 else 0)       # A blocks: + the column op's swapped copy
    abytes = na * 2048 * (2 if split else 1)   # A operands: 2 KB per op (+ the ieee small ops)
    # an image's lines: (output depth,) segment, output row
    lines_d = p.nseg * p.P
    p.lines_img = lines_d * v.Dout
    if v.D > 0 and p.lines_img > 0x7fffffff:   # (WGPiece's line arithmetic in int)
        return w
    p.lines_d = min(lines_d, 0x7fffffff)
    p.vT = v.T if v.D > 0 else 0
    p.vC = C // v.T if v.D > 0 else 0
    p.vD, p.vDout, p.vsd, p.vpd, p.vdd = v.D, v.Dout, v.sd, v.pd, v.dd
    p.L = N * p.lines_img
    nops_line = wg_straight_ops(dtype, nops_pred, col16, lm, sw2, r2, v.D > 0, split)   # > 0: a straight-line kernel
    # ring slots: the rows of one output row + the next row's first; R2: + sh, as row t - 1's chain is still in
    # flight while row t + 1's rows land
    need = sh + span + 1 + (sh if r2 else 0)
    ones = 128                                 # the bias op's ones block (8 rows x 16 B)

    def dtab_bytes(slots):                     # B descriptor table (wg_dtab_fill)
        return slots * 2 * abi.wg_dstride(nops_line) * 4

    # TMA: TNCHW's stages (D = 2 row groups in flight, sh rows each) and the stages' mbarriers (TVEC: one per ring
    # slot), + 2 x 128 bytes to align the stages and the whole layout (fa_wgmma_kernel)
    tnchw_d = 2
    stage_bytes = p.CG * nbox * 8 * bc * (4 if f32 else 2) if tnchw else 0
    nst_tnchw = tnchw_d * sh

    def tma_bytes(slots):
        return 0 if not tma else 8 * slots + 256 if tvec else nst_tnchw * (stage_bytes + 8) + 256

    def total(slots):
        return slots * slot + ones + dtab_bytes(slots) + tma_bytes(slots)

    # blocks per SM: BPS (3xTF32: at most 2), fewer when the ring of a large filter / many channels needs it; the
    # device's shared memory per block (the H200's 227 KB) split between them, 1 KB reserved per block
    bps = min(BPS, 2) if split else BPS

    def budget_of(b):
        return props.smem_optin // b - 1024 - 64 - abytes

    bps_asked = bps
    while bps > 1 and total(need) > budget_of(bps):
        bps -= 1
    # (a grid of at most one block per SM, p.L lines <= SMs, has no second block to lose: small problems keep the
    # fused kernel, whose one launch is what decides their time)
    if bps < min(bps_asked, MIN_BPS) and p.L > props.sm_count:
        w.why = (_PREFIX + "the sm_90 kernel's weights and ring of input rows leave room for one block per SM "
                 "(filter height x channels x the row's columns): slower than the fallback")
        return w
    budget = budget_of(bps)
    rb = need                                  # any slot count: the kernel indexes the ring modulo RB
    if total(rb) > budget or rb > 64:
        w.why = (_PREFIX + "the sm_90 kernel's weights and ring of input rows (filter height x channels x the row's "
                 "columns) do not fit in shared memory")
        return w
    while not tnchw and rb + 1 <= MAX_RING and total(rb + 1) <= budget:
        rb += 1
    p.RB = rb
    if tnchw:
        p.D = tnchw_d
    else:   # group t + D's rows must miss row t's slots (R2: row t - 1's too)
        p.D = min(_tdiv(rb - 1 - span, sh) - (1 if r2 else 0), 8)
    if p.D < 1:
        return w
    w.bps = bps
    p.slot_bytes = slot
    p.a_small_off = nops_pred * 2048
    # [A ops][ones block][ring][descriptor table]: the bias op's B descriptor (SBO = LBO = 0) reads only the 128-byte
    # ones block, but a checker sizes a wgmma B read as N x K elements from its start (n128: 4 KB, n64: 2 KB;
    # compute-sanitizer memcheck: "Invalid __shared__ read of size 4096" past the allocation when the block sat after
    # the ring), so it lies before the ring, whose bytes cover that extent; same total, so RB, D and blocks per SM are
    # unchanged
    p.ones_off = abytes
    p.ring_off = abytes + ones
    p.dtab_off = abytes + ones + rb * slot
    w.smem = abytes + ones + rb * slot + dtab_bytes(rb)
    if rb * slot < 4096 - ones:                # (never: a ring is larger)
        w.smem = max(w.smem, abytes + 4096)
    if tma:   # [stages][mbarriers] after the descriptor table
        p.NST = rb if tvec else nst_tnchw
        p.stage_off = (w.smem + 127) // 128 * 128
        p.stage_bytes = stage_bytes
        p.bar_off = p.stage_off + p.NST * p.stage_bytes
        w.smem = p.bar_off + 8 * p.NST + 128   # + the kernel's alignment of its layout to 128 bytes
        p.tma_nbox, p.tma_bc, p.tma_cols, p.tma_delta = nbox, bc, cols, tdelta
        # (a Conv3d's boxes land C x T of the group's 8 channel rows: wg_tma_row)
        p.tma_bytes = (p.CG * (2 if f32 else 1) * (2 if sw2 else 1) * nbox * bc * 16 if tvec
                       else nbox * C * bc * (4 if f32 else 2) if v.D > 0 else stage_bytes)
        if v.D > 0 and (tvec or p.CG != 1):
            return w
    spare = _wg_ops(p, pb, C, plane, step_s, step_g, col16, posr, f32)
    if (spare >= 0) != bias_spare or p.nops != nops_pred:   # (never: the prediction above and the ops agree)
        return w
    p.slot16 = slot >> 4
    p.mCG, p.sCG = _magic(p.CG)
    p.mTWa, p.sTWa = _magic(p.TWa)
    p.mHP, p.sHP = _magic(p.CG * 2)
    p.mNQ, p.sNQ = _magic(p.nq)
    p.mRB, p.sRB = _magic(p.RB)
    if tma:
        p.mST, p.sST = _magic(p.NST)
        p.mBC, p.sBC = _magic(p.tma_bc)
    G = min(bps * props.sm_count, p.L)
    p.G = G
    per = (p.L + G - 1) // G
    p.J = (per + p.lines_img - 1) // p.lines_img + 1
    p.inv_pq = _f32(1.0 / (float(v.Dout) * float(p.P) * float(p.Q)))
    w.ws_cnt_bytes, w.ws_bytes = _reduce_workspace(pb, N, K, G * p.J)
    w.ok = True
    return w


def _wg_ops(p, pb: Problem, C: int, plane: int, step_s: int, step_g: int, col16: bool, posr, f32: bool) -> int:
    """The op list (p.op_*, p.nops, p.na, p.col_j, p.col_rd2) and each op's A-operand sources (op_wo / op_wn).
    16-bit, one channel group (step_s 2): the two 8-column K chunks of a k16 op are taps (r, s) and (r, s + 1) — the
    second tap's pixels are the first's shifted by dw columns, i.e. LBO = dw positions — so a row of S taps takes
    ceil(S / 2) ops instead of S; more channel groups (step_g 2): the chunks are groups cg and cg + 1 of one tap — the
    next group's plane, LBO = one plane — so a tap takes ceil(CG / 2) ops instead of CG.
    Ring operand: K-major core matrices, SBO = 8 pixels (128 B), LBO = to the next K chunk (fp32: the second
    4-channel plane; 16-bit: the next tap's pixels, or the slot's ones plane, read by 8 zero-weight columns or by the
    bias; the column pair: 0 here, the ring slots' distance from the descriptor table).  Returns the op whose spare K
    chunk carries the bias (-1: the bias op of its own)."""
    R, S, dh, dw, CG = pb.R, pb.S, pb.dh, pb.dw, p.CG
    for j in range(WG_MAXOPS):
        p.op_u0[j] = p.op_u1[j] = WG_UNIT_NONE
        p.op_d[j] = p.op_mask[j] = p.op_hi[j] = 0
        p.op_rd[j] = 0
    nops = 0

    def add_op(u0, u1, off, lbo, rd):
        nonlocal nops
        p.op_u0[nops], p.op_u1[nops] = u0, u1
        p.op_d[nops] = (((p.ring_off + off) >> 4) | ((lbo >> 4) << 16)) & 0xFFFFFFFF
        p.op_mask[nops], p.op_hi[nops], p.op_rd[nops] = 0xFFFFFFFF, 128 >> 4, rd
        nops += 1

    for r in range(R):
        for s in range(0, S, step_s):
            for cg in range(0, CG, step_g):
                if col16 and s == S - 1 and r < 2:   # (0, 2) and (1, 2): the column pair below
                    continue
                off = (cg * 2 * plane if f32 else cg * plane) + (WG_PAD + posr(s * dw)) * 16
                pair, gpair = step_s == 2 and s + 1 < S, step_g == 2 and cg + 1 < CG
                # (a pair's taps: s even, so SW2 puts tap s + 1 in the odd half or further on in the even one: lbo > 0)
                lbo = (plane if f32 else (posr((s + 1) * dw) - posr(s * dw)) * 16 if pair
                       else plane if gpair else (CG - cg) * plane)
                u0 = (r * S + s) * CG + cg
                add_op(u0, (r * S + s + 1) * CG + cg if pair else u0 + 1 if gpair else WG_UNIT_NONE, off, lbo, r * dh)
    # the column pair (WG_COL16_OPS, one channel group): op WG_COL16_J after (2, 0) + (2, 1) and (2, 2); its LBO and,
    # where the rows' slots are in the other order, its swapped A block (block WG_COL16_OPS, not issued) come from the
    # descriptor table (wg_dtab_fill)
    if col16:
        tap02, tap12 = 2, S + 2
        add_op(tap02, tap12, (WG_PAD + posr(2 * dw)) * 16, 0, 0)
        p.op_u0[nops], p.op_u1[nops] = tap12, tap02
    p.col_j = WG_COL16_J if col16 else -1
    p.col_rd2 = dh   # the column op's second row: tap row 1
    # bias: 16-bit, the second K chunk of the first op with one tap (it reads the ones plane); else an op of its own
    # on the ones block, every row and K chunk the same 16 bytes (LBO = SBO = 0)
    spare = next((j for j in range(nops) if p.op_u1[j] == WG_UNIT_NONE), -1) if not f32 else -1
    if spare >= 0:
        p.op_u1[spare] = WG_UNIT_BIAS
    else:
        p.op_u0[nops] = WG_UNIT_BIAS
        p.op_d[nops], p.op_mask[nops], p.op_hi[nops], p.op_rd[nops] = p.ones_off >> 4, 0, 0, 0
        nops += 1
    p.nops = nops
    p.na = nops + (1 if col16 else 0)
    kc = 4 if f32 else 8
    for j in range(WG_MAXOPS):
        for h in range(2):
            u = p.op_u1[j] if not f32 and h else p.op_u0[j]
            k0 = 4 * h if f32 else 0
            p.op_wo[h][j] = p.op_wn[h][j] = 0
            if j >= p.na or u == WG_UNIT_NONE:
                continue
            if u == WG_UNIT_BIAS:
                p.op_wn[h][j] = -1 if k0 == 0 else 0
                continue
            t, cg = divmod(u, CG)
            r, s = divmod(t, S)
            c0 = cg * 8 + k0
            p.op_wn[h][j] = max(0, min(kc, C - c0))
            p.op_wo[h][j] = (c0 * R + r) * S + s
    p.wsc, p.wsk = R * S, p.C * R * S   # a contiguous weight's (Launches.blocks_for: any other strides)
    return spare


def wg_copy_loader(lm: int, dtype: int) -> int:
    """The copy loader that replaces TMA loader lm (where its layout does not fit or its tensor map cannot be made)."""
    return WG_LM_VEC if lm == WG_LM_TVEC else WG_LM_NCHW4 if dtype == F32 else WG_LM_NCHW8


def wg_plan(pb: Problem, C: int, base: MmaPlan, lm: int, v: Vol, props) -> WGPlan:
    """The plan for loader lm; a TMA loader only where its layout keeps at least the blocks per SM of the loader it
    replaces, else that one (VEC / NCHW4 / NCHW8).  Stride-2 columns have only the TMA loaders (the workspace is sized
    for the mma.sync kernel too, which serves them where the tensor map cannot be made).  Two output rows per tile
    (R2, TMA loaders only) where that plan keeps the blocks per SM of the one-row plan chosen so."""
    def plan(l, r2):
        return wg_plan_lm(pb, C, base, l, v, r2, props)

    if not wg_lm_tma(lm) or pb.sw == 2:
        one = plan(lm, False)
    else:
        a = plan(wg_copy_loader(lm, pb.dtype), False)
        if not a.ok:
            return a
        t = plan(lm, False)
        one = t if t.ok and t.bps >= a.bps else a
    if not wg_r2_applies(lm, pb.dtype == F32 and pb.precision == PREC_IEEE, v, base.Q):
        return one
    two = plan(lm, True)
    return two if two.ok and (not one.ok or two.bps >= one.bps) else one


def wg_loader(pb: Problem, aligned: bool, v: Vol) -> int:
    """Input loader: channels_last with C % 8 == 0 -> TVEC; NCHW with W % 4 (fp32) / 8 (16-bit) == 0 -> TNCHW; else
    ELEM (fp32) / REG (16-bit).  The 16-byte and TMA loaders need a 16-byte-aligned input.  (wg_plan may still turn
    a TMA loader into the one it replaces.)  A Conv3d: NCDHW as NCHW — TNCHW when C x T <= 8 (one channel group),
    else NCHW4 / NCHW8 — other layouts ELEM / REG."""
    f32 = pb.dtype == F32
    # NCHW (NCDHW) rows that the 16-byte loaders and TNCHW take: W % 4 (fp32) / 8 (16-bit) == 0
    cols = not pb.channels_last and pb.W % (4 if f32 else 8) == 0 and aligned
    if v.D > 0:
        # TMA rows where one box per column range brings every (c, t) channel: C x T <= 8, T dd depth slices per box
        # (TMA: element strides <= 8)
        if cols and pb.C * v.T <= 8 and v.T * v.dd <= 256 and v.dd <= 8:
            return WG_LM_TNCHW
    else:
        vec = pb.channels_last and pb.C % 8 == 0 and aligned
        if vec or cols:
            return WG_LM_TVEC if vec else WG_LM_TNCHW
    if cols:
        return WG_LM_NCHW4 if f32 else WG_LM_NCHW8
    return WG_LM_ELEM if f32 else WG_LM_REG


# ---- the choice ----
@dataclass
class Choice:
    """Which kernel serves a call: the wgmma plan (wp.ok) or the mma.sync plan (pl); why = the reason neither can."""
    pl: MmaPlan
    wp: WGPlan
    why: Optional[str]
    lm: int = -1   # the loader asked for (wg_loader)


# rows of <= this many output pixels: the mma.sync kernel even with two rows per tile
R2_NARROW = 32


def choose(pb: Problem, props, lm: int) -> Choice:
    """The sm_90 wgmma plan when it can, else the mma.sync plan; why = the reason neither can (invalid call, or beyond
    both kernels: then the wgmma kernel's capacity message where it had one).  A Conv3d (D > 0) only on the wgmma
    kernel, as the Conv2d over C x T channels (Vol)."""
    v = make_vol(pb.D, pb.T, pb.sd, pb.pd, pb.dd)
    why = vol_why(v, pb.C)
    if why:
        return Choice(MmaPlan(), WGPlan(), why, lm)
    Cx = pb.C * v.T if v.D > 0 else pb.C
    pl = make_plan(pb, Cx, props.smem_optin)
    if pl.why:
        return Choice(pl, WGPlan(), pl.why, lm)
    if v.D > 0:
        pl.mma_why = (_PREFIX + "a Conv3d needs the sm_90 wgmma kernel (stride-1 columns, C_in x kernel depth x R x "
                      "S / 8 <= 64 K units, a ring of input rows that fits); the mma.sync kernel covers Conv2d only")
    wp = wg_plan(pb, Cx, pl, lm, v, props)
    # Narrow output rows: a wgmma tile is 128 pixels of one output row, so a row of Q pixels fills Q / 128 of it, and
    # the mma.sync kernel's 16-pixel tiles are faster below: measured at Q = 30 (1.8-2.6x faster in every mode) and
    # 62 (ieee 1.2-1.3x, TF32 channels_last 1.3x faster; TF32 NCHW and 16-bit 6-18 % slower), docs/design.md; the
    # thresholds between come from time ~ 1 / Q (wgmma) vs ~ ceil(Q / 16) / Q (mma.sync) per output.  Two rows per
    # tile (R2) fill 2 Q / 128 of a tile: it keeps rows of more than R2_NARROW pixels (docs/design.md).
    q_narrow = (R2_NARROW if wp.prm.r2 else
                64 if pb.precision == PREC_IEEE or (pb.dtype == F32 and pb.channels_last) else 48)
    if wp.ok and not pl.mma_why and pl.Q <= q_narrow:
        wp.ok = False
    why = None
    if not wp.ok and pl.mma_why:   # (both kernels' reasons where the wgmma kernel's is the input's layout)
        why = (wp.why + "; " + pl.mma_why[len(_PREFIX):] if wp.why and wp.why.startswith(_STRIDE_WHY)
               else wp.why or pl.mma_why)
    return Choice(pl, wp, why, lm)


def choose_call(pb: Problem, props, aligned: bool = True) -> Choice:
    """choose() with the loader for an input x whose address is 16-byte aligned or not (aligned: the loader the
    workspace query and the plan's description assume)."""
    v = make_vol(pb.D, pb.T, pb.sd, pb.pd, pb.dd)
    return choose(pb, props, wg_loader(pb, aligned, v))


def fallback_choice(pb: Problem, props, c: Choice) -> Choice:
    """The plan where TMA plan c's tensor map cannot be made: the copy loader (stride-2 columns: none, so the mma.sync
    kernel)."""
    return choose(pb, props, wg_copy_loader(c.wp.lm, pb.dtype))


def uses_tma(c: Choice) -> bool:
    return c.why is None and c.wp.ok and wg_lm_tma(c.wp.lm)


def unsupported(pb: Problem, props) -> Optional[str]:
    """Why no fused kernel serves the problem (None: one does)."""
    return choose_call(pb, props).why


_ROWS = ("channels_last rows by 16-byte copies", "rows per element", "rows per element", "NCHW rows by 16-byte copies",
         "NCHW rows by 16-byte copies", "channels_last rows by TMA", "NCHW rows by TMA")


def describe(c: Choice, pb: Problem) -> Optional[str]:
    """Which kernel serves a choice, in words (the fused model's `.plans` shows it); None where none does."""
    if c.why:
        return None
    if not c.wp.ok:
        return "mma.sync kernel, " + ("16-bit MMAs" if pb.dtype != F32 else
                                      "3xTF32" if pb.precision == PREC_IEEE else "TF32")
    p = c.wp.prm
    line = plan_straight_ops(pb.dtype, pb.precision, c.wp.lm, p) > 0
    return (f"sm_90 wgmma kernel{' (Conv3d)' if pb.D > 0 else ''}, {_ROWS[c.wp.lm]}"
            f"{' split into even / odd columns (stride 2)' if p.sw2_sub > 0 else ''}"
            f"{', two output rows per tile' if p.r2 else ''}, {p.nops} ops per tile "
            f"({'straight-line' if line else 'general chain'}), {c.wp.bps} blocks per SM")


def kernel_text(pb: Problem, props) -> Optional[str]:
    """describe() of the plan an aligned input gets."""
    return describe(choose_call(pb, props), pb)


def workspace_bytes(pb: Problem, props) -> int:
    """The largest workspace of the plans a call of this problem may take: the aligned input's loader, the copy
    loader that replaces a TMA loader whose tensor map cannot be made (no stride 2, no two rows per tile: the mma.sync
    kernel may serve instead), the loader of an input that is not 16-byte aligned.  The workspace must be zero before
    its first use; every launch leaves it zero."""
    if choose_call(pb, props).why:
        return 0
    v = make_vol(pb.D, pb.T, pb.sd, pb.pd, pb.dd)
    lm = wg_loader(pb, True, v)
    lms = (lm, wg_copy_loader(lm, pb.dtype) if wg_lm_tma(lm) else -1, wg_loader(pb, False, v))
    ws = 0
    for i, l in enumerate(lms):
        if l < 0 or (i == 2 and l in lms[:2]):   # (each loader planned once)
            continue
        f = choose(pb, props, l)
        if not f.why:
            ws = max(ws, f.wp.ws_bytes if f.wp.ok else f.pl.ws_bytes)
    return ws


def tensor_map_geometry(pb: Problem, lm: int, p):
    """The TMA loaders' view of input x for runtime.tensor_map (dtype, dims, byte strides, box, element strides;
    innermost first): TVEC: NHWC as (16 bytes of channels, C / that, W, H, N), box 16 bytes x 1 x tma_bc (stride-2
    columns: x 2 tma_bc, every other column); TNCHW: NCHW as (W, H, C, N), box tma_bc x 1 x 8 channels (channels >= C
    read as zeros); a Conv3d's TNCHW: NCDHW as (W, H, D, C, N), box tma_bc x 1 x T dd slices (every dd-th) x C
    channels.  16-bit input moves as uint16.  Rows, columns and channels outside the input arrive as zeros."""
    W, H, C, N = p.W, p.H, p.C, p.N
    es = 4 if pb.dtype == F32 else 2
    cq = 16 // es
    ty = "float32" if pb.dtype == F32 else "uint16"
    if p.vT > 0:
        D, Ci = p.vD, p.vC
        return (ty, (W, H, D, Ci, N), (W * es, H * W * es, D * H * W * es, Ci * D * H * W * es),
                (p.tma_bc, 1, p.vT * p.vdd, p.vC, 1), (1, 1, p.vdd, 1, 1))
    if lm == WG_LM_TVEC:
        ew = 2 if p.sw2_sub > 0 else 1
        return (ty, (cq, C // cq, W, H, N), (16, C * es, W * C * es, H * W * C * es), (cq, 1, ew * p.tma_bc, 1, 1),
                (1, 1, ew, 1, 1))
    return ty, (W, H, C, N), (W * es, H * W * es, C * H * W * es), (p.tma_bc, 1, 8, 1), (1, 1, 1, 1)
