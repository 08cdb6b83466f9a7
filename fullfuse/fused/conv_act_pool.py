"""Family A fused kernel (csrc/fused_conv_act_pool/): implicit-GEMM conv whose epilogue adds the bias, applies the
activation and reduces per (image, channel); only (N, C_out) values leave the chip.  The plan is conv_act_pool_plan's,
the kernels are compiled per instantiation at first use (cutlass_ops.conv_act_pool) and launched through runtime."""
from __future__ import annotations

import ctypes
import threading
from typing import List, Optional, Tuple

import torch

from cutlass_ops import conv_act_pool as abi
from .. import launch, runtime, workspace
from ..codes import ACTIVATIONS, POOLS, PRECISIONS, dtype_code
from ..spec import ConvActPoolSpec
from ..weights import contiguous
from . import conv_act_pool_plan as plan


def static_unsupported(spec: ConvActPoolSpec) -> Optional[str]:
    """Why the fused kernel can never serve this spec (None if it may, depending on the input)."""
    if spec.groups != 1:
        return "groups != 1"
    if spec.padding_mode != "zeros":
        return f"padding_mode={spec.padding_mode!r}"
    return None


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _kernel_layout(x: torch.Tensor) -> Tuple[bool, int]:
    """(copy x first, channels_last): the layout the kernel reads x in — its own (NCHW / NCDHW or channels_last), else
    a contiguous copy.  A channels_last(_3d) input that only the per-element loader would read — a Conv3d's, or a
    Conv2d's with fewer than 8 channels — is copied to NCHW / NCDHW when its rows suit the TMA / 16-byte loaders there
    (W % 4 fp32, % 8 16-bit): the copy (one read and write of the input, which the call then holds as extra memory)
    costs far less than the per-element loader (docs/design.md)."""
    if x.is_contiguous():
        return False, 0
    if x.is_contiguous(memory_format=_CHANNELS_LAST[x.dim()]):
        rows_suit = x.shape[-1] % (4 if x.dtype == torch.float32 else 8) == 0
        if rows_suit and (x.dim() == 5 or x.shape[1] < 8):
            return True, 0
        return False, 1
    return True, 0


def _problem(spec, x, mode, deterministic) -> Tuple[bool, plan.Problem]:
    """(copy x first (_kernel_layout), the problem): the Conv2d's (rows, columns) and, for a Conv3d, its depth (D = 0:
    none), in the layout the kernel reads x in."""
    copy, channels_last = _kernel_layout(x)
    n, c, *space = x.shape
    k, s, p, d = spec.kernel_size, spec.stride, spec.padding, spec.dilation
    depth = (space[0], k[0], s[0], p[0], d[0]) if spec.dims == 3 else (0, 1, 1, 0, 1)
    h, w = space[-2:]
    precision = PRECISIONS.get(mode, 0)
    return copy, plan.Problem(dtype_code(x.dtype), channels_last, n, c, h, w, spec.out_channels, *k[-2:], *s[-2:],
                              *p[-2:], *d[-2:], ACTIVATIONS[spec.activation], POOLS[spec.pool], precision,
                              int(deterministic), *depth)


def _aligned(x: torch.Tensor, copy: bool) -> bool:
    """Whether the tensor the kernel reads starts 16-byte aligned (a copy is a fresh allocation: aligned)."""
    return copy or x.data_ptr() % 16 == 0


def unsupported(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool) -> Optional[str]:
    """Why the fused kernel cannot serve this call (None if it can): the planner's reason for the problem, or for this
    input where it is not 16-byte aligned; or why its kernel cannot be compiled or loaded here."""
    reason = static_unsupported(spec)
    if reason:
        return reason
    copy, pb = _problem(spec, x, mode, deterministic)
    try:
        index = launch.device_index(x.device)
        props = runtime.device_props(index)
        choice = plan.choose_call(pb, props)
        if not choice.why and not _aligned(x, copy):
            choice = plan.choose_call(pb, props, aligned=False)
        if choice.why:
            return choice.why
        runtime.kernel(_variant(pb, choice), index)   # compiled (or found in the cache) and loaded
    except Exception as exc:  # no NVRTC and no cached kernel, a compile failure, a GPU the kernel cannot run on
        return f"fused kernel unavailable: {str(exc).splitlines()[0]}"
    return None


