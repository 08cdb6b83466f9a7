"""Probe (device): the fused family-A kernel's fixed cost per call (launch, per-block setup, pipeline fill, flush) —
kernel-only time vs the number of images N at 256x256, channels_last, deterministic mean (no memset): the slope is
the cost per image, the intercept the fixed part.  FF_FUSED_A_SO = the library (as probe_fused_a.py); timed with
fullfuse.measure.time_cuda (the benchmark's L2 flush, host lead, warm-up and median).

    PYTHONPATH=. python3 benchmarks/probe_fixed_a.py
"""
import torch

from fullfuse.measure import environment, time_cuda
from probe_fused_a import ACTS, DT, Case, load_lib, make_inputs, prep, run_kernel

lib = load_lib()
print("# environment:", environment())
print("mode  N    median ms   (deterministic mean, GELU erf, channels_last, median of 30, L2 flushed)")
for label, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16)):
    pts = []
    for n in (1, 2, 4, 8, 32, 128):
        c = Case("fixed", n, 8, 256, 256, 64, 3, 3)
        x, w, b = make_inputs(c, 3)
        _, xin, wd = prep(x, w, dtype, 1)
        a = c.args(DT[dtype], 1, ACTS["gelu_erf"], 0, 0, 1)   # channels_last, mean, precision 0 (tf32), deterministic
        ws = torch.zeros(max(lib.ff_fused_conv_act_pool_workspace_bytes(*a), 16), dtype=torch.uint8, device="cuda")
        out = torch.empty(n, 64, device="cuda")
        ms = time_cuda(lambda: run_kernel(lib, c, xin, wd, b, dtype, 1, "gelu_erf", 0, 0, 1, out, ws))["median_ms"]
        pts.append((n, ms))
        print(f"{label:5s} {n:4d} {ms:10.4f}", flush=True)
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    slope = (t1 - t0) / (n1 - n0)
    print(f"{label}: {slope * 1e3:.2f} us per image (N 32 -> 128), intercept {t1 - slope * n1:.4f} ms", flush=True)
