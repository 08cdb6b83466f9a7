"""One fused model called from many threads at once on the CPU, from its first call on: each thread's calls (its own
input shapes, unbatched ones among them, in no_grad and inference_mode) answer as the original model does, while the
threads prepare their call signatures, build the regions' change tests and look at the graph concurrently."""
import threading

import pytest
import torch

import fullfuse
from fullfuse.seed_models import SeedA, SeedB

THREADS = 8
ROUNDS = 20
SHAPES = {"A": [(1, 8, 12, 12), (2, 8, 9, 17), (8, 10, 10), (3, 8, 16, 5)],
          "B": [(1, 32, 7, 7, 7), (2, 32, 7, 8, 7), (32, 7, 7, 7), (1, 32, 8, 7, 9)]}


def _failures_in_threads(call) -> list:
    """Run ``call(thread_index, round)`` for ROUNDS rounds in each of THREADS threads started together; its
    failures (a False answer: (thread, round); an exception: (thread, its repr))."""
    start = threading.Barrier(THREADS)
    failures = []

    def work(index: int) -> None:
        try:
            start.wait()
            for round_ in range(ROUNDS):
                if not call(index, round_):
                    failures.append((index, round_))
        except Exception as exc:   # (reported by the caller)
            failures.append((index, repr(exc)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


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

    failures = _failures_in_threads(call)
    assert not failures, failures[:5]
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

    failures = _failures_in_threads(call)
    assert not failures, failures[:5]
