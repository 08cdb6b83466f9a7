"""A spec's calls: PyTorch's semantics around the dispatcher, and each call signature's prepared call.

``SpecCalls`` serves one (spec, path, precision, deterministic), as a region or ``ops.run_spec`` calls it:

- the common call (a batched input, no autograd, no autocast, eager) is a lookup of its signature and the prepared
  call, with nothing else in between (host time per call; ``run``);
- an unbatched input (as torch convs accept it) runs as a batch of one, the spec's post view (family A) taken after;
- an input or weight that needs gradients runs the torch path (fullfuse is inference-only), with a one-time warning;
- a tensor subclass (its own __torch_function__ / __torch_dispatch__, DTensor...) runs PyTorch's ops, which it
  overrides as it defines (nn.Parameter is no subclass here);
- under a torch.func transform (vmap, grad, jvp, functionalize), forward-mode AD (a dual level), a torch dispatch
  mode (make_fx, FakeTensorMode, FlopCounterMode...) or a torch function mode (but ``torch.device(...)``'s) the call
  runs PyTorch's ops, which those see and transform (a kernel launch would be invisible to them, and their tensors
  have no storage to launch on);
- under autocast the region computes in the autocast dtype, as the original would (float32 out where autocast runs
  the last op in float32);
- under torch.compile the call goes through the registered op (``ops``), which dynamo sees as one opaque op; under
  torch.export it runs PyTorch's ops, so the exported program runs without fullfuse (ONNX, AOTInductor, ExecuTorch).

``last`` is (path, reason) of the most recent call: what ``FusedModel.plans`` shows.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Dict, Optional

import torch
from torch.autograd import forward_ad as _forward_ad

from . import dispatch, torch_path
from .precision import NATIVE_MODES, check_precision, resolve, torch_conv_precision
from .spec import ConvActPoolSpec, ConvTPoolReduceSpec

# whether torch.compile is tracing the call (torch.compiler.is_compiling; never on torch builds without it)
compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
# whether torch.export is tracing it (a stricter test than compiling(); never on torch builds without it): torch's
# flag itself where it has one, whose value torch.compile reads (torch.compiler.is_exporting() reads True under any
# torch.compile on torch 2.11, which would give a compiled model PyTorch's ops for every region)
_compiler = getattr(torch, "compiler", None)
if hasattr(_compiler, "_is_exporting_flag"):
    def _exporting() -> bool:
        return _compiler._is_exporting_flag
else:
    _exporting = getattr(_compiler, "is_exporting", lambda: False)


def exporting() -> bool:
    """Whether torch.export is tracing the call."""
    return compiling() and _exporting()


_grad_enabled = torch.is_grad_enabled
_deterministic_algorithms = getattr(torch._C, "_get_deterministic_algorithms",
                                    torch.are_deterministic_algorithms_enabled)
_AUTOCAST_INPUTS = (torch.float32, torch.float16, torch.bfloat16)
# torch.func's transforms active (vmap, grad, jvp, functionalize: None when none is), torch dispatch modes active
# (their count), forward-mode AD's dual level (-1 outside one): one C call or module global each
_functorch_stack = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", lambda: None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_function_modes = getattr(torch._C, "_len_torch_function_stack", lambda: 0)
# torch function modes that change nothing a kernel call does: `with torch.device(...)` (the default device of
# factory functions; every tensor a call makes gets its device explicitly)
try:
    from torch.utils._device import DeviceContext as _DeviceContext
    _PASSIVE_FUNCTION_MODES: tuple = (_DeviceContext,)
except ImportError:   # (torch without it: every function mode counts)
    _PASSIVE_FUNCTION_MODES = ()
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))   # the tensor types the kernels take (exact types)


def _autocast_query():
    """Whether autocast is on for CUDA, as one C call: torch's getter without arguments (CUDA's, in every torch
    fullfuse supports) where it answers silently, else bound to "cuda" (host time per call)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.is_autocast_enabled()
        return torch.is_autocast_enabled
    except Exception:   # (a torch that deprecates the spelling without a device)
        return functools.partial(torch.is_autocast_enabled, "cuda")


_cuda_autocast_on = _autocast_query()
_warned_grad = False


def _warn_grad_once():
    global _warned_grad
    if not _warned_grad:
        _warned_grad = True
        warnings.warn("fullfuse: an input or weight requires grad; running the torch path so autograd works "
                      "(fullfuse's kernels are inference-only)", stacklevel=4)


