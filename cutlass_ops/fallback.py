"""The fallbacks' epilogue kernels (csrc/fallback_act_pool.cuh, csrc/fallback_window_reduce.cuh): their ABI and every
instantiation the host side (fullfuse/fallback/epilogue_plan.py) may pick.

Template parameters are the integer codes of csrc/codes.h (dtype, activation, pool, reduction) and a load width:
- ``ff_act_pool::pool_planes<T, ACT, MAX>`` (NCHW / NCDHW conv output; 16-byte loads after a scalar head);
- ``ff_act_pool::pool_rows<T, ACT, MAX, V>`` (channels_last), V = 16 / sizeof(T) or 1;
- ``ff_window_reduce::window_reduce<T, ACT, RED, V>``, V = 16 / sizeof(T) or 1, with ``Geo`` by value.
3 dtypes x 5 activations (family A's epilogues also for an fp16 model's float32 conv output): 40 + 80 + 90 units,
sm_80 code (portable).
"""
from __future__ import annotations

import ctypes
from ctypes import c_float, c_int, c_longlong, c_uint
from typing import List

from .variants import PORTABLE, Variant, layout_asserts

ACT_POOL_HEADER = "fallback_act_pool.cuh"
WINDOW_REDUCE_HEADER = "fallback_window_reduce.cuh"
# by dtype code (codes.h: FF_F32, FF_BF16, FF_F16), then F16_RANGE: an fp16 model's conv output stored as float32,
# given fp16's overflow in the epilogue (activation.cuh: ff_f16_range; family A only)
C_TYPES = ("float", "__nv_bfloat16", "__half", "ff_f16_range")
ITEM_BYTES = (4, 2, 2, 4)
F16_RANGE = 3
ACTIVATION_CODES = range(5)                      # FF_ACT_NONE .. FF_ACT_SILU
POOL_CODES = range(2)                            # FF_POOL_MEAN, FF_POOL_MAX
REDUCTION_CODES = range(3)                       # FF_RED_SUM, FF_RED_MEAN, FF_RED_MAX
POOL_MAX, RED_MAX = 1, 2


class Geo(ctypes.Structure):
    """ff_window_reduce::Geo: window_reduce's problem, passed by value (epilogue_plan.window_reduce fills it)."""
    _fields_ = [
        ("K", c_longlong), ("sN", c_longlong), ("sK", c_longlong), ("sD", c_longlong), ("sH", c_longlong),
        ("sW", c_longlong),
        ("Dp", c_uint), ("Hp", c_uint), ("Wp", c_uint), ("n_out", c_uint),
        ("wd", c_int), ("wh", c_int), ("ww", c_int), ("P", c_int),
        ("CL", c_int), ("PL", c_int),
        ("cs_stride", c_int), ("ps_stride", c_int),
        ("use_tab", c_int),
        ("scale", c_float),
    ]


_GEO_CHECKS = layout_asserts(Geo, "ff_window_reduce::Geo")


def vector_width(dtype: int) -> int:
    """Elements per 16-byte load of dtype code ``dtype``."""
    return 16 // ITEM_BYTES[dtype]


def _bool(flag) -> str:
    return "true" if flag else "false"


def _check_codes(dtype: int, activation: int) -> None:
    if dtype not in range(len(C_TYPES)) or activation not in ACTIVATION_CODES:
        raise ValueError(f"fullfuse: no fallback epilogue for dtype code {dtype}, activation code {activation}")


def pool_planes(dtype: int, activation: int, pool: int) -> Variant:
    """Family A's epilogue over an NCHW / NCDHW conv output."""
    _check_codes(dtype, activation)
    if pool not in POOL_CODES:
        raise ValueError(f"fullfuse: unknown pool code {pool}")
    return Variant(ACT_POOL_HEADER,
                   f"ff_act_pool::pool_planes<{C_TYPES[dtype]}, {activation}, {_bool(pool == POOL_MAX)}>", PORTABLE)


def pool_rows(dtype: int, activation: int, pool: int, vectorized: bool) -> Variant:
    """Family A's epilogue over a channels_last conv output; ``vectorized``: 16-byte loads."""
    _check_codes(dtype, activation)
    if pool not in POOL_CODES:
        raise ValueError(f"fullfuse: unknown pool code {pool}")
    v = vector_width(dtype) if vectorized else 1
    return Variant(ACT_POOL_HEADER,
                   f"ff_act_pool::pool_rows<{C_TYPES[dtype]}, {activation}, {_bool(pool == POOL_MAX)}, {v}>", PORTABLE)


def window_reduce(dtype: int, activation: int, reduction: int, vectorized: bool) -> Variant:
    """Family B's epilogue; ``vectorized``: 16-byte loads along channels."""
    _check_codes(dtype, activation)
    if dtype == F16_RANGE:
        raise ValueError("fullfuse: family B's epilogue reads the conv output in the model's dtype")
    if reduction not in REDUCTION_CODES:
        raise ValueError(f"fullfuse: unknown reduction code {reduction}")
    v = vector_width(dtype) if vectorized else 1
    return Variant(WINDOW_REDUCE_HEADER,
                   f"ff_window_reduce::window_reduce<{C_TYPES[dtype]}, {activation}, {reduction}, {v}>", PORTABLE,
                   _GEO_CHECKS)


def _all() -> List[Variant]:
    out = []
    for dtype in range(len(C_TYPES)):
        for act in ACTIVATION_CODES:
            out += [pool_planes(dtype, act, pool) for pool in POOL_CODES]
            out += [pool_rows(dtype, act, pool, vec) for pool in POOL_CODES for vec in (True, False)]
            if dtype != F16_RANGE:
                out += [window_reduce(dtype, act, red, vec) for red in REDUCTION_CODES for vec in (True, False)]
    return out


VARIANTS = _all()
