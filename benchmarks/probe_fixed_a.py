"""Probe (device): the fused family-A kernel's fixed cost per call (launch, per-block setup, pipeline fill, flush) —
kernel-only time vs the number of images N at 256x256, channels_last, deterministic mean (no memset): the slope is
the cost per image, the intercept the fixed part.  FF_FUSED_A_SO = the library (as probe_fused_a.py).

    python3 benchmarks/probe_fixed_a.py
"""
import torch

from probe_fused_a import DT, ACTS, Case, load_lib, make_inputs, prep

lib = load_lib()
flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
print("mode  N    median ms   (deterministic mean, GELU erf, channels_last, median of 30, L2 flushed)")
for label, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16)):
    pts = []
    for n in (1, 2, 4, 8, 32, 128):
        c = Case("fixed", n, 8, 256, 256, 64, 3, 3)
        x, w, b = make_inputs(c, 3)
        _, xin, wd = prep(x, w, dtype, 1)
        a = c.args(DT[dtype], 1, ACTS["gelu_erf"], 0, 0, 1)   # precision 0 = tf32 for fp32 input
        ws = torch.zeros(max(lib.ff_fused_conv_act_pool_workspace_bytes(*a), 16), dtype=torch.uint8, device="cuda")
        out = torch.empty(n, 64, device="cuda")
        call = lambda: lib.ff_fused_conv_act_pool(xin.data_ptr(), wd.data_ptr(), b.data_ptr(), out.data_ptr(), *a,
                                                  ws.data_ptr(), torch.cuda.current_stream().cuda_stream)
        for _ in range(5):
            call()
        ts = []
        for _ in range(30):
            flush.fill_(1.0)
            torch.cuda._sleep(1_000_000)   # the launch is queued before the start event fires
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); call(); e1.record(); e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        ts.sort()
        pts.append((n, ts[len(ts) // 2]))
        print(f"{label:5s} {n:4d} {pts[-1][1]:10.4f}", flush=True)
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    slope = (t1 - t0) / (n1 - n0)
    print(f"{label}: {slope * 1e3:.2f} us per image (N 32 -> 128), intercept {t1 - slope * n1:.4f} ms", flush=True)
