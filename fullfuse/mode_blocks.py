"""Mode blocks inside a traced forward: ``with torch.no_grad():`` / ``torch.inference_mode()`` and
``with torch.autocast(...):`` around part of it (a frozen part; a part forced to float32 or to 16-bit), or a forward
decorated with ``@torch.autocast(...)``.  fx records none of them, so the traced graph would run those ops in the
caller's modes: with grad on, a frozen part's parameters would get gradients and its regions run PyTorch's ops with
autograd, unfused; an autocast block's ops would compute (and return) in the caller's precision.

Each traced node notes its grad mode and the autocast contexts it was traced inside (``GRAD_MODE``, ``AUTOCAST``:
``trace._Tracer``, with ``recording_autocast``); ``keep_mode_blocks`` puts the changes into the graph as calls: grad
off before each run of nodes traced with it off and the caller's mode restored after it, autocast contexts entered
and exited where the nodes' contexts change.  An ``inference_mode`` block runs with grad off (the same values and
autograd; its outputs are no inference tensors); a forward wholly under a grad mode is the fused model's own case
(``grad_mode``), where the graph keeps the exact mode.

Invariants: every run of grad-off nodes ends in a restore, and every context entered is exited, before the graph's
output; where an op inside a block raises, the fused model restores the caller's modes (``FusedModel.forward``:
``open_contexts`` / ``exit_contexts``); a region runs in one grad mode (``region_mode``) and one autocast state
(``model._fuse_regions`` leaves a match across an autocast block's edge to PyTorch's ops).
"""
from __future__ import annotations

import threading
from copy import deepcopy
from typing import List, Optional, Tuple

import torch
import torch.fx
from torch.amp import autocast_mode

from .calls import compiling

GRAD_MODE = "fullfuse_grad_mode"   # a traced node's meta entry: "grad", "no_grad" or "inference_mode"
AUTOCAST = "fullfuse_autocast"     # another: the autocast contexts it was traced inside, outermost first
_OFF = ("no_grad", "inference_mode")
_COMPUTE = ("call_function", "call_method", "call_module")


# ----------------------------------------------------------------------------------------- recording, while tracing

patch_lock = threading.RLock()   # (one trace patches torch's classes at a time: trace's too)


def _state(context) -> Tuple:
    """What a ``torch.autocast`` object sets: (device, enabled, dtype, cache enabled)."""
    return (context.device, bool(context._enabled), context.fast_dtype, bool(context._cache_enabled))


class recording_autocast:
    """For the duration of a trace in this thread: the autocast contexts its forward enters, as a list (``stack``,
    innermost last) that ``trace._Tracer`` notes on each node.  torch.autocast's enter and exit are wrapped meanwhile
    (other threads' contexts pass through unrecorded)."""

    def __enter__(self) -> List[Tuple]:
        patch_lock.acquire()
        self.enter, self.exit = autocast_mode.autocast.__enter__, autocast_mode.autocast.__exit__
        real_enter, real_exit, mine = self.enter, self.exit, threading.get_ident()
        stack: List[Tuple] = []

        def enter(context):
            out = real_enter(context)
            if threading.get_ident() == mine:
                stack.append(_state(context))
            return out

        def exit(context, *exc):
            if threading.get_ident() == mine and stack:
                stack.pop()
            return real_exit(context, *exc)
        autocast_mode.autocast.__enter__, autocast_mode.autocast.__exit__ = enter, exit
        return stack

    def __exit__(self, *exc) -> None:
        autocast_mode.autocast.__enter__, autocast_mode.autocast.__exit__ = self.enter, self.exit
        patch_lock.release()


# ------------------------------------------------------------------------------------------- the calls in a graph

def grad_off(dependency) -> bool:
    """Turn grad off; returns whether it was on.  ``dependency``: a value of the graph, so that fx's re-trace of a
    pickled graph records this call (it records a wrapped function only where an argument is traced)."""
    enabled = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    return enabled


def grad_restore(enabled: bool) -> None:
    """Set grad mode back to what ``grad_off`` found."""
    torch._C._set_grad_enabled(enabled)


# torch's own enter / exit of an autocast context as calls (torch >= 2.4): torch.compile traces them, torch.export
# records them (an explicit __enter__ call breaks dynamo's graph between the two)
_torch_enter = getattr(torch.amp, "_enter_autocast", None)
_torch_exit = getattr(torch.amp, "_exit_autocast", None)
_TORCH_CALLS = _torch_enter is not None and _torch_exit is not None


def autocast_enter(dependency, device: str, enabled: bool, dtype, cache: bool):
    """Enter an autocast context as the forward did (``dependency``: as for ``grad_off``); returns it.  Kept in this
    thread's list of open contexts (``exit_contexts``), but under torch.compile, which traces no thread-local list."""
    if _TORCH_CALLS:
        context = _torch_enter(device, dtype, enabled, cache)
    else:
        context = torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=cache)
        context.__enter__()
    if not compiling():
        open_contexts_list().append(context)
    return context


def autocast_exit(context) -> None:
    """Exit a context ``autocast_enter`` entered."""
    if not compiling():
        opened = open_contexts_list()
        if opened and opened[-1] is context:
            opened.pop()
    if _TORCH_CALLS:
        _torch_exit(context)
    else:
        context.__exit__(None, None, None)


