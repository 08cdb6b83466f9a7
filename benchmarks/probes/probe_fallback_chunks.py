"""Probe (device): fallback A and B at the seed shapes for several batch-chunk sizes, with and without the
two-stream overlap (fullfuse.fallback.pipeline).  Small chunks keep the conv output in L2 between the conv and
the epilogue; large chunks keep cuDNN efficient."""
import torch

import fullfuse
from fullfuse.fallback import pipeline
from fullfuse.measure import time_cuda
from fullfuse.seed_models import SEED_SHAPE, SeedA, SeedB

for family, model in (("A", SeedA()), ("B", SeedB())):
    model = model.cuda().eval()
    fused = fullfuse.fused_model(model, path="fallback")
    for fmt in ("contiguous", "channels_last"):
        x = torch.randn(SEED_SHAPE[family], device="cuda")
        if fmt == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last if family == "A" else torch.channels_last_3d)
        with torch.no_grad():
            for mb in (24, 48, 96, 256, 1 << 16):
                for overlap in (False, True):
                    pipeline.AUTOTUNE, pipeline.CHUNK_BYTES, pipeline.OVERLAP = False, mb << 20, overlap
                    ms = time_cuda(lambda: fused(x), repeats=15)["median_ms"]
                    print(f"{family} {fmt:13} chunk {mb:6d} MB overlap={overlap!s:5}: {ms:.3f} ms", flush=True)
            pipeline.AUTOTUNE = True
            ms = time_cuda(lambda: fused(x), repeats=15)["median_ms"]
            print(f"{family} {fmt:13} autotuned: {ms:.3f} ms; chosen {pipeline.describe()[-1][1:]}", flush=True)
