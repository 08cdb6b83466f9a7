"""Seed problem A through the product path, for profiling: `python3 benchmarks/profile_fused_a.py ncu` runs the fused
kernel a few times (NHWC then NCHW, TF32) for `ncu -k regex:fa_wgmma`; `... time [tf32|ieee|bf16|fp16]` times the
product call per
launch (CUDA events, L2 flushed) against the same call replayed from a CUDA graph, which splits host time from GPU
time."""
from __future__ import annotations

import sys

import torch

from fullfuse.measure import time_cuda
from fullfuse.ops import conv_act_pool


PRECISION = sys.argv[2] if len(sys.argv) > 2 else "tf32"   # or bf16 / fp16: the inputs in that dtype
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION, torch.float32)


def seed_inputs(channels_last: bool):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(128, 8, 256, 256, device="cuda", generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 8, 3, 3, device="cuda", generator=g) * 0.1
    b = torch.randn(64, device="cuda", generator=g) * 0.1
    return x.to(DTYPE), w.to(DTYPE), b


def call(x, w, b):
    return conv_act_pool(x, w, b, path="fused", precision=PRECISION if DTYPE == torch.float32 else "auto")


def main(mode: str):
    for cl in (True, False):
        x, w, b = seed_inputs(cl)
        for _ in range(3 if mode == "ncu" else 10):
            call(x, w, b)
        torch.cuda.synchronize()
        if mode != "time":
            continue
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call(x, w, b)
            with torch.cuda.graph(graph, stream=s):
                call(x, w, b)
        torch.cuda.current_stream().wait_stream(s)
        for name, fn in (("eager call", lambda: call(x, w, b)), ("graph replay", graph.replay)):
            t = time_cuda(fn, repeats=40)
            print(f"{PRECISION} {'NHWC' if cl else 'NCHW'} {name:12s}: median {t['median_ms']:.4f} ms  "
                  f"min {t['min_ms']:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "time")
