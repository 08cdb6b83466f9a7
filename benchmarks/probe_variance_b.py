"""Probe (device): where the run-to-run spread of the fused family-B end-to-end figures comes from.  At the seed
(TF32), side by side in one process: the kernel alone (ctypes) with several copies of the packed weights and of the
input at different addresses, with and without the L2 flush; then the FusedModel call (the bench's end-to-end
figure) repeated, each layout, with and without the flush.  Medians of 20 CUDA-event timings (fullfuse.measure)."""
import ctypes
import gc
import statistics

import torch

import fullfuse
from fullfuse import launch, workspace
from fullfuse.fused import convt_pool_reduce as fb
from fullfuse.measure import time_cuda
from fullfuse.seed_models import seed_model

torch.manual_seed(0)
model = seed_model("B").cuda().eval()
conv = model.conv_transpose
fused = fullfuse.fused_model(model, path="fused", precision="tf32")
spec = fused.plans[0].spec
raw_fn = launch.function(fb.LIB, "ff_fused_convt_pool_reduce")
stream = torch.cuda.current_stream().cuda_stream
base = torch.randn(16, 32, 32, 32, 32, device="cuda")
layouts = {"NCDHW": lambda t: t.contiguous(), "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last_3d)}
packed = [fb.pack_weights(conv.weight.detach(), spec.stride)]
keep = []
for _ in range(3):   # further copies of the weights at other addresses (a spacer between them)
    keep.append(torch.empty(1 << (20 + len(keep)), device="cuda", dtype=torch.uint8))
    packed.append(packed[0].clone())
print("kernel only (ms, median of 20):")
for name, fmt in layouts.items():
    xs = [fmt(base.clone()) for _ in range(2)]
    out = torch.empty(16, 10, 10, 10, device="cuda")
    args = fb.problem(spec, xs[0], "tf32")
    ws_bytes = workspace.nbytes(xs[0].device, fb.LIB, "ff_fused_convt_pool_reduce_workspace_bytes", (args,))
    ws = workspace.zeroed(xs[0].device, ws_bytes)
    for xi, x in enumerate(xs):
        row = []
        for wp in packed:
            call = lambda: raw_fn(x.data_ptr(), wp.data_ptr(), conv.bias.data_ptr(), out.data_ptr(), args.address, None if ws is None else ws.data_ptr(), ctypes.c_void_p(stream))
            row.append(f"{time_cuda(call, repeats=20)['median_ms']:.3f}/{time_cuda(call, repeats=20, flush_l2=False)['median_ms']:.3f}")
        print(f"  {name:13} input copy {xi} x weight copies 0-3 (flushed/not): {'  '.join(row)}", flush=True)
print("FusedModel call (ms, median of 20; flushed / not flushed), repeated:")
with torch.no_grad():
    for rep in range(3):
        for name, fmt in layouts.items():
            x = fmt(base)
            f = time_cuda(lambda: fused(x), repeats=20)["median_ms"]
            nf = time_cuda(lambda: fused(x), repeats=20, flush_l2=False)["median_ms"]
            print(f"  rep {rep} {name:13} {f:.3f} / {nf:.3f}", flush=True)

# per run: the host time of the call itself beside its CUDA-event time (time_cuda per_run), to tell host delays (a
# call whose host part outlasts the flush leaves the GPU idle inside the timed region) from GPU ones
print("per run, FusedModel call, flushed: median GPU ms | median / max host us of the call | runs with GPU > 1.05 x min: their host us")
with torch.no_grad():
    for rep in range(4):
        for gc_on in (True, False):
            for name, fmt in layouts.items():
                x = fmt(base)
                if not gc_on:
                    gc.disable()
                t = time_cuda(lambda: fused(x), repeats=20, per_run=True)
                gc.enable()
                host, gpu = t["host_us"], t["runs_ms"]
                slow = [f"{h:.0f}" for h, g in zip(host, gpu) if g > 1.05 * min(gpu)]
                print(f"  rep {rep} gc {'on ' if gc_on else 'off'} {name:13} {t['median_ms']:.3f} ms | "
                      f"{statistics.median(host):.0f} / {max(host):.0f} us | slow: {len(slow)} {' '.join(slow)}", flush=True)