def _torch_ops_needed(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[str]:
    """Why PyTorch's ops must run instead of a kernel (None: nothing records, transforms or overrides the call's ops).
    Under torch.compile only the export and subclass tests apply (dynamo traces neither C query of the others)."""
    if compiling():
        if _exporting():
            return "torch.export records PyTorch's ops (the program then runs where fullfuse does not)"
    elif _functorch_stack() is not None:
        return "a torch.func transform (vmap, grad, jvp, functionalize) runs PyTorch's ops"
    elif _forward_ad._current_level >= 0:
        return "forward-mode AD (a dual level) runs PyTorch's ops"
    elif _dispatch_modes():
        return "a torch dispatch mode (make_fx, FakeTensorMode, FlopCounterMode...) sees PyTorch's ops"
    elif _function_modes() and not all(isinstance(mode, _PASSIVE_FUNCTION_MODES)
                                       for mode in torch.overrides._get_current_function_mode_stack()):
        return "a torch function mode sees PyTorch's ops"
    if not (type(x) in _PLAIN and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN)):
        return "a tensor subclass runs PyTorch's ops, as it overrides them"
    return None


def _autocast_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype autocast would run this region's convolution in (None: autocast is off or leaves x as it is).
    Convolutions are on autocast's lower-precision list: float tensors on an autocast-enabled device are cast."""
    if not x.is_cuda or x.dtype not in _AUTOCAST_INPUTS or not _cuda_autocast_on():
        return None
    get = getattr(torch, "get_autocast_dtype", None)
    return get("cuda") if get is not None else torch.get_autocast_gpu_dtype()


def _autocast_float32(spec) -> bool:
    """Whether autocast runs the region's last op in float32: ``sum`` is on its float32 list; mean / amax / the
    adaptive pools are not (they keep their input's dtype)."""
    return isinstance(spec, ConvTPoolReduceSpec) and spec.reduction == "sum"


def _requires_grad(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    return x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)


