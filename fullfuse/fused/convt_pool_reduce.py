"""Family B fused kernel (csrc/fused_convt_pool_reduce/): the transposed conv as sub-pixel implicit GEMMs on the
tensor cores whose epilogue keeps the pooling-window maxima on chip, then one fixed-order channel reduction; only
the pooled result is written.  Planned in Python (convt_pool_reduce_plan), compiled per instantiation at first use
and launched through fullfuse.runtime; the weights are packed in every call, by the kernel's own blocks (one launch)
or, for a grid of more than one wave, by the packing kernel just before it."""
from __future__ import annotations

import ctypes
import threading
from typing import Optional, Tuple

import torch

from cutlass_ops import convt_pool_reduce as abi

from .. import launch, runtime, workspace
from ..codes import ACTIVATIONS, PRECISIONS, REDUCTIONS, dtype_code
from ..spec import ConvTPoolReduceSpec
from ..weights import contiguous
from . import convt_pool_reduce_plan as planner


def static_unsupported(spec: ConvTPoolReduceSpec) -> Optional[str]:
    """Why the fused kernel can never serve this spec (None if it may, depending on the input)."""
    if spec.dims != 3:
        return "the fused kernel covers ConvTranspose3d only; ConvTranspose2d runs the fallback"
    if any(d != 1 for d in spec.dilation):
        return "dilation != 1"
    if spec.groups != 1:
        return "groups != 1"
    if spec.in_channels % 4 or spec.in_channels > 64:
        return "C_in % 4 != 0 or C_in > 64 (the fused kernel reads 16-byte channel groups, at most 64 channels)"
    if spec.out_channels > 64:
        return "C_out > 64"
    return None


def _channels_last(x: torch.Tensor) -> bool:
    return x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()


def problem(spec, x, mode) -> Tuple[int, ...]:
    """The planner's problem (convt_pool_reduce_plan.PROBLEM_FIELDS): dtype, precision, layout, shape, geometry per
    dim, activation, reduction."""
    n, c, d, h, w = x.shape
    return (dtype_code(x.dtype), PRECISIONS.get(mode, 0), int(_channels_last(x)), n, c, d, h, w, spec.out_channels,
            *spec.kernel_size, *spec.stride, *spec.padding, *spec.output_padding, *spec.window,
            ACTIVATIONS[spec.activation], REDUCTIONS[spec.reduction])


def plan(spec, x, mode) -> planner.Plan:
    """The kernel's plan for inputs like ``x`` on their device."""
    return planner.plan(problem(spec, x, mode), runtime.device_props(launch.device_index(x.device)))


def _kernel(p: planner.Plan, index: int):
    """The plan's fused kernel, loaded on device ``index`` (compiled on first use)."""
    return runtime.kernel(abi.fused_variant(p.has_act, p.ks, p.kv), index)


def unsupported(spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool) -> Optional[str]:
    """Why the fused kernel cannot serve this call (None if it can)."""
    reason = static_unsupported(spec)
    if reason:
        return reason
    if _channels_last(x) and x.data_ptr() % 16:
        return "channels_last_3d input not 16-byte aligned (the fused kernel copies 16-byte channel groups)"
    try:
        p = plan(spec, x, mode)
        if p.why:
            return p.why
        fused = _kernel(p, launch.device_index(x.device))
    except Exception as exc:  # no NVRTC and no cached kernel, a compile failure, a kernel this GPU cannot load
        return f"fused kernel unavailable: {str(exc).splitlines()[0]}"
    if p.smem > fused.max_dynamic_smem:
        return planner.PREFIX + "the input tile of one window row does not fit in shared memory"
    return None


def kernel(spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool) -> str:
    """Which kernel serves this call, in words (``unsupported`` said one does)."""
    return "sm_90 wgmma kernel: the transposed conv per sub-pixel class, window maxima in shared memory"


def padded_channels(c_in: int, dtype: torch.dtype = torch.float32) -> int:
    """Input channels of one packed weight slice (fb_ksteps in the kernel): C_in padded up to 8, 16, 32 or 64 for
    fp32 (8-channel k steps), up to 16, 32 or 64 for bf16 / fp16 (16-channel k steps)."""
    sizes = (8, 16, 32, 64) if dtype == torch.float32 else (16, 32, 64)
    return next(c for c in sizes if c_in <= c)


