"""Host time per call: the same call signature repeated, per path, at a tiny, a small and the seed shape of each
family, with one eager PyTorch op's cost beside it.

    python benchmarks/host_time.py [--out benchmarks/results]

Three figures per path (µs):
- ``<path>_host_us``: the host time of an isolated call: the call alone is timed, with the GPU idle when it starts
  (synchronised before, untimed), median of the calls.  Nothing waits for the GPU, so this is what a call costs the
  host: Python, allocations, the driver's enqueue of each kernel.  The paths and the eager op take turns call by
  call, so each call runs after other code (caches colder).
- ``<path>_repeated_host_us``: the same, with the call repeated and nothing else between its calls (the paths take
  turns in blocks of 20 calls: fullfuse.measure.repeated_host_us): a program calling one signature again and again.
- ``<path>_us``: the wall time per call of back-to-back calls, synchronised at the end, best of 5 rounds: host and GPU
  time together (whichever is longer sets it; the seed shapes are GPU-bound).
- ``eager_op_after_wait_host_us``: the eager op's isolated host time where, as for a repeated call of the fused path,
  the GPU has just been busy for as long as that call's GPU time (``wait_us``: a sleep kernel, synchronised, untimed).
  After a long wait every launch costs the host more (the seed rows: a repeated call follows a wait of 0.4-0.8 ms);
  this is the eager op's cost under the seed rows' conditions; the last row (``after_waits``) times seed A's tiny
  fused call, its eager model and the op after waits of 0-800 µs.
"auto" is what fused_model() runs by default (its first-call measurement done before timing); "auto ran" says which
path it kept.  ``eager_op``: one eager PyTorch op (F.gelu of 64 floats).  Per shape, the paths and the eager op take
turns call by call (fullfuse.measure.interleaved_host_us): their ratios hold on a shared host whose speed drifts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import fullfuse
from fullfuse.measure import environment, interleaved_host_us, repeated_host_us, result_stem
from fullfuse.seed_models import SEED_SHAPE, seed_model

SHAPES = {"A": [("tiny", (1, 8, 16, 16)), ("small", (4, 8, 64, 64)), ("seed", SEED_SHAPE["A"])],
          "B": [("tiny", (1, 32, 4, 4, 4)), ("small", (2, 32, 8, 8, 8)), ("seed", SEED_SHAPE["B"])]}


class _Squeezed(torch.nn.Module):
    """Seed A's output, given: its call squeezes it (what the seed's forward does after its region's ops)."""

    def __init__(self, pooled: torch.Tensor):
        super().__init__()
        self.pooled = pooled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pooled.squeeze()


def _sleep_cycles_per_us() -> float:
    """GPU clock cycles per µs of ``torch.cuda._sleep`` (timed with CUDA events once)."""
    cycles = 2_000_000
    torch.cuda._sleep(cycles)   # (warm)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


def _seconds_after_wait(fn, cycles: int) -> float:
    """Host time in s of one call of ``fn`` just after the host waited for ``cycles`` GPU clock cycles of a sleep kernel
    (launched and synchronised, untimed)."""
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def after_wait_host_us(fn, wait_us: float, cycles_per_us: float, calls: int) -> float:
    """Median host time in µs of ``fn`` called just after the host waited ``wait_us`` for the GPU."""
    fn()
    cycles = max(1, int(wait_us * cycles_per_us))
    times = [_seconds_after_wait(fn, cycles) for _ in range(calls)]
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


WAITS_US = (0, 25, 100, 400, 800)


def after_waits(cycles_per_us: float, calls: int) -> dict:
    """The same calls after GPU waits of each length of WAITS_US (the seed rows' repeated calls each follow a wait of
    their own GPU time): seed A's fused call, its eager model and the eager op at the tiny shape, taking turns call by
    call.  A longer wait that costs every call more is the host's, not the path's."""
    model = seed_model("A").cuda().eval()
    x = torch.randn(SHAPES["A"][0][1], device="cuda")
    one = torch.randn(64, device="cuda")
    fused = fullfuse.fused_model(model, path="fused")
    fns = {"fused": lambda: fused(x), "eager": lambda: model(x), "eager_op": lambda: torch.nn.functional.gelu(one)}
    row = {"family": "A", "size": "tiny after GPU waits", "shape": list(x.shape), "waits_us": list(WAITS_US)}
    for fn in fns.values():
        fn()
    times = {(name, wait): [] for name in fns for wait in WAITS_US}
    for _ in range(calls):   # (call by call: a drift of the shared host's speed hits every figure alike)
        for wait in WAITS_US:
            for name, fn in fns.items():
                times[name, wait].append(_seconds_after_wait(fn, max(1, int(wait * cycles_per_us))))
    torch.cuda.synchronize()
    for name in fns:
        row[f"{name}_after_wait_host_us"] = [1e6 * statistics.median(times[name, wait]) for wait in WAITS_US]
    return row


