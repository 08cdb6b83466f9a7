"""Probe (device): host time per call of the fused family-B seed call, to explain the gap between the eager call
and its CUDA-graph replay.  Times N back-to-back calls on the host (kernels queue up asynchronously), for the
FusedModel, the functional op and the bare ctypes launch, then prints cProfile's top entries for the FusedModel."""
import cProfile
import ctypes
import pstats
import time

import torch

import fullfuse
from fullfuse import launch, workspace
from fullfuse.fused import convt_pool_reduce as fb
from fullfuse.seed_models import seed_model

N = 200
model = seed_model("B").cuda().eval()
fused = fullfuse.fused_model(model)
x = torch.randn(16, 32, 32, 32, 32, device="cuda")
conv = model.conv_transpose
spec = fused.plans[0].spec


def host_us(fn):
    with torch.no_grad():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
    return (t1 - t0) / N * 1e6


packed = fb.pack_weights(conv.weight.detach(), spec.stride)
out = torch.empty(x.shape[0], *spec.pooled_spatial(tuple(x.shape[2:])), device="cuda")
args = fb.problem(spec, x, "tf32")
ws = workspace.zeroed(x.device, workspace.nbytes(x.device, fb.LIB, "ff_fused_convt_pool_reduce_workspace_bytes",
                                                 (args,)))
raw_fn = launch.function(fb.LIB, "ff_fused_convt_pool_reduce")
stream = torch.cuda.current_stream().cuda_stream
raw = lambda: raw_fn(x.data_ptr(), packed.data_ptr(), conv.bias.data_ptr(), out.data_ptr(), args.address, None if ws is None else ws.data_ptr(), ctypes.c_void_p(stream))
print(f"host us per call: FusedModel {host_us(lambda: fused(x)):.1f}, "
      f"ops.convt_pool_reduce {host_us(lambda: fullfuse.ops.convt_pool_reduce(x, conv.weight, conv.bias, 2, 2, 0, 1, 6)):.1f}, "
      f"launch.launch {host_us(lambda: launch.launch(fb.LIB, 'ff_fused_convt_pool_reduce', x, packed, conv.bias, out, args, ws, device=x.device)):.1f}, "
      f"raw ctypes {host_us(raw):.1f}")
with torch.no_grad():
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N):
        fused(x)
    prof.disable()
    torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
