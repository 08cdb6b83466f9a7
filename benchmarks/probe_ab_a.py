"""Probe (device): two or more builds of the fused family-A library timed side by side in one process, their calls
interleaved rep by rep (each after an L2 flush), so that clock and machine drift between processes cancels — the A/B
comparison for kernel changes whose effect is a few percent.

    FF_AB_LIBS="old=/path/libfused_conv_act_pool.so,new=/path/..." PYTHONPATH=. python3 benchmarks/probe_ab_a.py
Libraries built before commit 0841f20 take the C API without its five Conv3d depth arguments: compare against them with
the probes of their own commit.
Env: FF_AB_REPS (default 40); FF_PROBE_MODES / FF_PROBE_LAYOUTS as probe_fused_a.py.  Cases: the seed (atomic mean,
GELU erf) per mode and layout, and N = 1 and 128 in the deterministic mode (the default of fused_model), channels_last.
"""
import os

import torch

from fullfuse.measure import environment
from probe_fused_a import load_lib, layouts, modes, seed_call, seed_case

libs = [(item.split("=", 1)[0], load_lib(item.split("=", 1)[1])) for item in os.environ["FF_AB_LIBS"].split(",")]
reps = int(os.environ.get("FF_AB_REPS", "40"))
flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
print("# environment:", environment())
print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; median ms of {reps} interleaved reps, L2 flushed")
cases = [(lbl, dt, prec, cl, 128, 0) for lbl, dt, prec in modes() for cl in layouts()]
cases += [(lbl, dt, prec, 1, n, 1) for lbl, dt, prec in modes() if lbl in ("tf32", "bf16") for n in (1, 128)]
for label, dtype, prec, cl, n, det in cases:
    case = seed_case(n, dtype, cl, 5)   # one input for every library
    calls = []
    for name, lib in libs:
        call = seed_call(lib, case, dtype, cl, prec, det)
        for _ in range(3):
            call()
        calls.append((name, call))
    ts = {name: [] for name, _ in calls}
    for _ in range(reps):
        for name, call in calls:
            flush.fill_(1.0)
            torch.cuda._sleep(1_000_000)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); call(); e1.record(); e1.synchronize()
            ts[name].append(e0.elapsed_time(e1))
    med = {k: sorted(v)[len(v) // 2] for k, v in ts.items()}
    base = med[calls[0][0]]
    row = "  ".join(f"{k} {v:.4f} ({(v / base - 1) * 100:+.1f} %)" for k, v in med.items())
    print(f"{label:5s} N={n:<3d} cl={cl} det={det}: {row}", flush=True)