def untouched_rest(calls: int) -> dict:
    """What the untouched rest of a model costs once a region is fused: seed A's region followed by a classifier head
    (linear, relu, linear on its (64,) output) that matches nothing, at the tiny shape.  To time the rest alone, the
    region's own work is then replaced in both models by returning its output: the original's Sequential runs a
    module in seed A's place that only squeezes its output, then the head (the same modules); the fused model runs its
    traced graph (the region's call, which absorbed the squeeze, and the head nodes).  Isolated calls, the two models
    alternating (drift of the shared host hits both)."""
    region = seed_model("A").cuda().eval()
    model = torch.nn.Sequential(region, torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).cuda().eval()
    x = torch.randn(SHAPES["A"][0][1], device="cuda")
    fused_model = fullfuse.fused_model(model)
    row = {"family": "A", "size": "tiny + head", "shape": list(x.shape)}
    measured = interleaved_host_us({"eager": lambda: model(x), "auto": lambda: fused_model(x)}, calls)
    row["eager_host_us"], row["auto_host_us"] = measured["eager"][0], measured["auto"][0]
    row["auto_ran"] = fused_model.plans[0].last_path
    pooled = region.pool(region.act(region.conv(x)))
    squeezed = pooled.squeeze()
    model = torch.nn.Sequential(_Squeezed(pooled), *list(model)[1:])   # (the original itself stays as fused)
    fused_model.graph_module._modules["fullfuse_region_0"].forward = lambda *_args: squeezed
    assert torch.equal(model(x), fused_model(x))
    eager, fused = [], []
    for _ in range(calls):
        for fn, times in ((model, eager), (fused_model, fused)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    row["head_eager_host_us"] = 1e6 * statistics.median(eager)
    row["head_fused_host_us"] = 1e6 * statistics.median(fused)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    one = torch.randn(64, device="cuda")
    rows = []
    cycles_per_us = _sleep_cycles_per_us()
    with torch.inference_mode():
        for family, shapes in SHAPES.items():
            model = seed_model(family).cuda().eval()
            for size, shape in shapes:
                x = torch.randn(shape, device="cuda")
                calls = 20 if size == "seed" else 300
                row = {"family": family, "size": size, "shape": list(shape)}
                fns = {"eager_op": lambda: torch.nn.functional.gelu(one), "eager": lambda: model(x)}
                fused_models = {}
                for path in ("fused", "fallback", "auto"):
                    fused = fused_models[path] = fullfuse.fused_model(model, path=path)
                    try:
                        fused(x)   # auto: its first-call measurement, before any timing
                        fns[path] = lambda fused=fused: fused(x)
                    except fullfuse.UnsupportedError as exc:
                        row[f"{path}_why"] = str(exc)[:120]
                # the paths take turns call by call: a drift of the shared host's speed hits them all alike
                for name, (iso, b2b) in interleaved_host_us(fns, calls).items():
                    row[f"{name}_host_us"], row[f"{name}_us"] = iso, b2b
                for name, iso in repeated_host_us(fns, calls).items():
                    row[f"{name}_repeated_host_us"] = iso
                row["auto_ran"] = fused_models["auto"].plans[0].last_path
                if "fused_us" in row:
                    row["wait_us"] = row["fused_us"]
                    row["eager_op_after_wait_host_us"] = after_wait_host_us(fns["eager_op"], row["wait_us"],
                                                                            cycles_per_us, calls)
                rows.append(row)
                print(" ".join(f"{k}={round(v, 1) if isinstance(v, float) else v}" for k, v in row.items()),
                      flush=True)
        rows.append(untouched_rest(calls=2000))
        print(rows[-1], flush=True)
        rows.append(after_waits(cycles_per_us, calls=200))
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result_stem('host_time')}.json"
    path.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
