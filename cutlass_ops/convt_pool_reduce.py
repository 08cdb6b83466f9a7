"""Family B fused (csrc/fused_convt_pool_reduce/): the ABI of its kernels and every instantiation its planner picks.

``FBParams`` mirrors the C++ parameter struct of ``fb_kernel`` (passed by value, ``__grid_constant__``) and
``PackGeometry`` that of the weight packing (done inside ``fb_kernel``; ``fb_pack::pack_kernel`` runs it alone for
tests and probes); each variant's compile unit carries static_asserts that the mirror's size and field offsets are
the C++ struct's.  ``fb_kernel<HAS_ACT, KS, KV>`` is instantiated per activation on / off, k-step count and kernel
variant (fp32 TF32, bf16, fp16, fp32 "ieee"): 26 units, sm_90a only (wgmma).  The packing kernel alone uses no
Hopper instruction.
"""
from __future__ import annotations

import ctypes
from ctypes import c_float, c_int, c_longlong, c_void_p
from typing import List

from .variants import HOPPER, PORTABLE, Variant, layout_asserts

# kernel variants (the KV template parameter): the input dtype codes of codes.h, plus fp32 at precision "ieee"
KV_F32, KV_BF16, KV_F16, KV_X3 = 0, 1, 2, 3
MAXCLS = 27          # residue classes s_d * s_h * s_w at most (FB_MAXCLS)
HEADER = "fused_convt_pool_reduce/kernel.cuh"
PACK_HEADER = "fused_convt_pack_kernel.cuh"


class PackGeometry(ctypes.Structure):
    """fb_pack::Geometry (csrc/fused_convt_pack.cuh): what the packing needs of the weight and its layout."""
    _fields_ = [
        ("op", c_int), ("C", c_int), ("K", c_int), ("cpad", c_int), ("cpad16", c_int),
        ("T", c_int * 3), ("s", c_int * 3),
        ("ws", c_longlong * 5),
        ("nslices", c_int),
    ]


class FBParams(ctypes.Structure):
    """fb_kernel's parameters (csrc/fused_convt_pool_reduce/params.cuh); the planner fills every field but the
    pointers and the weight's strides (pg.ws), which each call sets."""
    _fields_ = [
        ("x", c_void_p), ("wp", c_void_p), ("bias", c_void_p), ("out", c_void_p),
        ("N", c_int), ("C", c_int), ("D", c_int), ("H", c_int), ("W", c_int), ("K", c_int),
        ("channels_last", c_int), ("ncdhw_vec", c_int),
        ("T", c_int * 3), ("s", c_int * 3), ("p", c_int * 3), ("win", c_int * 3), ("P", c_int * 3),
        ("act", c_int), ("red", c_int), ("ncls", c_int),
        ("cls_r", (c_int * 3) * MAXCLS), ("cls_M", (c_int * 3) * MAXCLS), ("cls_slice", c_int * MAXCLS),
        ("Mmax", c_int * 3),
        ("nd", c_int), ("nh", c_int), ("pwb", c_int), ("nwc", c_int), ("wh", c_int), ("nhb", c_int),
        ("nfull", c_longlong),
        ("tail_nhalf", c_int), ("tail_g", c_int),
        ("ws", c_void_p), ("ws_cnt", c_void_p),
        ("plane_bytes", c_int), ("tile_bytes", c_int), ("tile_alloc", c_int), ("max_steps", c_int),
        ("inv_k", c_float),
        # the packing in the kernel (weight_pack.cuh)
        ("w", c_void_p), ("pack_cnt", c_void_p), ("pg", PackGeometry),
        ("pack_total", c_longlong), ("pack_chunks", c_int), ("nblocks", c_int),
    ]


PACK_OPS = {"copy16": 0, "tf32": 1, "ieee": 2}   # fb_pack::Op
PACK_THREADS = 256        # the packing kernel's block (fb_pack::PACK_THREADS), and its tile: PACK_TILE_ROWS (c, k)
PACK_TILE_ROWS = 16       # rows over PACK_TILE_TAPS taps (fb_pack::TILE_ROWS, TILE_TAPS)
PACK_TILE_TAPS = 128

_CHECKS = layout_asserts(FBParams, "FBParams")
# the k-step counts each kernel variant is built for: fp32 8-channel steps up to 64 channels; 16-bit 16-channel
# steps; "ieee" up to 32 channels (its two tiles do not fit beside the weights at 64, the planner refuses it)
KSTEPS = {KV_F32: (1, 2, 4, 8), KV_BF16: (1, 2, 4), KV_F16: (1, 2, 4), KV_X3: (1, 2, 4)}


def fused_variant(has_act: bool, ks: int, kv: int) -> Variant:
    """The fb_kernel instantiation that serves a plan (convt_pool_reduce_plan.Plan: has_act, ks, kv)."""
    if ks not in KSTEPS.get(kv, ()):
        raise ValueError(f"fullfuse: no fb_kernel for {ks} k steps of kernel variant {kv}")
    return Variant(HEADER, f"fb_kernel<{'true' if has_act else 'false'}, {ks}, {kv}>", HOPPER, _CHECKS)


PACK_CHECKS = layout_asserts(PackGeometry, "fb_pack::Geometry") + "".join(
    f'static_assert(fb_pack::{n} == {v}, "fb_pack::{n} differs from cutlass_ops/convt_pool_reduce.py");\n'
    for n, v in (("PACK_THREADS", PACK_THREADS), ("TILE_ROWS", PACK_TILE_ROWS), ("TILE_TAPS", PACK_TILE_TAPS)))
PACK = Variant(PACK_HEADER, "fb_pack::pack_kernel", PORTABLE, PACK_CHECKS)


def _all() -> List[Variant]:
    return [fused_variant(act, ks, kv) for act in (False, True) for kv, counts in KSTEPS.items() for ks in counts]


VARIANTS = _all() + [PACK]