def _tf32(w: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to TF32, to nearest with ties away from zero (cvt.rna.tf32.f32)."""
    bits = w.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def pack_weights(weight: torch.Tensor, stride, dtype: torch.dtype = torch.float32, mode: str = "tf32") -> torch.Tensor:
    """(C, K, Td, Th, Tw) -> per residue class (rd, rh, rw), per tap (md, mh, mw): one [C_pad/G][64][G] slice (G = 4
    fp32 values, TF32-rounded to nearest with ties away, or 8 bf16 / fp16 values as given), input channels
    zero-padded to C_pad, output channels to 64: the layout csrc/fused_convt_pool_reduce.cu streams.
    fp32 at mode "ieee": per tap three slices, [w_hi = tf32(w)] [tf32(w - w_hi)] [bf16(w), C padded as for bf16],
    returned as bytes."""
    if dtype == torch.float32 and mode == "ieee":
        hi = pack_weights(weight, stride).view(-1, padded_channels(weight.shape[0]) * 64)
        lo = _tf32(pack_weights(weight - _tf32(weight), stride, mode="exact")).view(hi.shape)
        bf = pack_weights(weight.to(torch.bfloat16), stride, torch.bfloat16).view(hi.shape[0], -1)
        return torch.cat([hi.view(torch.uint8), lo.view(torch.uint8), bf.view(torch.uint8)], dim=1).reshape(-1)
    c_in, k_out = weight.shape[:2]
    c_pad = padded_channels(c_in, dtype)
    group = 4 if dtype == torch.float32 else 8
    taps = weight.shape[2:]
    parts = []
    for rd in range(stride[0]):
        for rh in range(stride[1]):
            for rw in range(stride[2]):
                for td in range(rd, taps[0], stride[0]):
                    for th in range(rh, taps[1], stride[1]):
                        for tw in range(rw, taps[2], stride[2]):
                            kc = weight.new_zeros(64, c_pad, dtype=dtype)
                            kc[:k_out, :c_in] = weight[:, :, td, th, tw].t().to(dtype)
                            parts.append(kc.view(64, c_pad // group, group).permute(1, 0, 2).reshape(-1))
    packed = torch.cat(parts)
    return packed if dtype != torch.float32 or mode == "exact" else _tf32(packed)


def pack_geometry(spec: ConvTPoolReduceSpec, weight: torch.Tensor, mode: str) -> Tuple[abi.PackGeometry, int]:
    """(the packing's geometry (csrc/fused_convt_pack.cuh, fb_pack::Geometry), packed bytes): the layout
    pack_weights builds, for a weight of this dtype and strides."""
    c_in, k_out = weight.shape[:2]
    dtype = dtype_code(weight.dtype)
    kv, ks = abi.KV_X3 if weight.dtype == torch.float32 and mode == "ieee" else dtype, planner.ksteps(dtype, c_in)
    g = abi.PackGeometry()
    planner.fill_pack_geometry(g, kv, ks, c_in, k_out, weight.shape[2:], spec.stride)
    g.ws[:] = weight.stride()
    return g, g.nslices * planner.slice_bytes(kv, ks)


def packed_weights(spec: ConvTPoolReduceSpec, weight: torch.Tensor, mode: str) -> torch.Tensor:
    """The packed weights in a new buffer, made on the caller's current stream by the packing alone
    (fb_pack::pack_kernel: the fused kernel's own pack_load / pack_store; tests, probes)."""
    g, nbytes = pack_geometry(spec, weight, mode)
    out = torch.empty(nbytes, dtype=torch.uint8, device=weight.device)
    grid = planner.packing_grid(g)
    if grid is not None:
        kernel = runtime.kernel(abi.PACK, launch.device_index(weight.device))
        kernel.launch(grid, abi.PACK_THREADS, 0, _pack_args(g, weight, out))
    return out


def _pack_args(g: abi.PackGeometry, weight: torch.Tensor, out: torch.Tensor) -> runtime.Args:
    """The packing kernel's arguments: from ``weight`` into ``out`` with geometry ``g`` (copied)."""
    return runtime.Args(ctypes.c_void_p(weight.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                        abi.PackGeometry.from_buffer_copy(g))


def prepare(spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool):
    """The call for inputs like ``x`` (dtype, shape, strides, device, alignment), everything that depends only on
    those worked out once (the plan, its kernel, grid, shared memory, a template of the kernel's parameters): returns
    ``run(x, weight, bias) -> out`` (host time per call).  The weights as they are now are packed in every call into
    this thread's scratch buffer of the stream: by the kernel's own blocks (csrc/fused_convt_pool_reduce/
    weight_pack.cuh: one launch), or, for a grid of more than one wave, by the packing kernel launched just before it
    with a programmatic dependency (the plan's pack_grid)."""
    copy = not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last_3d))
    xs = x.contiguous() if copy else x   # NCDHW / channels_last_3d read natively, else copied
    index = launch.device_index(x.device)
    p = planner.plan(problem(spec, xs, mode), runtime.device_props(index))
    if p.why:
        raise RuntimeError(f"fullfuse: {p.why}")
    fused = _kernel(p, index)
    packer = runtime.kernel(abi.PACK, index) if p.pack_grid else None
    # the launches at this signature's dimensions, converted once (host time per call)
    launch_fused = fused.at(p.blocks, p.threads, p.smem)
    launch_packing = packer.at(p.pack_grid, abi.PACK_THREADS, 0) if packer is not None else None
    launch_dependent = fused.dependent_at(p.blocks, p.threads, p.smem) if packer is not None else None
    pooled = spec.pooled_spatial(tuple(x.shape[2:]))
    # out in the shape the call returns (keepdim's unit channel dim changes no offset of the kernel's writes)
    shape = (x.shape[0], *([1] if spec.keepdim else []), *pooled)
    channels_last = bool(p.params.channels_last)
    vec_shape = not channels_last and p.params.W % p.vec_columns == 0   # NCDHW 16-byte column groups, if aligned
    template = bytes(p.params)   # every field but the pointers, the weight's strides and ncdhw_vec
    ws_cnt, ws_pack = p.ws_cnt_offset, p.ws_pack_offset
    # window maxima and counters (zero; the kernel leaves them zero), this thread's buffer for the packed weights
    wanted = ((p.ws_bytes, workspace.ZEROED),
              (p.params.pg.nslices * planner.slice_bytes(p.kv, p.ks), workspace.PACKED))
    local = threading.local()   # .args: this thread's parameter struct (a launch copies it: free again after)

    def run(x, weight, bias):
        if copy:
            x = x.contiguous()
        stream, kept = workspace.for_launch(index, wanted)
        out = launch.new_output(x, shape)   # the model's dtype, written by the kernel
        bias = contiguous(bias)
        xp = x.data_ptr()
        if channels_last and xp % 16:
            raise RuntimeError("fullfuse: the fused kernel needs a 16-byte aligned channels_last_3d input")
        args = getattr(local, "args", None)
        if args is None:
            args = local.args = runtime.Args(abi.FBParams.from_buffer_copy(template))
            args.strides, args.ws = None, None
            if packer is not None:
                args.pack = _pack_args(args.values[0].pg, weight, kept[1])
        prm = args.values[0]
        strides = weight.stride()
        if strides != args.strides:   # the packing reads the weight through its strides (any layout)
            prm.pg.ws[:] = strides
            args.strides = strides
            if packer is not None:
                args.pack.values[2].ws[:] = strides
        wptr = weight.data_ptr()
        prm.x, prm.w, prm.out = xp, wptr, out.data_ptr()
        prm.bias = None if bias is None else bias.data_ptr()
        wsp, wp = kept.pointers
        if kept.pointers != args.ws:   # the kept buffers' addresses, set where they changed
            prm.ws, prm.ws_cnt, prm.pack_cnt, prm.wp = wsp, wsp + ws_cnt, wsp + ws_pack, wp
            args.ws = kept.pointers
        prm.ncdhw_vec = int(vec_shape and xp % 16 == 0)
        if packer is None:
            launch_fused(stream, args)
            return out
        pack = args.pack.values
        pack[0].value, pack[1].value = wptr, wp
        launch_packing(stream, args.pack)
        # the fused kernel's first blocks load their tiles while the packing runs and wait for it (griddepcontrol.wait)
        # before their first weight read; whatever wrote x came before the packing, complete before it started
        launch_dependent(stream, args)
        return out
    return run
