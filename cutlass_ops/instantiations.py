"""The table of every kernel instantiation fullfuse may launch, one compile unit each (``fullfuse build``).

Each family keeps its own list beside its ABI, where its planner maps a plan to a variant:
``cutlass_ops.conv_act_pool.VARIANTS`` (family A fused), ``cutlass_ops.convt_pool_reduce.VARIANTS`` (family B
fused and its weight packing), ``cutlass_ops.fallback.VARIANTS`` (the fallbacks' epilogues).
"""
from __future__ import annotations

import importlib
from typing import Dict, List

from .variants import Variant

FAMILIES = ("conv_act_pool", "convt_pool_reduce", "fallback")


def variants(family: str) -> List[Variant]:
    return list(importlib.import_module(f"cutlass_ops.{family}").VARIANTS)


def all_variants() -> Dict[str, List[Variant]]:
    return {family: variants(family) for family in FAMILIES}
