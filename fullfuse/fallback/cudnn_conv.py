"""Convolutions through the cuDNN frontend with cuDNN's fastest plan: ``conv_fprop`` (family A's conv) and
strided ``conv_dgrad`` (= ConvTranspose, family B's conv).

PyTorch's own call picks a slow plan for some problems (40.8 ms for seed B's fp32 ConvTranspose3d on an H200,
against 1.2 ms for cuDNN's best).  Here every plan cuDNN offers is timed once per problem and the fastest is kept
for the process.  Returns None whenever the frontend is missing or has no plan, and TORCH_CALL (convs in the input's
dtype) where PyTorch's own call is within 10 % of the best plan on the GPU: the caller then runs PyTorch's call, which
costs far less host time per call than the frontend's execute.  Set FULLFUSE_CUDNN_FRONTEND=0 to skip it.

Invariants:
- A cuDNN handle is used by one thread only (one per (thread, device)): ``set_stream`` then ``execute`` are two
  calls on the handle, and another thread's ``set_stream`` between them would run the plan on a foreign stream.
- Under CUDA-graph capture no plan is built or timed (both synchronise the host, which breaks the capture):
  a problem not seen before returns None, uncached, and PyTorch's (capturable) call serves it.
- Every pointer handed to cuDNN is 16-byte aligned, as the plans assume (else CUDNN_STATUS_BAD_PARAM_MISALIGNED_
  POINTER); a misaligned input or weight is copied to fresh (aligned) memory first.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Dict, Optional

import torch

from .. import launch
from ..precision import cudnn_settings
from ..spec import ConvActPoolSpec, ConvTPoolReduceSpec
from ..torch_path import CONV, CONV_T

_SLOW_MS = 20.0          # a plan slower than this on its first run is not timed again
_REPEATS = 3
_ALIGN = 16              # bytes; the alignment the frontend's tensors declare by default
_SPREADING_NOTES = ("FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13")
_WORKSPACE_FLOOR = 64 << 20   # a plan may take this much workspace, or as much as the conv's output if more
# PyTorch's own call serves a forward conv where it is this close to cuDNN's best plan on the GPU: it costs far less
# host time per call than the frontend's execute (~10 us against 100+ us), which decides small problems
_TORCH_MARGIN = 1.1
TORCH_CALL = "PyTorch's call"   # run()'s answer where PyTorch's own call serves (kept as the problem's entry)
_entries: Dict[tuple, object] = {}   # problem -> _Entry, TORCH_CALL or None (no plan)
_local = threading.local()   # .handles: device index -> this thread's cuDNN handle
_lock = threading.Lock()     # builds (and times) one problem's plans at a time; guards _entries


def frontend():
    if os.environ.get("FULLFUSE_CUDNN_FRONTEND", "1") == "0":
        return None
    try:
        import cudnn  # nvidia-cudnn-frontend

        return cudnn
    except Exception:
        return None


def available() -> bool:
    return frontend() is not None


class _Entry:
    def __init__(self, graph, tensors, index: int, workspace_bytes: int, ms: float, plans: int):
        self.graph, self.tensors, self.index, self.workspace_bytes = graph, tensors, index, workspace_bytes
        self.ms, self.plans = ms, plans


def data_type(cudnn, dtype: torch.dtype):
    return {torch.float32: cudnn.data_type.FLOAT, torch.bfloat16: cudnn.data_type.BFLOAT16,
            torch.float16: cudnn.data_type.HALF}[dtype]


def handle_for(cudnn, device: torch.device):
    """This thread's cuDNN handle on ``device`` (the input's device), created on first use."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    index = launch.device_index(device)
    if index not in handles:
        with torch.cuda.device(index):
            handles[index] = cudnn.create_handle()
    return handles[index]


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or where its data pointer is not 16-byte aligned a copy in fresh memory (the caching allocator's blocks
    are 512-byte aligned; a dense tensor keeps its strides).  A copy rather than PyTorch's call: the result then does
    not depend on the address (same plan, same bits) and the timed plan's speed is kept, for the cost of one copy."""
    if t.data_ptr() % _ALIGN == 0:
        return t
    copy = torch.empty_like(t, memory_format=torch.preserve_format)
    if copy.data_ptr() % _ALIGN:
        raise RuntimeError("fullfuse: the allocator returned memory that is not 16-byte aligned")
    return copy.copy_(t)


def _best_ms(fn, device, skip_slow: bool = True) -> float:
    """GPU time in ms of ``fn`` on ``device``'s current stream: the best of _REPEATS runs (skip_slow: one where the
    first takes more than _SLOW_MS)."""
    stream = torch.cuda.current_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(_REPEATS):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
        if skip_slow and times[0] > _SLOW_MS:
            break
    return min(times)


def time_plan(graph, pack, workspace, index, handle) -> float:
    """One plan's GPU time (``handle``'s stream is the current one of ``workspace``'s device)."""
    return _best_ms(lambda: graph.execute_plan_at_index(pack, workspace, index=index, handle=handle), workspace.device)


