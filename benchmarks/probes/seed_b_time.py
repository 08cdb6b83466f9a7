"""Seed B through this tree's fused path: per-call time of a call started on an idle GPU (CUDA events around the call,
median of 60; the seed is GPU-bound, so this is the kernels' time plus the launch latency), fp32 (TF32) and bf16,
NCDHW and channels_last_3d; one line per cell.  An A/B of two source trees runs this in each, alternating processes
(each tree with its own FULLFUSE_CACHE_DIR), as for fused B's in-kernel weight packing against the packing kernel
(`benchmarks/results/ab_fused_b_packing_*.txt`).  ``--in-kernel-packing``: the seed's grid (several waves) packs its
weights in the fused kernel's blocks as a one-wave grid does (the planner's packing kernel withheld), for an A/B of the
two within one tree.  ``--prepacked``: the packing kernel runs in the first call of each signature only, later calls
reuse what it packed (stale after a weight update: a floor for the per-call packing's cost, never a product path).
``--flush``: L2 flushed before each call (a 256 MB write), as `fullfuse bench` times end to end.
``--out-channels K``: the seed's model with K output channels (K < 64: the kernel's padded channels).
``--activation NAME``: the seed with an activation (relu, gelu_erf, gelu_tanh, silu) after its ConvTranspose3d.

Usage (a CUDA GPU):
    python3 benchmarks/probes/seed_b_time.py [label] [--in-kernel-packing | --prepacked] [--flush] [--out-channels K]
                                             [--activation NAME]
"""
import statistics
import sys

import torch
from torch import nn

import fullfuse
from fullfuse.seed_models import SEED_SHAPE, SeedB


ACTIVATIONS = {"relu": nn.ReLU, "gelu_erf": nn.GELU, "gelu_tanh": lambda: nn.GELU("tanh"), "silu": nn.SiLU}


class _Activated(SeedB):
    def __init__(self, activation: str, **kwargs):
        super().__init__(**kwargs)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x):
        return torch.sum(self.pool2(self.pool1(self.act(self.conv_transpose(x)))), dim=1, keepdim=True)


def main(label: str, flush: bool, out_channels: int, activation: str = None) -> None:
    torch.manual_seed(0)
    scratch = torch.empty(64 << 20, dtype=torch.float32, device="cuda") if flush else None
    for dtype in (torch.float32, torch.bfloat16):
        seed = SeedB(out_channels=out_channels) if activation is None else _Activated(activation,
                                                                                     out_channels=out_channels)
        model = seed.cuda().to(dtype).eval()
        fused = fullfuse.fused_model(model, path="fused", precision="tf32" if dtype == torch.float32 else "auto")
        for channels_last in (False, True):
            x = torch.randn(*SEED_SHAPE["B"], device="cuda", dtype=dtype)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last_3d)
            times = []
            with torch.no_grad():
                for _ in range(5):
                    fused(x)
                for _ in range(60):
                    if scratch is not None:
                        scratch.zero_()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fused(x)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
            layout = "channels_last" if channels_last else "NCDHW"
            print(f"{label} {str(dtype)[6:]:8s} {layout:13s} median {1e3 * statistics.median(times):7.1f} us",
                  flush=True)


class _PackOnce:
    """A packing kernel that launches in its first call only (--prepacked)."""

    def __init__(self, kernel):
        self.kernel, self.done = kernel, False

    def launch(self, *args):
        if not self.done:
            self.kernel.launch(*args)
            self.done = True


def _prepacked() -> None:
    from fullfuse.fused import convt_pool_reduce
    real = convt_pool_reduce.runtime.kernel

    def kernel(variant, index):
        found = real(variant, index)
        return _PackOnce(found) if variant == convt_pool_reduce.abi.PACK else found
    convt_pool_reduce.runtime.kernel = kernel


if __name__ == "__main__":
    argv = sys.argv[1:]
    k_out = 64
    if "--out-channels" in argv:
        at = argv.index("--out-channels")
        k_out = int(argv[at + 1])
        del argv[at:at + 2]
    act = None
    if "--activation" in argv:
        at = argv.index("--activation")
        act = argv[at + 1]
        del argv[at:at + 2]
    args = [a for a in argv if not a.startswith("--")]
    if "--in-kernel-packing" in sys.argv:
        from fullfuse.fused import convt_pool_reduce_plan
        convt_pool_reduce_plan.packing_grid = lambda g: None
    if "--prepacked" in sys.argv:
        _prepacked()
    main(args[0] if args else "this tree", "--flush" in sys.argv, k_out, act)
