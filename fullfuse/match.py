"""Find the two fusable conv pipelines in a torch.fx graph.

Family A (``ConvActPoolSpec``)::

    Conv2d/Conv3d (module, or F.conv2d/F.conv3d/torch.conv2d/3d with a get_attr weight)
      -> optional activation (GELU erf/tanh, ReLU, SiLU; module, functional, torch.* or Tensor method, in-place ok)
      -> global pool over every spatial dim:
           AdaptiveAvgPool{2,3}d(1) / F.adaptive_avg_pool{2,3}d(x, 1)      -> "mean", keepdim True
           x.mean(dim=spatial[, keepdim]) / torch.mean(...)                 -> "mean", keepdim as given
           AdaptiveMaxPool{2,3}d(1) / F.adaptive_max_pool{2,3}d(x, 1)      -> "max",  keepdim True
           x.amax(dim=spatial[, keepdim]) / torch.amax(...)                 -> "max",  keepdim as given
      -> optional view of the pooled tensor, absorbed (spec.POSTS): torch.flatten(y, 1) / y.flatten(1) /
         nn.Flatten() -> "flatten"; y.squeeze() / torch.squeeze(y) -> "squeeze"

Family B (``ConvTPoolReduceSpec``)::

    ConvTranspose2d/3d (module, or F.conv_transpose2d/3d with a get_attr weight)
      -> optional activation (as above)
      -> one or more MaxPool{2,3}d (module, F.max_pool{2,3}d or torch.max_pool{2,3}d) with kernel == stride,
         padding 0, dilation 1, ceil_mode False, return_indices False; composed window = product of kernels
      -> reduction over dim 1: sum / mean / amax (Tensor method or torch.*), keepdim as given

Rules common to both:

* every node of a region except its last one must have exactly one user (otherwise the intermediate value is
  needed elsewhere and the region is left alone);
* a module whose class overrides ``forward`` of the torch class it derives from, or which carries forward/backward
  hooks, is not matched (replacing it would change what runs);
* for functional convs the weight must be a ``get_attr`` node (its tensor is read from the GraphModule to get the
  channel counts and the kernel size).  A weight that arrives as a graph input (placeholder) has no shape at trace
  time, so it is only accepted when the node carries shape metadata (``meta['tensor_meta']`` from
  ``torch.fx.passes.shape_prop.ShapeProp`` or ``meta['val']``); otherwise: no match.  The bias may be ``None``, a
  ``get_attr`` or a placeholder node.  Any other weight/bias producer (a computed weight), or a stride / padding /
  dilation / groups argument that is a graph value instead of a constant: no match;
* ``groups != 1`` and ``padding_mode != 'zeros'`` are matched and recorded in the spec (the planner decides which
  path can serve them).  String padding: ``'valid'`` becomes 0; ``'same'`` becomes the symmetric padding
  ``dilation * (k - 1) // 2`` when stride is 1 and ``dilation * (k - 1)`` is even in every dim, else no match;
* matches never overlap and are returned in graph order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from .spec import POSTS, ConvActPoolSpec, ConvTPoolReduceSpec, same_padding

Node = torch.fx.Node

__all__ = ["Match", "find_matches"]


@dataclass
class Match:
    spec: Union[ConvActPoolSpec, ConvTPoolReduceSpec]
    input_node: Node                 # the activation tensor fed to the conv
    output_node: Node                # the node whose value the fused op replaces (the pool / reduction node)
    nodes: List[Node]                # every node of the region, in graph order (conv ... output_node)
    weight: Optional[Node]           # for F.conv*: the node giving the weight; for module convs None
    bias: Optional[Node]             # likewise (None also when a functional conv has no bias)
    conv_module: Optional[str]       # qualified name of the nn.ConvNd / nn.ConvTransposeNd module, if a module
    description: str                 # human readable, e.g. "Conv2d(conv) -> gelu -> adaptive_avg_pool2d(1)"


# --------------------------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------------------------

_MISSING = object()


def _bind(node: Node, names: Sequence[str], defaults: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Map the node's positional args and kwargs onto ``names``; None if they don't fit the signature."""
    if len(node.args) > len(names):
        return None
    out: Dict[str, Any] = dict(zip(names, node.args))
    for k, v in node.kwargs.items():
        if k == "self":  # call_method nodes sometimes spell the tensor as a keyword
            k = "input"
        if k not in names or k in out:
            return None
        out[k] = v
    for n in names:
        if n not in out:
            if n not in defaults:
                return None
            out[n] = defaults[n]
    return out


