"""One fused model called from many threads at once on the CPU, from its first call on: each thread's calls (its own
input shapes, unbatched ones among them, in no_grad and inference_mode) answer as the original model does, while the
threads prepare their call signatures, build the regions' change tests and look at the graph concurrently."""
import pytest
import torch

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
