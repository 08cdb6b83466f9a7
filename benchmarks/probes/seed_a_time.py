"""Seed A (TF32, or bf16 with --bf16) through the fused kernel of the fullfuse on the path: GPU time per call (CUDA
events, L2 flushed, median of 40) and the accuracy against float64 in both layouts, with PyTorch's own eager result's
accuracy beside it; one JSON line.  An A/B of two source trees runs this script against each tree's package
(PYTHONPATH), alternating processes, each tree with its own FULLFUSE_CACHE_DIR.

Usage: python3 benchmarks/probes/seed_a_time.py [label] [--bf16]   (a CUDA GPU)
"""
import json
import os
import sys

os.environ.setdefault("FULLFUSE_POISON_OUTPUTS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fullfuse.measure import errors, time_cuda  # noqa: E402
from fullfuse.ops import conv_act_pool  # noqa: E402


def reference(x, w, b):
    """GELU (erf) -> mean of the float64 conv, 16 images at a time."""
    out = [F.gelu(F.conv2d(x[i:i + 16].double(), w.double(), b.double())).mean(dim=(2, 3))
           for i in range(0, x.shape[0], 16)]
    return torch.cat(out)


def main(label: str, dtype: torch.dtype) -> None:
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    g = torch.Generator(device="cuda").manual_seed(1234)
    x = torch.randn(128, 8, 256, 256, device="cuda", generator=g).to(dtype)
    w = (torch.randn(64, 8, 3, 3, device="cuda", generator=g) * (1.0 / 72 ** 0.5)).to(dtype)
    b = (torch.randn(64, device="cuda", generator=g) * 0.1).to(dtype)
    precision = "tf32" if dtype == torch.float32 else "auto"
    ref = reference(x, w, b)
    rows = []
    for layout in ("NCHW", "channels_last"):
        xl = x.contiguous(memory_format=torch.channels_last) if layout != "NCHW" else x

        def call():
            return conv_act_pool(xl, w, b, path="fused", precision=precision, keepdim=False)
        err = errors(call(), ref)
        eager = errors(F.gelu(F.conv2d(xl, w, b)).mean(dim=(2, 3)), ref)
        t = time_cuda(call, repeats=40)
        rows.append({"layout": layout, "median_ms": round(t["median_ms"], 4), "min_ms": round(t["min_ms"], 4),
                     "relerr": err["relerr"], "maxabs": err["maxabs"], "eager_relerr": eager["relerr"]})
    print(json.dumps({"tree": label, "dtype": str(dtype)[6:], "rows": rows}), flush=True)


if __name__ == "__main__":
    labels = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(labels[0] if labels else "", torch.bfloat16 if "--bf16" in sys.argv else torch.float32)
