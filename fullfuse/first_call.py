"""Path "auto"'s first call of a signature: the kernel path it chose (fused or fallback) against the torch path, timed
as the user sees them, so that auto never runs slower than PyTorch itself (tiny problems, where a kernel path's fixed
cost per call exceeds eager's, or shapes the fused kernel cannot serve and the fallback loses on).

Each path's first call takes its one-time work (library load, cuDNN plan choice, chunk schedule) out of the timing;
then the wall time of a few back-to-back calls, synchronised at the end (host and GPU time together: small problems
are host-bound, large ones GPU-bound), best of five rounds, the two paths' rounds interleaved (kernel, torch; then
torch, kernel; ...): a shared host or GPU that slows down during the comparison slows both alike (timed one path after
the other, a slow phase of a few hundred µs can fall on one path's rounds alone and keep the slower path for good).
The torch path stops early where a round is already several times slower, and where it runs out of memory (the
kernels hold far less than eager's conv output).  Not under CUDA-graph capture (timing synchronises): the static
choice stands there.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import torch

ROUNDS = 5
CALLS_PER_ROUND = 3
CLEARLY_SLOWER = 3.0     # a torch round this many times slower than the kernel path's best ends the comparison
KERNEL_MARGIN = 0.95     # the kernel path is kept only where it takes at most this share of torch's time: in a
                         # near-tie (host-bound calls, noise of a few %) PyTorch's own ops are the safer choice


def _sync(device: torch.device) -> None:
    torch.cuda.synchronize(device)


def _round_ms(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / calls


def per_call_ms(fn: Callable[[], object], device: torch.device, give_up_above: Optional[float] = None,
                rounds: int = ROUNDS, calls: int = CALLS_PER_ROUND) -> float:
    """Best per-call wall time of ``fn`` in ms over ``rounds`` rounds of ``calls`` back-to-back calls, each
    synchronised at its end (after one untimed call); stops after a round slower than ``give_up_above``."""
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(rounds):
        best = min(best, _round_ms(fn, device, calls))
        if give_up_above is not None and best > give_up_above:
            break
    return best


def compare_ms(first: Callable[[], object], second: Callable[[], object], device: torch.device,
               give_up_ratio: Optional[float] = None, rounds: int = ROUNDS,
               calls: int = CALLS_PER_ROUND) -> Tuple[float, float]:
    """(first's, second's) best per-call wall time in ms over ``rounds`` rounds each of ``calls`` back-to-back calls
    (after one untimed call of each, first's before second's), the rounds interleaved in alternating order; second is
    not timed further once its best exceeds ``give_up_ratio`` times first's.  An error of second's (out of memory)
    propagates."""
    first()
    _sync(device)
    second()
    _sync(device)
    best = [float("inf"), float("inf")]
    fns, timing_second = (first, second), True
    for index in range(rounds):
        for which in ((0, 1) if index % 2 == 0 else (1, 0)):
            if which == 0 or timing_second:
                best[which] = min(best[which], _round_ms(fns[which], device, calls))
        if give_up_ratio is not None and best[1] > give_up_ratio * best[0]:
            timing_second = False
    return best[0], best[1]


def torch_is_faster(kernel_call: Callable[[], object], torch_call: Callable[[], object],
                    device: torch.device) -> Tuple[bool, float, float]:
    """(run the torch path: the kernel path is not clearly faster, kernel ms, torch ms) per call."""
    try:
        kernel_ms, torch_ms = compare_ms(kernel_call, torch_call, device, give_up_ratio=CLEARLY_SLOWER)
    except torch.cuda.OutOfMemoryError:
        return False, per_call_ms(kernel_call, device), float("inf")
    return kernel_ms > KERNEL_MARGIN * torch_ms, kernel_ms, torch_ms
