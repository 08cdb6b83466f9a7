"""How the fallbacks' epilogue kernels are launched for one problem: which instantiation, grid, block, dynamic shared
memory, scalar arguments and workspace size: pure arithmetic (no GPU, no torch).  The kernels' contracts are in
the headers' comments (csrc/fallback_act_pool.cuh, csrc/fallback_window_reduce.cuh).

Integers follow the kernels' C types; divisions of positive values are floor divisions as in C.  ``aligned16``: the
conv output's address is a multiple of 16 (the 16-byte loads need it; the caller passes ``data_ptr() % 16 == 0``).
"""
from __future__ import annotations

from ctypes import c_float, c_int, c_longlong, c_uint
from dataclasses import dataclass
from typing import Dict, Tuple

from cutlass_ops import fallback as abi
from cutlass_ops.variants import Variant

THREADS = 256                 # kThreads of both kernels
WARPS = THREADS // 32
INT_MAX = 0x7FFFFFFF
TAB_MAX = 8192                # window offsets in the shared-memory table at most (32 KB)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- family A: act + global pool (ff_act_pool)

def act_pool_items(n: int, k: int, s: int, channels_last: bool) -> Tuple[int, int]:
    """(C, len): C items per plane of ``len`` elements (NCHW), or C row chunks of ``len`` rows per image
    (channels_last).  Depends on the shape only, so the workspace size is known before the dtype."""
    if not channels_last:   # warp items over a plane of s contiguous elements
        planes = n * k
        c = ceil_div(s, 8192)
        while planes * c < 8192 and ceil_div(s, c) > 2048:   # small batch: more, shorter items
            c *= 2
        c = min(c, 4096)                                      # bounds the finish (<= 128 partials a lane)
        length = ceil_div(ceil_div(s, c), 256) * 256
        return ceil_div(s, length), length
    rows = max(32768 // k, 64)                                # ~32 K elements a block item; partials <= y / 64
    while n * ceil_div(s, rows) < 1024 and rows > 8:
        rows = ceil_div(rows, 2)
    if ceil_div(s, rows) > 4096:
        rows = ceil_div(s, 4096)
    return ceil_div(s, rows), rows


def _counters_bytes(count: int) -> int:
    return ceil_div(count * 4, 256) * 256


def act_pool_workspace_bytes(n: int, k: int, s: int, channels_last: bool) -> int:
    """Bytes of the zero-filled workspace a call needs (0: none): int counters (one per plane, or per image where
    channels_last), padded to 256 bytes, then the float partials.  Empty where no plane / image is split."""
    if n < 1 or k < 1 or s < 1:
        return 0
    items, _ = act_pool_items(n, k, s, channels_last)
    if items == 1:
        return 0
    return _counters_bytes(n if channels_last else n * k) + n * k * items * 4


@dataclass(frozen=True)
class ActPoolLaunch:
    """One family-A epilogue launch: the kernel's arguments are (y, bias, out, *scalars, counters, partials)."""
    variant: Variant
    grid: Tuple[int, int, int]
    scalars: Tuple[Tuple[type, object], ...]   # (ctypes type, value) in argument order
    workspace_bytes: int
    partials_offset: int          # byte offset of the partials in the workspace (after the counters)


def act_pool(n: int, k: int, s: int, channels_last: bool, dtype: int, activation: int, pool: int,
             aligned16: bool) -> ActPoolLaunch:
    """The launch of ``ff_act_pool`` for y of n x k x s elements of dtype code ``dtype``.  Raises ValueError where
    the kernels cannot take the problem (empty, n * k >= 2^31, more than 2^31 - 1 blocks)."""
    if n < 1 or k < 1 or s < 1 or n * k > INT_MAX:
        raise ValueError(f"fullfuse: the act-pool epilogue cannot take N={n}, K={k}, S={s}")
    items, length = act_pool_items(n, k, s, channels_last)
    scale = (c_float, 1.0 / s)    # rounded to float32 by ctypes, as the C cast (float)(1.0 / (double)S) did
    workspace = act_pool_workspace_bytes(n, k, s, channels_last)
    counters = _counters_bytes(n if channels_last else n * k) if workspace else 0
    if not channels_last:
        grid = (ceil_div(n * k, WARPS), items, 1)
        scalars = ((c_uint, n * k), (c_uint, k), (c_longlong, s), (c_int, items), (c_longlong, length), scale)
        return ActPoolLaunch(abi.pool_planes(dtype, activation, pool), grid, scalars, workspace, counters)
    vw = abi.vector_width(dtype)
    vec = k % vw == 0 and aligned16
    kv = k // vw if vec else k
    cw = min(kv, THREADS)
    blocks_per_row = ceil_div(kv, cw)
    blocks = n * items * blocks_per_row
    if blocks > INT_MAX:
        raise ValueError(f"fullfuse: the act-pool epilogue cannot take N={n}, K={k}, S={s} ({blocks} blocks)")
    scalars = ((c_longlong, k), (c_longlong, s), (c_int, items), (c_longlong, length), (c_int, blocks_per_row),
               (c_int, cw), (c_int, THREADS // cw), scale)
    return ActPoolLaunch(abi.pool_rows(dtype, activation, pool, vec), (blocks, 1, 1), scalars, workspace, counters)


# ------------------------------------------- family B: window max + channel reduction (ff_window_reduce)

@dataclass(frozen=True)
class WindowReduceLaunch:
    """One family-B epilogue launch: the kernel's arguments are (y, bias, out, Geo); ``blocks == 0``: empty output,
    nothing to launch."""
    variant: Variant
    blocks: int
    smem: int                     # dynamic shared memory bytes (the window offset table)
    geo: Dict[str, object]        # field -> value of cutlass_ops.fallback.Geo


def window_reduce(shape: Tuple[int, int, int, int, int], strides: Tuple[int, int, int, int, int],
                  window: Tuple[int, int, int], dtype: int, activation: int, reduction: int,
                  aligned16: bool) -> WindowReduceLaunch:
    """The launch of ``ff_window_reduce`` for y of ``shape`` (N, K, D, H, W) with element ``strides``, window
    (wd, wh, ww) = stride.  Raises ValueError where the kernel cannot take the problem."""
    n, k, d, h, w = shape
    s_n, s_k, s_d, s_h, s_w = strides
    wd, wh, ww = window
    if min(n, d, h, w) < 0 or min(wd, wh, ww) < 1:
        raise ValueError(f"fullfuse: the window-reduce epilogue cannot take y {shape}, window {window}")
    dp, hp, wp = d // wd, h // wh, w // ww
    n_out = n * dp * hp * wp
    variant = abi.window_reduce(dtype, activation, reduction, False)
    if n_out == 0:
        return WindowReduceLaunch(variant, 0, 0, {})
    positions = wd * wh * ww
    if k < 1 or positions > INT_MAX or n_out > INT_MAX:
        raise ValueError(f"fullfuse: the window-reduce epilogue cannot take y {shape}, window {window}")
    if k == 1:
        s_k = 1                   # a size-1 dim's stride is irrelevant
    span = (wd - 1) * abs(s_d) + (wh - 1) * abs(s_h) + (ww - 1) * abs(s_w)
    use_tab = positions <= TAB_MAX and span <= INT_MAX
    vw = abi.vector_width(dtype)
    vec = s_k == 1 and k % vw == 0 and aligned16 and all(x % vw == 0 for x in (s_n, s_d, s_h, s_w))
    if s_k == 1:                  # channel-fast: lanes along channels
        kv = k // vw if vec else k
        cl = ceil_div(kv, ceil_div(kv, 32))
        pl = min(32 // cl, positions)
        cs_stride, ps_stride = 1, cl
    else:                         # position-fast: lanes along window positions
        pl = min(positions, 32)
        cl = min(32 // pl, k)
        cs_stride, ps_stride = pl, 1
    geo = dict(K=k, sN=s_n, sK=s_k, sD=s_d, sH=s_h, sW=s_w, Dp=dp, Hp=hp, Wp=wp, n_out=n_out, wd=wd, wh=wh, ww=ww,
               P=positions, CL=cl, PL=pl, cs_stride=cs_stride, ps_stride=ps_stride, use_tab=int(use_tab),
               scale=1.0 / k)
    if vec:
        variant = abi.window_reduce(dtype, activation, reduction, True)
    return WindowReduceLaunch(variant, ceil_div(n_out, WARPS), positions * 4 if use_tab else 0, geo)
