"""What a matched region computes: the static description every path (fused, fallback, torch) works from.

Shapes of the activations (batch, spatial extent) are run-time values and are NOT part of a spec; everything in
a spec is fixed by the model's modules (channels, kernel, stride, ...).  Compile-time choices of a kernel
(activation, pooling kind, dtype, precision) are selected at launch from the codes in ``fullfuse.codes``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Tuple

from .codes import ACTIVATIONS, POOLS, REDUCTIONS

IntTuple = Tuple[int, ...]


def same_padding(kernel: IntTuple, stride: IntTuple, dilation: IntTuple):
    """padding='same' as one padding per spatial dim, as PyTorch pads for it: dilation * (k - 1) // 2 where the
    stride is 1 and dilation * (k - 1) is even in every dim; None elsewhere (PyTorch pads one side more there, or
    refuses a strided 'same')."""
    if any(st != 1 for st in stride):
        return None
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return None if any(t % 2 for t in total) else tuple(t // 2 for t in total)


def _check_choice(kind: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"fullfuse: unknown {kind} {value!r}; expected one of {sorted(allowed)}")


def _check_spec(spec, choices, per_dim_fields) -> None:
    """choices: (field, allowed) pairs; per_dim_fields: tuple fields that need one entry per spatial dim."""
    for name, allowed in choices:
        _check_choice(name, getattr(spec, name), allowed)
    for name in per_dim_fields:
        if len(getattr(spec, name)) != spec.dims:
            raise ValueError(f"fullfuse: {name} must have {spec.dims} entries, got {getattr(spec, name)}")


def _cached_hash(spec) -> int:
    """A spec's hash, worked out once (host time: every call keys its decision by the spec; a dataclass's own hash
    rebuilds the tuple of all fields each time).  Not pickled (_state): string hashes differ between processes."""
    h = spec.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(spec, f.name) for f in fields(spec)))
        object.__setattr__(spec, "_hash", h)
    return h


def _state(spec) -> dict:
    return {k: v for k, v in spec.__dict__.items() if k != "_hash"}


# Views of family A's pooled (N, C_out[, 1, ...]) tensor that a region absorbs when the model takes one right after
# the pool (the view costs a whole op's host time per call): torch.flatten(y, 1) / y.flatten(1) / nn.Flatten(), and
# y.squeeze() (every unit dim, the batch's too where N = 1).
POSTS = {"none": "", "flatten": "flatten(1)", "squeeze": "squeeze()"}


@dataclass(frozen=True)
class ConvActPoolSpec:
    """Family A: ConvNd (N=2 or 3) -> activation -> global pool over all spatial dims.

    Output: (N, C_out) or, with keepdim, (N, C_out, 1, ..., 1) exactly as the matched pool node returns it; then the
    view ``post`` takes of it where the model's next op was one the region absorbed (POSTS).
    """

    dims: int                      # spatial rank: 2 (Conv2d) or 3 (Conv3d)
    in_channels: int
    out_channels: int
    kernel_size: IntTuple
    stride: IntTuple
    padding: IntTuple
    dilation: IntTuple
    has_bias: bool
    activation: str = "gelu_erf"   # key of codes.ACTIVATIONS
    pool: str = "mean"             # key of codes.POOLS
    keepdim: bool = True           # adaptive pools keep the 1x1 dims; mean/amax(dim=...) may not
    groups: int = 1
    padding_mode: str = "zeros"
    post: str = "none"             # key of POSTS: the view of the pooled tensor the region returns

    family = "A"
    __hash__, __getstate__ = _cached_hash, _state

    def __post_init__(self):
        _check_spec(self, (("activation", ACTIVATIONS), ("pool", POOLS), ("post", POSTS)),
                    ("kernel_size", "stride", "padding", "dilation"))

    def output_shape(self, n: int) -> IntTuple:
        """The shape the region returns for a batch of ``n``: the pool's, (n, C_out[, 1, ...]), then ``post``'s view
        (unbatched inputs run as a batch of one, the view taken after: ops.run_spec)."""
        pooled = (n, self.out_channels, *((1,) * self.dims if self.keepdim else ()))
        if self.post == "flatten":
            return (n, self.out_channels)
        if self.post == "squeeze":
            return tuple(d for d in pooled if d != 1)
        return pooled

    @property
    def weight_shape(self) -> IntTuple:
        """The conv weight's shape: (C_out, C_in / groups, *kernel)."""
        return (self.out_channels, self.in_channels // self.groups, *self.kernel_size)

    def output_spatial(self, in_spatial: IntTuple) -> IntTuple:
        """Spatial extent of the convolution output for an input of spatial extent ``in_spatial``."""
        return tuple(
            (i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(in_spatial, self.kernel_size, self.stride, self.padding, self.dilation)
        )


@dataclass(frozen=True)
class ConvTPoolReduceSpec:
    """Family B: ConvTransposeNd (N=2 or 3) -> optional activation -> chain of non-overlapping max pools
    (composed into one window) -> reduction over the channel dim (dim 1).

    Output: (N, 1, *pooled) with keepdim, else (N, *pooled).
    """

    dims: int                      # spatial rank: 3 (ConvTranspose3d) or 2 (ConvTranspose2d)
    in_channels: int
    out_channels: int
    kernel_size: IntTuple
    stride: IntTuple
    padding: IntTuple
    output_padding: IntTuple
    dilation: IntTuple
    has_bias: bool
    window: IntTuple               # composed max-pool window (kernel == stride, per dim)
    activation: str = "none"       # applied between the conv and the pools
    reduction: str = "sum"         # key of codes.REDUCTIONS
    keepdim: bool = True
    groups: int = 1
    padding_mode: str = "zeros"

    family = "B"
    __hash__, __getstate__ = _cached_hash, _state

    def __post_init__(self):
        _check_spec(self, (("activation", ACTIVATIONS), ("reduction", REDUCTIONS)),
                    ("kernel_size", "stride", "padding", "output_padding", "dilation", "window"))

    @property
    def weight_shape(self) -> IntTuple:
        """The transposed conv weight's shape: (C_in, C_out / groups, *kernel)."""
        return (self.in_channels, self.out_channels // self.groups, *self.kernel_size)

    def conv_output_spatial(self, in_spatial: IntTuple) -> IntTuple:
        return tuple(
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
            for i, k, s, p, op, d in zip(
                in_spatial, self.kernel_size, self.stride, self.padding, self.output_padding, self.dilation
            )
        )

    def pooled_spatial(self, in_spatial: IntTuple) -> IntTuple:
        """floor(conv_out / window) per dim: a chain of pools with kernel == stride composes to this."""
        return tuple(o // w for o, w in zip(self.conv_output_spatial(in_spatial), self.window))
