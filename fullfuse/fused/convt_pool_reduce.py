"""Family B fused kernel (csrc/fused_convt_pool_reduce.cu): the transposed conv as sub-pixel implicit GEMMs on the
tensor cores whose epilogue keeps the pooling-window maxima on chip, then one fixed-order channel reduction; only
the pooled result is written."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .. import launch, workspace
from ..codes import ACTIVATIONS, PRECISIONS, REDUCTIONS, dtype_code
from ..spec import ConvTPoolReduceSpec
from ..weights import float32_bias

LIB = "fused_convt_pool_reduce"


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


def problem(spec, x, mode) -> launch.Problem:
    """The C API's problem array (csrc/fused_convt_pool_reduce.cu, FB_PROBLEM_LEN): dtype, precision, layout, shape,
    geometry per dim, activation, reduction."""
    n, c, d, h, w = x.shape
    return launch.Problem((dtype_code(x.dtype), PRECISIONS.get(mode, 0), int(_channels_last(x)), n, c, d, h, w,
                           spec.out_channels, *spec.kernel_size, *spec.stride, *spec.padding, *spec.output_padding,
                           *spec.window, ACTIVATIONS[spec.activation], REDUCTIONS[spec.reduction]))


def unsupported(spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool) -> Optional[str]:
    """Why the fused kernel cannot serve this call (None if it can)."""
    reason = static_unsupported(spec)
    if reason:
        return reason
    if _channels_last(x) and x.data_ptr() % 16:
        return "channels_last_3d input not 16-byte aligned (the fused kernel copies 16-byte channel groups)"
    try:
        why = launch.call(LIB, "ff_fused_convt_pool_reduce_unsupported", problem(spec, x, mode), device=x.device)
    except Exception as exc:  # no nvcc and no cached build, or a build failure
        return f"fused kernel unavailable: {str(exc).splitlines()[0]}"
    return None if why is None else why.decode()


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


def pack_geometry(spec: ConvTPoolReduceSpec, weight: torch.Tensor, mode: str) -> Tuple[launch.Problem, int]:
    """(the C API's geometry for ff_fused_convt_pack_weights (csrc/fused_convt_pack.cuh), packed bytes): the layout
    pack_weights builds, for a weight of this dtype and strides."""
    c_in, k_out = weight.shape[:2]
    if weight.dtype != torch.float32:
        op, c_pad, c_pad16, item_bytes = 0, padded_channels(c_in, weight.dtype), 0, 2
    elif mode == "ieee":
        op, c_pad, c_pad16 = 2, padded_channels(c_in), padded_channels(c_in, torch.bfloat16)
        item_bytes = None
    else:
        op, c_pad, c_pad16, item_bytes = 1, padded_channels(c_in), 0, 4
    taps = math.prod(weight.shape[2:])
    nbytes = taps * (c_pad * 64 * 8 + c_pad16 * 64 * 2 if item_bytes is None else c_pad * 64 * item_bytes)
    values = (op, c_in, k_out, c_pad, c_pad16, *weight.shape[2:], *spec.stride, *weight.stride(), taps)
    return launch.Problem(values), nbytes


def packed_weights(geometry: launch.Problem, nbytes: int, weight: torch.Tensor) -> torch.Tensor:
    """The packed weights, made on the caller's current stream from the weight as it is now."""
    out = torch.empty(nbytes, dtype=torch.uint8, device=weight.device)
    launch.launch(LIB, "ff_fused_convt_pack_weights", weight, geometry, out, device=weight.device)
    return out


def prepare(spec: ConvTPoolReduceSpec, x: torch.Tensor, mode: str, deterministic: bool):
    """The call for inputs like ``x`` (dtype, shape, strides, device, alignment), everything that depends only on
    those worked out once: returns ``run(x, weight, bias) -> out`` (host time per call).  The weights are packed in
    every call (packed_weights), the geometry of that once per weight layout."""
    copy = not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last_3d))
    prob = problem(spec, x.contiguous() if copy else x, mode)   # NCDHW / channels_last_3d read natively, else copied
    pooled = spec.pooled_spatial(tuple(x.shape[2:]))
    shape, dtype, device, keepdim = (x.shape[0], *pooled), x.dtype, x.device, spec.keepdim
    ws_bytes = workspace.nbytes(device, LIB, "ff_fused_convt_pool_reduce_workspace_bytes", (prob,))
    geometries = {}   # weight strides -> (geometry, bytes)

    call = launch.launcher(LIB, "ff_fused_convt_pool_reduce", device, (prob,), 4)   # x, w, bias, out, prob, ws

    def run(x, weight, bias):
        if copy:
            x = x.contiguous()
        geometry = geometries.get(weight.stride())
        if geometry is None:
            geometry = geometries[weight.stride()] = pack_geometry(spec, weight, mode)
        packed = packed_weights(*geometry, weight)
        out = launch.new_output(*shape, device=device, dtype=dtype)   # the model's dtype, written by the kernel
        bias = float32_bias(bias)
        ws = workspace.zeroed(device, ws_bytes)
        call(x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
             0 if ws is None else ws.data_ptr())
        return out.unsqueeze(1) if keepdim else out
    return run
