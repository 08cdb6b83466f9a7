"""The host planner of family B's fused kernel (csrc/fused_convt_pool_reduce/): a pure function of the problem and the
device's properties that says why the kernel cannot serve a problem, or gives its launch: the fb_kernel variant,
grid, block, dynamic shared memory, workspace bytes and every field of its parameter struct but the pointers.

The problem is the tuple of ``PROBLEM_FIELDS`` (integers): dtype, precision, channels_last, N, C, D, H, W, K, per
dim (d, h, w) kernel T, stride s, padding, output_padding, pooling window, then activation and channel reduction.

Decomposition (kernel.cuh says more): output o = s q + r - p per dim (residue class r = (o + p) mod s) is a stride-1
conv over the input with taps m = 0 .. M_r - 1, M_r = ceil((T - r) / s); a block is one image x one window row in d x
``wh`` (<= 2) window rows in h x ``pwb`` windows in w whose input columns fit the tile's 32; the last wave's items are
split into pieces (window rows, then class groups) so that it fills the SMs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from cutlass_ops.convt_pool_reduce import (KV_BF16, KV_F16, KV_F32, KV_X3, MAXCLS, PACK_OPS, PACK_TILE_ROWS,
                                          PACK_TILE_TAPS, FBParams, PackGeometry)

if TYPE_CHECKING:
    from ..runtime import DeviceProps

PROBLEM_FIELDS = ("dtype", "precision", "channels_last", "N", "C", "D", "H", "W", "K",
                  "Td", "Th", "Tw", "sd", "sh", "sw", "pd", "ph", "pw", "opd", "oph", "opw", "wind", "winh", "winw",
                  "act", "red")
F32, BF16, F16 = 0, 1, 2            # codes.h ff_dtype
PREC_TF32, PREC_IEEE = 0, 1         # codes.h ff_precision
RED_SUM, RED_MEAN, RED_MAX = 0, 1, 2

ROWS = 3            # q_h rows per MMA tile (FB_ROWS)
COLS = 32           # q_w columns per tile row, the input tile's row pitch (FB_COLS)
WH = 2              # window rows (in h) per block, at most (FB_WH)
CINFO = 10          # ints of per-class block info in shared memory (FB_CINFO)
ROW_BYTES = COLS * 16                       # one tile row of one 16-byte channel plane (FB_ROW_BYTES)
TILE_SLACK = ROWS * COLS * 16 + 512         # a 3-row tile may read this far past its last row (FB_TILE_SLACK)
SMEM_LIMIT = 227 * 1024                     # sm_90's opt-in shared memory per block (H100, H200)
NBUF = {KV_F32: 3, KV_BF16: 4, KV_F16: 4, KV_X3: 3}   # weight buffers per warpgroup (FB_NBUF32 / 16 / X3)
PACK_PER_THREAD = 8     # items of the weight packing per thread and chunk (FB_PACK_PER_THREAD)
PREFIX = "fused convT-pool-reduce: "


def taps_per_step(kv: int) -> int:
    """2 for 16-bit input (a step's barrier, copies and descriptors serve twice the MMAs); 1 for fp32, whose two
    warpgroups' buffers of 2 x 8 KB taps would not fit beside the 160 KB tile."""
    return 1 if kv in (KV_F32, KV_X3) else 2


def warpgroups(kv: int) -> int:
    return 1 if kv == KV_X3 else 2     # "ieee": one warpgroup (its two tiles leave no room for a second's buffers)


def tiles_per_group(kv: int) -> int:
    return 3 * warpgroups(kv)


def ks16(ks: int) -> int:
    """bf16 k steps of the "ieee" variant's x_lo term."""
    return (ks + 1) // 2


def slice_bytes(kv: int, ks: int) -> int:
    """One tap's packed weights: 2 KB per k step; "ieee" packs [w_hi tf32 | w_lo tf32 | bf16(w)] per tap."""
    return ks * 4096 + ks16(ks) * 2048 if kv == KV_X3 else ks * 2048


def slice_items(kv: int, ks: int) -> int:
    """Items of one packed slice, as fb_pack::slice_items counts them: C_pad x 64 (4-byte tf32 or 2-byte 16-bit
    values); "ieee" C_pad x 64 (tf32 hi, lo pairs) + C_pad16 x 64 (bf16)."""
    return ks * 512 + ks16(ks) * 1024 if kv == KV_X3 else ks * (512 if kv == KV_F32 else 1024)


def fill_pack_geometry(g: PackGeometry, kv: int, ks: int, c: int, k: int, T: Sequence[int], s: Sequence[int]) -> None:
    """Every field of the packing's geometry g (fb_pack::Geometry) but the weight's strides, for kernel variant kv at
    ks k steps, C_in c, C_out k, taps T and strides s per dim."""
    g.op = PACK_OPS["ieee" if kv == KV_X3 else "tf32" if kv == KV_F32 else "copy16"]
    g.C, g.K = c, k
    g.cpad, g.cpad16 = (8 if kv in (KV_F32, KV_X3) else 16) * ks, 16 * ks16(ks) if kv == KV_X3 else 0
    for a in range(3):
        g.T[a], g.s[a] = T[a], s[a]
    g.nslices = T[0] * T[1] * T[2]


def ksteps(dtype: int, c: int) -> int:
    """K steps of the kernel serving C input channels: 8 channels each for fp32 (C padded up to 8, 16, 32, 64), 16
    for bf16 / fp16 (up to 16, 32, 64); the packed weights use the same padding (convt_pool_reduce.padded_channels)."""
    if dtype == F32:
        return 1 if c <= 8 else 2 if c <= 16 else 4 if c <= 32 else 8
    return 1 if c <= 16 else 2 if c <= 32 else 4


def _cdiv(a: int, b: int) -> int:
    """C's integer division (toward zero), as the kernel computes."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _floordiv(a: int, b: int) -> int:
    return a // b      # fb_floordiv (b > 0)


def cols_needed(pw0: int, npw: int, win: int, s: int, pad: int, mmax: int) -> int:
    """Input columns a block of windows [pw0, pw0 + npw) needs: q_w from the first window's lowest class to the
    last window's highest, plus the taps' reach."""
    last = (pw0 + npw) * win - 1 + pad
    return last // s - (pw0 * win + pad) // s + mmax if last >= 0 else 0


@dataclass(frozen=True)
class Plan:
    """A problem's launch: ``why`` is None where the kernel serves it (then every other field is set)."""
    why: Optional[str]
    # every field but x, wp, bias, out, ws, ws_cnt, w, pack_cnt, pg.ws and ncdhw_vec (per call)
    params: Optional[FBParams] = None
    has_act: bool = False
    ks: int = 0
    kv: int = 0                         # kernel variant: KV_F32 / KV_BF16 / KV_F16 / KV_X3
    smem: int = 0                       # dynamic shared memory per block
    blocks: int = 0                     # grid (x): params.nblocks computing, the rest packing only
    pack_grid: Optional[Tuple[int, int, int]] = None   # the packing kernel's grid where it runs before this kernel
    threads: int = 0                    # block (x): 128 per warpgroup
    ws_parts: int = 0                   # workspace: [ws_parts][wh][pwb][64] window maxima, then [ws_parts] counters,
    ws_bytes: int = 0                   # then at ws_pack_offset the packing's 3 counters (zeroed once by the caller,
    ws_pack_offset: int = 0             # left zeroed by every launch)

    @property
    def ws_cnt_offset(self) -> int:
        """Byte offset of the piece counters in the workspace."""
        return self.ws_parts * self.params.wh * self.params.pwb * 64 * 4 if self.params is not None else 0

    @property
    def vec_columns(self) -> int:
        """NCDHW 16-byte column groups (ncdhw_vec) need W % this == 0 and a 16-byte aligned input."""
        return 8 if self.kv in (KV_BF16, KV_F16) else 4


def _refuse(why: str) -> Plan:
    return Plan(PREFIX + why)


def plan(problem: Sequence[int], props: "DeviceProps") -> Plan:
    """The plan of ``problem`` (PROBLEM_FIELDS) on a device with properties ``props`` (runtime.DeviceProps: the
    kernel is wgmma code, compute capability 9.0 only; the last wave's split depends on the SM count)."""
    if len(problem) != len(PROBLEM_FIELDS):
        raise ValueError(f"fullfuse: a family-B problem has {len(PROBLEM_FIELDS)} values, got {len(problem)}")
    q = [int(v) for v in problem]
    dtype, precision, channels_last, n, c, d, h, w, k = q[:9]
    T, s, pad, outpad, win = q[9:12], q[12:15], q[15:18], q[18:21], q[21:24]
    act, red = q[24], q[25]
    if dtype not in (F32, BF16, F16):
        return _refuse("bad dtype")
    if precision not in (PREC_TF32, PREC_IEEE):
        return _refuse("bad precision code")
    kv = KV_X3 if dtype == F32 and precision == PREC_IEEE else dtype
    if c % (4 if dtype == F32 else 8) != 0 or c > 64:
        return _refuse("needs C_in <= 64 and C_in % 4 == 0 (fp32) or % 8 == 0 (bf16 / fp16)")
    if k > 64:
        return _refuse("C_out > 64")
    if not (0 <= act <= 4 and 0 <= red <= 2):
        return _refuse("bad activation/reduction code")
    if n <= 0:
        return _refuse("empty batch")
    if (props.major, props.minor) != (9, 0):
        return _refuse("needs sm_90 (wgmma)")
    ks = ksteps(dtype, c)
    if kv == KV_X3 and ks > 4:
        return _refuse("precision ieee needs C_in <= 32 (two tiles in shared memory)")
    p = FBParams()
    p.N, p.C, p.D, p.H, p.W, p.K, p.act, p.red = n, c, d, h, w, k, act, red
    p.channels_last = int(channels_last != 0)
    p.inv_k = 1.0 / k if k else float("inf")
    size = (d, h, w)
    P, Mmax = [0, 0, 0], [0, 0, 0]
    ncls = 1
    for a in range(3):
        p.T[a], p.s[a], p.p[a], p.win[a] = T[a], s[a], pad[a], win[a]
        if T[a] <= 0 or s[a] <= 0 or pad[a] < 0 or outpad[a] < 0 or win[a] <= 0:
            return _refuse("bad parameters")
        out = (size[a] - 1) * s[a] - 2 * pad[a] + T[a] + outpad[a]
        P[a] = p.P[a] = _cdiv(out, win[a])
        if P[a] <= 0:
            return _refuse("empty pooled output")
        ncls *= s[a]
        Mmax[a] = p.Mmax[a] = (T[a] + s[a] - 1) // s[a]
    if ncls > MAXCLS:
        return _refuse("more than 27 residue classes")
    p.ncls = ncls
    cls_r, cls_M = [], []
    first = 0
    for cl in range(ncls):
        r = (cl // (s[1] * s[2]), (cl // s[2]) % s[1], cl % s[2])
        m = tuple((T[a] - r[a] + s[a] - 1) // s[a] if r[a] < T[a] else 0 for a in range(3))
        for a in range(3):
            p.cls_r[cl][a], p.cls_M[cl][a] = r[a], m[a]
        p.cls_slice[cl] = first
        first += m[0] * m[1] * m[2]
        cls_r.append(r)
        cls_M.append(m)

    # windows per block in w: as many as keep every block's input columns within the tile's 32
    pwb = 0
    for cand in range(P[2], 0, -1):
        if all(cols_needed(pw0, min(cand, P[2] - pw0), win[2], s[2], pad[2], Mmax[2]) <= COLS
               for pw0 in range(0, P[2], cand)):
            pwb = cand
            break
    if not pwb:
        return _refuse("one pooling window's input columns exceed the 32-column tile")
    p.pwb, p.nwc = pwb, -(-P[2] // pwb)

    # window rows per block in h: WH when its tile fits in shared memory, else 1
    nt, tps, nwg = tiles_per_group(kv), taps_per_step(kv), warpgroups(kv)
    limit = min(SMEM_LIMIT, props.smem_optin)
    smem = 0
    for wh in range(min(WH, P[1]), 0, -1):
        nhb = -(-P[1] // wh)
        p.wh, p.nhb = wh, nhb
        # tile rows: input rows q - m over the block's windows (one in d, wh in h); the span and the step count
        # depend on the block's first output index mod s only
        wins, nblk = (1, wh), (P[0], nhb)
        ext = [0, 0]
        for a in range(2):
            for kk in range(min(s[a], nblk[a])):
                x0 = kk * wins[a] * win[a] + pad[a]
                length = min(wins[a], P[a] - kk * wins[a]) * win[a]
                ext[a] = max(ext[a], (x0 + length - 1) // s[a] - x0 // s[a] + Mmax[a])
        p.nd, p.nh = ext
        max_steps = 0
        for kd in range(min(s[0], nblk[0])):
            for kh in range(min(s[1], nblk[1])):
                o = (kd * win[0], kh * wh * win[1])
                length = (win[0], min(wh, P[1] - kh * wh) * win[1])
                total = 0
                for cl in range(ncls):
                    nq = [_floordiv(o[a] + length[a] - 1 + pad[a] - cls_r[cl][a], s[a])
                          - _floordiv(o[a] + pad[a] - cls_r[cl][a] + s[a] - 1, s[a]) + 1 for a in range(2)]
                    taps = cls_M[cl][0] * cls_M[cl][1] * cls_M[cl][2]
                    if nq[0] <= 0 or nq[1] <= 0 or taps == 0:
                        continue
                    tiles = nq[0] * (-(-nq[1] // ROWS))
                    total += -(-tiles // nt) * (-(-taps // tps))
                max_steps = max(max_steps, total)
        p.max_steps = max_steps
        p.plane_bytes = p.nd * p.nh * ROW_BYTES
        p.tile_bytes = 2 * ks * p.plane_bytes
        p.tile_alloc = p.tile_bytes + TILE_SLACK
        if kv == KV_X3:
            p.tile_alloc += 2 * ks16(ks) * p.plane_bytes + TILE_SLACK    # + the x_lo tile (bf16)
        smem = (p.tile_alloc + nwg * NBUF[kv] * tps * slice_bytes(kv, ks) + wh * pwb * 64 * 4 + max_steps * 16
                + ncls * CINFO * 4 + ncls * COLS)
        if smem <= limit:
            break
    if smem > limit:
        return _refuse("the input tile of one window row does not fit in shared memory")

    # one block per SM: the last wave holds `tail` items; split them into window rows (when that fits the SMs), then
    # into class groups (at most ncls / 2 of them with two warpgroups: a class each) as far as the SMs go
    items = n * P[0] * p.nhb * p.nwc
    sm_count = props.sm_count
    tail = items % sm_count if sm_count > 0 else 0
    p.tail_nhalf = p.wh if (tail > 0 and p.wh > 1 and p.wh * tail <= sm_count) else 1
    gmax = ncls // 2 if nwg == 2 else ncls
    p.tail_g = max(1, min(sm_count // (tail * p.tail_nhalf), gmax)) if tail > 0 else 1
    p.nfull = items - tail if (p.tail_nhalf > 1 or p.tail_g > 1) else items
    blocks = p.nfull + (items - p.nfull) * p.tail_nhalf * p.tail_g
    ws_parts = (items - p.nfull) * p.tail_nhalf if p.tail_g > 1 else 0   # tail parts combining in global memory
    # the weight packing (every launch: the weights as they are now).  A grid of more than one wave: the packing
    # kernel just before (pack_grid; the fused kernel's first blocks load their tiles while it runs, then wait for it),
    # so that no later block touches the packing's counters (in-kernel: +0.4 to +3.8 % at the seed).  Else the
    # kernel's blocks pack in chunks (weight_pack.cuh; pack_chunks), with blocks that only pack where the grid has
    # fewer blocks than chunks and SMs: one launch per call.
    fill_pack_geometry(p.pg, kv, ks, c, k, T, s)
    p.pack_total = p.pg.nslices * slice_items(kv, ks)
    pack_grid = packing_grid(p.pg) if blocks > sm_count else None
    p.pack_chunks = 0 if pack_grid else -(-p.pack_total // (PACK_PER_THREAD * 128 * nwg))
    pack_blocks = max(0, min(sm_count, p.pack_chunks) - blocks)
    p.nblocks = blocks
    if blocks + pack_blocks > 0x7FFFFFFF:
        return _refuse("too many blocks")
    ws_pack = -(-ws_parts * (p.wh * pwb * 64 + 1) * 4 // 16) * 16   # the packing's counters, after the tail's
    return Plan(None, p, has_act=act != 0, ks=ks, kv=kv, smem=smem, blocks=blocks + pack_blocks, threads=128 * nwg,
                pack_grid=pack_grid, ws_parts=ws_parts, ws_bytes=ws_pack + 16, ws_pack_offset=ws_pack)


def packing_grid(g: PackGeometry) -> Optional[Tuple[int, int, int]]:
    """The packing kernel's grid (fb_pack::pack_kernel, PACK_THREADS per block) for geometry ``g``: one block per
    tile of PACK_TILE_ROWS (c, k) rows of one slice channel group over up to PACK_TILE_TAPS taps, per part of a slice
    (16-bit or tf32 values; "ieee" also its bf16 values, in channel groups of 8); None where there is nothing to
    pack."""
    if not (g.nslices and g.cpad):
        return None
    chunks = -(-g.nslices // PACK_TILE_TAPS)
    group = 8 if g.op == PACK_OPS["copy16"] else 4
    tiles = g.cpad // group * (64 * group // PACK_TILE_ROWS) * chunks
    if g.op == PACK_OPS["ieee"]:
        tiles += g.cpad16 // 8 * (64 * 8 // PACK_TILE_ROWS) * chunks
    return tiles, 1, 1