def fastest_plan(graph, pack, handle, device, workspace_cap: int = 1 << 62):
    """Time every built plan of ``graph`` whose workspace is at most ``workspace_cap`` bytes once on ``pack``; returns
    (index, ms, workspace bytes, plan count)."""
    cudnn = frontend()
    count = graph.get_execution_plan_count()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    best = None
    for index in range(count):
        try:
            ws = graph.get_workspace_size_plan_at_index(index)
            if ws > workspace_cap:
                _debug(f"plan {index} of {count} skipped: workspace {ws} bytes")
                continue
            workspace = torch.empty(max(ws, 1), dtype=torch.uint8, device=device)
            ms = time_plan(graph, pack, workspace, index, handle)
        except Exception as exc:
            _debug(f"plan {index} of {count} failed: {exc}")
            continue
        if best is None or ms < best[1]:
            best = (index, ms, ws)
    if best is None:
        raise RuntimeError(f"none of the {count} plans ran")
    _debug(f"{count} plans, best #{best[0]} {best[1]:.3f} ms")
    return (*best, count)


def _build(cudnn, kind, x, weight, out_shape, out_dtype, padding, stride, dilation, mode, deterministic,
           torch_call) -> object:
    original = (x, weight)   # PyTorch's call, the alternative, runs on the operands as the caller has them
    x, weight = _plan_layout(x), _plan_layout(weight)
    io = data_type(cudnn, x.dtype)
    handle = handle_for(cudnn, x.device)
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    tx = graph.tensor(name="x", dim=list(x.shape), stride=list(x.stride()), data_type=io)
    tw = graph.tensor(name="w", dim=list(weight.shape), stride=list(weight.stride()), data_type=io)
    geometry = dict(padding=list(padding), stride=list(stride), dilation=list(dilation),
                    compute_data_type=cudnn.data_type.FLOAT)
    if kind == "dgrad":
        ty = graph.conv_dgrad(loss=tx, filter=tw, **geometry)
    else:
        ty = graph.conv_fprop(image=tx, weight=tw, **geometry)
    y = _channels_last(out_shape, out_dtype, x.device)
    ty.set_output(True).set_dim(list(y.shape)).set_stride(list(y.stride())).set_data_type(data_type(cudnn, out_dtype))
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    notes = [cudnn.numerical_note.TENSOR_CORE] if mode == "ieee" and x.dtype == torch.float32 else []  # no TF32
    # no FFT / Winograd transforms: they spread an inf or NaN of the input over outputs a direct sum never reaches
    # (inf - inf in the transform), so the NaN / inf masks would differ from the convolution's own
    notes += [getattr(cudnn.numerical_note, n) for n in _SPREADING_NOTES if hasattr(cudnn.numerical_note, n)]
    if deterministic:
        notes.append(cudnn.numerical_note.NONDETERMINISTIC)
    if notes:
        graph.deselect_numeric_notes(notes)
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.ALL)
    # a plan needing more workspace than the conv's own output (FFT-like) would make the first call of a problem the
    # one that runs out of memory: not timed
    cap = max(_WORKSPACE_FLOOR, y.numel() * y.element_size())
    index, ms, ws, count = fastest_plan(graph, {tx: x, tw: weight, ty: y}, handle, x.device, cap)
    del y
    if torch_call is not None and out_dtype == x.dtype:
        torch_ms = _torch_ms(torch_call, *original, mode, deterministic)
        if torch_ms <= _TORCH_MARGIN * ms:
            _debug(f"PyTorch's call {torch_ms:.3f} ms against the best plan's {ms:.3f} ms: PyTorch's call serves")
            return TORCH_CALL
    return _Entry(graph, (tx, tw, ty), index, ws, ms, count)


def _torch_ms(torch_call, x, weight, mode: str, deterministic: bool) -> float:
    """GPU time of PyTorch's own call ``torch_call = (fn, args)``, ``fn(x, weight, None, *args)``, for the same conv:
    the best of _REPEATS runs, always all of them."""
    fn, args = torch_call
    with cudnn_settings(mode, deterministic):
        fn(x, weight, None, *args)   # PyTorch's own algorithm choice, out of the timing
        return _best_ms(lambda: fn(x, weight, None, *args), x.device, skip_slow=False)


def _debug(message: str) -> None:
    global last_error
    last_error = message
    if os.environ.get("FULLFUSE_DEBUG"):
        print(f"fullfuse: cuDNN frontend: {message}", file=sys.stderr, flush=True)


last_error = ""


def _channels_last(shape, dtype, device):
    fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    return torch.empty(shape, dtype=dtype, device=device, memory_format=fmt)


def _plan_layout(t: torch.Tensor) -> torch.Tensor:
    """An operand as the plans take it: channels_last(_3d), 16-byte aligned (made per call, never cached: a
    parameter's copy sees every change).  PyTorch's call, where it serves, takes the operands as the caller has them
    (no copy)."""
    t = t.contiguous(memory_format=torch.channels_last_3d if t.dim() == 5 else torch.channels_last)
    return aligned(t)


