"""Diagnostic: the seed-A bench's ieee NCHW fused call (SeedA weights, torch.randn input, seed 0) timed like the bench,
and the same model on profile_fused_a.py's data; run once per knob setting (FF_FUSED_A_NOCLAMP)."""
import os
import torch
import fullfuse
from fullfuse.measure import time_cuda
from fullfuse.precision import cudnn_conv_precision
from fullfuse.seed_models import SeedA

torch.manual_seed(0)
model = SeedA().cuda().eval()
x = torch.randn(128, 8, 256, 256, device="cuda")
g = torch.Generator(device="cuda").manual_seed(0)
x2 = torch.randn(128, 8, 256, 256, device="cuda", generator=g)
for prec in ("ieee", "tf32"):
    fused = fullfuse.fused_model(model, path="fused", precision=prec)
    with torch.no_grad(), cudnn_conv_precision(prec):
        for name, inp in (("bench x", x), ("profile x", x2), ("bench x cl", x.contiguous(memory_format=torch.channels_last))):
            t = time_cuda(lambda: fused(inp), repeats=30)
            print(f"NOCLAMP={os.environ.get('FF_FUSED_A_NOCLAMP', '1')} {prec} {name:10s}: median {t['median_ms']:.4f} min {t['min_ms']:.4f}", flush=True)
print("weights max", model.conv.weight.abs().max().item(), "bias max", model.conv.bias.abs().max().item())
