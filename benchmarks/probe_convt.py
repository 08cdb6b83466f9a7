"""Probe (device): how fast can the convolutions of the seeds run through cuDNN?  A: PyTorch's conv2d in both layouts,
with and without cudnn.benchmark (TF32).  B: the transposed conv likewise, against the cuDNN frontend's best plan
(fullfuse.fallback.cudnn_dgrad)."""
import torch
import torch.nn.functional as F

from fullfuse.fallback import cudnn_dgrad
from fullfuse.measure import time_cuda
from fullfuse.precision import cudnn_conv_precision
from fullfuse.spec import ConvTPoolReduceSpec

x = torch.randn(128, 8, 256, 256, device="cuda")
w = torch.randn(64, 8, 3, 3, device="cuda") * 0.1
with cudnn_conv_precision("tf32"):
    for layout, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        xi, wi = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            ms = time_cuda(lambda: F.conv2d(xi, wi), repeats=10, warmup=2)["median_ms"]
            print(f"A tf32 conv2d {layout} benchmark={bench}: {ms:.3f} ms", flush=True)
    ms = time_cuda(lambda: x.contiguous(memory_format=torch.channels_last), repeats=10)["median_ms"]
    print(f"A NCHW -> channels_last copy of x: {ms:.3f} ms", flush=True)
torch.backends.cudnn.benchmark = False
del x, w

spec = ConvTPoolReduceSpec(3, 32, 64, (5,) * 3, (2,) * 3, (2,) * 3, (0,) * 3, (1,) * 3, True, (6,) * 3)
for dtype, mode in ((torch.float32, "tf32"), (torch.float32, "ieee"), (torch.bfloat16, "bfloat16")):
    x = torch.randn(16, 32, 32, 32, 32, device="cuda", dtype=dtype)
    w = torch.randn(32, 64, 5, 5, 5, device="cuda", dtype=dtype) * 0.02
    xc, wc = x.contiguous(memory_format=torch.channels_last_3d), w.contiguous(memory_format=torch.channels_last_3d)
    rows = []
    with cudnn_conv_precision(mode):
        for layout, (xi, wi) in (("ncdhw", (x, w)), ("ndhwc", (xc, wc))):
            for bench in (False, True):
                if mode == "ieee" and not bench:
                    continue  # 40 ms+ plans: skip the slowest combination
                torch.backends.cudnn.benchmark = bench
                fn = lambda: F.conv_transpose3d(xi, wi, None, 2, 2)  # noqa: E731
                rows.append((f"torch {layout} benchmark={bench}", time_cuda(fn, repeats=10, warmup=2)["median_ms"]))
        torch.backends.cudnn.benchmark = False
        try:
            y = cudnn_dgrad.conv_transpose(spec, xc, wc, mode)
            if y is None:
                rows.append(("cudnn frontend", float("nan")))
            else:
                ref = F.conv_transpose3d(xc, wc, None, 2, 2)
                rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                fn = lambda: cudnn_dgrad.conv_transpose(spec, xc, wc, mode)  # noqa: E731
                rows.append((f"cudnn frontend best plan (relerr vs torch {rel:.1e})", time_cuda(fn, repeats=10)["median_ms"]))
        except Exception as exc:
            rows.append((f"cudnn frontend error {exc}", float("nan")))
    for name, ms in rows:
        print(f"{mode:9} {name:60} {ms:8.3f} ms", flush=True)
print("frontend plans:", [(k[4], k[-1], i, round(ms, 3), n) for k, i, ms, n in cudnn_dgrad.describe()])
