"""Static plan of a matched region: which path serves CUDA inputs, and why.

The run-time dispatcher (dispatch.py) may still step down for a particular input (a CPU tensor, a shape the
fused kernel cannot take); ``Plan.last_path`` / ``last_reason`` show what the most recent call ran.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import dispatch
from .errors import UnsupportedError


@dataclass
class Plan:
    name: str            # the region's submodule name in the fused model
    family: str          # "A" or "B"
    spec: object
    description: str     # the matched pattern, e.g. "conv2d -> gelu -> adaptive_avg_pool2d"
    requested: str       # the path the user asked for
    path: str            # the static choice for CUDA inputs: "fused" | "fallback" | "torch"
    reason: str
    calls: object = field(default=None, repr=False, compare=False)   # the region's calls.SpecCalls (set by it)

    @property
    def last_path(self):
        """The path the most recent call ran (None before the first)."""
        return None if self.calls is None else self.calls.last[0]

    @property
    def last_reason(self):
        return None if self.calls is None else self.calls.last[1]

    def __str__(self):
        return f"{self.name}: family {self.family} [{self.description}] -> {self.path} ({self.reason})"


def make_plan(name: str, spec, description: str, requested: str) -> Plan:
    dispatch.check_path(requested)
    family = spec.family

    def plan(path, reason):
        return Plan(name, family, spec, description, requested, path, reason)

    if requested == "torch":
        return plan("torch", "requested")
    no_kernel = dispatch.static_unsupported(spec)
    if no_kernel:
        if requested != "auto":
            raise UnsupportedError(f"fullfuse: path {requested!r} cannot serve {name}: {no_kernel}")
        return plan("torch", no_kernel)
    if requested == "fallback":
        return plan("fallback", "requested")
    no_fused = dispatch.fused_static_unsupported(spec)
    if no_fused is None:
        return plan("fused", "fused kernel available (checked again per input shape)")
    if requested == "fused":
        raise UnsupportedError(f"fullfuse: the fused kernel cannot serve {name}: {no_fused}")
    return plan("fallback", no_fused)
