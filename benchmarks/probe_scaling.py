"""Probe (device): time vs problem size for family A (fused and fallback), N*H*W from 1/16x to 2x the seed size."""
import torch

import fullfuse
from fullfuse.measure import time_cuda
from fullfuse.seed_models import SeedA

model = SeedA().cuda().eval()
paths = {p: fullfuse.fused_model(model, path=p) for p in ("fused", "fallback")}
print(f"{'shape':22} {'x seed':>7} {'fused ms':>9} {'fallback ms':>12}")
for n, hw in ((8, 256), (16, 256), (32, 256), (64, 256), (128, 256), (256, 256), (128, 362)):
    x = torch.randn(n, 8, hw, hw, device="cuda")
    ratio = n * (hw - 2) ** 2 / (128 * 254 ** 2)
    with torch.no_grad():
        ms = {p: time_cuda(lambda: m(x), repeats=15)["median_ms"] for p, m in paths.items()}
    print(f"{str(tuple(x.shape)):22} {ratio:7.3f} {ms['fused']:9.3f} {ms['fallback']:12.3f}", flush=True)
