"""What a forward writes out (a print, a log record, a warning) while torch.fx traces it.

fx runs the forward's Python once, at the trace, with proxies for the values: a ``print(y.shape)``,
``logger.info(...)`` or ``warnings.warn(...)`` there writes ``Proxy(...)`` once, and the traced graph never writes
again.  ``RecordingOutputs`` notes such writes of the model's code in the trace's thread (and drops them: the trace is
then refused, and the forward runs as written, writing each call's values); other threads' writes, and torch's and
fullfuse's own log records and warnings, pass through.  ``print`` is lent to the model's modules
(``traced_globals.ReadingGlobals``), not patched in builtins; logging's records are taken at ``Logger._log`` (called
only for a level the logger is enabled for); warnings at ``warnings.warn`` (and, through ``stand_ins``, a ``warn``
that the model's modules imported by name before).
"""
from __future__ import annotations

import logging
import sys
import threading
import warnings
from typing import Dict, List, Tuple

from .global_state import own_code
from .mode_blocks import patch_lock


class RecordingOutputs:
    """``with RecordingOutputs() as outputs, ReadingGlobals(lent=outputs.lent): <trace>``: then ``outputs.written``
    names what the model's code wrote (``print(...)``, ``a log record of logger 'name'``)."""

    def __init__(self):
        self.written: List[str] = []
        self.lent: Dict[str, object] = {}
        self.stand_ins: List[Tuple[object, object]] = []   # (warnings.warn, its recorder), for ReadingGlobals

    def __enter__(self) -> "RecordingOutputs":
        patch_lock.acquire()
        # (the recorders stay where code bound them during the trace, ``from warnings import warn`` in a module
        # imported then: after the trace they pass everything through)
        thread, written, self._active = threading.get_ident(), self.written, [True]
        active = self._active
        self._log = logging.Logger._log

        def traced() -> bool:   # (a write of the trace's thread while the trace runs)
            return active[0] and threading.get_ident() == thread

        def print_(*args, **kwargs):
            if traced():
                written.append("print(...)")
                return None
            return print(*args, **kwargs)

        def log(logger, *args, **kwargs):
            if traced() and not own_code(_caller_of_logging(sys._getframe(1))):
                written.append(f"a log record of logger {logger.name!r}")
                return None
            # (one frame more to skip: the record names the code that logged, not this function)
            return self._log(logger, *args, **dict(kwargs, stacklevel=kwargs.get("stacklevel", 1) + 1))
        self._warn = real_warn = warnings.warn

        def warn(message, category=None, stacklevel=1, *args, **kwargs):
            if traced() and not own_code(sys._getframe(1)):
                written.append("warnings.warn(...)")
                return None
            # (one frame more: the warning names the code that warned, not this function)
            return real_warn(message, category, stacklevel + 1, *args, **kwargs)
        self.lent["print"] = print_
        logging.Logger._log = log
        warnings.warn = warn
        self.stand_ins.append((real_warn, warn))
        return self

    def __exit__(self, *exc) -> None:
        self._active[0] = False
        logging.Logger._log = self._log
        warnings.warn = self._warn
        patch_lock.release()


def _caller_of_logging(frame):
    """The first frame outside the logging package (its ``info``, ``log``, a ``LoggerAdapter``'s)."""
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "logging":
        frame = frame.f_back
    return frame