def run(kind: str, x: torch.Tensor, weight: torch.Tensor, out_shape, padding, stride, dilation, mode: str,
        deterministic: bool, out_dtype: Optional[torch.dtype] = None, torch_call=None):
    """kind "fprop" or "dgrad"; returns the bias-free output in channels_last(_3d), of dtype ``out_dtype`` (default:
    the input's); or None: no frontend or plan, a new problem under CUDA-graph capture; or TORCH_CALL: PyTorch's own
    call ``torch_call`` = (fn, args), ``fn(x, weight, None, *args)`` on ``x`` and ``weight`` as given, serves as fast
    on the GPU (compared once per problem, where given; the caller then runs that call)."""
    cudnn = frontend()
    if cudnn is None:
        return None
    out_dtype = out_dtype or x.dtype
    # (shapes as torch.Size: a tuple's hash and equality; strides and the spec's values are tuples already)
    key = (kind, out_dtype, x.shape, x.stride(), x.data_ptr() % _ALIGN, weight.shape, weight.stride(),
           weight.data_ptr() % _ALIGN, x.dtype, x.device, tuple(out_shape), padding, stride, dilation, mode,
           deterministic)
    entry = _entries.get(key, _MISSING)
    if entry is _MISSING:
        if launch.capturing(x.device):
            return None       # building / timing plans synchronises: PyTorch's call serves this one, nothing cached
        with _lock:
            if key not in _entries:
                try:
                    with torch.cuda.device(launch.device_index(x.device)):
                        _entries[key] = _build(cudnn, kind, x, weight, out_shape, out_dtype, padding, stride,
                                               dilation, mode, deterministic, torch_call)
                except Exception as exc:  # no plan, unsupported problem, frontend API mismatch: caller falls back
                    _debug(f"{kind} unavailable for {tuple(out_shape)} ({mode}): {type(exc).__name__}: {exc}")
                    _entries[key] = None
            entry = _entries[key]
    if entry is None or entry is TORCH_CALL:
        return entry
    x, weight = _plan_layout(x), _plan_layout(weight)
    index = launch.device_index(x.device)
    # cuDNN launches on the current device's context (no switch where it is current already: host time per call)
    with contextlib.nullcontext() if index == torch.cuda.current_device() else torch.cuda.device(index):
        y = _channels_last(out_shape, out_dtype, x.device)        # fresh memory: aligned
        workspace = torch.empty(max(entry.workspace_bytes, 1), dtype=torch.uint8, device=x.device)
        handle = handle_for(cudnn, x.device)                       # this thread's: nobody re-sets its stream
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(x.device).cuda_stream)
        tx, tw, ty = entry.tensors
        entry.graph.execute_plan_at_index({tx: x, tw: weight, ty: y}, workspace, index=entry.index, handle=handle)
    return y


_MISSING = object()


def conv_transpose(spec: ConvTPoolReduceSpec, x: torch.Tensor, weight: torch.Tensor, mode: str,
                   deterministic: bool = True):
    """The transposed conv (no bias); or None (``run``), also for fp32 "ieee": cuDNN's non-tensor-core dgrad plans take
    ~200 ms at seed B, where sub-pixel forward convs take ~9 ms; or TORCH_CALL: PyTorch's own call serves as fast."""
    if spec.groups != 1 or (mode == "ieee" and x.dtype == torch.float32):
        return None
    out_shape = (x.shape[0], weight.shape[1], *spec.conv_output_spatial(tuple(x.shape[2:])))
    torch_call = (CONV_T[spec.dims], (spec.stride, spec.padding, spec.output_padding, 1, spec.dilation))
    return run("dgrad", x, weight, out_shape, spec.padding, spec.stride, spec.dilation, mode, deterministic,
               torch_call=torch_call)


def conv_forward(spec: ConvActPoolSpec, x: torch.Tensor, weight: torch.Tensor, mode: str, deterministic: bool = True,
                 out_dtype: Optional[torch.dtype] = None, out_shape=None) -> Optional[torch.Tensor]:
    """The forward conv (no bias) with output dtype ``out_dtype`` (default: the input's), or None: the caller runs
    PyTorch's own call (no frontend or plan, or that call is as fast).  ``out_shape``: its shape where the caller has
    it (host time), else worked out here."""
    if spec.groups != 1:
        return None
    if out_shape is None:
        out_shape = (x.shape[0], weight.shape[0], *spec.output_spatial(tuple(x.shape[2:])))
    y = run("fprop", x, weight, out_shape, spec.padding, spec.stride, spec.dilation, mode, deterministic, out_dtype,
            (CONV[spec.dims], (spec.stride, spec.padding, spec.dilation)))
    return None if y is TORCH_CALL else y


def describe() -> list:
    """(problem key, chosen plan index, its time in ms, number of plans) for every problem seen."""
    with _lock:
        return [(k, e.index, e.ms, e.plans) for k, e in _entries.items() if isinstance(e, _Entry)]
