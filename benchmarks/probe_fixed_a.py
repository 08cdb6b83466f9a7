"""Probe (device): the fused family-A kernel's fixed cost per call (launch, per-block setup, pipeline fill, flush) —
kernel-only time vs the number of images N at 256x256, channels_last, deterministic mean (no memset): the slope is
the cost per image, the intercept the fixed part.  FF_FUSED_A_SO = the library (as probe_fused_a.py); timed with
fullfuse.measure.time_cuda (the benchmark's L2 flush, host lead, warm-up and median).

Three columns split the intercept: "flushed" (the benchmark's conditions), "unflushed" (no L2 flush: data and kernel
code may still sit in L2 from the previous run), "code warm" (flushed, then one untimed call on a different N = 1 input
before the lead: the kernel's code is back in L2, the timed call's data is not).
FF_FIXED_NCU=1: only launch each case twice (for `ncu --metrics gpu__time_duration.sum`, which times the kernel alone).

    PYTHONPATH=. python3 benchmarks/probe_fixed_a.py
"""
import os

import torch

from fullfuse.measure import environment, time_cuda
from probe_fused_a import load_lib, seed_call, seed_case

lib = load_lib()
NCU = os.environ.get("FF_FIXED_NCU") == "1"


def setup(n, dtype, seed):   # channels_last, precision 0 (tf32), deterministic mean
    return seed_call(lib, seed_case(n, dtype, 1, seed), dtype, 1, 0, 1)


print("# environment:", environment())
if not NCU:
    print("mode  N    flushed  unflushed  code warm   (ms; deterministic mean, GELU erf, channels_last, median of 30)")
for label, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16)):
    warm = setup(1, dtype, 7)   # another input: re-loads the code, not the timed call's data
    pts = []
    for n in (1, 2, 4, 8, 32, 128):
        call = setup(n, dtype, 3)
        if NCU:
            call(); call(); torch.cuda.synchronize()
            continue
        t = [time_cuda(call)["median_ms"], time_cuda(call, flush_l2=False)["median_ms"],
             time_cuda(call, prepare=warm)["median_ms"]]
        pts.append((n, t))
        print(f"{label:5s} {n:4d} " + " ".join(f"{v:9.4f}" for v in t), flush=True)
    if NCU:
        continue
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    for i, col in enumerate(("flushed", "unflushed", "code warm")):
        slope = (t1[i] - t0[i]) / (n1 - n0)
        print(f"{label} {col}: {slope * 1e3:.2f} us per image (N 32 -> 128), intercept {t1[i] - slope * n1:.4f} ms",
              flush=True)
