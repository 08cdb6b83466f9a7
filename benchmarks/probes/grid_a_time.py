"""Family A's fused kernel at shapes of benchmarks/general_a.py's GRID (indices given): GPU time per call (CUDA events,
L2 flushed, median of 30) and the accuracy against float64, TF32 and bf16, NCHW and channels_last, with the kernel that
served each; one line per cell.  An A/B of two source trees runs this in each, alternating processes, each tree with
its own FULLFUSE_CACHE_DIR (as benchmarks/probes/seed_a_time.py).

Usage (a CUDA GPU):  python3 benchmarks/probes/grid_a_time.py [label] [--ieee] --only I [I ...]
(--ieee: float32 at precision "ieee" alone, in place of TF32 and bf16)
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("FULLFUSE_POISON_OUTPUTS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fullfuse  # noqa: E402
from fullfuse.measure import errors, time_cuda  # noqa: E402
from fullfuse.ops import conv_act_pool  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from general_a import GRID  # noqa: E402


def reference(x, w, b, stride, padding):
    """GELU (erf) -> mean of the float64 conv, 8 images at a time."""
    return torch.cat([F.gelu(F.conv2d(x[i:i + 8].double(), w.double(), b.double(), stride, padding)).mean(dim=(2, 3))
                      for i in range(0, x.shape[0], 8)])


def main(label: str, indices, modes) -> None:
    for i in indices:
        (n, c, h, w_), (k, r, s, p), what = GRID[i]
        g = torch.Generator(device="cuda").manual_seed(1234 + i)
        x32 = torch.randn(n, c, h, w_, device="cuda", generator=g)
        w32 = torch.randn(k, c, r, r, device="cuda", generator=g) * (1.0 / (c * r * r) ** 0.5)
        b32 = torch.randn(k, device="cuda", generator=g) * 0.1
        for dtype, precision in modes:
            x, w, b = x32.to(dtype), w32.to(dtype), b32.to(dtype)
            ref = reference(x, w, b, s, p)
            for layout in ("NCHW", "channels_last"):
                xl = x.contiguous(memory_format=torch.channels_last) if layout != "NCHW" else x

                def call():
                    return conv_act_pool(xl, w, b, stride=s, padding=p, path="fused", precision=precision,
                                         keepdim=False)
                try:
                    err = errors(call(), ref)
                except fullfuse.UnsupportedError as exc:   # (the fused path refuses what its plan says is slower)
                    print(f"{label} [{i}] {str(dtype)[6:]:8s} {layout:13s} refused: {exc}", flush=True)
                    continue
                t = time_cuda(call, repeats=30)
                print(f"{label} [{i}] {str(dtype)[6:]:8s} {layout:13s} median {t['median_ms']:.4f} ms  "
                      f"relerr {err['relerr']:.1e}  ({what})", flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    ieee = "--ieee" in argv
    if ieee:
        argv.remove("--ieee")
    at = argv.index("--only")
    main(argv[0] if at > 0 else "this tree", [int(a) for a in argv[at + 1:]],
         ((torch.float32, "ieee"),) if ieee else ((torch.float32, "tf32"), (torch.bfloat16, "auto")))
