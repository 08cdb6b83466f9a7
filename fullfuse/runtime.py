"""Kernels at run time: compiled for the GPU's own architecture (cutlass_ops), loaded per device, launched through
cuda-python's driver bindings on torch's current stream of the input's device.

Everything here that depends only on a kernel and a device (its module, function, shared-memory limit, occupancy)
is made once and kept.  Every driver call runs with the device's primary context (the one torch uses) current
(``_in_context``): where another device's, or none (a thread that has not touched the GPU yet), is current, that
context is made current for the call and the thread's own restored, so torch's current device never changes.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from cutlass_ops import cache as _cache
from cutlass_ops import nvrtc as _nvrtc
from cutlass_ops.variants import MIN_ARCH, Variant, loaded_arch

from .launch import current_device_index, stream_of

Dim3 = Union[int, Tuple[int, int, int]]


class KernelUnavailable(RuntimeError):
    """No kernel of this variant can run on this device (the message says why); callers step down."""


def _driver():
    from cuda.bindings import driver
    return driver


def _check(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        drv = _driver()
        _, text = drv.cuGetErrorString(err)
        raise RuntimeError(f"fullfuse: {what} failed: {text.decode() if text else err}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


@dataclass(frozen=True)
class DeviceProps:
    """What the planners need of a device: its compute capability, SM count and per-block shared-memory limit."""
    major: int
    minor: int
    sm_count: int
    smem_optin: int            # bytes of dynamic + static shared memory a block may opt in to

    @property
    def is_sm90(self) -> bool:  # H100 / H200: the wgmma / TMA kernels (sm_90a)
        return (self.major, self.minor) == (9, 0)


@lru_cache(maxsize=None)
def device_props(index: int) -> DeviceProps:
    p = torch.cuda.get_device_properties(index)
    optin = getattr(p, "shared_memory_per_block_optin", 0) or 0
    if not optin:
        drv = _driver()
        optin = _check(drv.cuDeviceGetAttribute(
            drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, index),
            "cuDeviceGetAttribute")
    return DeviceProps(p.major, p.minor, p.multi_processor_count, int(optin))


@lru_cache(maxsize=None)
def arch_of(index: int) -> str:
    """The NVRTC target for device ``index``: its own SASS ("sm_90a" on Hopper for wgmma), or, where this NVRTC
    predates the GPU, PTX for the newest architecture it knows ("compute_NN"), which the driver compiles.  Raises
    KernelUnavailable for a GPU older than the kernels (MIN_ARCH), before any compile."""
    props = device_props(index)
    cc = props.major * 10 + props.minor
    if cc < MIN_ARCH:
        raise KernelUnavailable(f"fullfuse: this GPU is sm_{cc}; the kernels need sm_{MIN_ARCH} (Ampere) or newer "
                                f"(path='auto' runs PyTorch's ops here)")
    if cc == 90 or cc in _nvrtc.supported_archs():
        return loaded_arch(cc)
    known = [a for a in _nvrtc.supported_archs() if a <= cc]
    if not known:
        raise KernelUnavailable(f"fullfuse: NVRTC {_nvrtc.version()} cannot target sm_{cc}")
    return f"compute_{max(known)}"


class Kernel:
    """One kernel loaded on one device."""

    def __init__(self, variant: Variant, device: int):
        drv = _driver()
        arch = arch_of(device)
        code, name = _cache.cubin(variant, arch)
        self.variant, self.device, self.name = variant, device, name
        self._ctx = _primary_context(device)
        _in_context(self._ctx, self._load, drv, code, name, arch)
        self._occupancy: Dict[Tuple[int, int], int] = {}
        self._launch, self._launch_ex = drv.cuLaunchKernel, drv.cuLaunchKernelEx

    def _load(self, drv, code: bytes, name: str, arch: str) -> None:
        try:
            self._module = _check(drv.cuModuleLoadData(code), f"loading {self.variant.label} ({arch})")
        except RuntimeError as exc:
            raise KernelUnavailable(f"{exc}; the kernel cannot run on this GPU") from exc
        self._fn = _check(drv.cuModuleGetFunction(self._module, name.encode()), "cuModuleGetFunction")
        attr = drv.CUfunction_attribute
        static = _check(drv.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self._fn),
                        "cuFuncGetAttribute")
        # the device's maximum once, never a call's own size: the attribute is the function's for every thread,
        # so a smaller value set by one thread would fail another's larger launch (invalid argument)
        self.max_dynamic_smem = device_props(self.device).smem_optin - int(static)
        _check(drv.cuFuncSetAttribute(self._fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      self.max_dynamic_smem), "cuFuncSetAttribute")

    def blocks_per_sm(self, block: int, smem: int) -> int:
        """Resident blocks per SM at ``block`` threads and ``smem`` bytes of dynamic shared memory (>= 1)."""
        got = self._occupancy.get((block, smem))
        if got is None:   # (the query needs the device's context current, as a launch does)
            query = _driver().cuOccupancyMaxActiveBlocksPerMultiprocessor
            got = max(1, int(_check(_in_context(self._ctx, query, self._fn, block, smem), "occupancy query")))
            self._occupancy[(block, smem)] = got
        return got

    def launch(self, grid: Dim3, block: Dim3, smem: int, args: "Args", stream: Optional[int] = None) -> None:
        """Launch on ``stream`` (default: torch's current stream of the kernel's device) with the kernel's arguments
        ``args`` (an Args: it holds the values and the pointer array alive until the driver has copied them)."""
        self.at(grid, block, smem)(stream_of(self.device) if stream is None else stream, args)

    def at(self, grid: Dim3, block: Dim3, smem: int) -> Callable[[int, "Args"], None]:
        """``launch`` at these dimensions as ``fn(stream, args)``, the dimensions converted once (host time per call:
        a prepared call keeps it; one frame, the launch straight to the driver where torch's current device is the
        kernel's, as ``_launch_in_context`` says)."""
        gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else grid
        bx, by, bz = (block, 1, 1) if isinstance(block, int) else block
        launch, fn, device = self._launch, self._fn, self.device

        def launch_at(stream: int, args: "Args") -> None:
            if current_device_index() == device:
                err, = launch(fn, gx, gy, gz, bx, by, bz, smem, stream, args.address, 0)
                if not err:
                    return
                err, = _in_context(self._ctx, launch, fn, gx, gy, gz, bx, by, bz, smem, stream, args.address, 0)
            else:
                err, = _launch_in_context(self, launch, fn, gx, gy, gz, bx, by, bz, smem, stream, args.address, 0)
            if err:
                _check((err,), f"launching {self.variant.label}")
        return launch_at

    def dependent_at(self, grid: Dim3, block: Dim3, smem: int) -> Callable[[int, "Args"], None]:
        """``at`` with a programmatic dependency on the kernel before it in the stream
        (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION): its blocks may start once every block of that kernel
        has signalled (griddepcontrol.launch_dependents), so its prologue overlaps that kernel's tail.  The kernel
        must wait (griddepcontrol.wait) before it reads what that kernel writes; where the previous work in the
        stream is not a kernel, or the GPU predates sm_90, the launch is an ordinary one.  Each thread has its own
        launch configuration, the attribute set once (a call sets its stream only: host time per call)."""
        local = threading.local()   # .config: this thread's CUlaunchConfig

        def launch_at(stream: int, args: "Args") -> None:
            config = getattr(local, "config", None)
            if config is None:
                config = local.config = self._config(grid, block, smem)
            config.hStream = stream
            err, = _launch_in_context(self, self._launch_ex, config, self._fn, args.address, 0)
            if err:
                _check((err,), f"launching {self.variant.label}")
        return launch_at

    @staticmethod
    def _config(grid: Dim3, block: Dim3, smem: int):
        """A launch configuration for these dimensions with the programmatic dependency set."""
        drv = _driver()
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = (grid, 1, 1) if isinstance(grid, int) else grid
        config.blockDimX, config.blockDimY, config.blockDimZ = (block, 1, 1) if isinstance(block, int) else block
        config.sharedMemBytes = smem
        config.attrs, config.numAttrs = [attr], 1
        return config


class Args:
    """A kernel's argument list as ctypes values and the pointer array a launch takes; ``Args(struct)`` for kernels
    that take one parameter struct by value.  Keep one per call (or per thread): launches copy the values."""

    def __init__(self, *values: ctypes._SimpleCData):
        self.values = values
        self._ptrs = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        self.address = ctypes.addressof(self._ptrs)


_kernels: Dict[Tuple[Variant, int], Kernel] = {}
_kernels_lock = threading.Lock()
_contexts: Dict[int, object] = {}


def _in_context(ctx, fn, *args):
    """``fn(*args)`` with context ``ctx`` (a device's primary context, torch's) current on this thread, restoring the
    thread's own afterwards, so torch's current device never changes; the common case — ``ctx`` current already —
    costs one driver query."""
    get, set_ = _ctx_fns()
    _, current = get()
    if int(current) == int(ctx):
        return fn(*args)
    set_(ctx)
    try:
        return fn(*args)
    finally:
        set_(current)


def _launch_in_context(kernel: Kernel, fn, *args):
    """A launch ``fn(*args)`` of ``kernel`` (a driver call returning (error,)) with its device's primary context
    current.  Where torch's current device is the kernel's, that context is current already (the CUDA runtime keeps
    the two in step), so the launch goes straight to the driver (host time: no context query).  A launch made in any
    other context fails without enqueueing anything (the function and stream handles are the primary context's), and
    a thread with no context yet fails too: every failure is retried through ``_in_context``, whose result is final."""
    if current_device_index() == kernel.device:
        result = fn(*args)
        if int(result[0]) == 0:
            return result
    return _in_context(kernel._ctx, fn, *args)


@lru_cache(maxsize=None)
def _ctx_fns():
    drv = _driver()
    return drv.cuCtxGetCurrent, drv.cuCtxSetCurrent


def _primary_context(device: int):
    ctx = _contexts.get(device)
    if ctx is None:
        torch.cuda.init()
        with torch.cuda.device(device):
            torch.empty(0, device=f"cuda:{device}")  # the runtime's primary context exists and is current
        drv = _driver()
        ctx = _check(drv.cuDevicePrimaryCtxRetain(_check(drv.cuDeviceGet(device), "cuDeviceGet")),
                     "cuDevicePrimaryCtxRetain")
        _contexts[device] = ctx
    return ctx


def kernel(variant: Variant, device: int) -> Kernel:
    """The loaded kernel of ``variant`` on device ``device`` (compiled and cached on first use; thread-safe).
    Raises cutlass_ops.cache.BuildError when it can be neither found nor compiled, KernelUnavailable when it cannot
    run on the device."""
    k = _kernels.get((variant, device))
    if k is None:
        with _kernels_lock:
            k = _kernels.get((variant, device))
            if k is None:
                k = Kernel(variant, device)
                _kernels[(variant, device)] = k
    return k


def memset_zero(address: int, nbytes: int, device: int) -> None:
    """Zero ``nbytes`` at ``address`` on torch's current stream of ``device`` (cuMemsetD8Async; 32-bit words where
    the size and address allow)."""
    drv = _driver()
    if nbytes % 4 == 0 and address % 4 == 0:
        fn, count = drv.cuMemsetD32Async, nbytes // 4
    else:
        fn, count = drv.cuMemsetD8Async, nbytes
    err, = _in_context(_primary_context(device), fn, address, 0, count, stream_of(device))
    if int(err) != 0:
        _check((err,), "cuMemsetAsync")


class DeviceBuffer:
    """``size`` bytes of device memory from the driver's stream-ordered allocator (cuMemAllocAsync on ``stream`` of
    device ``device``), freed on that stream when dropped.  Outside torch's caching allocator on purpose: memory kept
    across calls must not be taken from a CUDA-graph pool that torch routes allocations to (torch.compile's cudagraph
    warm-up runs eagerly with its pool active, and a live allocation it does not own fails its checks).  Where the
    device has no memory pools (some virtualised GPUs) it is cuMemAlloc's, and cuMemFree waits for the device's work
    before it frees."""

    def __init__(self, device: int, size: int, stream: int):
        drv = _driver()
        self.device, self.size, self.stream = device, size, stream
        self._ctx = _primary_context(device)
        err, ptr = _in_context(self._ctx, drv.cuMemAllocAsync, size, stream)
        self._ordered = int(err) == 0
        if not self._ordered:
            ptr = _check(_in_context(self._ctx, drv.cuMemAlloc, size), "cuMemAlloc")
        self.ptr = int(ptr)

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        return self.size

    @property
    def __cuda_array_interface__(self):   # torch.as_tensor(buffer, device=...) views its bytes (tests)
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "stream": None}

    def __del__(self):
        try:   # (at interpreter exit the driver may be gone; a destroyed stream: the memory stays with the process)
            if self._ordered:
                _in_context(self._ctx, _driver().cuMemFreeAsync, self.ptr, self.stream)
            else:
                _in_context(self._ctx, _driver().cuMemFree, self.ptr)
        except Exception:
            pass


