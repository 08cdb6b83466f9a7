"""What a forward reads from outside its modules while fx traces it: torch's global modes and settings, the process's
environment variables, and the global random generators.

fx runs the forward's Python once and keeps every value that Python computed as a constant of the graph.  A forward
that asks torch for a mode or setting (``torch.is_grad_enabled()``, ``torch.get_default_dtype()``,
``torch.backends.cudnn.allow_tf32``) or reads an environment variable (``os.environ.get("DEBUG")``) would answer
every call as the trace was answered, and one that draws from a
global random generator outside the graph's ops (``torch.randn(64)`` with no traced value among its arguments,
``random.random()``) would add the trace's draw to every call.  ``ReadingGlobalState`` records both for one trace in
one thread, where the caller refuses the trace (``fused_model`` then fuses the model's children that trace).  Reads
and draws by torch's and fullfuse's own code do not count.  The model's own globals are ``traced_globals``', the
attributes it reads ``module_tree``'s.
"""
from __future__ import annotations

import os
import pickle
import random
import sys
import threading
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .mode_blocks import patch_lock

# torch's queries of its global modes and settings, by namespace
QUERIES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("torch", ("is_grad_enabled", "is_inference_mode_enabled", "is_autocast_enabled", "is_autocast_cpu_enabled",
               "is_autocast_cache_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype", "get_autocast_cpu_dtype",
               "get_default_dtype", "get_default_device", "are_deterministic_algorithms_enabled",
               "is_deterministic_algorithms_warn_only_enabled", "get_deterministic_debug_mode",
               "get_float32_matmul_precision", "get_num_threads", "get_num_interop_threads", "is_anomaly_enabled",
               "is_anomaly_check_nan_enabled", "is_warn_always_enabled", "initial_seed", "get_rng_state")),
    ("torch.cuda", ("current_device", "current_stream", "default_stream", "is_current_stream_capturing",
                    "get_rng_state", "initial_seed")),
    ("torch.backends.cuda", ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
                             "cudnn_sdp_enabled", "preferred_linalg_library")),
    # whether a tracer runs the code: True for fx at the trace (False in every call), False for torch.compile (True
    # under a torch.compile of the fused model).  (TorchScript's and ONNX's queries need no refusal: under
    # torch.jit.trace and torch.export the fused model runs the model's own forward, whose code asks them itself)
    ("torch.fx._symbolic_trace", ("is_fx_tracing", "is_fx_symbolic_tracing")),
    ("torch.compiler", ("is_compiling", "is_dynamo_compiling", "is_exporting")),
    ("torch._dynamo", ("is_compiling",)),
    ("torch._utils", ("is_compiling",)),
)
# TorchScript's query, noted without refusal: the trace answers no, as eager calls do, but a script of the model
# answers yes (``FusedModel.__prepare_scriptable__`` then scripts the model itself, not the traced graph)
SCRIPTING_QUERIES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("torch.jit", ("is_scripting",)), ("torch._jit_internal", ("is_scripting",)))


def own_code(frame) -> bool:
    """Whether ``frame`` runs torch's or fullfuse's own code (not a model's: torchvision's is a model's)."""
    return own_module(frame.f_globals.get("__name__", "") if frame is not None else "")


def own_module(name: str) -> bool:
    """Whether the Python module ``name`` is torch's or fullfuse's."""
    return name in ("torch", "fullfuse") or name.startswith(("torch.", "fullfuse."))