def _has_node(v: Any) -> bool:
    if isinstance(v, Node):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_node(x) for x in v)
    if isinstance(v, dict):
        return any(_has_node(x) for x in v.values())
    return False


def _count_uses(v: Any, node: Node) -> int:
    if v is node:
        return 1
    if isinstance(v, (tuple, list)):
        return sum(_count_uses(x, node) for x in v)
    if isinstance(v, dict):
        return sum(_count_uses(x, node) for x in v.values())
    return 0


def _lookup(table: Dict[Any, Any], target: Any) -> Any:
    """``table.get(target)`` that tolerates unhashable call_function targets."""
    try:
        return table.get(target)
    except TypeError:
        return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tup(v: Any, n: int) -> Optional[Tuple[int, ...]]:
    """int or length-1/length-n sequence of ints -> n-tuple; None if not a constant of that form."""
    if _is_int(v):
        return (v,) * n
    if isinstance(v, (tuple, list)) and all(_is_int(x) for x in v):
        if len(v) == n:
            return tuple(v)
        if len(v) == 1:
            return (v[0],) * n
    return None


def _short(t: Tuple[int, ...]) -> str:
    return str(t[0]) if len(set(t)) == 1 else str(t)


def _plain_module(mod: nn.Module, base: type, methods: Sequence[str] = ("forward",)) -> bool:
    """``mod`` is an instance of ``base`` whose class and instance don't override its computation (a method set on
    the instance, as accelerate's hooks set ``forward``) and has no hooks."""
    if not isinstance(mod, base):
        return False
    cls = type(mod)
    if any(getattr(cls, m) is not getattr(base, m) or m in vars(mod) for m in methods):
        return False
    for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        if getattr(mod, hooks, None):
            return False
    return True


def _module_of(node: Node, modules: Dict[str, nn.Module], bases: Sequence[type],
               methods: Sequence[str] = ("forward",)) -> Optional[Tuple[nn.Module, type]]:
    if node.op != "call_module":
        return None
    mod = modules.get(node.target)
    if mod is None:
        return None
    for base in bases:
        if _plain_module(mod, base, methods):
            return mod, base
    return None


def _module_call_input(node: Node) -> Optional[Node]:
    """The single tensor argument of a call_module node (None if it has other args/kwargs)."""
    if len(node.args) != 1 or node.kwargs:
        return None
    return node.args[0]


def _static_shape(gm: torch.fx.GraphModule, node: Node) -> Optional[Tuple[int, ...]]:
    """Shape of a weight node: the tensor of a get_attr, or shape metadata of a placeholder."""
    if node.op == "get_attr":
        obj: Any = gm
        try:
            for atom in str(node.target).split("."):
                obj = getattr(obj, atom)
        except AttributeError:
            return None
        if isinstance(obj, torch.Tensor) and not isinstance(obj, nn.parameter.UninitializedTensorMixin):
            return tuple(obj.shape)
        return None
    if node.op == "placeholder":
        tm = node.meta.get("tensor_meta")
        if tm is not None and hasattr(tm, "shape"):
            return tuple(int(s) for s in tm.shape)
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            try:
                return tuple(int(s) for s in val.shape)
            except Exception:  # symbolic sizes
                return None
    return None


# --------------------------------------------------------------------------------------------------------------
# convolutions
# --------------------------------------------------------------------------------------------------------------

@dataclass
class _Conv:
    node: Node
    transposed: bool
    dims: int
    in_channels: int
    out_channels: int
    kernel_size: Tuple[int, ...]
    stride: Tuple[int, ...]
    padding: Tuple[int, ...]
    output_padding: Tuple[int, ...]
    dilation: Tuple[int, ...]
    groups: int
    padding_mode: str
    has_bias: bool
    input_node: Node
    weight: Optional[Node]
    bias: Optional[Node]
    module_name: Optional[str]
    label: str


