"""Path "auto"'s first call of a signature: the kernel path it chose (fused or fallback) against the torch path, timed
as the user sees them, so that auto never runs slower than PyTorch itself (tiny problems, where a kernel path's fixed
cost per call exceeds eager's, or shapes the fused kernel cannot serve and the fallback loses on).

Each path's first call takes its one-time work (library load, cuDNN plan choice, chunk schedule) out of the timing;
then the wall time of a few back-to-back calls, synchronised at the end (host and GPU time together: small problems
are host-bound, large ones GPU-bound), best of three rounds.  The torch path stops early where its first timed round
is already several times slower, and where it runs out of memory (the kernels hold far less than eager's conv output).
Not under CUDA-graph capture (timing synchronises): the static choice stands there.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import torch

ROUNDS = 3
CALLS_PER_ROUND = 3
CLEARLY_SLOWER = 3.0     # a torch round this many times slower than the kernel path's best ends the comparison
KERNEL_MARGIN = 0.95     # the kernel path is kept only where it takes at most this share of torch's time: in a
                         # near-tie (host-bound calls, noise of a few %) PyTorch's own ops are the safer choice


def _round_ms(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls


def per_call_ms(fn: Callable[[], object], device: torch.device, give_up_above: Optional[float] = None,
                rounds: int = ROUNDS, calls: int = CALLS_PER_ROUND) -> float:
    """Best per-call wall time of ``fn`` in ms over ``rounds`` rounds of ``calls`` back-to-back calls, each
    synchronised at its end (after one untimed call); stops after a round slower than ``give_up_above``."""
    fn()
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(rounds):
        best = min(best, _round_ms(fn, device, calls))
        if give_up_above is not None and best > give_up_above:
            break
    return best


def torch_is_faster(kernel_call: Callable[[], object], torch_call: Callable[[], object],
                    device: torch.device) -> Tuple[bool, float, float]:
    """(run the torch path: the kernel path is not clearly faster, kernel ms, torch ms) per call."""
    kernel_ms = per_call_ms(kernel_call, device)
    try:
        torch_ms = per_call_ms(torch_call, device, give_up_above=CLEARLY_SLOWER * kernel_ms)
    except torch.cuda.OutOfMemoryError:
        return False, kernel_ms, float("inf")
    return kernel_ms > KERNEL_MARGIN * torch_ms, kernel_ms, torch_ms