def kernel(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool) -> str:
    """Which kernel serves this call, in words (``unsupported`` said one does)."""
    copy, pb = _problem(spec, x, mode, deterministic)
    text = plan.kernel_text(pb, runtime.device_props(launch.device_index(x.device)))
    return (text or "fused kernel") + (", on a contiguous copy of the input" if copy else "")


def _variant(pb: plan.Problem, c: plan.Choice):
    if c.wp.ok:
        return abi.wg_plan_variant(pb.dtype, pb.precision, c.wp.lm, c.wp.prm)
    return abi.mma_plan_variant(pb.dtype, pb.precision, c.pl.nu)


class Launches:
    """One call signature's launches, everything that depends only on the signature worked out once: the plan, its
    kernel build, grid, shared memory and parameter templates.  ``params`` fills a call's pointers into copies of the
    templates (thread-safe: the templates are only read); the device-free half of the launch path."""

    def __init__(self, pb: plan.Problem, props: runtime.DeviceProps, choice: plan.Choice):
        self.pb, self.props, self.choice = pb, props, choice
        if choice.why:
            raise launch_error(choice.why)
        self.variant = _variant(pb, choice)
        self.esize = 4 if pb.dtype == abi.F32 else 2   # bytes of an input, weight or bias element
        # the non-deterministic mean adds into its output atomically: float32, zeroed first; otherwise the kernel
        # writes each value once, in the input's dtype (bytes of an output element: osize)
        self.atomic = pb.pool == plan.POOL_MEAN and not pb.deterministic
        self.osize = 4 if self.atomic else self.esize
        self.wgmma = choice.wp.ok
        self.tma = plan.uses_tma(choice)
        # (mma.sync) 16-byte row loads of a channels_last input with channels in 8s, where the call's x is aligned
        self.vec_rows = bool(pb.channels_last) and pb.C % 8 == 0
        self.geometry = plan.tensor_map_geometry(pb, choice.wp.lm, choice.wp.prm) if self.tma else None
        if self.wgmma:
            self._init_wgmma(choice.wp)
        else:
            self._init_mma(choice.pl)
        # the launches for each weight layout met (element strides -> blocks; None: read through a contiguous copy)
        self._by_strides = {(pb.C * pb.T * pb.R * pb.S, pb.T * pb.R * pb.S, pb.R * pb.S, pb.S, 1) if pb.D > 0 else
                            (pb.C * pb.R * pb.S, pb.R * pb.S, pb.S, 1): self.blocks}

    def _init_wgmma(self, wp: plan.WGPlan):
        pb = self.pb
        q = abi.WGParams.from_buffer_copy(wp.prm)
        q.nhwc = pb.channels_last
        q.gelu_fast = 1   # GELU (erf) clamp-free while a block's inputs are bounded (the kernel checks)
        q.fulltile = 1    # whole 16-bit tiles skip the per-column-block mask tests
        # 16-bit GELU mean: the half-precision epilogue (gelu_h2.cuh; tiles out of fp16's range redone in fp32)
        q.h2 = 1 if pb.dtype != abi.F32 and pb.activation == plan.ACT_GELU_ERF and pb.pool == plan.POOL_MEAN else 0
        self.grid, self.smem = q.G, wp.smem
        self.ws_cnt, self.ws_bytes = wp.ws_cnt_bytes, wp.ws_bytes
        # K > 64: one launch per 64 channels, launch kb's (N, K_kb) block of a tmp buffer copied into out's columns;
        # offsets in bytes of the weights (one output channel's: C x R x S elements) and of the bias (both in the
        # input's dtype)
        wrow = q.wsk * self.esize   # (the planner's template: a contiguous weight's strides)
        self.nkb = wp.nkb
        self.blocks: List[Tuple[bytes, int, int, int]] = []   # (template, first channel, channels, weight offset)
        for kb in range(wp.nkb):
            k0 = 64 * kb
            q.K = min(pb.K - k0, 64)
            self.blocks.append((bytes(q), k0, q.K, k0 * wrow))

    def blocks_for(self, strides: Tuple[int, ...]) -> Optional[List[Tuple[bytes, int, int, int]]]:
        """The launches (as ``blocks``) for a weight with these element strides, read as it lies (a channels_last
        filter: no copy per call); None where it must be made contiguous first: a Conv3d's (its C x T channels share one
        stride only when contiguous; the key above is its 5-d contiguous strides) or offsets past 32 bits."""
        try:
            return self._by_strides[strides]
        except KeyError:
            pass
        blocks = self._restrided(strides)
        self._by_strides[strides] = blocks   # (a race computes the same value twice: harmless)
        return blocks

    def _restrided(self, strides: Tuple[int, ...]) -> Optional[List[Tuple[bytes, int, int, int]]]:
        pb = self.pb
        if pb.D > 0 or len(strides) != 4 or min(strides) < 0:
            return None
        sk, sc, sr, ss = strides
        if sc >= 2**31 or (pb.C - 1) * sc + (pb.R - 1) * sr + (pb.S - 1) * ss >= 2**31:
            return None
        if not self.wgmma:   # the mma.sync kernel reads every element through the four strides
            q = abi.FAParams.from_buffer_copy(self.blocks[0][0])
            q.wsk, q.wsc, q.wsr, q.wss = strides
            return [(bytes(q), 0, pb.K, 0)]
        blocks = []
        for template, k0, kk, _ in self.blocks:
            q = abi.WGParams.from_buffer_copy(template)
            # op_wo of a contiguous weight is (c0 R + r) S + s (conv_act_pool_plan._wg_ops): the same element here
            for h in range(2):
                for j in range(len(q.op_wo[h])):
                    if q.op_wn[h][j] > 0:
                        c0, rs = divmod(q.op_wo[h][j], pb.R * pb.S)
                        r, s = divmod(rs, pb.S)
                        q.op_wo[h][j] = c0 * sc + r * sr + s * ss
            q.wsc, q.wsk = sc, sk
            blocks.append((bytes(q), k0, kk, k0 * sk * self.esize))
        return blocks

    def _init_mma(self, pl: plan.MmaPlan):
        self.grid_blocks = self.pb.N * pl.nksl * pl.nbands * pl.nseg
        self.smem = pl.smem
        self.ws_cnt, self.ws_bytes = pl.ws_cnt_bytes, pl.ws_bytes
        self.nkb = 1
        self.blocks = [(bytes(plan.mma_params(self.pb, pl, aligned=True)), 0, self.pb.K, 0)]

    def fill_ws(self, q, ws: int, parts: int):
        """The workspace's counters and maxima in the zeroed buffer ``ws`` (kept zero by the kernel), its partials
        in the scratch buffer ``parts`` (workspace.py).  Without a workspace the fields stay NULL, as the templates
        have them."""
        if self.ws_bytes:
            q.ws_cnt = ws
            if self.pb.pool == plan.POOL_MEAN:
                q.ws_part = parts
            else:
                q.ws_max = ws + self.ws_cnt

    @staticmethod
    def fill_tmap(q, tmap: Optional[bytes]) -> None:
        """The input's tensor map (TMA loaders; None: none) in the struct's first 128 bytes."""
        if tmap is not None:
            ctypes.memmove(ctypes.addressof(q), tmap, len(tmap))

    def fill(self, q, x: int, w: int, bias: int, out: int, k0: int = 0, woff: int = 0) -> None:
        """Set one launch's tensor addresses in its parameters ``q`` (bias 0: none; k0 / woff: the launch's first
        output channel and its weights' byte offset, K > 64)."""
        q.x, q.w, q.bias, q.out = x, w + woff, (bias + self.esize * k0) if bias else None, out
        if not self.wgmma:
            q.vec_ok = 1 if self.vec_rows and x % 16 == 0 else 0

    def params(self, x: int, w: int, bias: int, out: int, ws: int, parts: int, tmap: Optional[bytes] = None,
               tmp: int = 0, blocks=None):
        """The kernel parameters of each launch for these addresses (tmp: the workspace's tmp block, K > 64 only;
        blocks: the weight layout's launches, blocks_for, default a contiguous weight's)."""
        if not self.wgmma:
            q = abi.FAParams.from_buffer_copy((blocks or self.blocks)[0][0])
            self.fill(q, x, w, bias, out)
            self.fill_ws(q, ws, parts)
            return [q]
        out_list = []
        for template, k0, _, woff in blocks or self.blocks:
            q = abi.WGParams.from_buffer(bytearray(template))
            self.fill_tmap(q, tmap)
            self.fill(q, x, w, bias, out if self.nkb == 1 else tmp + self.osize * self.pb.N * k0, k0, woff)
            self.fill_ws(q, ws, parts)
            out_list.append(q)
        return out_list


