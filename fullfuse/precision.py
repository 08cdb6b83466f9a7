"""Precision names follow PyTorch's: "tf32" or "ieee" for float32 convolutions; "auto" follows PyTorch's own
setting for cuDNN convolutions (``torch.backends.cudnn.conv.fp32_precision``, or ``allow_tf32`` on older torch),
so a user gets what PyTorch would give them.  bfloat16/float16 inputs compute in their dtype with float32
accumulation whatever the setting ("native").
"""
from __future__ import annotations

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
    """What PyTorch would use for a float32 cuDNN convolution right now: "tf32" or "ieee".  Where torch has the
    fp32_precision levels, its legacy getter resolves them for cuDNN as a whole (conv, else cuDNN's, else the
    generic level, else the legacy flag) and raises only where the conv's and the RNN's resolved values differ: one
    C call in the common case (host time per call); the conv's own level walked only then."""
    if _FAST is not None:
        try:
            return "tf32" if torch._C._get_cudnn_allow_tf32() else "ieee"
        except RuntimeError:
            pass
        getter, levels = _FAST
        for level in levels:
            value = getter(*level)
            if value in ("tf32", "ieee"):
                return value
        return _legacy_allow_tf32()
    return _walked_levels()


def _walked_levels() -> str:
    """``torch_conv_precision`` by the fp32_precision attributes, conv level first (torch without the fast getters);
    the legacy flag where no level says tf32 / ieee or torch has none."""
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


NATIVE_MODES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def resolve(precision: str, dtype: torch.dtype) -> str:
    """The mode a call runs in: "tf32" / "ieee" for float32, else "bfloat16" / "float16" (other dtypes: their
    name).  Raises ValueError for an unknown precision."""
    if dtype == torch.float32:
        if precision == "auto":
            return torch_conv_precision()
        if precision in ("tf32", "ieee"):
            return precision
    check_precision(precision)
    return NATIVE_MODES.get(dtype) or str(dtype).replace("torch.", "")


# Process-wide torch flags are changed only here, under this lock, which a call holds while its convolutions are
# enqueued: a fullfuse call asking for a precision then never runs while another has the flag changed.
_FLAGS_LOCK = threading.RLock()
_get_deterministic = getattr(torch._C, "_get_cudnn_deterministic", None)
_set_deterministic = getattr(torch._C, "_set_cudnn_deterministic", None)


def _deterministic() -> bool:
    return _get_deterministic() if _get_deterministic is not None else torch.backends.cudnn.deterministic


def _set_cudnn_deterministic(value: bool) -> None:
    if _set_deterministic is not None:
        _set_deterministic(value)
    else:
        torch.backends.cudnn.deterministic = value


def _precision_flag():
    """(holder, attribute) of the torch flag that selects cuDNN convolutions' float32 precision, and the value that
    gives each mode."""
    conv = _conv_backend()
    if conv is not None:
        return conv, "fp32_precision", {"tf32": "tf32", "ieee": "ieee"}
    return torch.backends.cudnn, "allow_tf32", {"tf32": True, "ieee": False}


class _CudnnSettings:
    """Inside: cuDNN convolutions run in ``mode`` ("tf32" / "ieee"; other modes leave the precision as it is) and,
    where ``deterministic``, with cuDNN's deterministic algorithms; the lock held.  A flag is changed only where
    PyTorch's current setting differs (read through torch's own getters: host time per call), and set back after."""

    __slots__ = ("mode", "deterministic", "restore")

    def __init__(self, mode: str, deterministic: bool):
        self.mode, self.deterministic, self.restore = mode, deterministic, ()

    def __enter__(self):
        _FLAGS_LOCK.acquire()
        try:
            restore = []
            if self.mode in ("tf32", "ieee") and torch_conv_precision() != self.mode:
                holder, name, values = _precision_flag()
                restore.append((setattr, holder, name, getattr(holder, name)))
                setattr(holder, name, values[self.mode])
            if self.deterministic and not _deterministic():
                restore.append((_set_cudnn_deterministic, False))
                _set_cudnn_deterministic(True)
            self.restore = restore
        except BaseException:
            self._undo()
            raise
        return self

    def _undo(self):
        try:
            for fn, *args in reversed(self.restore):
                fn(*args)
        finally:
            self.restore = ()
            _FLAGS_LOCK.release()

    def __exit__(self, *exc):
        self._undo()
        return False


def cudnn_conv_precision(mode: str):
    """Run the cuDNN convolutions inside in ``mode`` ("tf32" or "ieee"; other modes leave torch as it is)."""
    return _CudnnSettings(mode, False)


def cudnn_settings(mode: str, deterministic: bool):
    """cudnn_conv_precision(mode), and cuDNN's deterministic-algorithm switch while inside."""
    return _CudnnSettings(mode, deterministic)