class SpecCalls:
    """The calls of one (spec, path, precision, deterministic) (the module's text says what a call does); one object
    per such tuple (``calls_for``), so that a region, ``ops.run_spec`` and the registered op share prepared calls."""

    LIMIT = 1024   # prepared call signatures kept (a process that sees ever new shapes does not grow without limit)

    def __init__(self, spec, path: str, precision: str, deterministic: bool):
        dispatch.check_path(path)
        check_precision(precision)
        self.spec, self.path, self.precision, self.deterministic = spec, path, precision, deterministic
        self.last = (None, None)
        self._rank = spec.dims + 2
        # the mode of each input dtype where it does not follow torch's flags (float32 under "auto" does: read per call)
        self._modes = dict(NATIVE_MODES)
        if precision != "auto":
            self._modes[torch.float32] = precision
        # call signature -> ((path, reason), run(x, weight, bias)); the signature is what the choice and the prepared
        # call depend on: the mode, the input's dtype, device, shape and strides (the layout) and its address's
        # 16-byte alignment (the loaders), the weight's and bias's dtype, device and shape (a weight replaced by
        # one of another shape runs PyTorch's ops: dispatch)
        self._prepared: Dict[tuple, tuple] = {}
        self._pooled: Optional[SpecCalls] = None
        # PyTorch's ops of the spec, bound once (the general route's calls: autograd, transforms, modes, subclasses)
        self._torch_ops = torch_path.prepared(spec)

    def __reduce__(self):
        """Pickled and copied as its arguments: the copy is the process's own object for them (prepared calls hold
        loaded kernels, which neither pickle nor copy)."""
        return calls_for, (self.spec, self.path, self.precision, self.deterministic)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if compiling():   # (before the C queries of eager: torch.compile traces none of them)
            return self._general(x, weight, bias, _grad_enabled() and _requires_grad(x, weight, bias))
        return self.eager(x, weight, bias)

    def eager(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """``__call__`` outside torch.compile (a caller that knows it is not tracing asks nothing more: host time).  A
        call that needs no gradient is the common one, which ``run`` serves as it is, where it has a batched input of
        the spec's rank, plain tensors, no CUDA autocast, no torch dispatch or function mode, torch.func transform or
        dual level (tested inline: host time per call).  Under autocast for another device alone a CUDA input's ops
        run as written, and a CPU input's prepared call is PyTorch's ops, which that autocast sees."""
        if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
            return self._general(x, weight, bias, True)
        if (x.dim() == self._rank and type(x) in _PLAIN and type(weight) in _PLAIN
                and (bias is None or type(bias) in _PLAIN) and not _cuda_autocast_on() and not _dispatch_modes()
                and not _function_modes() and _functorch_stack() is None and _forward_ad._current_level < 0):
            return self.run(x, weight, bias)
        return self._general(x, weight, bias, False)

    def run(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """The dispatcher: the signature's prepared call (made on its first call: dispatch.prepare), run.  Built
        inline: host time per call."""
        dtype = x.dtype
        mode = self._modes.get(dtype)
        if mode is None:
            mode = torch_conv_precision() if dtype is torch.float32 else resolve(self.precision, dtype)
        # (torch.use_deterministic_algorithms(True) asks for deterministic reductions whatever this object's own
        # setting: read per call only where that setting allows the atomic ones)
        deterministic = self.deterministic or _deterministic_algorithms()
        key = (mode, deterministic, dtype, x.device, x.shape, x.stride(), x.data_ptr() % 16, weight.dtype,
               weight.device, weight.shape, None if bias is None else (bias.dtype, bias.device, bias.shape))
        entry = self._prepared.get(key)
        if entry is None:
            entry = dispatch.prepare(self.spec, self.path, self.precision, mode, deterministic, x, weight, bias)
            if len(self._prepared) >= self.LIMIT:
                self._prepared.clear()
            self._prepared[key] = entry
        self.last = entry[0]
        return entry[1](x, weight, bias)

    def run_op(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """The registered op's call (``ops``): the dispatcher on the inputs as given — a custom op computes in its
        inputs' dtypes, autocast aside, as its fake implementation says (torch.compile's graphs call it so, under the
        caller's autocast) — an unbatched input as a batch of one, as the wrappers take it."""
        if x.dim() != self.spec.dims + 1:
            return self.run(x, weight, bias)
        return self._batch_of_one(SpecCalls.run, x, weight, bias)

    def _batch_of_one(self, call, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """An unbatched input through ``call`` (``SpecCalls.__call__`` or ``run``) of the spec without its post view
        as a batch of one, the post view (family A) taken after."""
        pooled = self._pooled_calls()
        out = call(pooled, x.unsqueeze(0), weight, bias).squeeze(0)
        if pooled is not self:
            self.last = pooled.last
            out = torch_path.post_view(self.spec, out)
        return out

    def _general(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 needs_grad: bool) -> torch.Tensor:
        """Every call that is not the common one (the module's text, in this order; needs_grad: autograd needs the
        call's graph)."""
        spec = self.spec
        if x.dim() == spec.dims + 1:
            return self._batch_of_one(SpecCalls.__call__, x, weight, bias)
        if needs_grad:
            _warn_grad_once()
            self.last = ("torch", "an input or weight requires grad (autograd runs PyTorch's ops)")
            return self._torch_ops(x, weight, bias)
        why = _torch_ops_needed(x, weight, bias)
        if why is not None:   # (under the caller's autocast, as the original's ops)
            self.last = ("torch", why)
            return self._torch_ops(x, weight, bias)
        cast = _autocast_dtype(x)
        if cast is not None:
            if self.path == "torch":                      # PyTorch's own ops under the caller's autocast
                self.last = ("torch", "requested")
                return self._torch_ops(x, weight, bias)
            with torch.autocast("cuda", enabled=False):
                out = self(x.to(cast), weight.to(cast), None if bias is None else bias.to(cast))
            return out.float() if _autocast_float32(spec) else out
        if not compiling() or spec.groups != 1 or spec.padding_mode != "zeros":
            return self.run(x, weight, bias)
        return _registered_op(spec, x, weight, bias, self.path, self.precision, self.deterministic)

    def _pooled_calls(self) -> "SpecCalls":
        """The calls of the spec without its post view (family A; B has none): what a batched call of an unbatched
        input runs."""
        if self._pooled is None:
            post = getattr(self.spec, "post", "none")
            self._pooled = self if post == "none" else calls_for(dataclasses.replace(self.spec, post="none"),
                                                                 self.path, self.precision, self.deterministic)
        return self._pooled


_registry: Dict[tuple, SpecCalls] = {}
REGISTRY_LIMIT = 256   # (as ops' spec caches; a region keeps its own SpecCalls, also once the registry let it go)


def calls_for(spec, path: str = "auto", precision: str = "auto", deterministic: bool = True) -> SpecCalls:
    """The process's ``SpecCalls`` of these arguments (made on first use; raises ValueError for an unknown path or
    precision, keeping nothing)."""
    key = (spec, path, precision, deterministic)
    calls = _registry.get(key)
    if calls is None:
        calls = SpecCalls(spec, path, precision, deterministic)
        if len(_registry) >= REGISTRY_LIMIT:
            _registry.clear()
        calls = _registry.setdefault(key, calls)
    return calls


def _registered_op(spec, x, weight, bias, path: str, precision: str, deterministic: bool) -> torch.Tensor:
    """The call through the op ``ops`` registers (torch.ops.fullfuse.*), as torch.compile traces it."""
    if isinstance(spec, ConvActPoolSpec):
        return torch.ops.fullfuse.conv_act_pool(x, weight, bias, list(spec.stride), list(spec.padding),
                                                list(spec.dilation), spec.activation, spec.pool, spec.keepdim,
                                                spec.post, path, precision, deterministic)
    return torch.ops.fullfuse.convt_pool_reduce(x, weight, bias, list(spec.stride), list(spec.padding),
                                                list(spec.output_padding), list(spec.dilation), list(spec.window),
                                                spec.activation, spec.reduction, spec.keepdim, path, precision,
                                                deterministic)