def launch_error(why: str) -> RuntimeError:
    return RuntimeError(f"fullfuse: the fused kernel cannot serve this call: {why}")


class _Runner:
    """One call signature's prepared call (``run``): launches bound to a device, the kernel loaded, the mma.sync grid
    from its occupancy, and the call's output and kept buffers.  A TMA plan's runner makes (and keeps) the tensor map
    of each call's input; where the driver cannot make one, the call runs the copy loader's plan
    (``plan.fallback_choice``), prepared on first need."""

    def __init__(self, launches: Launches, device: int, copy: bool, shape: Tuple[int, ...], dtype: torch.dtype):
        self.l, self.device, self.copy, self.dtype = launches, device, copy, dtype
        self._local = threading.local()   # .args: strides -> this thread's parameter struct (one launch, nkb == 1)
        self.kernel = runtime.kernel(launches.variant, device)
        if launches.wgmma:
            self.grid = launches.grid
        else:   # at most the blocks that are resident at once; each loops over its items
            occ = self.kernel.blocks_per_sm(128, launches.smem)
            self.grid = min(launches.grid_blocks, occ * launches.props.sm_count)
        self._launch = self.kernel.at(self.grid, 128, launches.smem)
        # (the planner's geometry: the maps made once per signature and address)
        self.tmaps = runtime.TensorMaps(launches.geometry) if launches.tma else None
        self._copy_loader: Optional[_Runner] = None
        # out in the shape the call returns (any view of the N x K values the kernel writes); the atomic mean adds
        # into a zeroed float32 out, converted after
        self.shape, self.zeros_sizes = shape, launch.size_args(shape)
        # counters and maxima (zero; the kernel leaves them zero), the mean's partials (an upper bound)
        ws_bytes = plan.workspace_bytes(launches.pb, launches.props)
        self.wanted = ((ws_bytes, workspace.ZEROED),
                       (ws_bytes if launches.pb.pool == plan.POOL_MEAN else 0, workspace.PARTIALS))

    def _without_tensor_map(self) -> "_Runner":
        if self._copy_loader is None:   # (a race prepares it twice: harmless)
            l = self.l
            self._copy_loader = _Runner(Launches(l.pb, l.props, plan.fallback_choice(l.pb, l.props, l.choice)),
                                        self.device, self.copy, self.shape, self.dtype)
        return self._copy_loader

    def run(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """One call, launched on the current stream of the kernel's device (the one the kept buffers serve).  The
        kernels read a Conv2d's weight in its own layout (Launches.blocks_for); a Conv3d's is made contiguous for this
        call where it is not.  Every tensor the kernel reads is held by a name until the launch is enqueued."""
        if self.copy:
            x = x.contiguous()
        tmap = None
        if self.tmaps is not None:
            tmap = self.tmaps(x.data_ptr())
            if tmap is None:
                return self._without_tensor_map().run(x, weight, bias)
        l = self.l
        out = (torch.zeros(*self.zeros_sizes, dtype=torch.float32, device=x.device) if l.atomic
               else launch.new_output(x, self.shape))
        bias = contiguous(bias)
        stream, kept = workspace.for_launch(self.device, self.wanted)
        strides = weight.stride()
        if l.nkb != 1:
            self._launch_blocks(x, weight, bias, out, *kept, stream, tmap, strides)
        else:
            # one launch: this thread's own parameter struct per weight layout (the layout's strides as the caller
            # has them), made once from the layout's template, gets the call's pointers (a launch copies the
            # parameters, so the struct is free again when the launch returns); the kept buffers' pointers and the
            # tensor map only where they changed
            by_strides = getattr(self._local, "args", None)
            if by_strides is None:
                by_strides = self._local.args = {}
            mine = by_strides.get(strides)
            if mine is None:
                blocks = l.blocks_for(strides)
                mine = by_strides[strides] = runtime.Args(l.params(0, 0, 0, 0, 0, 0, blocks=blocks)[0])
                mine.contiguous, mine.tmap, mine.kept = blocks is None, None, (0, 0)
            if mine.contiguous:
                weight = contiguous(weight)
            q = mine.values[0]
            if tmap is not mine.tmap:   # (TensorMaps gives one object per address)
                l.fill_tmap(q, tmap)
                mine.tmap = tmap
            if kept.pointers != mine.kept:   # (the same tuple while for_launch's answer is reused: one test)
                l.fill_ws(q, *kept.pointers)
                mine.kept = kept.pointers
            l.fill(q, x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr())
            self._launch(stream, mine)
        return out.to(self.dtype) if l.atomic and self.dtype != torch.float32 else out

    def _launch_blocks(self, x, weight, bias, out, ws, parts, stream: int, tmap, strides) -> None:
        """K > 64: launch kb into its (N, K_kb) block of a tmp buffer of this call (zeroed for the atomic mean, which
        adds into it), then the block into out's columns, all in stream order."""
        l = self.l
        blocks = l.blocks_for(strides)
        if blocks is None:
            weight = contiguous(weight)   # (held by this name until the launches are enqueued)
        ptrs = (x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                0 if ws is None else ws.data_ptr(), 0 if parts is None else parts.data_ptr())
        n = l.pb.N
        tmp = (torch.zeros if l.atomic else torch.empty)(n * l.nkb * 64, dtype=out.dtype, device=out.device)
        for q, (_, k0, kk, _) in zip(l.params(*ptrs, tmap, tmp.data_ptr(), blocks), l.blocks):
            block = tmp[n * k0:n * (k0 + kk)].view(n, kk)
            self._launch(stream, runtime.Args(q))
            out.view(n, -1)[:, k0:k0 + kk].copy_(block)


def prepare(spec: ConvActPoolSpec, x: torch.Tensor, mode: str, deterministic: bool):
    """The call for inputs like ``x`` (dtype, shape, strides, device, 16-byte alignment), everything that depends only
    on those worked out once: returns ``run(x, weight, bias) -> out`` (host time per call)."""
    copy, pb = _problem(spec, x, mode, deterministic)
    index = launch.device_index(x.device)
    props = runtime.device_props(index)
    launches = Launches(pb, props, plan.choose_call(pb, props, _aligned(x, copy)))
    return _Runner(launches, index, copy, spec.output_shape(x.shape[0]), x.dtype).run
