"""Kernel launch: the one place that turns the C API of the compiled libraries into Python calls.

Every exported function is declared once in ``SIGNATURES``; ``launch(lib, fn, *args)`` converts tensors to
device pointers, appends the current CUDA stream where the C function takes one, and raises on a non-zero
return code.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from ctypes import c_char_p, c_int, c_longlong, c_size_t, c_void_p
from typing import Any, Dict, Optional, Tuple

import torch

import cutlass_ops

_P = c_void_p
_L = c_longlong
_I = c_int
_FUSED_A_SHAPE = [_I, _I, _L, *[_I] * 16, *[_I] * 5]   # ... deterministic, then a Conv3d's depth: D, T, sd, pd, dd

# library -> exported function -> (restype, argtypes).  Kernel launchers (int return, called through launch())
# take the cudaStream_t as one more, last argument, not listed here.
SIGNATURES: Dict[str, Dict[str, Tuple[Any, list]]] = {
    "fallback_act_pool": {                      # csrc/fallback_act_pool.cu
        "ff_act_pool_workspace_bytes": (c_size_t, [_L, _L, _L, _I]),
        "ff_act_pool": (c_int, [_P, _I, _P, _P, _L, _L, _L, _I, _I, _I, _P]),
    },
    "fallback_window_reduce": {                 # csrc/fallback_window_reduce.cu
        "ff_window_reduce": (c_int, [_P, _I, _P, _P, *[_L] * 10, _I, _I, _I, _I, _I]),
    },
    "fused_conv_act_pool": {                    # csrc/fused_conv_act_pool.cu
        "ff_fused_conv_act_pool_unsupported": (c_char_p, _FUSED_A_SHAPE),
        "ff_fused_conv_act_pool_kernel": (c_char_p, _FUSED_A_SHAPE),
        "ff_fused_conv_act_pool_workspace_bytes": (c_size_t, _FUSED_A_SHAPE),
        "ff_fused_conv_act_pool": (c_int, [_P, _P, _P, _P, *_FUSED_A_SHAPE, _P]),
    },
    "fused_convt_pool_reduce": {                # csrc/fused_convt_pool_reduce.cu
        "ff_fused_convt_pool_reduce_unsupported": (c_char_p, [_P]),             # the problem (a Problem)
        "ff_fused_convt_pool_reduce_workspace_bytes": (c_size_t, [_P]),
        "ff_fused_convt_pool_reduce": (c_int, [_P, _P, _P, _P, _P, _P]),        # x, w, bias, out, problem, workspace
        "ff_fused_convt_pack_weights": (c_int, [_P, _P, _P]),                   # w, geometry (a Problem), out
    },
}

_functions: Dict[Tuple[str, str], Any] = {}

# Tests and `fullfuse check` set this (or FULLFUSE_POISON_OUTPUTS=1): kernel outputs then start as NaN, so an
# element a kernel fails to write cannot pass as a plausible value.
POISON_OUTPUTS = os.environ.get("FULLFUSE_POISON_OUTPUTS", "0") == "1"


def new_output(*shape, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A buffer (float32 unless told) for a kernel to write completely."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


def bind(cdll, lib: str):
    """Declare the functions of ``lib`` (SIGNATURES) on a library loaded by hand (the benchmarks' probes load their own
    builds); kernel launchers get their stream argument declared too."""
    for name, (restype, argtypes) in SIGNATURES[lib].items():
        fn = getattr(cdll, name)
        fn.restype = restype
        fn.argtypes = argtypes + ([c_void_p] if restype is c_int else [])
    return cdll


def function(lib: str, name: str):
    key = (lib, name)
    if key not in _functions:
        restype, argtypes = SIGNATURES[lib][name]
        fn = getattr(cutlass_ops.load(lib), name)
        fn.restype, fn.argtypes = restype, argtypes
        _functions[key] = fn
    return _functions[key]


class Problem:
    """A kernel's problem description (integers) handed to C as one int64 array: one ctypes argument instead of
    dozens (ctypes converts each argument on every call; host time per call).  Hashable by its values."""
    __slots__ = ("values", "_array", "address", "_hash")

    def __init__(self, values):
        self.values = tuple(int(v) for v in values)
        self._array = (c_longlong * len(self.values))(*self.values)
        self.address = ctypes.addressof(self._array)
        self._hash = hash(self.values)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, Problem) and other.values == self.values

    def __repr__(self):
        return f"Problem{self.values}"


def _arg(value):
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if isinstance(value, Problem):
        return value.address
    return value


def _cuda_error_name(code: int) -> str:
    try:
        return torch.cuda.cudart().cudaGetErrorString(torch.cuda.cudart().cudaError(code))
    except Exception:
        return f"cudaError {code}"


def call(lib: str, name: str, *args, device: Optional[torch.device] = None):
    """Call a host function that does not launch (queries); returns its value.  ``device``: the CUDA device whose
    properties a plan query reads (the C side asks the current device), made current for the call."""
    fn = function(lib, name)
    with _on(device):
        return fn(*[_arg(a) for a in args])


def _on(device: Optional[torch.device]):
    """A context that makes ``device`` current unless it is already (no device switch: host time)."""
    if device is None or device.index is None or device.index == current_device_index():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is being captured into a CUDA graph (no device switch where ``device`` is
    current already: host time)."""
    with _on(device):
        return torch.cuda.is_current_stream_capturing()


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # CUDA builds of torch: one C call each
_get_device = getattr(torch._C, "_cuda_getDevice", None)


def current_device_index() -> int:
    return _get_device() if _get_device is not None else torch.cuda.current_device()


def device_index(device: torch.device) -> int:
    """``device``'s index ("cuda" without one: the current device)."""
    return device.index if device.index is not None else current_device_index()


def current_stream(device: torch.device) -> int:
    """The cudaStream_t of ``device``'s current stream (host time: torch's own C getter where it has one)."""
    if _raw_stream is not None:
        return _raw_stream(device_index(device))
    return torch.cuda.current_stream(device).cuda_stream


def launch(lib: str, name: str, *args, device: torch.device, stream: Optional[int] = None):
    """Launch a kernel on the current stream of ``device`` (or the given cudaStream_t, which must be that) and check
    its return code."""
    fn = function(lib, name)
    if stream is None:
        stream = current_stream(device)
    with _on(device):
        code = fn(*[_arg(a) for a in args], ctypes.c_void_p(stream))
    if code != 0:
        raise RuntimeError(f"fullfuse: {name} failed: {_cuda_error_name(code)} ({code})")


def launcher(lib: str, name: str, device: torch.device, fixed: tuple, head: int):
    """``launch`` prepared once for one call signature: returns ``call(*pointers)`` that passes the first ``head``
    data pointers (ints, 0 for none), the ``fixed`` arguments (ints, or a Problem), the remaining pointers and the
    current stream of ``device``, with no per-argument conversion in Python (host time per call)."""
    fn = function(lib, name)
    index = device_index(device)
    keep, fixed = fixed, tuple(_arg(v) for v in fixed)   # keep: a Problem's array lives as long as the call

    def call(*pointers, _keep=keep):
        args = (*pointers[:head], *fixed, *pointers[head:], ctypes.c_void_p(current_stream(device)))
        if index == current_device_index():
            code = fn(*args)
        else:
            with torch.cuda.device(index):
                code = fn(*args)
        if code != 0:
            raise RuntimeError(f"fullfuse: {name} failed: {_cuda_error_name(code)} ({code})")
    return call
