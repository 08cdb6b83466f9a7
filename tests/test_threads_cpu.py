"""One fused model called from many threads at once on the CPU, from its first call on: each thread's calls (its own
input shapes, unbatched ones among them, in no_grad and inference_mode) answer as the original model does, while the
threads prepare their call signatures, build the regions' change tests and look at the graph concurrently; models
fused in one thread while others serve (fx's trace patches every thread's module calls and attribute reads)."""
import threading
import warnings
from warnings import warn

import pytest
import torch
from torch import is_grad_enabled

import fullfuse
from fullfuse.seed_models import SeedA, SeedB
from in_threads import in_threads

THREADS = 8
ROUNDS = 20
SHAPES = {"A": [(1, 8, 12, 12), (2, 8, 9, 17), (8, 10, 10), (3, 8, 16, 5)],
          "B": [(1, 32, 7, 7, 7), (2, 32, 7, 8, 7), (32, 7, 7, 7), (1, 32, 8, 7, 9)]}


def _every_round(check):
    """A thread's job: ROUNDS calls of ``check(thread, round)``, each answering as the original (an AssertionError
    names the thread and round)."""
    def job(index: int) -> None:
        for round_ in range(ROUNDS):
            assert check(index, round_), (index, round_)
    return job


@pytest.mark.parametrize("family", ["A", "B"])
def test_threads_from_the_first_call(family):
    torch.manual_seed(0)
    model = (SeedA if family == "A" else SeedB)().eval()
    inputs = [torch.randn(shape) for shape in SHAPES[family]]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    fused = fullfuse.fused_model(model)

    def call(index: int, round_: int) -> bool:
        which = (index + round_) % len(inputs)
        with (torch.no_grad() if (index + round_) % 2 else torch.inference_mode()):
            return torch.equal(fused(inputs[which]), expected[which])

    failures = in_threads(_every_round(call), THREADS)
    assert not failures, failures[:2]
    assert fused.plans and fused.plans[0].last_path == "torch"   # (a CPU input: PyTorch's ops, in the region)


@pytest.mark.parametrize("family", ["A", "B"])
def test_threads_two_models_of_one_spec(family):
    """Two fused models of the same spec (the process shares its prepared calls between them) with different weights,
    called from threads at once: each answers with its own weights."""
    torch.manual_seed(0)
    models = [(SeedA if family == "A" else SeedB)().eval() for _ in range(2)]
    x = torch.randn(SHAPES[family][0])
    with torch.no_grad():
        expected = [model(x) for model in models]
    assert not torch.equal(expected[0], expected[1])
    fused = [fullfuse.fused_model(model) for model in models]
    assert fused[0].plans[0].calls is fused[1].plans[0].calls

    def call(index: int, round_: int) -> bool:
        which = (index + round_) % 2
        with torch.no_grad():
            return torch.equal(fused[which](x), expected[which])

    failures = in_threads(_every_round(call), THREADS)
    assert not failures, failures[:2]


class _Scaled(torch.nn.Module):
    """Seed A's region, then a factor and a dict entry the forward reads (traced: their values fixed in the graph)."""

    def __init__(self, k: float):
        super().__init__()
        self.body, self.k, self.table = SeedA(), k, {"s": 1.0}

    def forward(self, x):
        return self.body(x) * self.k * self.table["s"]


def test_fusing_in_one_thread_while_others_serve():
    """fx patches nn.Module.__call__ for every thread while it traces: threads serving a fused model and a plain model
    meanwhile run their own calls (not the trace's), and each model fused meanwhile answers as the original."""
    torch.manual_seed(1)
    x = torch.randn(2, 8, 10, 10)
    served, plain = fullfuse.fused_model(_Scaled(1.0).eval()), _Scaled(2.0).eval()
    with torch.no_grad():
        want_served, want_plain = served(x), plain(x)

    done = threading.Event()

    def serve(index: int) -> None:
        with torch.no_grad():
            while not done.is_set():   # (as long as models are being fused)
                assert torch.equal(served(x) if index % 2 else plain(x), want_served if index % 2 else want_plain)

    def fuse(threads) -> None:
        try:
            for k in range(ROUNDS):
                model = _Scaled(float(k)).eval()
                fused = fullfuse.fused_model(model)
                with torch.no_grad():
                    assert torch.equal(fused(x), model(x)) and [p.name for p in fused.plans] == ["fullfuse_region_0"]
        finally:
            done.set()

    failures = in_threads(serve, 4, main_work=fuse)
    assert not failures, failures[0]


class _Headed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = SeedA(), torch.nn.Linear(64, 3)

    def forward(self, x):
        return self.head(self.body(x))


def test_fusing_a_model_again_while_it_is_served():
    """Threads serving a fused model (its head reads its weight by attribute) while the same model is fused again: fx
    answers every thread's parameter reads while it traces, and the serving threads get the parameters, not the
    trace's proxies of them."""
    torch.manual_seed(2)
    model, x = _Headed().eval(), torch.randn(2, 8, 10, 10)
    served = fullfuse.fused_model(model)
    with torch.no_grad():
        want = model(x)

    done = threading.Event()

    def serve(index: int) -> None:
        with torch.no_grad():
            while not done.is_set():
                assert torch.equal(served(x), want)

    def fuse(threads) -> None:
        try:
            for _ in range(ROUNDS):
                again = fullfuse.fused_model(model)
                with torch.no_grad():
                    assert torch.equal(again(x), want)
        finally:
            done.set()

    failures = in_threads(serve, 4, main_work=fuse)
    assert not failures, failures[0]


class _CallsByName(torch.nn.Module):
    """A region, then functions this module imported by name: the trace puts its recorders in the module's globals."""

    def __init__(self):
        super().__init__()
        self.body = SeedA()

    def forward(self, x):
        y = self.body(x)
        warn("served")
        return y * 2 if is_grad_enabled() else y


def test_fusing_in_one_thread_while_others_call_functions_the_trace_records():
    """While a trace holds recorders in place of ``warn`` and ``is_grad_enabled`` in this module, threads running the
    module's code meanwhile get the real answers and warnings (the recorders pass other threads' calls through)."""
    torch.manual_seed(3)
    x, plain = torch.randn(2, 8, 10, 10), _CallsByName().eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = plain(x)
    done, calls = threading.Event(), [0] * 4

    def serve(index: int) -> None:
        with torch.no_grad():
            while not done.is_set():
                assert torch.equal(plain(x), want)
                calls[index] += 1

    def fuse(threads) -> None:
        try:
            for _ in range(ROUNDS):
                model = _CallsByName().eval()
                fused = fullfuse.fused_model(model)
                assert [p.name for p in fused.plans] == ["body.fullfuse_region_0"]   # (refused as a whole)
        finally:
            done.set()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failures = in_threads(serve, 4, main_work=fuse)
    assert not failures, failures[0]
    assert (warn, is_grad_enabled) == (warnings.warn, torch.is_grad_enabled)
    assert sum(1 for w in caught if str(w.message) == "served") == sum(calls) > 0
