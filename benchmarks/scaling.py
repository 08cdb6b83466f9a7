"""Probe (device): time vs problem size (fused and fallback paths through fused_model), and at the seed the fused
path's eager call beside its CUDA-graph replay (the gap is host time the GPU waits for).

    python3 benchmarks/probe_scaling.py [A|B]      A: N*H*W from 1/16x to 2x the seed; B: N*D*H*W from 1/8x to 2x
"""
import sys

import torch

import fullfuse
from fullfuse.measure import time_cuda
from fullfuse.seed_models import seed_model

FAMILY = sys.argv[1] if len(sys.argv) > 1 else "A"
if FAMILY == "A":
    SHAPES = [(n, 8, hw, hw)
              for n, hw in ((8, 256), (16, 256), (32, 256), (64, 256), (128, 256), (256, 256), (128, 362))]
    SEED = (128, 8, 256, 256)
    work = lambda s: s[0] * (s[2] - 2) * (s[3] - 2)            # conv output positions per channel
else:
    SHAPES = [(2, 32, 32, 32, 32), (4, 32, 32, 32, 32), (8, 32, 32, 32, 32), (16, 32, 32, 32, 32), (16, 32, 32, 32, 48),
              (32, 32, 32, 32, 32)]
    SEED = (16, 32, 32, 32, 32)
    work = lambda s: s[0] * s[2] * s[3] * s[4]                 # input positions per channel

model = seed_model(FAMILY).cuda().eval()
paths = {p: fullfuse.fused_model(model, path=p) for p in ("fused", "fallback")}
print(f"family {FAMILY}\n{'shape':26} {'x seed':>7} {'fused ms':>9} {'fallback ms':>12}")
for shape in SHAPES:
    x = torch.randn(shape, device="cuda")
    with torch.no_grad():
        ms = {p: time_cuda(lambda: m(x), repeats=15)["median_ms"] for p, m in paths.items()}
    print(f"{str(shape):26} {work(shape) / work(SEED):7.3f} {ms['fused']:9.3f} {ms['fallback']:12.3f}", flush=True)

# seed: the fused path's eager call vs the same call replayed from a CUDA graph (both L2-flushed, median)
x = torch.randn(SEED, device="cuda")
m = paths["fused"]
with torch.no_grad():
    for layout, xin in (("contiguous", x),
                        ("channels_last", x.contiguous(memory_format=torch.channels_last if FAMILY == "A"
                                                       else torch.channels_last_3d))):
        eager = time_cuda(lambda: m(xin), repeats=20)["median_ms"]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(xin)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            m(xin)
        replay = time_cuda(graph.replay, repeats=20)["median_ms"]
        print(f"seed {layout}: fused eager {eager:.3f} ms, CUDA-graph replay {replay:.3f} ms", flush=True)