def compile_cannot_trace(gm: torch.fx.GraphModule) -> bool:
    """Whether torch.compile cannot trace ``gm``'s autocast blocks: torch's that put ``torch.amp._enter_autocast`` in
    the graph as an op (torch 2.11 and older: "returned non-Tensor", then an assertion that the global autocast state
    changed), where a forward's own ``with torch.autocast(...):`` traces.  Asked only under torch.compile (whose
    modules are loaded then)."""
    if not any(node.target is autocast_enter for node in gm.graph.nodes):
        return False
    rules = getattr(getattr(getattr(torch, "_dynamo", None), "trace_rules", None),
                    "torch_non_c_binding_in_graph_functions", {})
    return "torch.amp.autocast_mode._enter_autocast" in rules


_open = threading.local()


def open_contexts_list() -> list:
    """The autocast contexts this thread's graphs have entered and not yet exited, innermost last."""
    opened = getattr(_open, "contexts", None)
    if opened is None:
        opened = _open.contexts = []
    return opened


def open_contexts() -> int:
    return len(open_contexts_list())


def exit_contexts(depth: int) -> None:
    """Exit, innermost first, the contexts entered since ``open_contexts()`` was ``depth`` (an op raised inside)."""
    opened = open_contexts_list()
    while len(opened) > depth:
        autocast_exit(opened[-1])


CALLS = (grad_off, grad_restore, autocast_enter, autocast_exit)   # (trace's tracer wraps them: re-traces keep them)
_side_effects = getattr(torch.fx.node, "_side_effectful_functions", None)
if isinstance(_side_effects, set):   # (fx's dead-code elimination keeps them, as torch's own _set_grad_enabled)
    _side_effects.update(CALLS)


# ------------------------------------------------------------------------------------------ putting them in a graph

def node_mode(node: torch.fx.Node) -> Optional[str]:
    """The grad mode ``node`` was traced in (None: a node fullfuse made, or one not traced by ``trace.trace``)."""
    return node.meta.get(GRAD_MODE)


def node_autocast(node: torch.fx.Node) -> Tuple:
    return node.meta.get(AUTOCAST, ())


def grad_mode(gm: torch.fx.GraphModule) -> Optional[str]:
    """"no_grad" or "inference_mode" where every op of ``gm`` (traced by ``trace.trace``, with grad on) was traced in
    that mode — a forward under such a decorator, or wholly inside such a block — else None (its ops run in the
    caller's mode, blocks inside forward as ``keep_mode_blocks`` keeps them)."""
    modes = {node_mode(node) for node in gm.graph.nodes if node.op in _COMPUTE}
    return modes.pop() if len(modes) == 1 and modes <= set(_OFF) else None


def region_mode(nodes) -> Optional[str]:
    """The grad mode a region of these traced nodes runs in: grad off where any of them was traced with it off (a
    region across a block's edge: its output is made from values without grad either way, and its intermediates are
    not seen), else theirs."""
    modes = [node_mode(node) for node in nodes]
    return next((mode for mode in modes if mode in _OFF), modes[-1])


def one_autocast(nodes) -> bool:
    """Whether these nodes were traced inside the same autocast contexts (a region computes in one precision)."""
    return len({node_autocast(node) for node in nodes}) == 1


def keep_mode_blocks(gm: torch.fx.GraphModule) -> bool:
    """Put ``grad_off`` / ``grad_restore`` calls around each run of ``gm``'s nodes traced with grad off, where other
    nodes were traced with it on (a forward wholly in one grad mode: none; see ``grad_mode``), and
    ``autocast_enter`` / ``autocast_exit`` calls where the nodes' autocast contexts change.  Returns whether it put
    any (``gm`` recompiled then).  A graph without inputs has no value to make the calls depend on: unchanged."""
    graph = gm.graph
    nodes = list(graph.nodes)
    placeholders = [node for node in nodes if node.op == "placeholder"]
    compute = [node for node in nodes if node.op in _COMPUTE]
    modes = {node_mode(node) for node in compute} - {None}
    grad_blocks = bool(modes & set(_OFF)) and "grad" in modes
    autocast_blocks = any(node_autocast(node) for node in compute)
    if not placeholders or not (grad_blocks or autocast_blocks):
        return False
    dependency = placeholders[0]
    enabled = None   # the grad_off node of the run being walked (None: in the caller's mode)
    # (state, autocast_enter node) of the contexts open at the node walked, outermost first
    entered: List[Tuple[Tuple, torch.fx.Node]] = []
    for node in nodes:
        if node.op not in _COMPUTE and node.op != "output":
            continue
        last = node.op == "output"
        mode = None if last else node_mode(node)
        want = () if last else node_autocast(node)
        with graph.inserting_before(node):
            if grad_blocks and enabled is None and mode in _OFF:
                enabled = graph.call_function(grad_off, (dependency,))
            elif enabled is not None and (last or mode == "grad"):
                graph.call_function(grad_restore, (enabled,))
                enabled = None
            if autocast_blocks and want != tuple(state for state, _ in entered):
                same = 0
                while same < min(len(want), len(entered)) and want[same] == entered[same][0]:
                    same += 1
                while len(entered) > same:
                    graph.call_function(autocast_exit, (entered.pop()[1],))
                for state in want[same:]:
                    entered.append((state, graph.call_function(autocast_enter, (dependency,) + state)))
    graph.lint()
    gm.recompile()
    return True


def without_mode_blocks(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` without the calls ``keep_mode_blocks`` put in (TorchScript cannot compile them: its blocks
    then run in the caller's modes)."""
    copy = deepcopy(graph)   # (its code generator too: the forward's signature)
    for node in reversed(list(copy.nodes)):   # (an exit, which uses its enter's value, comes first)
        if node.op == "call_function" and node.target in CALLS:
            copy.erase_node(node)
    return copy