# ---- TMA descriptors ----
def tensor_map(geometry: tuple, address: int) -> Optional[bytes]:
    """The 128-byte CUtensorMap of a tiled view of global memory at ``address`` (cuTensorMapEncodeTiled: no
    interleave, no swizzle, L2 promotion 128 B, out-of-range elements read as zero), or None where the driver refuses
    it.  ``geometry`` = (dtype, dims, strides, box, element_strides): dtype is "float32" or "uint16"; dims / box /
    element_strides innermost first, strides in bytes for dims 1.. (rank - 1 entries)."""
    dtype, dims, strides, box, element_strides = geometry
    drv = _driver()
    ty = (drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32 if dtype == "float32"
          else drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16)
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    err, tmap = drv.cuTensorMapEncodeTiled(
        ty, len(dims), address, [u64(d) for d in dims], [u64(s) for s in strides], [u32(b) for b in box],
        [u32(e) for e in element_strides], drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if int(err) != 0:
        return None
    return ctypes.string_at(tmap.getPtr(), 128)


class TensorMaps:
    """One geometry's tensor maps (``tensor_map``) by address, each made on first need and kept: a tensor map depends
    on nothing else.  Keyed by the address alone (host time per call: an int's hash); at most ``limit`` kept."""

    __slots__ = ("geometry", "limit", "_by_address")

    def __init__(self, geometry: tuple, limit: int = 256):
        self.geometry, self.limit, self._by_address = geometry, limit, {}

    def __call__(self, address: int) -> Optional[bytes]:
        got = self._by_address.get(address, self)   # (self: not made yet; None: the driver refused)
        if got is self:
            got = tensor_map(self.geometry, address)
            if len(self._by_address) >= self.limit:
                self._by_address.clear()
            self._by_address[address] = got
        return got
