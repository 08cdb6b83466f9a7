"""Probe (device): how fast can the transposed conv of seed B run?  PyTorch's call, sub-pixel forward convs, and the cuDNN frontend's best plan
(fullfuse.fallback.cudnn_dgrad)."""
import os
import traceback

import torch
import torch.nn.functional as F

from fullfuse.fallback import cudnn_dgrad, subpixel
from fullfuse.measure import time_cuda
from fullfuse.precision import cudnn_conv_precision
from fullfuse.spec import ConvTPoolReduceSpec

spec = ConvTPoolReduceSpec(3, 32, 64, (5,) * 3, (2,) * 3, (2,) * 3, (0,) * 3, (1,) * 3, True, (6,) * 3)
for dtype, mode in ((torch.float32, "tf32"), (torch.float32, "ieee"), (torch.bfloat16, "bfloat16")):
    x = torch.randn(16, 32, 32, 32, 32, device="cuda", dtype=dtype)
    w = torch.randn(32, 64, 5, 5, 5, device="cuda", dtype=dtype) * 0.02
    xc, wc = x.contiguous(memory_format=torch.channels_last_3d), w.contiguous(memory_format=torch.channels_last_3d)
    rows = []
    with cudnn_conv_precision(mode):
        # (run 1: torch's call took 40-42 ms in fp32 whatever the layout and cudnn.benchmark; bf16 NDHWC 0.68 ms)
        fn = lambda: F.conv_transpose3d(xc, wc, None, 2, 2)  # noqa: E731
        rows.append(("torch ndhwc", time_cuda(fn, repeats=5, warmup=1)["median_ms"]))
        ref = F.conv_transpose3d(xc, wc, None, 2, 2)
        fn = lambda: subpixel.conv_transpose(xc, wc, (2, 2, 2), (2, 2, 2), (0, 0, 0))  # noqa: E731
        rel = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
        rows.append((f"sub-pixel conv3d x8 (relerr vs torch {rel:.1e})", time_cuda(fn, repeats=10)["median_ms"]))
        if dtype == torch.float32 and mode == "tf32":
            try:  # the frontend's own error, with its traceback
                cudnn_dgrad._build(cudnn_dgrad.frontend(), spec, xc, wc, tuple(ref.shape), mode, True)
            except Exception:
                traceback.print_exc()
        try:
            y = cudnn_dgrad.conv_transpose(spec, xc, wc, mode)
            if y is None:
                rows.append(("cudnn frontend", float("nan")))
            else:
                rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                fn = lambda: cudnn_dgrad.conv_transpose(spec, xc, wc, mode)  # noqa: E731
                rows.append((f"cudnn frontend best plan (relerr vs torch {rel:.1e})", time_cuda(fn, repeats=10)["median_ms"]))
        except Exception as exc:
            rows.append((f"cudnn frontend error {exc}", float("nan")))
    for name, ms in rows:
        print(f"{mode:9} {name:60} {ms:8.3f} ms", flush=True)
print("frontend last message:", cudnn_dgrad.last_error)
print("frontend plans:", [(k[4], k[-1], i, round(ms, 3), n) for k, i, ms, n in cudnn_dgrad.describe()])