class ReadingGlobalState:
    """``with ReadingGlobalState() as state: <trace>``: then ``state.read`` names the queries of torch's global modes
    and settings the traced code made in this thread (``torch.get_default_dtype()``, ``torch.backends.cudnn.
    allow_tf32``), ``state.environment`` the environment variables it read (``os.environ``, ``os.getenv``, also
    bound by name), and ``state.drawn`` the global random generators whose state the trace changed (torch's CPU and
    CUDA default generators, Python's ``random``, NumPy's ``numpy.random``).  The queries are wrapped for the
    duration (other threads' calls pass through unrecorded); the generators' states are compared before and after."""

    def __init__(self):
        self.read: List[str] = []
        self.drawn: List[str] = []
        self.stand_ins: List[Tuple[object, object]] = []   # (query, its wrapper), for ReadingGlobals
        self.scripting: List[str] = []   # the SCRIPTING_QUERIES the traced code made
        self.environment: List[str] = []   # the environment variables it read, as os.environ['NAME']

    def __enter__(self) -> "ReadingGlobalState":
        patch_lock.acquire()
        self._thread = threading.get_ident()
        self._undo: List[Callable[[], None]] = []
        self._states = generator_states()
        try:
            self._wrap_functions()
            self._wrap_backend_flags()
            self._wrap_environment()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._restore()
            after = generator_states()
            self.drawn = [name for name, state in after.items() if not _same(self._states.get(name), state)]
        finally:
            patch_lock.release()

    def _restore(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def _note(self, label: str, frame, into: Optional[List[str]] = None) -> None:
        into = self.read if into is None else into
        if threading.get_ident() == self._thread and label not in into and not own_code(frame):
            into.append(label)

    def _wrap_functions(self) -> None:
        for (path, names), into in [(query, self.read) for query in QUERIES] + \
                                   [(query, self.scripting) for query in SCRIPTING_QUERIES]:
            namespace = sys.modules.get(path)
            for name in names if namespace is not None else ():
                real = namespace.__dict__.get(name)
                if not callable(real):
                    continue

                def query(*args, _real=real, _label=f"{path}.{name}()", _into=into, **kwargs):
                    self._note(_label, sys._getframe(1), _into)
                    return _real(*args, **kwargs)
                setattr(namespace, name, query)
                self.stand_ins.append((real, query))
                self._undo.append(lambda namespace=namespace, name=name, real=real: setattr(namespace, name, real))

    def _wrap_backend_flags(self) -> None:
        """The flags of ``torch.backends.<x>`` (cudnn, mkldnn...: properties of the module's class) and
        ``torch.backends.cuda.matmul`` (read through its class's ``__getattr__``)."""
        backends = sys.modules.get("torch.backends")
        prop_module = getattr(backends, "PropModule", None)
        context_prop = getattr(backends, "ContextProp", None)
        for module_name, module in list(vars(backends).items()) if prop_module is not None else ():
            cls = type(module)
            if not isinstance(module, prop_module):
                continue
            for name, prop in list(vars(cls).items()):
                if isinstance(prop, (context_prop, _RecordedFlag)):   # (a trace inside a trace wraps the wrapper)
                    setattr(cls, name, _RecordedFlag(prop, f"torch.backends.{module_name}.{name}", self._note))
                    self._undo.append(lambda cls=cls, name=name, prop=prop: setattr(cls, name, prop))
        matmul = getattr(sys.modules.get("torch.backends.cuda"), "matmul", None)
        real = type(matmul).__dict__.get("__getattr__") if matmul is not None else None
        if real is not None:
            cls, note = type(matmul), self._note

            def getattr_(obj, name, _real=real):
                note(f"torch.backends.cuda.matmul.{name}", sys._getframe(1))
                return _real(obj, name)
            cls.__getattr__ = getattr_
            self._undo.append(lambda: setattr(cls, "__getattr__", real))

    def _wrap_environment(self) -> None:
        """Reads of os.environ's class (``os.environ[...]``, ``.get``, ``in``, ``os.getenv``, iteration: each goes
        through ``__getitem__`` or ``__iter__``), noted for the first caller outside ``os`` and the mapping ABCs
        (torch reading its own variables is torch's)."""
        cls = type(os.environ)
        note, environment = self._note, self.environment
        real_getitem, real_iter = cls.__dict__.get("__getitem__"), cls.__dict__.get("__iter__")
        if real_getitem is None or real_iter is None:
            return

        def getitem(env, key):
            note(f"os.environ[{key!r}]", _reader(sys._getframe(1)), environment)
            return real_getitem(env, key)

        def iterate(env):
            note("os.environ (all of it)", _reader(sys._getframe(1)), environment)
            return real_iter(env)
        cls.__getitem__, cls.__iter__ = getitem, iterate
        self._undo.append(lambda: (setattr(cls, "__getitem__", real_getitem), setattr(cls, "__iter__", real_iter)))


_ENVIRONMENT_HELPERS = frozenset(("os", "_collections_abc", "collections.abc", "typing"))


def _reader(frame):
    """The frame that reads the environment: the first one outside os.getenv and the mapping methods that call
    os.environ's ``__getitem__`` / ``__iter__``."""
    while frame is not None and frame.f_globals.get("__name__", "") in _ENVIRONMENT_HELPERS:
        frame = frame.f_back
    return frame


class _RecordedFlag:
    """A backend flag's property, noting each read (then reading it as the property does)."""

    def __init__(self, real, label: str, note: Callable):
        self.real, self.label, self.note = real, label, note

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        self.note(self.label, sys._getframe(1))
        return self.real.__get__(obj, objtype)

    def __set__(self, obj, value) -> None:
        self.real.__set__(obj, value)


def generator_states() -> Dict[str, object]:
    """The global random generators' states, by name: torch's CPU generator, the CUDA generators of devices whose
    context exists (not while this thread's stream is being captured into a CUDA graph, where torch refuses the
    query), Python's ``random`` and, where NumPy is imported, ``numpy.random``'s."""
    states: Dict[str, object] = {"torch.default_generator": torch.default_generator.get_state(),
                                 "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
        for index, generator in enumerate(torch.cuda.default_generators):
            try:
                states[f"torch.cuda.default_generators[{index}]"] = generator.get_state()
            except RuntimeError:   # (a generator torch will not read now: not compared)
                pass
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy.random"] = pickle.dumps(numpy.random.get_state())
    return states


def _same(before, after) -> bool:
    if isinstance(after, torch.Tensor):
        if before is None:
            # a CUDA context made during the trace: its generator's state is (seed, offset), 8 bytes each, and a draw
            # moved the offset on from 0
            return after.numel() != 16 or not bool(after[8:].any())
        return torch.equal(before, after)
    return before == after
