"""Probe (device): how fast can the transposed conv of seed B run?  PyTorch's call, sub-pixel forward convs, and the
cuDNN frontend's best plan
(fullfuse.fallback.cudnn_conv)."""
import torch
import torch.nn.functional as F

from fullfuse.fallback import cudnn_conv, subpixel
from fullfuse.measure import time_cuda
from fullfuse.precision import cudnn_conv_precision
from fullfuse.spec import ConvTPoolReduceSpec

spec = ConvTPoolReduceSpec(3, 32, 64, (5,) * 3, (2,) * 3, (2,) * 3, (0,) * 3, (1,) * 3, True, (6,) * 3)


def frontend_dgrad(xc, wc, mode):
    """The frontend's best plan for the transposed conv (cudnn_conv.run, no PyTorch call to compare with)."""
    out_shape = (xc.shape[0], wc.shape[1], *spec.conv_output_spatial(tuple(xc.shape[2:])))
    return cudnn_conv.run("dgrad", xc, wc, out_shape, spec.padding, spec.stride, spec.dilation, mode, True)


for dtype, mode in ((torch.float32, "tf32"), (torch.float32, "ieee"), (torch.bfloat16, "bfloat16")):
    x = torch.randn(16, 32, 32, 32, 32, device="cuda", dtype=dtype)
    w = torch.randn(32, 64, 5, 5, 5, device="cuda", dtype=dtype) * 0.02
    xc, wc = x.contiguous(memory_format=torch.channels_last_3d), w.contiguous(memory_format=torch.channels_last_3d)
    rows = []
    with cudnn_conv_precision(mode):
        # (measured: torch's call took 40-42 ms in fp32 whatever the layout and cudnn.benchmark; bf16 NDHWC 0.68 ms)
        fn = lambda: F.conv_transpose3d(xc, wc, None, 2, 2)  # noqa: E731
        rows.append(("torch ndhwc", time_cuda(fn, repeats=5, warmup=1)["median_ms"]))
        ref = F.conv_transpose3d(xc, wc, None, 2, 2)
        fn = lambda: subpixel.conv_transpose(xc, wc, (2, 2, 2), (2, 2, 2), (0, 0, 0))  # noqa: E731
        rel = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
        rows.append((f"sub-pixel conv3d x8 (relerr vs torch {rel:.1e})", time_cuda(fn, repeats=10)["median_ms"]))
        try:
            y = frontend_dgrad(xc, wc, mode)
            if y is None:
                rows.append(("cudnn frontend", float("nan")))
            else:
                rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                fn = lambda: frontend_dgrad(xc, wc, mode)  # noqa: E731
                rows.append((f"cudnn frontend best plan (relerr vs torch {rel:.1e})",
                             time_cuda(fn, repeats=10)["median_ms"]))
        except Exception as exc:
            rows.append((f"cudnn frontend error {exc}", float("nan")))
    for name, ms in rows:
        print(f"{mode:9} {name:60} {ms:8.3f} ms", flush=True)
print("frontend last message:", cudnn_conv.last_error)
print("frontend plans:", [(k[4], k[-1], i, round(ms, 3), n) for k, i, ms, n in cudnn_conv.describe()])

# Family A's conv through the frontend: channels_last input, and the NCHW input as it is (NHWC output).
from fullfuse.spec import ConvActPoolSpec  # noqa: E402

spec_a = ConvActPoolSpec(2, 8, 64, (3, 3), (1, 1), (0, 0), (1, 1), True)
x = torch.randn(128, 8, 256, 256, device="cuda")
w = (torch.randn(64, 8, 3, 3, device="cuda") * 0.1).contiguous(memory_format=torch.channels_last)
for mode in ("tf32", "ieee"):
    for name, xi in (("nchw input", x), ("nhwc input", x.contiguous(memory_format=torch.channels_last))):
        fprop = lambda: cudnn_conv.run("fprop", xi, w, (128, 64, 254, 254), (0, 0), (1, 1), (1, 1), mode,  # noqa: E731
                                       True)
        y = fprop()
        if y is None:
            print(f"A {mode} frontend fprop {name}: no plan ({cudnn_conv.last_error})", flush=True)
            continue
        ms = time_cuda(fprop, repeats=10)["median_ms"]
        with cudnn_conv_precision(mode):
            torch_ms = time_cuda(lambda: F.conv2d(xi, w), repeats=10)["median_ms"]
        print(f"A {mode} frontend fprop {name}: {ms:.3f} ms (torch's call {torch_ms:.3f} ms)", flush=True)
