"""Measurement helpers shared by `fullfuse check`, `fullfuse bench` and the tests: errors vs float64, CUDA-event
timing with an L2 flush, peak extra memory, and the environment a result was measured in."""
from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch

WARMUP_S = 0.3
L2_FLUSH_BYTES = 256 << 20   # > 4x the H200's 60 MB L2
# Before each timed run the GPU spins this long after the L2 flush, so that the call under test is already queued when
# its start event fires: the figure is the GPU time of the call's kernels, not the host's dispatch latency, which
# otherwise leaks in whenever dispatch outlasts the flush (~65 us on the H200) — measured as a 0.05-0.08 ms
# process-to-process spread of fused end-to-end figures whose kernels agreed within 1 %.  The host time of each call is
# reported beside it (host_us_median / host_us_max); a lead shorter than host_us_max shows up there.
HOST_LEAD_US = 500.0
_SPIN_CYCLES_PER_US = 2000   # torch.cuda._sleep spins in GPU clock cycles; ~2 GHz SM clock under load


def errors(out: torch.Tensor, ref: torch.Tensor) -> Dict[str, float]:
    """‖out − ref‖ / ‖ref‖ and max |out − ref| in float64; NaN anywhere in out gives inf."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if out64.shape != ref64.shape:
        raise AssertionError(f"shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}")
    if not torch.isfinite(out64).all() and torch.isfinite(ref64).all():
        return {"relerr": float("inf"), "maxabs": float("inf")}
    diff = (out64 - ref64).nan_to_num(0.0)
    norm = ref64.nan_to_num(0.0).norm().item()
    return {"relerr": diff.norm().item() / (norm if norm > 0 else 1.0),
            "maxabs": diff.abs().max().item() if diff.numel() else 0.0}


def time_cuda(fn: Callable[[], object], repeats: int = 30, warmup: int = 3, flush_l2: bool = True,
              per_run: bool = False, host_lead_us: float = HOST_LEAD_US,
              prepare: Optional[Callable[[], object]] = None) -> Dict[str, object]:
    """Median and min in ms of ``fn`` timed with CUDA events, after warm-up, flushing the L2 before each run and
    giving the host ``host_lead_us`` to queue the call before its start event (HOST_LEAD_US; 0: none).
    per_run: also every run's time ("runs_ms") and the host time of its call of ``fn`` ("host_us").
    prepare: run (untimed) after each flush, before the lead — e.g. to re-warm one thing the flush evicted."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    # warm-up: at least `warmup` calls and WARMUP_S seconds of them (an idle GPU starts at a low clock: measured
    # 345 MHz before a run on the H200, and the first variant of a table came out slower than the rest)
    t0, calls = time.perf_counter(), 0
    while calls < warmup or (time.perf_counter() - t0 < WARMUP_S and calls < 1000):
        fn()
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    spin = getattr(torch.cuda, "_sleep", None) if host_lead_us > 0 else None
    times, host_us = [], []
    for _ in range(repeats):
        if flush is not None:
            flush.zero_()
        if prepare is not None:
            prepare()
        if spin is not None:
            spin(int(host_lead_us * _SPIN_CYCLES_PER_US))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t_call = time.perf_counter()
        fn()
        host_us.append((time.perf_counter() - t_call) * 1e6)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    result = {"median_ms": statistics.median(times), "min_ms": min(times), "runs": repeats,
              "host_us_median": statistics.median(host_us), "host_us_max": max(host_us),
              "host_lead_us": host_lead_us if spin is not None else 0.0}
    if per_run:
        result.update(runs_ms=times, host_us=host_us)
    return result


