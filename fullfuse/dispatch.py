"""Run-time choice of the path for one call, then the call: fused | fallback | torch.

``plan.py`` makes the static choice for a region; this module re-checks it against the actual input (device,
dtype, rank, shape) and never lets a path run on an input it cannot serve: an explicit path that cannot serve
raises UnsupportedError, "auto" steps down (fused -> fallback -> torch) and records why.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import first_call, launch
from . import precision as precision_mod
from . import torch_path
from .errors import UnsupportedError
from .fallback import conv_act_pool as fallback_a
from .fallback import convt_pool_reduce as fallback_b
from .fused import conv_act_pool as fused_a
from .fused import convt_pool_reduce as fused_b
from .spec import ConvActPoolSpec

PATH_CHOICES = ("auto", "fused", "fallback", "torch")
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

def check_path(path: str) -> None:
    if path not in PATH_CHOICES:
        raise ValueError(f"fullfuse: path must be one of {PATH_CHOICES}, got {path!r}")


def static_unsupported(spec) -> Optional[str]:
    """Why no kernel path (fused or fallback) can serve this spec at all."""
    if spec.groups != 1:
        return f"groups={spec.groups} (the kernels cover groups=1)"
    if spec.padding_mode != "zeros":
        return f"padding_mode={spec.padding_mode!r} (the kernels cover zero padding)"
    return None


def fused_static_unsupported(spec) -> Optional[str]:
    return _fused_module(spec).static_unsupported(spec)


def _fused_module(spec):
    return fused_a if isinstance(spec, ConvActPoolSpec) else fused_b


def _input_unsupported(spec, x: torch.Tensor, weight: torch.Tensor, bias) -> Optional[str]:
    """Why no kernel can serve this input; torch then runs it (and raises torch's own error if it is invalid)."""
    if x.device.type != "cuda":
        return f"input on {x.device.type}"
    if x.dim() != spec.dims + 2:
        return f"input of rank {x.dim()} (kernels take batched rank-{spec.dims + 2} input)"
    if x.dtype not in KERNEL_DTYPES:
        return f"dtype {x.dtype}"
    if weight.device != x.device or weight.dtype != x.dtype or (
            bias is not None and (bias.device != x.device or bias.dtype != x.dtype)):
        return "input, weight and bias differ in device or dtype"   # (torch raises its own error)
    if x.shape[1] != spec.in_channels or x.shape[0] == 0 or x.numel() == 0:
        return f"input shape {tuple(x.shape)}"
    if tuple(weight.shape) != spec.weight_shape or (bias is not None and tuple(bias.shape) != (spec.out_channels,)):
        # (a weight replaced after fused_model, e.g. pruned: PyTorch's ops compute with it as it is, or raise)
        return (f"weight {tuple(weight.shape)}" + ("" if bias is None else f" and bias {tuple(bias.shape)}")
                + f" are not the region's conv's ({spec.weight_shape}, ({spec.out_channels},))")
    if isinstance(spec, ConvActPoolSpec):
        if min(spec.output_spatial(tuple(x.shape[2:]))) < 1:
            return "empty convolution output"
    elif min(spec.pooled_spatial(tuple(x.shape[2:]))) < 1:
        return "convolution output smaller than the pooling window"
    return static_unsupported(spec)


def _fallback_module(spec):
    return fallback_a if isinstance(spec, ConvActPoolSpec) else fallback_b


def choose(spec, requested: str, x, weight, bias, mode: str, deterministic: bool) -> Tuple[str, str]:
    """(path, reason) for this call: an explicit path that cannot serve raises UnsupportedError with the reason;
    "auto" steps down fused -> fallback -> torch (also where a kernel library cannot be built or loaded here)."""
    if requested == "torch":
        return "torch", "requested"
    reason = _input_unsupported(spec, x, weight, bias)
    if reason:
        if requested != "auto":
            raise UnsupportedError(f"fullfuse: path {requested!r} cannot serve this call: {reason}")
        return "torch", reason
    why = None
    if requested in ("auto", "fused"):
        why = fused_static_unsupported(spec) or _fused_module(spec).unsupported(spec, x, mode, deterministic)
        if why is None:
            return "fused", "fused kernel serves it: " + _fused_module(spec).kernel(spec, x, mode, deterministic)
        if requested == "fused":
            raise UnsupportedError(f"fullfuse: the fused kernel cannot serve this call: {why}")
    missing = _fallback_module(spec).unavailable()
    if missing:
        if requested == "fallback":
            raise UnsupportedError(f"fullfuse: the fallback cannot serve this call: {missing}")
        return "torch", f"{why}; fallback unavailable: {missing}"
    return "fallback", why or "requested"


def _runner(spec, chosen: str, x, mode: str, deterministic: bool, follows_torch: bool = False):
    """The prepared call of a path.  follows_torch: the mode is PyTorch's own current setting (precision "auto"), so
    the torch path runs PyTorch's ops as they are, with no flag to hold."""
    if chosen == "torch":
        # (a signature's calls share the batch size: calls.SpecCalls; an input of another rank gets torch's own error)
        ops = torch_path.prepared(spec, x.shape[0] if x.dim() == spec.dims + 2 else None)
        if follows_torch or mode not in ("tf32", "ieee"):
            return ops

        def run_torch(x, weight, bias):
            with precision_mod.cudnn_conv_precision(mode):   # under the flags lock; a change only where needed
                return ops(x, weight, bias)
        return run_torch
    if chosen == "fused":
        return _fused_module(spec).prepare(spec, x, mode, deterministic)
    return _fallback_module(spec).prepare(spec, x, mode, deterministic)


def _measured(spec, decision, runner, x, weight, bias, mode: str, deterministic: bool, follows_torch: bool):
    """Path "auto", first call of a signature: the chosen kernel path against the torch path (first_call.py); returns
    the (decision, runner) to keep."""
    if decision[0] == "torch" or launch.capturing(x.device):
        return decision, runner
    torch_run = _runner(spec, "torch", x, mode, deterministic, follows_torch)
    slower, kernel_ms, torch_ms = first_call.torch_is_faster(lambda: runner(x, weight, bias),
                                                             lambda: torch_run(x, weight, bias), x.device)
    timing = f"measured {kernel_ms:.3f} ms per call against torch's {torch_ms:.3f} ms"
    if slower:
        return ("torch", f"faster than the {decision[0]} path here ({timing}; {decision[1]})"), torch_run
    return (decision[0], f"{decision[1]} ({timing})"), runner


def prepare(spec, path: str, precision: str, mode: str, deterministic: bool, x, weight, bias) -> Tuple[tuple, object]:
    """((path, reason), run(x, weight, bias)): the choice for a call signature like this call's (calls.SpecCalls keys
    them) and its prepared call, everything that depends only on the signature worked out once.  Raises where an
    explicit path cannot serve (nothing is kept then)."""
    decision = choose(spec, path, x, weight, bias, mode, deterministic)
    follows_torch = precision == "auto"
    runner = _runner(spec, decision[0], x, mode, deterministic, follows_torch)
    if path == "auto":
        decision, runner = _measured(spec, decision, runner, x, weight, bias, mode, deterministic, follows_torch)
    return decision, runner
