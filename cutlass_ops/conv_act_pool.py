"""Family A fused kernels' ABI (csrc/fused_conv_act_pool/): the parameter structs as ctypes mirrors, the design
constants the host planner shares with the kernels, and every kernel instantiation the planner may pick.

Two kernels: ``fa_wgmma_kernel`` (sm_90a wgmma over a ring of input rows, parameters ``WGParams``) and
``fused_conv_act_pool_kernel`` (the portable mma.sync kernel, ``FAParams``).  Each variant's compile unit carries
static_asserts that its struct and constants match the ones here, so a drift fails the compile, not a launch.
"""
from __future__ import annotations

import ctypes
from ctypes import c_float, c_int, c_longlong, c_ubyte, c_uint, c_ulonglong, c_void_p
from typing import List

from .variants import HOPPER, PORTABLE, Variant, layout_asserts

# codes.h
F32, BF16, F16 = 0, 1, 2
PREC_TF32, PREC_IEEE = 0, 1

# wgmma_params.cuh: segments of output pixels (stride 1, stride-2 columns, two rows per tile), op-list bounds,
# the straight-line op counts, the slack positions per ring-slot plane, the op units that are no tap
WG_NT, WG_NT2, WG_NT_R2 = 256, 128, 64
WG_MAXOPS, WG_OPS3X3 = 64, 10
WG_COL16_OPS, WG_COL16_J = 5, 4
WG_PAD = 8
WG_UNIT_NONE, WG_UNIT_BIAS = -1, -2
# input loaders (wgmma_params.cuh: what each reads and how)
WG_LM_VEC, WG_LM_ELEM, WG_LM_REG, WG_LM_NCHW4, WG_LM_NCHW8, WG_LM_TVEC, WG_LM_TNCHW = range(7)
# mma_sync_kernel.cuh: K units (filter taps x 8 input channels) its register-resident weights hold
NU_MAX = 9


def wg_lm_tma(lm: int) -> bool:
    return lm in (WG_LM_TVEC, WG_LM_TNCHW)


def wg_lm_c16(lm: int) -> bool:
    """Loaders with straight-line kernels for op lists as long as a 3x3 filter's over 9..16 channels."""
    return wg_lm_tma(lm) or lm in (WG_LM_NCHW4, WG_LM_NCHW8)


def wg_ops_c16(dtype: int) -> int:
    """That op count: fp32 18 taps + the bias op; 16-bit 9 channel-group pairs + the bias op."""
    return 19 if dtype == F32 else 10


def wg_dstride(nops: int) -> int:
    """Entries per (ring slot, half) row of the B descriptor table (WG_DSTRIDE in wgmma_issue.cuh)."""
    return nops + 1 if nops == WG_COL16_OPS else nops if nops > 0 else WG_MAXOPS


_I64 = c_longlong
_U64 = c_ulonglong
_OPS = c_int * WG_MAXOPS
_UOPS = c_uint * WG_MAXOPS


def _fields(*groups):
    return [(name, ty) for names, ty in groups for name in names.split()]


class WGParams(ctypes.Structure):
    """fa_wgmma_kernel's parameters (wgmma_params.cuh, field for field); CUtensorMap is 64-byte aligned, so the struct
    is padded to a multiple of 64 bytes."""
    _fields_ = _fields(
        ("tmap", c_ubyte * 128),
        ("x w bias out", c_void_p),
        ("N C H W K R S sh ph pw dh dw", c_int),
        ("P Q act pool det nhwc gelu_fast fulltile", c_int),
        ("h2", c_int),
        ("CG nops nseg TWa RB D", c_int),
        ("na col_j col_rd2", c_int),
        ("plane_bytes nq", c_int),
        ("slot_bytes small_off ones_off ring_off a_small_off dtab_off", c_int),
        ("mCG mTWa mHP mNQ mRB", _U64), ("sCG sTWa sHP sNQ sRB", c_int),
        ("L lines_img", _I64), ("G J", c_int),
        ("inv_pq", c_float),
        ("op_u0 op_u1", _OPS),
        ("op_wo op_wn", _OPS * 2),
        ("op_d op_mask op_hi", _UOPS),
        ("op_rd", _OPS), ("slot16", c_int),
        ("ws_part ws_max ws_cnt", c_void_p),
        ("tma_nbox tma_bc tma_bytes tma_cols tma_delta NST stage_off stage_bytes bar_off", c_int),
        ("mST mBC", _U64), ("sST sBC", c_int),
        ("vT vC vD vDout vsd vpd vdd lines_d", c_int),
        ("sw2_sub", c_int),
        ("r2", c_int),
        ("wsc", c_int), ("wsk", _I64),
    )


