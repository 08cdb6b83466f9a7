"""Host time of a fused and a fallback call on a machine without a GPU: ``fused_model(x)`` of each family's seed at a
tiny shape, the real per-call path from the fused model down to cuda-bindings' cuLaunchKernel, into a stub CUDA driver
(a shared library compiled here whose entry points return success).  The device's properties, its current stream, the
kept buffers and the tensor maps are stand-ins; the input stays on the CPU.  A fallback call's conv is PyTorch's cuDNN
op called directly (as the cuDNN frontend's timing picks at these shapes on an H200), stood in by a function that
returns a conv output made once: its own host time (28-48 us on the GPU machine) is not in the figure.  What it
measures is the Python host time that the GPU machine adds to the driver's and cuDNN's own costs, comparable between
two checkouts on one machine.

    python benchmarks/probes/host_time_stub_driver.py [--against OTHER_CHECKOUT] [--rounds 4]

Needs a C compiler and cuda-bindings.  With --against, the two trees run in alternating processes, ``rounds`` each.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import timeit

_STUB_DRIVER = r"""
#include <dlfcn.h>
typedef int CUresult;
CUresult cuInit(unsigned f) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *stream, void **params, void **extra) { return 0; }
CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) { return 0; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x1234; return 0; }
CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, int *status) {
    *fn = dlsym(RTLD_DEFAULT, symbol);
    if (status) *status = *fn ? 0 : 1;
    return *fn ? 0 : 500;
}
"""
SHAPES = {"A": (1, 8, 16, 16), "B": (1, 32, 4, 4, 4)}


def _stub_driver_dir() -> str:
    out = tempfile.mkdtemp(prefix="fullfuse-stub-driver-")
    source = os.path.join(out, "stub_driver.c")
    with open(source, "w") as f:
        f.write(_STUB_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", os.path.join(out, "libcuda.so.1"), source, "-ldl"],
                   check=True)
    return out


def _stand_ins() -> None:
    """The GPU-side objects the per-call path reads, faked (an H200's properties, device 0, stream 0)."""
    import ctypes

    import cuda.bindings.driver as drv

    from fullfuse import launch, runtime, workspace

    def kernel(variant, device):
        k = runtime.Kernel.__new__(runtime.Kernel)
        k.variant, k.device, k._ctx, k._occupancy = variant, 0, 0x1234, {(128, 0): 1}
        k._fn, k._launch, k._launch_ex = drv.CUfunction(0x5555), drv.cuLaunchKernel, drv.cuLaunchKernelEx
        k.blocks_per_sm = lambda block, smem: 1
        return k

    class Buffer:
        def __init__(self, index, size, zero, stream):
            self.size, self.ptr = size, 1 << 20

        def data_ptr(self):
            return self.ptr

        def numel(self):
            return self.size

    runtime.kernel = kernel
    runtime.device_props = lambda index: runtime.DeviceProps(9, 0, 132, 232448)
    runtime.current_device_index = launch.current_device_index = lambda: 0
    runtime.TensorMaps = lambda geometry: (lambda address, tmap=bytes(128): tmap)
    launch.device_index = lambda device: 0
    launch.stream_and_capturing = lambda index: (0, False)
    workspace._kept = Buffer
    ctypes.CDLL("libcuda.so.1")   # (the stub: fails here, not mid-call, where the path is not set)


def _fallback_stand_ins(conv_outputs: dict) -> None:
    """The fallbacks' epilogue kernels available, the frontend's answer PyTorch's call, and that call's cuDNN op a
    function returning ``conv_outputs[x.shape]``; the CPU tensors' device (-1) stands for device 0's."""
    import torch

    from fullfuse import launch, workspace
    from fullfuse.fallback import conv_act_pool, convt_pool_reduce, cudnn_conv

    conv_act_pool.unavailable = convt_pool_reduce.unavailable = lambda: None
    cudnn_conv.lookup = lambda *args, **kwargs: (cudnn_conv.TORCH_CALL, True)
    torch.backends.cudnn.is_available = lambda: True
    torch.cudnn_convolution = torch.cudnn_convolution_transpose = lambda x, *args: conv_outputs[x.shape]
    launch.stream_of = lambda index: 0
    for_launch = workspace.for_launch
    workspace.for_launch = lambda index, wanted: for_launch(max(index, 0), wanted)


def measure(calls: int = 20000, repeat: int = 7) -> dict:
    """{row: best ns per fused_model(x) call} of the checkout on sys.path (rows "A", "B": fused; "A fallback",
    "B fallback")."""
    import torch

    import fullfuse
    from fullfuse import calls as calls_mod
    from fullfuse.fallback import conv_act_pool as fallback_a
    from fullfuse.fallback import convt_pool_reduce as fallback_b
    from fullfuse.fused import conv_act_pool, convt_pool_reduce
    from fullfuse.seed_models import seed_model

    _stand_ins()
    conv_outputs = {}
    _fallback_stand_ins(conv_outputs)
    modules = {("A", "fused"): conv_act_pool, ("B", "fused"): convt_pool_reduce,
               ("A", "fallback"): fallback_a, ("B", "fallback"): fallback_b}
    got = {}
    with torch.inference_mode():
        for (family, path), module in modules.items():
            shape = SHAPES[family]
            model = seed_model(family).eval()
            x = torch.randn(shape)
            conv_outputs[x.shape] = next(model.children())(x).detach()   # (the conv's output, bias and all)
            fused = fullfuse.fused_model(model, path="auto")
            fused(x)   # (the input is on the CPU: its prepared call is PyTorch's; the path's runner replaces it)
            region = fused.graph_module._modules["fullfuse_region_0"]
            spec_calls = calls_mod.calls_for(region.plan.spec, region.plan.requested, region.precision,
                                             region.deterministic)
            for key in list(spec_calls._prepared):
                runner = module.prepare(spec_calls.spec, x, "tf32", True)
                spec_calls._prepared[key] = ((path, "stub driver"), runner)
            fused(x)
            row = family if path == "fused" else f"{family} {path}"
            got[row] = min(timeit.repeat(lambda: fused(x), number=calls, repeat=repeat)) / calls * 1e9
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout, run in alternating processes")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(repr(measure()))
        return
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    trees = [here] + ([os.path.abspath(args.against)] if args.against else [])
    env = dict(os.environ, LD_LIBRARY_PATH=_stub_driver_dir())
    results = {tree: [] for tree in trees}
    for _ in range(args.rounds):
        for tree in trees:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], cwd=tempfile.gettempdir(),
                                 env=dict(env, PYTHONPATH=tree), check=True, capture_output=True, text=True)
            results[tree].append(eval(out.stdout.strip().splitlines()[-1]))
    for tree, rows in results.items():
        print(f"{tree}: fused_model(x), median of {len(rows)} processes (us):")
        for row in rows[0]:
            print(f"  {row:10s} {statistics.median(r[row] for r in rows) / 1e3:6.2f}  "
                  f"({' '.join(f'{r[row] / 1e3:.2f}' for r in rows)})")


if __name__ == "__main__":
    main()
