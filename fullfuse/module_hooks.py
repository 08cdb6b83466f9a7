"""Hooks of the modules a trace goes into, run by the traced graph in every call as ``nn.Module.__call__`` runs them.

fx traces into a block, a Sequential or a custom module and keeps its ops, not its call: the hooks its call would run
ran once, at the trace, on fx's proxies, so a hook that keeps a feature (``features["x"] = out``) or counts calls did
nothing in any later call.  ``trace`` therefore keeps a module with forward pre-hooks or backward hooks as one call of
it (``has_call_hooks``: the pre-hooks may change its inputs, backward hooks need the call's autograd set-up), and
traces into a module with forward hooks alone, its result then passed through a ``ForwardHooks`` of it, a module of
the graph that runs the module's forward hooks on the real values (hooks added to it later too).
"""
from __future__ import annotations

from typing import Dict

from torch import nn

from .region import keep_as_fx_call


def has_call_hooks(module: nn.Module) -> bool:
    """Whether ``module`` has hooks that only its own call can run: forward pre-hooks, backward hooks."""
    return bool(module._forward_pre_hooks or module._backward_hooks or getattr(module, "_backward_pre_hooks", None))


class ForwardHooks(nn.Module):
    """``hooks(args, kwargs, result)``: the forward hooks of ``hooked`` (a module whose ops the graph holds) on the
    result of its ops, as its call would run them: each with the module, its inputs (and keyword inputs where
    registered with_kwargs) and the result so far, which a hook's own result replaces where it returns one."""

    _fullfuse_leaf = True   # (trace.trace keeps it as a module call)

    def __init__(self, hooked: nn.Module):
        super().__init__()
        self.__dict__["hooked"] = hooked   # (not a child: its state and its place are the model's)
        keep_as_fx_call(self)

    def forward(self, args: tuple, kwargs: Dict, result):
        module = self.__dict__["hooked"]
        with_kwargs = getattr(module, "_forward_hooks_with_kwargs", {})
        for hook_id, hook in tuple(module._forward_hooks.items()):
            got = hook(module, args, kwargs, result) if hook_id in with_kwargs else hook(module, args, result)
            if got is not None:
                result = got
        return result

    def extra_repr(self) -> str:
        return f"hooks of {type(self.__dict__['hooked']).__name__}"
