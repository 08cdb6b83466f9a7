"""FusedRegion: the module that replaces one matched region inside the traced model."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from . import calls, original_ops, torch_path
from .plan import Plan


_fx = torch.fx._symbolic_trace
fx_tracing = getattr(_fx, "is_fx_symbolic_tracing", None) or _fx.is_fx_tracing
jit_tracing = torch._C._get_tracing_state   # (torch.jit.trace and ONNX export set it)
# whether autocast is on for any device (one C call; CPU and CUDA autocast where a torch build lacks it)
any_autocast = getattr(torch._C, "_is_any_autocast_enabled",
                       lambda: torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled())


def keep_as_fx_call(module: nn.Module) -> None:
    """Make torch.fx's tracers keep ``module`` (a fused model or region) as one module call: fx's default
    ``Tracer.is_leaf_module`` (feature extraction, FX quantization, a user's passes) keeps a module whose
    ``__module__`` starts with "torch.nn" and traces into any other, where a region's per-call tests on traced values
    fail (TraceError).  Set on the instance, it leaves the class (and pickling, which names the class) as it is."""
    module.__dict__["__module__"] = "torch.nn.fullfuse"


class FusedRegion(nn.Module):
    """Runs one spec through its ``calls.SpecCalls`` (shared with its plan, which shows the last call's path).  Holds
    the original conv module (sharing its parameters), or gets the weight and bias as inputs when the model called
    F.convNd.  Where the plan no longer describes the model (``original_ops.Changes``: hooks, a forward set on one of
    its modules, a setting of one changed: the conv's stride, GELU's approximation), an unbatched input means
    something else to the ops as written, or a non-CUDA input runs under autocast (whose per-device op lists cast the
    ops the model wrote, which a spec's PyTorch ops need not be: CPU autocast runs adaptive_avg_pool3d in float32,
    not mean), it runs the region's own ops instead."""

    _fullfuse_leaf = True   # (trace.trace keeps it as a module call)

    def __init__(self, plan: Plan, conv: Optional[nn.Module], precision: str, deterministic: bool,
                 original: Optional[nn.Module] = None, modules: Tuple[nn.Module, ...] = (),
                 unbatched_as_written: bool = False):
        super().__init__()
        self.plan = plan
        # (None too: forward reads _modules["conv"], which plain assignment of None skips)
        self.add_module("conv", conv)
        self.calls = plan.calls = calls.calls_for(plan.spec, plan.requested, precision, deterministic)
        # kept outside _modules (no second copy of the conv's parameters in the state dict, no second device move:
        # the same module objects): the region's own ops and what says the plan no longer describes the model
        self.__dict__["_original"] = original
        # the change test (original_ops.Changes) of _watch's modules against their settings now, made on the first
        # call (True until then; pickling and copying set it back: __getstate__)
        self.__dict__["_watch"] = (modules, original_ops.settings_of(modules)) if original is not None else None
        self.__dict__["_changed"] = True if original is not None else None
        # an unbatched input's rank where the region's ops count a dim from the batch (match.counts_dims_from_the_batch:
        # a batch of one would reduce another dim than the ops as written)
        self.__dict__["_unbatched_rank"] = plan.spec.dims + 1 if original is not None and unbatched_as_written else None
        keep_as_fx_call(self)

    @property
    def precision(self) -> str:
        return self.calls.precision

    @property
    def deterministic(self) -> bool:
        return self.calls.deterministic

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None):
        return self.run(x, weight, bias, calls.compiling())

    def run(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
            compiling: bool = False):
        """``forward``, told whether torch.compile is tracing the call (its eager callers know it is not: host time)."""
        d = self.__dict__   # (dict lookups, not Module.__getattr__: host time per call; still live)
        conv = d["_modules"]["conv"]
        changed = d["_changed"]
        if changed is not None:
            if changed is True:
                changed = d["_changed"] = original_ops.Changes(*d["_watch"])
            if changed.since_match(compiling):
                return self._run_original(x, weight, bias, "a module hook, forward or setting was added or "
                                                           "changed after fused_model")
            unbatched = d["_unbatched_rank"]
            if unbatched is not None and x.dim() == unbatched:
                return self._run_original(x, weight, bias, "an unbatched input, and the ops count a dim from the batch")
            if not x.is_cuda and any_autocast():
                return self._run_original(x, weight, bias, "autocast on a non-CUDA input: its op lists set the "
                                                           "dtype of each op the model wrote")
        if conv is not None:
            params = conv._parameters
            weight = params.get("weight")
            if weight is None:   # a parametrized weight (torch.nn.utils.parametrize), a DataParallel replica's tensor
                weight = conv.weight
            bias = params["bias"] if "bias" in params else conv.bias
        return d["calls"](x, weight, bias) if compiling else d["calls"].eager(x, weight, bias)

    def __getstate__(self):
        """Pickling and deepcopy: without the change test, which holds the live dicts it reads (the modules' instance
        dicts, torch's global hooks): a copy makes its own on its first call."""
        state = dict(super().__getstate__())
        if state.get("_changed") is not None:
            state["_changed"] = True
        return state

    def _run_original(self, x, weight, bias, why: str):
        self.calls.last = ("torch", f"the region's own ops: {why}")
        original = self.__dict__["_original"]
        return original(x) if self._modules["conv"] is not None else original(x, weight, bias)

    def __call__(self, *args, **kwargs):
        """``forward`` without nn.Module.__call__'s hook checks (~1.5 us of host time per call; a region is
        fullfuse's own and has no hooks), except under fx tracing (a pickled fused model is re-traced when loaded)
        and torch.compile, which see the module call as usual.  Under a TorchScript trace (torch.jit.trace, ONNX
        export) the region runs PyTorch's ops, which the trace records (a kernel launch would be missing from it).
        (A fused model whose graph is this region alone calls ``forward`` itself, outside any such trace.)"""
        if fx_tracing() or calls.compiling():
            return super().__call__(*args, **kwargs)
        if jit_tracing():
            return self._traced(*args, **kwargs)
        if "forward" in self.__dict__:   # (a forward set on the instance, as accelerate's hooks do: nn.Module calls it)
            return self.forward(*args, **kwargs)
        return self.run(*args, **kwargs)

    def _traced(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None):
        if self.__dict__["_original"] is not None:
            return self._run_original(x, weight, bias, "a TorchScript trace records PyTorch's ops")
        conv = self._modules["conv"]
        if conv is not None:
            weight, bias = conv.weight, conv.bias
        self.calls.last = ("torch", "a TorchScript trace records PyTorch's ops")
        return torch_path.run(self.plan.spec, x, weight, bias)

    def extra_repr(self) -> str:
        return f"{self.plan.description} -> {self.plan.path}, precision={self.precision}"