_CONV_MODULES = {nn.Conv2d: 2, nn.Conv3d: 3}
_CONVT_MODULES = {nn.ConvTranspose2d: 2, nn.ConvTranspose3d: 3}
_CONV_FUNCS = {torch.conv2d: 2, torch.conv3d: 3, F.conv2d: 2, F.conv3d: 3}
_CONVT_FUNCS = {torch.conv_transpose2d: 2, torch.conv_transpose3d: 3, F.conv_transpose2d: 2, F.conv_transpose3d: 3}


def _resolve_padding(padding: Any, dims: int, kernel: Tuple[int, ...], stride: Tuple[int, ...],
                     dilation: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * dims
        if padding == "same":
            return same_padding(kernel, stride, dilation)   # (None: no symmetric padding tuple expresses it)
        return None
    return _tup(padding, dims)


def _conv_label(kind: str, module_name: Optional[str], groups: int, padding_mode: str) -> str:
    extra = []
    if groups != 1:
        extra.append(f"groups={groups}")
    if padding_mode != "zeros":
        extra.append(f"padding_mode={padding_mode!r}")
    if module_name is not None:
        return f"{kind}({', '.join([module_name] + extra)})"
    return f"{kind}({', '.join(extra)})" if extra else kind


def _parse_conv(gm: torch.fx.GraphModule, modules: Dict[str, nn.Module], node: Node) -> Optional[_Conv]:
    if node.op == "call_module":
        found = _module_of(node, modules, list(_CONV_MODULES), ("forward", "_conv_forward"))
        transposed = False
        if found is None:
            found = _module_of(node, modules, list(_CONVT_MODULES), ("forward", "_output_padding"))
            transposed = True
        if found is None:
            return None
        mod, base = found
        x = _module_call_input(node)  # ConvTranspose called with output_size=... is not matched
        if not isinstance(x, Node):
            return None
        if isinstance(mod.weight, nn.parameter.UninitializedTensorMixin):
            return None
        dims = (_CONVT_MODULES if transposed else _CONV_MODULES)[base]
        k, s, d = tuple(mod.kernel_size), tuple(mod.stride), tuple(mod.dilation)
        p = _resolve_padding(mod.padding, dims, k, s, d)
        if p is None:
            return None
        op = tuple(mod.output_padding) if transposed else (0,) * dims
        return _Conv(
            node=node, transposed=transposed, dims=dims, in_channels=int(mod.in_channels),
            out_channels=int(mod.out_channels), kernel_size=k, stride=s, padding=p, output_padding=op,
            dilation=d, groups=int(mod.groups), padding_mode=str(mod.padding_mode), has_bias=mod.bias is not None,
            input_node=x, weight=None, bias=None, module_name=str(node.target),
            label=_conv_label(base.__name__, str(node.target), int(mod.groups), str(mod.padding_mode)),
        )

    if node.op != "call_function":
        return None
    if _lookup(_CONV_FUNCS, node.target) is not None:
        transposed, dims = False, _CONV_FUNCS[node.target]
    elif _lookup(_CONVT_FUNCS, node.target) is not None:
        transposed, dims = True, _CONVT_FUNCS[node.target]
    else:
        return None
    if transposed:
        a = _bind(node, ["input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"],
                  {"bias": None, "stride": 1, "padding": 0, "output_padding": 0, "groups": 1, "dilation": 1})
    else:
        a = _bind(node, ["input", "weight", "bias", "stride", "padding", "dilation", "groups"],
                  {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
    if a is None:
        return None
    x, w, b = a["input"], a["weight"], a["bias"]
    if not isinstance(x, Node) or not isinstance(w, Node) or w.op not in ("get_attr", "placeholder"):
        return None
    if b is not None and not (isinstance(b, Node) and b.op in ("get_attr", "placeholder")):
        return None
    consts = [a[k] for k in a if k not in ("input", "weight", "bias")]
    if any(_has_node(v) for v in consts):
        return None
    groups = a["groups"]
    if not _is_int(groups) or groups < 1:
        return None
    shape = _static_shape(gm, w)
    if shape is None or len(shape) != dims + 2:
        return None
    k = tuple(shape[2:])
    s, d = _tup(a["stride"], dims), _tup(a["dilation"], dims)
    if s is None or d is None:
        return None
    p = _resolve_padding(a["padding"], dims, k, s, d)
    if p is None:
        return None
    if transposed:
        op = _tup(a["output_padding"], dims)
        if op is None:
            return None
        in_ch, out_ch = shape[0], shape[1] * groups
    else:
        op = (0,) * dims
        in_ch, out_ch = shape[1] * groups, shape[0]
    kind = ("conv_transpose" if transposed else "conv") + f"{dims}d"
    return _Conv(
        node=node, transposed=transposed, dims=dims, in_channels=int(in_ch), out_channels=int(out_ch),
        kernel_size=k, stride=s, padding=p, output_padding=op, dilation=d, groups=groups, padding_mode="zeros",
        has_bias=b is not None, input_node=x, weight=w, bias=b, module_name=None,
        label=_conv_label(kind, None, groups, "zeros"),
    )


# --------------------------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------------------------

def _gelu_code(approximate: Any) -> Optional[Tuple[str, str]]:
    if approximate == "none":
        return "gelu_erf", "gelu"
    if approximate == "tanh":
        return "gelu_tanh", "gelu(tanh)"
    return None


def _parse_activation(node: Node, src: Node, modules: Dict[str, nn.Module]) -> Optional[Tuple[str, str]]:
    """(code, label) if ``node`` applies a supported activation to ``src`` and nothing else."""
    if node.op == "call_module":
        found = _module_of(node, modules, [nn.GELU, nn.ReLU, nn.SiLU])
        if found is None or _module_call_input(node) is not src:
            return None
        mod, base = found
        if base is nn.GELU:
            return _gelu_code(mod.approximate)
        return ("relu", "relu") if base is nn.ReLU else ("silu", "silu")

    if node.op == "call_method":
        if node.target in ("relu", "relu_"):
            a = _bind(node, ["input"], {})
            return ("relu", "relu") if a is not None and a["input"] is src else None
        return None

    if node.op != "call_function":
        return None
    t = node.target
    if t is F.relu or t is F.silu:
        a = _bind(node, ["input", "inplace"], {"inplace": False})
        if a is None or a["input"] is not src or not isinstance(a["inplace"], bool):
            return None
        return ("relu", "relu") if t is F.relu else ("silu", "silu")
    if t in (torch.relu, torch.relu_, F.relu_):
        a = _bind(node, ["input"], {})
        return ("relu", "relu") if a is not None and a["input"] is src else None
    if t is F.gelu:
        a = _bind(node, ["input", "approximate"], {"approximate": "none"})
        if a is None or a["input"] is not src:
            return None
        return _gelu_code(a["approximate"])
    return None


# --------------------------------------------------------------------------------------------------------------
# family A: global pools
# --------------------------------------------------------------------------------------------------------------

_ADAPTIVE_AVG_MODULES = {nn.AdaptiveAvgPool2d: 2, nn.AdaptiveAvgPool3d: 3}
_ADAPTIVE_MAX_MODULES = {nn.AdaptiveMaxPool2d: 2, nn.AdaptiveMaxPool3d: 3}


def _all_ones(output_size: Any, dims: int) -> bool:
    t = _tup(output_size, dims)
    return t is not None and all(v == 1 for v in t)


def _norm_dims(dim: Any, rank: int) -> Optional[List[int]]:
    """int or sequence of ints -> list of non-negative dims; None if not constant ints in range."""
    seq = [dim] if _is_int(dim) else dim
    if not isinstance(seq, (tuple, list)) or not seq or not all(_is_int(v) for v in seq):
        return None
    out = []
    for v in seq:
        if not -rank <= v < rank:
            return None
        out.append(v % rank)
    return out


def _parse_reduce_call(node: Node, src: Optional[Node]) -> Optional[Tuple[str, Any, Any]]:
    """('mean'|'sum'|'amax', dim, keepdim) for x.mean/sum/amax(...) and torch.mean/sum/amax(x, ...) on ``src`` (None:
    on any input)."""
    if node.op == "call_method" and node.target in ("mean", "sum", "amax"):
        kind = node.target
    elif node.op == "call_function" and node.target in (torch.mean, torch.sum, torch.amax):
        kind = node.target.__name__
    else:
        return None
    if kind == "amax":
        a = _bind(node, ["input", "dim", "keepdim"], {"dim": (), "keepdim": False})
    else:
        a = _bind(node, ["input", "dim", "keepdim", "dtype"], {"dim": None, "keepdim": False, "dtype": None})
        if a is not None and a["dtype"] is not None:
            return None  # a dtype-converting reduction is a different computation
    if a is None or (src is not None and a["input"] is not src) or not isinstance(a["keepdim"], bool):
        return None
    return kind, a["dim"], a["keepdim"]


def counts_dims_from_the_batch(nodes: Sequence[Node]) -> bool:
    """Whether a mean / sum / amax among ``nodes`` names a dim by a non-negative index (``sum(1)``, ``mean((2, 3))``):
    on an unbatched input that index names another dim (or none), so the ops as written differ from a batch of one."""
    for node in nodes:
        parsed = _parse_reduce_call(node, None)
        if parsed is None:
            continue
        dim = parsed[1]
        for d in (dim if isinstance(dim, (tuple, list)) else () if dim is None else (dim,)):
            if not isinstance(d, int) or d >= 0:
                return True
    return False


def _parse_global_pool(node: Node, src: Node, dims: int,
                       modules: Dict[str, nn.Module]) -> Optional[Tuple[str, bool, str]]:
    """(pool, keepdim, label) if ``node`` pools ``src`` (rank dims+2) over all its spatial dims."""
    rank = dims + 2
    if node.op == "call_module":
        found = _module_of(node, modules, list(_ADAPTIVE_AVG_MODULES) + list(_ADAPTIVE_MAX_MODULES))
        if found is None or _module_call_input(node) is not src:
            return None
        mod, base = found
        is_avg = base in _ADAPTIVE_AVG_MODULES
        if (_ADAPTIVE_AVG_MODULES if is_avg else _ADAPTIVE_MAX_MODULES)[base] != dims:
            return None
        if not _all_ones(mod.output_size, dims):
            return None
        if not is_avg and mod.return_indices:
            return None
        name = f"adaptive_{'avg' if is_avg else 'max'}_pool{dims}d(1)"
        return ("mean" if is_avg else "max"), True, name

    if node.op == "call_function":
        t = node.target
        avg_f = {F.adaptive_avg_pool2d: 2, F.adaptive_avg_pool3d: 3}
        max_f = {F.adaptive_max_pool2d: 2, F.adaptive_max_pool3d: 3}
        fdims = _lookup(avg_f, t) or _lookup(max_f, t)
        if fdims is not None:
            is_avg = _lookup(avg_f, t) is not None
            if fdims != dims:
                return None
            if is_avg:
                a = _bind(node, ["input", "output_size"], {})
            else:
                a = _bind(node, ["input", "output_size", "return_indices"], {"return_indices": False})
            if a is None or a["input"] is not src or not _all_ones(a["output_size"], dims):
                return None
            if not is_avg and a["return_indices"] is not False:
                return None
            name = f"adaptive_{'avg' if is_avg else 'max'}_pool{dims}d(1)"
            return ("mean" if is_avg else "max"), True, name

    r = _parse_reduce_call(node, src)
    if r is None:
        return None
    kind, dim, keepdim = r
    if kind == "sum":
        return None
    nd = _norm_dims(dim, rank)
    if nd is None or len(nd) != dims or sorted(nd) != list(range(2, rank)):
        return None
    label = f"{kind}(dim={tuple(sorted(nd))}{', keepdim=True' if keepdim else ''})"
    return ("mean" if kind == "mean" else "max"), keepdim, label


# --------------------------------------------------------------------------------------------------------------
# family B: non-overlapping max pools and the channel reduction
# --------------------------------------------------------------------------------------------------------------

_MAXPOOL_MODULES = {nn.MaxPool2d: 2, nn.MaxPool3d: 3}


def _pool_window(kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any, return_indices: Any,
                 dims: int) -> Optional[Tuple[int, ...]]:
    if any(_has_node(v) for v in (kernel, stride, padding, dilation, ceil_mode, return_indices)):
        return None
    k = _tup(kernel, dims)
    if k is None or any(v < 1 for v in k):
        return None
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        s = k
    else:
        s = _tup(stride, dims)
    p, d = _tup(padding, dims), _tup(dilation, dims)
    if s != k or p is None or any(p) or d is None or any(v != 1 for v in d):
        return None
    if ceil_mode is not False or return_indices is not False:
        return None
    return k


def _parse_maxpool(node: Node, src: Node, dims: int,
                   modules: Dict[str, nn.Module]) -> Optional[Tuple[Tuple[int, ...], str]]:
    """(window, label) if ``node`` is a max pool of ``src`` with kernel == stride, padding 0, ..."""
    if node.op == "call_module":
        found = _module_of(node, modules, list(_MAXPOOL_MODULES))
        if found is None or _module_call_input(node) is not src:
            return None
        mod, base = found
        if _MAXPOOL_MODULES[base] != dims:
            return None
        w = _pool_window(mod.kernel_size, mod.stride, mod.padding, mod.dilation, mod.ceil_mode,
                         mod.return_indices, dims)
    elif node.op == "call_function":
        t = node.target
        funcs = {F.max_pool2d: 2, F.max_pool3d: 3, torch.max_pool2d: 2, torch.max_pool3d: 3}
        fdims = _lookup(funcs, t)
        if fdims is None or fdims != dims:
            return None
        names = ["input", "kernel_size", "stride", "padding", "dilation", "ceil_mode"]
        defaults = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False}
        if t in (F.max_pool2d, F.max_pool3d):
            names.append("return_indices")
        a = _bind(node, names, defaults)
        if a is None or a["input"] is not src:
            return None
        w = _pool_window(a["kernel_size"], a["stride"], a["padding"], a["dilation"], a["ceil_mode"],
                         a.get("return_indices", False), dims)
    else:
        return None
    if w is None:
        return None
    return w, f"max_pool{dims}d({_short(w)})"


def _parse_channel_reduction(node: Node, src: Node, dims: int) -> Optional[Tuple[str, bool, str]]:
    """(reduction, keepdim, label) if ``node`` reduces ``src`` over dim 1 only."""
    r = _parse_reduce_call(node, src)
    if r is None:
        return None
    kind, dim, keepdim = r
    if isinstance(dim, (tuple, list)) and len(dim) != 1:
        return None
    nd = _norm_dims(dim, dims + 2)
    if nd != [1]:
        return None
    label = f"{kind}(dim=1{', keepdim=True' if keepdim else ''})"
    return {"sum": "sum", "mean": "mean", "amax": "max"}[kind], keepdim, label


def _parse_post_view(node: Node, src: Node, modules: Dict[str, nn.Module]) -> Optional[str]:
    """The key of spec.POSTS if ``node`` takes that view of the pooled ``src``: torch.flatten(src, 1) /
    src.flatten(1) / nn.Flatten() (start_dim 1, end_dim -1), or src.squeeze() / torch.squeeze(src) (every unit
    dim).  Anything else (a dim argument, another start_dim) is left to run as the model's own op."""
    if node.op == "call_module":
        found = _module_of(node, modules, [nn.Flatten])
        if found is None or _module_call_input(node) is not src:
            return None
        mod = found[0]
        return "flatten" if (mod.start_dim, mod.end_dim) == (1, -1) else None
    if node.op == "call_method" and node.target in ("flatten", "squeeze"):
        names = ["input", "start_dim", "end_dim"] if node.target == "flatten" else ["input"]
        a = _bind(node, names, {"start_dim": 0, "end_dim": -1})
    elif node.op == "call_function" and node.target in (torch.flatten, torch.squeeze):
        names = ["input", "start_dim", "end_dim"] if node.target is torch.flatten else ["input"]
        a = _bind(node, names, {"start_dim": 0, "end_dim": -1})
    else:
        return None
    if a is None or a["input"] is not src:
        return None
    if "start_dim" in names:
        return "flatten" if (a["start_dim"], a["end_dim"]) == (1, -1) else None
    return "squeeze"


# --------------------------------------------------------------------------------------------------------------
# the matcher
# --------------------------------------------------------------------------------------------------------------

def _sole_user(node: Node) -> Optional[Node]:
    """The single user of ``node``, provided it uses ``node`` exactly once; else None."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if _count_uses(user.args, node) + _count_uses(user.kwargs, node) != 1:
        return None
    return user


def _match_from(conv: _Conv, modules: Dict[str, nn.Module]) -> Optional[Match]:
    nodes = [conv.node]
    labels = [conv.label]
    cur = conv.node

    nxt = _sole_user(cur)
    if nxt is None:
        return None
    activation = "none"
    act = _parse_activation(nxt, cur, modules)
    if act is not None:
        activation = act[0]
        labels.append(act[1])
        nodes.append(nxt)
        cur = nxt
        nxt = _sole_user(cur)
        if nxt is None:
            return None

    if not conv.transposed:
        pool = _parse_global_pool(nxt, cur, conv.dims, modules)
        if pool is None:
            return None
        nodes.append(nxt)
        labels.append(pool[2])
        # a view the model takes of the pool right after it joins the region (spec.POSTS: one op less per call)
        after = _sole_user(nxt)
        post = _parse_post_view(after, nxt, modules) if after is not None else None
        if post is not None:
            nodes.append(after)
            labels.append(POSTS[post])
        spec = ConvActPoolSpec(
            dims=conv.dims, in_channels=conv.in_channels, out_channels=conv.out_channels,
            kernel_size=conv.kernel_size, stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
            has_bias=conv.has_bias, activation=activation, pool=pool[0], keepdim=pool[1], groups=conv.groups,
            padding_mode=conv.padding_mode, post=post or "none",
        )
    else:
        window = (1,) * conv.dims
        n_pools = 0
        while True:
            mp = _parse_maxpool(nxt, cur, conv.dims, modules)
            if mp is None:
                break
            window = tuple(a * b for a, b in zip(window, mp[0]))
            n_pools += 1
            nodes.append(nxt)
            labels.append(mp[1])
            cur = nxt
            nxt = _sole_user(cur)
            if nxt is None:
                return None
        if n_pools == 0:
            return None
        red = _parse_channel_reduction(nxt, cur, conv.dims)
        if red is None:
            return None
        nodes.append(nxt)
        labels.append(red[2])
        spec = ConvTPoolReduceSpec(
            dims=conv.dims, in_channels=conv.in_channels, out_channels=conv.out_channels,
            kernel_size=conv.kernel_size, stride=conv.stride, padding=conv.padding,
            output_padding=conv.output_padding, dilation=conv.dilation, has_bias=conv.has_bias, window=window,
            activation=activation, reduction=red[0], keepdim=red[1], groups=conv.groups,
            padding_mode=conv.padding_mode,
        )

    return Match(
        spec=spec, input_node=conv.input_node, output_node=nodes[-1], nodes=nodes, weight=conv.weight,
        bias=conv.bias, conv_module=conv.module_name, description=" -> ".join(labels),
    )


def find_matches(gm: torch.fx.GraphModule) -> List[Match]:
    """Every family A / family B region of ``gm``, non-overlapping, in graph order."""
    modules = dict(gm.named_modules())
    matches: List[Match] = []
    claimed: set = set()
    for node in gm.graph.nodes:
        if node in claimed:
            continue
        conv = _parse_conv(gm, modules, node)
        if conv is None:
            continue
        m = _match_from(conv, modules)
        if m is None or any(n in claimed for n in m.nodes):
            continue
        matches.append(m)
        claimed.update(m.nodes)
    return matches
