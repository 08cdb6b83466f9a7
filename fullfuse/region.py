"""FusedRegion: the module that replaces one matched region inside the traced model."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import calls
from .plan import Plan


_fx = torch.fx._symbolic_trace
fx_tracing = getattr(_fx, "is_fx_symbolic_tracing", None) or _fx.is_fx_tracing


def conv_weights(conv: nn.Module):
    """(weight, bias) of a conv module as its own forward reads them: its parameters where they are registered (dict
    lookups: host time per call), else its attributes — a parametrized weight (torch.nn.utils.parametrize, e.g.
    weight_norm) is computed there, and a DataParallel replica holds plain tensors there."""
    params = conv._parameters
    weight = params.get("weight")
    if weight is None:
        weight = conv.weight
    return weight, (params["bias"] if "bias" in params else conv.bias)


class FusedRegion(nn.Module):
    """Runs one spec through its ``calls.SpecCalls`` (shared with its plan, which shows the last call's path).  Holds
    the original conv module (sharing its parameters), or gets the weight and bias as inputs when the model called
    F.convNd."""

    def __init__(self, plan: Plan, conv: Optional[nn.Module], precision: str, deterministic: bool):
        super().__init__()
        self.plan = plan
        # (None too: forward reads _modules["conv"], which plain assignment of None skips)
        self.add_module("conv", conv)
        self.calls = plan.calls = calls.calls_for(plan.spec, plan.requested, precision, deterministic)

    @property
    def precision(self) -> str:
        return self.calls.precision

    @property
    def deterministic(self) -> bool:
        return self.calls.deterministic

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None):
        conv = self._modules["conv"]   # (dict lookups, not Module.__getattr__: host time per call; still live)
        if conv is not None:
            weight, bias = conv_weights(conv)
        return self.calls(x, weight, bias)

    def __call__(self, *args, **kwargs):
        """``forward`` without nn.Module.__call__'s hook checks (~1.5 us of host time per call; a region is
        fullfuse's own and has no hooks), except under fx tracing (a pickled fused model is re-traced when loaded)
        and torch.compile, which see the module call as usual."""
        if fx_tracing() or calls.compiling():
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.plan.description} -> {self.plan.path}, precision={self.precision}"
