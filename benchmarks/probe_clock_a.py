"""Does the fused family-A kernel run at full SM clock?  Samples nvidia-smi (SM clock, power, clock-event reasons)
every 20 ms while the seed kernel runs back to back for ~1.5 s per mode, and once more under the benchmark's duty
cycle (256 MB L2 flush + 500 us spin before each call, as fullfuse.measure does).  Question: is the kernel's time
set by power (clock drops when the tensor cores and the GELU epilogue are both busy) or by issue / latency?

Env: FF_FUSED_A_SO (as probe_fused_a.py; else compiled into /tmp).  Output: a table on stdout, JSON to $OUT.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_fused_a import Case, load_lib, make_inputs, prep, run_kernel  # noqa: E402

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu"


def sample_during(fn, seconds):
    """Run fn() repeatedly for `seconds` while nvidia-smi samples; returns (calls, gpu ms per call, samples)."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "20"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)                         # nvidia-smi's first sample is at start-up, before the load
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.time()
    e0.record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            fn()
        n += 20
        torch.cuda.synchronize()
    e1.record()
    torch.cuda.synchronize()
    time.sleep(0.05)
    smi.terminate()
    lines = smi.communicate()[0].strip().splitlines()
    rows = []
    for ln in lines[15:]:                   # drop the samples of the first 0.3 s (idle)
        f = [v.strip() for v in ln.split(",")]
        try:
            rows.append(dict(mhz=float(f[0]), watt=float(f[1]), reasons=f[2], temp=float(f[3])))
        except (ValueError, IndexError):
            pass
    return n, e0.elapsed_time(e1) / n, rows


def summary(rows):
    if not rows:
        return dict(samples=0)
    mhz = [r["mhz"] for r in rows]
    w = [r["watt"] for r in rows]
    reasons = sorted({r["reasons"] for r in rows})
    return dict(samples=len(rows), mhz_median=statistics.median(mhz), mhz_min=min(mhz), watt_median=statistics.median(w),
                watt_max=max(w), reasons=reasons, temp_max=max(r["temp"] for r in rows))


def main():
    lib = load_lib()
    c = Case("seed", 128, 8, 256, 256, 64, 3, 3)
    x, w, b = make_inputs(c, 1)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    results = []
    for label, dtype, prec in (("tf32", torch.float32, 0), ("bf16", torch.bfloat16, 0), ("ieee", torch.float32, 1)):
        _, xin, wd = prep(x, w, dtype, 1)
        out = torch.zeros(c.N, c.K, device="cuda")
        ws = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        for act in ("gelu_erf", "none"):
            def call():
                run_kernel(lib, c, xin, wd, b, dtype, 1, act, 0, prec, 0, out=out, ws=ws)
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            n, ms, rows = sample_during(call, 1.5)
            s = summary(rows)
            results.append(dict(mode=label, act=act, duty="back-to-back", calls=n, ms_per_call=ms, **s))
            print(f"{label:5s} {act:9s} back-to-back: {ms:.3f} ms/call, SM {s.get('mhz_median')} MHz (min {s.get('mhz_min')}),"
                  f" {s.get('watt_median')} W (max {s.get('watt_max')}), reasons {s.get('reasons')}", flush=True)
            if act == "gelu_erf":
                def duty():
                    flush.zero_()
                    torch.cuda._sleep(int(500e-6 * 1.98e9))
                    call()
                n, ms, rows = sample_during(duty, 1.5)
                s = summary(rows)
                results.append(dict(mode=label, act=act, duty="bench (flush + 500 us spin + call)", calls=n, ms_per_call=ms, **s))
                print(f"{label:5s} {act:9s} bench duty  : {ms:.3f} ms/period, SM {s.get('mhz_median')} MHz (min {s.get('mhz_min')}),"
                      f" {s.get('watt_median')} W (max {s.get('watt_max')}), reasons {s.get('reasons')}", flush=True)
    outdir = os.environ.get("OUT")
    if outdir:
        Path(outdir, "probe_clock_a.json").write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                                                       commit=os.environ.get("FULLFUSE_COMMIT", "?"),
                                                                       results=results), indent=1))


if __name__ == "__main__":
    main()