def _pad_to(struct: type, align: int) -> type:
    size = ctypes.sizeof(struct)
    pad = -size % align
    if not pad:
        return struct
    return type(struct.__name__, (ctypes.Structure,), {"__doc__": struct.__doc__,
                                                      "_fields_": struct._fields_ + [("_pad", c_ubyte * pad)]})


WGParams = _pad_to(WGParams, 64)


class FAParams(ctypes.Structure):
    """fused_conv_act_pool_kernel's parameters (mma_sync_kernel.cuh, field for field)."""
    _fields_ = _fields(
        ("x w bias out", c_void_p),
        ("N", _I64), ("C H W K R S sh sw ph pw dh dw", c_int),
        ("P Q act pool det nhwc vec_ok", c_int),
        ("CG nu", c_int),
        ("BR QS nbands nseg nksl", c_int),
        ("TR TWa", c_int),
        ("mTWa mTR", _U64),
        ("sTWa sTR", c_int),
        ("nitems_total", _I64),
        ("inv_pq", c_float),
        ("ws_part ws_max ws_cnt", c_void_p),
        ("wsk", _I64), ("wsc wsr wss", c_int),
    )


_CONSTANTS = dict(WG_NT=WG_NT, WG_NT2=WG_NT2, WG_NT_R2=WG_NT_R2, WG_MAXOPS=WG_MAXOPS, WG_OPS3X3=WG_OPS3X3,
                  WG_COL16_OPS=WG_COL16_OPS, WG_COL16_J=WG_COL16_J, WG_PAD=WG_PAD, WG_UNIT_NONE=WG_UNIT_NONE,
                  WG_UNIT_BIAS=WG_UNIT_BIAS, WG_LM_VEC=WG_LM_VEC, WG_LM_ELEM=WG_LM_ELEM, WG_LM_REG=WG_LM_REG,
                  WG_LM_NCHW4=WG_LM_NCHW4, WG_LM_NCHW8=WG_LM_NCHW8, WG_LM_TVEC=WG_LM_TVEC, WG_LM_TNCHW=WG_LM_TNCHW,
                  FF_F32=F32, FF_BF16=BF16, FF_F16=F16)


def _constant_asserts(names) -> str:
    return "".join(f'static_assert({n} == {_CONSTANTS[n]}, "{n} differs from cutlass_ops/conv_act_pool.py");\n'
                   for n in names)


WG_HEADER = "fused_conv_act_pool/wgmma_kernel.cuh"
MMA_HEADER = "fused_conv_act_pool/mma_sync_kernel.cuh"
WG_CHECKS = (layout_asserts(WGParams, "WGParams") + _constant_asserts(_CONSTANTS)
             + "".join(f'static_assert(WG_DSTRIDE({n}) == {wg_dstride(n)}, "WG_DSTRIDE");\n' for n in (0, 5, 10, 19)))
MMA_CHECKS = (layout_asserts(FAParams, "FAParams") + _constant_asserts(("FF_F32", "FF_BF16", "FF_F16"))
              + f'static_assert(NU_MAX == {NU_MAX}, "NU_MAX differs from cutlass_ops/conv_act_pool.py");\n')