def isolated_host_us(fn: Callable[[], object], calls: int) -> float:
    """Median host time in µs of one call of ``fn`` started with the GPU idle (the synchronisation before each call
    is not timed): what a call costs the host — Python, allocations, the driver's enqueue of each kernel."""
    fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def interleaved_host_us(fns: Dict[str, Callable[[], object]], calls: int, rounds: int = 5,
                        back_to_back_calls: Optional[int] = None) -> Dict[str, Tuple[float, float]]:
    """For each of ``fns``, side by side: (the median host time in µs of an isolated call, as isolated_host_us; the
    best wall time in µs per call of ``back_to_back_calls`` back-to-back calls synchronised at the end, over
    ``rounds``).  The functions take turns call by call (isolated) and round by round (back to back), so a drift of
    the shared host's speed hits them all alike and their ratios hold; the order of the isolated turns is shuffled
    each time (fixed seed), so that what runs just before a call, which shifts its time, varies alike for all."""
    for fn in fns.values():
        fn()
    isolated: Dict[str, list] = {name: [] for name in fns}
    order, shuffle = list(fns.items()), random.Random(0).shuffle
    for _ in range(calls):
        shuffle(order)
        for name, fn in order:
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            isolated[name].append(time.perf_counter() - start)
    torch.cuda.synchronize()
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(back_to_back_calls or calls):
                fn()
            torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - start) / (back_to_back_calls or calls))
    return {name: (1e6 * statistics.median(isolated[name]), 1e6 * best[name]) for name in fns}


def repeated_host_us(fns: Dict[str, Callable[[], object]], calls: int, block: int = 20) -> Dict[str, float]:
    """For each of ``fns``: the median host time in µs of an isolated call (as isolated_host_us) with the same call
    repeated, nothing else run between its calls: the steady state of a program that calls one signature again and
    again.  The functions take turns block by block (``block`` calls each, shuffled order, fixed seed), so a drift
    of the shared host's speed hits them all alike.  interleaved_host_us, whose calls alternate with the others',
    times each call after other code has run (its caches colder): a few µs more per call on the H200 hosts."""
    for fn in fns.values():
        fn()
    times: Dict[str, list] = {name: [] for name in fns}
    order, shuffle = list(fns.items()), random.Random(0).shuffle
    for _ in range(max(1, calls // block)):
        shuffle(order)
        for name, fn in order:
            for _ in range(block):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return {name: 1e6 * statistics.median(t) for name, t in times.items()}


def peak_extra_memory(fn: Callable[[], object]) -> int:
    """Bytes allocated by one call of ``fn`` above what was allocated before it (output included), plus the
    workspaces fullfuse keeps across calls for it (outside torch's allocator: fullfuse.workspace.kept_bytes), which
    are freed first so that the call makes its own."""
    from . import workspace
    torch.cuda.synchronize()
    workspace.release()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - base + workspace.kept_bytes()


def git_commit() -> str:
    if os.environ.get("FULLFUSE_COMMIT"):
        return os.environ["FULLFUSE_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file() or not (root / "csrc").is_dir():
        # an installed copy (site-packages): git would answer for whatever repository encloses it, if any
        return "unknown (installed package, not a source checkout; set FULLFUSE_COMMIT)"
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else "unknown"
    except Exception:
        return "unknown"


def result_stem(name: str) -> str:
    """A result file's name: the benchmark, then the commit, GPU, torch and CUDA versions it was measured with."""
    env = environment()
    gpu = (env.get("gpu") or "cpu").replace("NVIDIA", "").strip().split()[0]
    commit = str(env["commit"])[:7] + ("+dirty" if "dirty" in str(env["commit"]) else "")
    torch_version = ".".join(str(env["torch"]).split("+")[0].split(".")[:2])
    return f"{name}_{commit}_{gpu}_torch{torch_version}_cu{env['cuda']}"


def nvrtc_version():
    from cutlass_ops import nvrtc
    try:
        return "%d.%d" % nvrtc.version()
    except Exception:
        return None


def environment() -> Dict[str, object]:
    env = {
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nvrtc": nvrtc_version(),
        "python": platform.python_version(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   driver=_driver_version())
    try:
        from importlib.metadata import version

        env["cudnn_frontend"] = version("nvidia-cudnn-frontend")
    except Exception:
        env["cudnn_frontend"] = None
    return env


def _nvidia_smi(fields: str):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return out or None
    except Exception:
        return None


def _driver_version():
    return _nvidia_smi("driver_version")


def gpu_state() -> Dict[str, object]:
    """SM clock (MHz), power (W) and temperature (C) as nvidia-smi reads them now: recorded beside each timing, so
    a run's spread can be told apart from a slower kernel (an H200 under sustained tensor-core load may clock down)."""
    out = _nvidia_smi("clocks.sm,power.draw,temperature.gpu")
    if not out:
        return {}
    keys = ("sm_clock_mhz", "power_w", "temperature_c")
    state = {}
    for key, value in zip(keys, out.split(",")):
        try:
            state[key] = float(value)
        except ValueError:
            pass
    return state
