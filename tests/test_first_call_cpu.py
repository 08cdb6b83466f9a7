"""Path "auto"'s first-call comparison (fullfuse/first_call.py) on a simulated clock: each call advances the clock by
its cost, scaled while the simulated host is in a slow phase; the GPU synchronisation is a no-op."""
import pytest
import torch

from fullfuse import first_call


class Clock:
    """A host whose calls cost ``slowdown`` times more during its first ``slow_calls`` calls (any function's)."""

    def __init__(self, monkeypatch, slow_calls: int = 0, slowdown: float = 1.0):
        self.now, self.calls, self.log = 0.0, 0, []
        self.slow_calls, self.slowdown = slow_calls, slowdown
        monkeypatch.setattr(first_call.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(first_call, "_sync", lambda device: None)

    def fn(self, name: str, cost_ms: float):
        def call():
            self.now += cost_ms * 1e-3 * (self.slowdown if self.calls < self.slow_calls else 1.0)
            self.calls += 1
            self.log.append(name)
        return call


DEVICE = torch.device("cpu")


def test_a_slow_phase_at_the_start_does_not_pick_the_slower_path(monkeypatch):
    """The host is 10x slower for the comparison's first 14 calls: timed one path after the other, the kernel path's
    rounds would all fall in that phase and PyTorch's ops (twice its time) would be kept; interleaved, both paths get
    rounds after it."""
    clock = Clock(monkeypatch, slow_calls=14, slowdown=10.0)
    slower, kernel_ms, torch_ms = first_call.torch_is_faster(clock.fn("kernel", 0.03), clock.fn("torch", 0.06), DEVICE)
    assert not slower
    assert kernel_ms == pytest.approx(0.03) and torch_ms == pytest.approx(0.06)


@pytest.mark.parametrize("slow_calls", [0, 5, 14, 20])
def test_the_faster_path_wins_whenever_the_slow_phase_ends(monkeypatch, slow_calls):
    """Whenever a slow phase at the start ends before the last two rounds, each path is measured at its own cost."""
    for kernel, torch_cost, want in ((0.03, 0.06, False), (0.06, 0.03, True)):
        clock = Clock(monkeypatch, slow_calls=slow_calls, slowdown=8.0)
        slower, kernel_ms, torch_ms = first_call.torch_is_faster(clock.fn("kernel", kernel),
                                                                 clock.fn("torch", torch_cost), DEVICE)
        assert slower == want and kernel_ms == pytest.approx(kernel) and torch_ms == pytest.approx(torch_cost)


def test_rounds_alternate_and_each_path_is_called_once_untimed_first(monkeypatch):
    clock = Clock(monkeypatch)
    first_call.compare_ms(clock.fn("a", 1.0), clock.fn("b", 1.0), DEVICE)
    calls = first_call.CALLS_PER_ROUND
    want = ["a", "b"]
    for index in range(first_call.ROUNDS):
        order = ("a", "b") if index % 2 == 0 else ("b", "a")
        want += [order[0]] * calls + [order[1]] * calls
    assert clock.log == want


def test_a_clearly_slower_torch_path_is_not_timed_further(monkeypatch):
    clock = Clock(monkeypatch)
    slower, kernel_ms, torch_ms = first_call.torch_is_faster(clock.fn("kernel", 1.0), clock.fn("torch", 5.0), DEVICE)
    assert not slower and kernel_ms == pytest.approx(1.0) and torch_ms == pytest.approx(5.0)
    assert clock.log.count("torch") == 1 + first_call.CALLS_PER_ROUND   # the untimed call and one round
    assert clock.log.count("kernel") == 1 + first_call.ROUNDS * first_call.CALLS_PER_ROUND


@pytest.mark.parametrize("ratio, slower", [(0.94, False), (0.95, False), (0.96, True), (1.5, True)])
def test_the_kernel_path_is_kept_only_within_the_margin(monkeypatch, ratio, slower):
    clock = Clock(monkeypatch)
    got = first_call.torch_is_faster(clock.fn("kernel", ratio), clock.fn("torch", 1.0), DEVICE)
    assert got[0] == slower


def test_torch_out_of_memory_keeps_the_kernel_path(monkeypatch):
    clock = Clock(monkeypatch)

    def out_of_memory():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    slower, kernel_ms, torch_ms = first_call.torch_is_faster(clock.fn("kernel", 0.5), out_of_memory, DEVICE)
    assert not slower and kernel_ms == pytest.approx(0.5) and torch_ms == float("inf")