def _b(v: bool) -> str:
    return "true" if v else "false"


# NVRTC 12.1 (torch 2.4's PyPI wheels bring it) crashes with a segmentation fault compiling any fa_wgmma_kernel;
# 12.2, 12.3, 12.4, 12.6, 12.8 and 13.x compile them (the other kernels compile with 12.1)
WG_MIN_NVRTC = (12, 2)


def wg_variant(dt: int, split: bool, lm: int, nops: int, minb: int, vol: bool, sw2: bool = False,
               r2: bool = False) -> Variant:
    """fa_wgmma_kernel<DT, SPLIT, LM, NOPS, MINB, VOL, SW2, R2> (every template argument spelled out)."""
    args = f"{dt}, {_b(split)}, {lm}, {nops}, {minb}, {_b(vol)}, {_b(sw2)}, {_b(r2)}"
    return Variant(WG_HEADER, f"fa_wgmma_kernel<{args}>", HOPPER, WG_CHECKS, WG_MIN_NVRTC)


def mma_variant(dt: int, split: bool, full: bool) -> Variant:
    """fused_conv_act_pool_kernel<DT, SPLIT, MT, NW = 4, FULL>: 3xTF32 (SPLIT) keeps 2 M tiles per warp for its
    registers, the rest 4; FULL = the register-resident weights hold all NU_MAX K units (fully unrolled)."""
    return Variant(MMA_HEADER, f"fused_conv_act_pool_kernel<{dt}, {_b(split)}, {2 if split else 4}, 4, {_b(full)}>",
                   PORTABLE, MMA_CHECKS)


def wg_straight_ops(dtype: int, nops: int, col: bool, lm: int, sw2: bool, r2: bool, vol: bool, split: bool) -> int:
    """The op count a straight-line kernel (wgmma issue without a fence per op) exists for, else 0: fp32 3x3 over
    <= 8 channels (9 taps + bias) and 16-bit 3x3 over <= 8 channels with the column pair (5, col), for every loader;
    op lists as long as a 3x3 filter's over 9..16 channels (wg_ops_c16: fp32 18 + the bias op, 16-bit 9
    channel-group pairs + the bias op; 16-bit 5x3 over <= 8 too) for a Conv2d whose rows come by TMA or NCHW's 16-byte
    copies (wg_lm_c16), one row per tile, stride-1 columns, not ieee.  Others (another 16-bit filter of 5 ops too)
    take the general kernel, which fences every wgmma."""
    if dtype == F32 and nops == WG_OPS3X3:
        return nops
    if col:
        return nops if nops == WG_COL16_OPS else 0
    return nops if nops == wg_ops_c16(dtype) and wg_lm_c16(lm) and not (sw2 or r2 or vol or split) else 0


def plan_straight_ops(dtype: int, precision: int, lm: int, p: WGParams) -> int:
    """wg_straight_ops of a plan's parameters."""
    return wg_straight_ops(dtype, p.nops, p.col_j >= 0, lm, p.sw2_sub > 0, p.r2 != 0, p.vT > 0,
                           dtype == F32 and precision == PREC_IEEE)


def wg_plan_variant(dtype: int, precision: int, lm: int, p: WGParams) -> Variant:
    """The wgmma build that serves a plan of loader ``lm`` with parameters ``p``."""
    vol, sw2 = p.vT > 0, p.sw2_sub > 0
    klm = wg_kernel_loader(dtype, lm, vol, sw2)
    return wg_kernel_for(dtype, dtype == F32 and precision == PREC_IEEE, klm, vol, sw2,
                         plan_straight_ops(dtype, precision, klm, p), p.r2 != 0)


def mma_plan_variant(dtype: int, precision: int, nu: int) -> Variant:
    """The mma.sync build that serves a plan of nu K units."""
    return mma_variant(dtype, dtype == F32 and precision == PREC_IEEE, nu == NU_MAX)


