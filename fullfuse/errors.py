"""Exceptions raised by fullfuse."""


class FullfuseError(Exception):
    """Base class of every fullfuse error."""


class UnsupportedError(FullfuseError):
    """The requested path cannot serve this region or input; the message says why."""


class TraceError(FullfuseError, RuntimeError):
    """torch.fx could not trace the model."""


from cutlass_ops.cache import BuildError  # noqa: E402,F401  (re-exported: a kernel could not be compiled or read)
