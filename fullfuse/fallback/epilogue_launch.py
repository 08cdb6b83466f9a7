"""The fallbacks' epilogue kernels at run time: a launch prepared once per call signature, and whether the kernels
can be had here at all.

A ``PreparedLaunch`` holds the loaded kernel, its grid and its argument list; the argument values that do not
change between calls (ctypes scalars, a parameter struct) are made once and shared read-only, the device-pointer
slots are per thread (runtime.Args: a launch copies the values, so a thread re-uses its own between calls).  A call
sets the pointers and launches: no argument conversion, no allocation.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import c_void_p
from typing import Dict, Optional, Sequence, Tuple

import torch

from cutlass_ops import cache
from cutlass_ops.variants import PORTABLE, Variant

from .. import launch, runtime
from ..errors import UnsupportedError

POINTER = None      # in a prepared argument list: a device pointer, set on every call (in order)


class PreparedLaunch:
    """One epilogue kernel launch of one call signature on one device."""

    def __init__(self, variant: Variant, device: int, grid, block: int, smem: int, args: Sequence):
        try:
            self.kernel = runtime.kernel(variant, device)
        except (cache.BuildError, runtime.KernelUnavailable) as exc:
            raise UnsupportedError(f"fullfuse: the fallback path cannot serve this call: {_first_line(exc)}") from exc
        self.device, self.grid, self.block, self.smem = device, grid, block, smem
        self._launch = self.kernel.at(grid, block, smem)
        self._args = tuple(args)
        self._pointers = sum(a is POINTER for a in self._args)
        self._local = threading.local()

    def _thread_args(self) -> Tuple[ctypes.Array, runtime.Args]:
        """This thread's (pointer slots, argument list): the slots one array, so that a call sets them all at once,
        each pointer argument one of its elements."""
        slots = (c_void_p * self._pointers)()
        fill = (c_void_p.from_buffer(slots, i * ctypes.sizeof(c_void_p)) for i in range(self._pointers))
        made = (slots, runtime.Args(*[next(fill) if a is POINTER else a for a in self._args]))
        self._local.args = made
        return made

    def __call__(self, *pointers: int, stream: Optional[int] = None) -> None:
        """Launch on ``stream`` (default: the current stream of the kernel's device) with ``pointers`` (ints, 0 for
        NULL; one per pointer slot, in order)."""
        slots, args = getattr(self._local, "args", None) or self._thread_args()
        slots[:] = pointers
        self._launch(launch.stream_of(self.device) if stream is None else stream, args)


class Prepared(dict):
    """Call signature -> prepared launch; bounded (a process that sees ever new shapes does not grow without
    limit).  Two threads preparing one signature at once both work; the first entry stays."""
    LIMIT = 256

    def keep(self, key, value):
        if len(self) >= self.LIMIT:
            self.clear()
        return self.setdefault(key, value)


_reasons: Dict[Tuple[Variant, Optional[int]], Optional[str]] = {}


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def unavailable(variant: Variant) -> Optional[str]:
    """None if the kernel ``variant`` can be had here (read from the kernel cache or compiled with NVRTC, and loaded
    on the current CUDA device where there is one); else the reason in one line, with the fix.  Decided once per
    process and device (a missing compiler is not looked for again on every call); never raises."""
    device = launch.current_device_index() if torch.cuda.is_available() else None
    key = (variant, device)
    if key not in _reasons:
        try:
            if device is None:
                cache.cubin(variant, PORTABLE[0])
            else:
                runtime.kernel(variant, device)
            reason = None
        except Exception as exc:  # BuildError (no NVRTC, unwritable cache, failed compile), KernelUnavailable
            reason = f"fallback epilogue kernel {variant.label} unavailable: {_first_line(exc)}"
        _reasons.setdefault(key, reason)   # two threads may both try; the first answer stays
    return _reasons[key]