def wg_kernel_loader(dt: int, lm: int, vol: bool, sw2: bool) -> int:
    """The loader a kernel is built for, of the loader a plan picked: a Conv3d's per-element / NCHW / TNCHW builds,
    stride-2 columns' TVEC / TNCHW builds, else the plan's own (the per-element one for any other)."""
    cols, anyl = (WG_LM_NCHW4, WG_LM_ELEM) if dt == F32 else (WG_LM_NCHW8, WG_LM_REG)
    if vol:
        return lm if lm in (WG_LM_TNCHW, cols) else anyl
    if sw2:
        return WG_LM_TVEC if lm == WG_LM_TVEC else WG_LM_TNCHW
    return lm if lm in (WG_LM_TVEC, WG_LM_TNCHW, WG_LM_VEC, cols) else anyl


def wg_kernel_for(dt: int, split: bool, lm: int, vol: bool, sw2: bool, line_ops: int, r2: bool) -> Variant:
    """The wgmma build serving a plan: ``lm`` the kernel's loader (wg_kernel_loader), ``line_ops`` the straight-line
    op count of the plan (0: the general chain, which fences every wgmma).
    Register budgets (MINB, __launch_bounds__): 3xTF32 2 blocks per SM; TF32 Conv2d 4 (128 registers) for the
    general chain, 3 (168) for the straight-line 3x3 kernel (the planner runs at most 3 blocks per SM: 168 registers
    measured 0.584 / 0.743 ms NHWC / NCHW at the seed against 0.674 / 0.847 for 4 blocks of 128); 16-bit and Conv3d
    3.  Stride-2 columns and two rows per tile have only the few-blocks builds (straight-line and general); op lists
    as long as a 3x3 filter's over 9..16 channels (wg_ops_c16) a straight-line build of their own (TMA or NCHW
    16-byte rows, one row per tile, stride-1 columns, not ieee, Conv2d)."""
    minb = 2 if split else (4 if dt == F32 and not vol else 3)
    minb_few = 2 if split else 3
    nops_line = WG_OPS3X3 if dt == F32 else WG_COL16_OPS
    line = line_ops == nops_line
    if wg_lm_tma(lm) and not split and not vol and r2:
        return wg_variant(dt, split, lm, nops_line if line else 0, minb_few, vol, sw2, True)
    if not split and wg_lm_c16(lm) and not vol and not sw2 and line_ops == wg_ops_c16(dt):
        return wg_variant(dt, split, lm, wg_ops_c16(dt), minb_few, vol)
    if sw2:
        return wg_variant(dt, split, lm, nops_line if line else 0, minb_few, vol, sw2)
    return wg_variant(dt, split, lm, nops_line, minb_few, vol) if line else wg_variant(dt, split, lm, 0, minb, vol)


def _wg_variants() -> List[Variant]:
    out = []
    for dt, split in ((F32, False), (F32, True), (BF16, False), (F16, False)):
        cols, anyl = (WG_LM_NCHW4, WG_LM_ELEM) if dt == F32 else (WG_LM_NCHW8, WG_LM_REG)
        kinds = ([(lm, True, False) for lm in (WG_LM_TNCHW, cols, anyl)]
                 + [(lm, False, True) for lm in (WG_LM_TVEC, WG_LM_TNCHW)]
                 + [(lm, False, False) for lm in (WG_LM_TVEC, WG_LM_TNCHW, WG_LM_VEC, cols, anyl)])
        for lm, vol, sw2 in kinds:
            for line_ops in (0, WG_OPS3X3 if dt == F32 else WG_COL16_OPS, wg_ops_c16(dt)):
                for r2 in (False, True):
                    v = wg_kernel_for(dt, split, lm, vol, sw2, line_ops, r2)
                    if v not in out:
                        out.append(v)
    return out


VARIANTS: List[Variant] = _wg_variants() + [mma_variant(dt, split, full) for dt, split in
                                            ((F32, False), (F32, True), (BF16, False), (F16, False))
                                            for full in (False, True)]
