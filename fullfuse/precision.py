"""Precision names follow PyTorch's: "tf32" or "ieee" for float32 convolutions; "auto" follows PyTorch's own
setting for cuDNN convolutions (``torch.backends.cudnn.conv.fp32_precision``, or ``allow_tf32`` on older torch),
so a user gets what PyTorch would give them.  bfloat16/float16 inputs compute in their dtype with float32
accumulation whatever the setting ("native").
"""
from __future__ import annotations

import contextlib
import threading

import torch

PRECISION_CHOICES = ("auto", "tf32", "ieee")

# Relative-error bounds vs float64 that the tests and `fullfuse check` hold each mode to.
TOLERANCE = {"tf32": 1e-3, "ieee": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}


def _conv_backend():
    conv = getattr(torch.backends.cudnn, "conv", None)
    return conv if conv is not None and hasattr(conv, "fp32_precision") else None


def _fast_getters():
    """torch's own getters behind cudnn.conv / cudnn / backends .fp32_precision, called directly (the attribute
    path costs ~5 us per call, this ~0.3), or None where this torch lacks them or they disagree with the
    attributes."""
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    conv = _conv_backend()
    if getter is None or conv is None:
        return None
    levels = ((conv.backend, conv.op), ("cuda", "all"), ("generic", "all"))
    try:
        same = [getter(*lv) for lv in levels] == [getattr(h, "fp32_precision", None)
                                                 for h in (conv, torch.backends.cudnn, torch.backends)]
    except Exception:
        return None
    return (getter, levels) if same else None


_FAST = _fast_getters()


def torch_conv_precision() -> str:
    """What PyTorch would use for a float32 cuDNN convolution right now: "tf32" or "ieee"."""
    if _FAST is not None:
        getter, levels = _FAST
        for level in levels:
            value = getter(*level)
            if value in ("tf32", "ieee"):
                return value
        return _legacy_allow_tf32()
    conv = _conv_backend()
    if conv is not None:
        for holder in (conv, torch.backends.cudnn, torch.backends):
            value = getattr(holder, "fp32_precision", "none")
            if value in ("tf32", "ieee"):
                return value
    return _legacy_allow_tf32()


def _legacy_allow_tf32() -> str:
    """The legacy flag, where no fp32_precision level says tf32 / ieee.  Its getter raises while cuDNN's conv and RNN
    flags differ (a user's mix of the legacy and new APIs); the conv's own default, TF32, applies then."""
    try:
        return "tf32" if torch._C._get_cudnn_allow_tf32() else "ieee"
    except RuntimeError:
        return "tf32"


def check_precision(precision: str) -> None:
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"fullfuse: precision must be one of {PRECISION_CHOICES}, got {precision!r}")


def resolve(precision: str, dtype: torch.dtype) -> str:
    """The mode a call runs in: "tf32" / "ieee" for float32, else "bfloat16" / "float16"."""
    check_precision(precision)
    if dtype != torch.float32:
        return str(dtype).replace("torch.", "")
    return torch_conv_precision() if precision == "auto" else precision


# Process-wide torch flags are changed only here, under this lock, which a call holds while its convolutions are
# enqueued: a fullfuse call asking for a precision then never runs while another has the flag changed.
_FLAGS_LOCK = threading.RLock()


@contextlib.contextmanager
def _flags_set(pairs):
    """Inside: the (holder, attribute, value) triples set, under the lock; restored after.  A flag already at its
    value is not touched."""
    with _FLAGS_LOCK:
        saved = [(h, a, getattr(h, a)) for h, a, v in pairs if getattr(h, a) != v]
        try:
            for h, a, v in pairs:
                if getattr(h, a) != v:
                    setattr(h, a, v)
            yield
        finally:
            for h, a, v in reversed(saved):
                setattr(h, a, v)


def _precision_flags(mode: str):
    """The torch flag that makes cuDNN convolutions run in ``mode`` ("tf32" / "ieee")."""
    if mode not in ("tf32", "ieee"):
        return []
    conv = _conv_backend()
    if conv is not None:
        return [(conv, "fp32_precision", mode)]
    return [(torch.backends.cudnn, "allow_tf32", mode == "tf32")]


def cudnn_conv_precision(mode: str):
    """Run the cuDNN convolutions inside in ``mode`` ("tf32" or "ieee"; other modes leave torch as it is)."""
    flags = _precision_flags(mode)
    return _flags_set(flags) if flags else contextlib.nullcontext()


def cudnn_settings(mode: str, deterministic: bool):
    """cudnn_conv_precision(mode), and cuDNN's deterministic-algorithm switch while inside (set, never cleared)."""
    flags = _precision_flags(mode)
    if deterministic:
        flags.append((torch.backends.cudnn, "deterministic", True))
    return _flags_set(flags) if flags else contextlib.nullcontext()
