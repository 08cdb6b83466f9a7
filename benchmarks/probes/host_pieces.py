"""Where a fused call's host time goes, and the kernels one seed call runs (docs/design.md 3.6).

Part 1, host time of each piece of the fused per-call path at seed A's tiny shape, isolated (the GPU idle before each
call, median of 300) and back to back (best of 5 rounds of 2000): each layer from the fused model down to the
prepared runner (with its launch, and with the launch replaced by nothing), the kept-buffer lookup, torch.empty,
the stream, capture and precision queries, Kernel.launch and cuLaunchKernel itself (through cuda-bindings and
through ctypes; the mma.sync kernel of the tiny shape and the wgmma kernel of (4, 8, 64, 64), whose parameter block
is 3 KB; and an empty kernel of 16 and of 3136 parameter bytes: what the block's size alone costs a launch), the
fallback calls, one eager op and the eager model.

Part 2, the fallback's per-call pieces at a tiny and a small shape of each family: the whole call, the layers down to
its prepared runner (the region's forward, ops.run_spec, the dispatcher), the runner, its conv as it runs (PyTorch's
cuDNN op called directly, torch_conv.py) against F.convNd under the flags, the frontend's execute where it has a plan,
the conv-problem lookup, the epilogue launch and the output's allocation; and which conv each problem's first call chose
(cudnn_conv).

Part 3, where auto runs PyTorch's ops (the first-call measurement kept them: (1, 3, 20, 20), 5x5 stride 2 over 3
channels, bfloat16): the eager model against the fused model, each layer of the fused model's call down to the
prepared ops (and the spec's ops as written, its post view not folded into the pool), and the eager model's own ops
called as its modules call them, side by side (interleaved_host_us); then the GPU span per call of back-to-back calls
of the eager and the fused model (host-bound where it is below their back-to-back time).

Part 4, torch.profiler over five fused calls per seed problem (A, B x float32, bfloat16): each kernel's GPU time and
the span of one call from its first kernel's start to its last kernel's end.

Usage: python3 benchmarks/probes/host_pieces.py   (a CUDA GPU)
"""
import ctypes
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import fullfuse
from fullfuse import calls, launch, ops, precision, torch_path, workspace
from fullfuse.fallback import conv_act_pool as fallback_a
from fullfuse.fallback import convt_pool_reduce as fallback_b
from fullfuse.fallback import cudnn_conv, torch_conv
from fullfuse.measure import interleaved_host_us, isolated_host_us
from fullfuse.seed_models import SEED_SHAPE, SeedA, SeedB, seed_model


def back_to_back_us(fn, calls=2000):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def _launched(run):
    """(kernel, grid as three dims, shared memory, this thread's argument list) of family A's prepared call ``run``
    (a fused runner's bound run, after one call)."""
    runner = run.__self__
    args = next(iter(runner._local.args.values()))
    grid = runner.grid if isinstance(runner.grid, tuple) else (runner.grid, 1, 1)
    return runner.kernel, grid, runner.l.smem, args


def _empty_kernel_launches(stream: int) -> dict:
    """cuLaunchKernel through cuda-bindings of an empty kernel (one block of 32 threads) taking a struct of 16 and of
    3136 bytes: the parameter block's own share of a launch's host time."""
    from cuda.bindings import driver
    from cutlass_ops.nvrtc import _program_api

    program, options = _program_api()
    sizes = (16, 3136)
    source = "".join(f"struct P{n} {{ int a[{n // 4}]; }};\n"
                     f"extern \"C\" __global__ void k{n}(P{n} p) {{ if (p.a[0] == 7 && threadIdx.x > 99) p.a[1]++; }}\n"
                     for n in sizes)
    major, minor = torch.cuda.get_device_capability()
    cubin = program(source, "c++", options=options(arch=f"sm_{major}{minor}")).compile("cubin").code
    err, module = driver.cuModuleLoadData(cubin)
    assert err == 0, err
    pieces = {}
    for n in sizes:
        err, fn = driver.cuModuleGetFunction(module, f"k{n}".encode())
        assert err == 0, err
        block = (ctypes.c_char * n)()
        pointers = (ctypes.c_void_p * 1)(ctypes.addressof(block))

        def launch_it(fn=fn, address=ctypes.addressof(pointers), keep=(block, pointers)):
            driver.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, address, 0)
        pieces[f"cuLaunchKernel, empty kernel, {n} B"] = launch_it
    return pieces


def host_pieces() -> None:
    x = torch.randn(1, 8, 16, 16, device="cuda")
    model = SeedA().cuda().eval()
    fused = fullfuse.fused_model(model, path="fused")
    region = fused.graph_module._modules["fullfuse_region_0"]
    weight, bias, spec = model.conv.weight, model.conv.bias, region.plan.spec
    pieces = {
        "fused_model(x)": lambda: fused(x),
        "graph_module.forward(x)": lambda: fused.graph_module.forward(x),
        "region(x)": lambda: region(x),
        "ops.run_spec": lambda: ops.run_spec(spec, x, weight, bias, "fused", "auto", True),
        "SpecCalls.__call__": lambda: region.calls(x, weight, bias),
        "SpecCalls.run (the dispatcher)": lambda: region.calls.run(x, weight, bias),
        "precision.resolve": lambda: precision.resolve("auto", x.dtype),
        "torch.empty(1, 64, 1, 1)": lambda: torch.empty(1, 64, 1, 1, device="cuda"),
        "workspace.for_launch (2 buffers)": lambda: workspace.for_launch(0, ((4096, workspace.ZEROED),
                                                                             (4096, workspace.PARTIALS))),
        "launch.stream_and_capturing": lambda: launch.stream_and_capturing(0),
        "eager F.gelu (64 floats)": lambda: torch.nn.functional.gelu(x),
        "eager model": lambda: model(x),
    }
    with torch.no_grad():
        fused(x)
        run = next(iter(region.calls._prepared.values()))[1]
        pieces["runner"] = lambda: run(x, weight, bias)
        stream = launch.stream_of(0)
        kernel, grid, smem, args = _launched(run)
        pieces["Kernel.launch"] = lambda: kernel.launch(grid, 128, smem, args)
        pieces["cuLaunchKernel (cuda-bindings)"] = lambda: kernel._launch(kernel._fn, *grid, 128, 1, 1, smem, stream,
                                                                          args.address, 0)
        c_launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
        c_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        c_launch.restype = ctypes.c_int
        function = int(kernel._fn)
        pieces["cuLaunchKernel (ctypes)"] = lambda: c_launch(function, *grid, 128, 1, 1, smem, stream, args.address,
                                                             None)
        xs = torch.randn(4, 8, 64, 64, device="cuda")
        fused(xs)
        wg_kernel, wg_grid, wg_smem, wg_args = _launched(next(e[1] for k, e in region.calls._prepared.items()
                                                              if k[4] == xs.shape))
        print(f"(4, 8, 64, 64): {wg_kernel.name[:40]}..., {ctypes.sizeof(wg_args.values[0])} parameter bytes")
        pieces["fused_model(x), (4, 8, 64, 64)"] = lambda: fused(xs)
        pieces["cuLaunchKernel, (4, 8, 64, 64)'s kernel"] = lambda: wg_kernel._launch(
            wg_kernel._fn, *wg_grid, 128, 1, 1, wg_smem, stream, wg_args.address, 0)
        pieces.update(_empty_kernel_launches(stream))
        fallback = fullfuse.fused_model(model, path="fallback")
        pieces["fallback A fused_model(x)"] = lambda: fallback(x)
        rows = {name: (isolated_host_us(fn, 300), back_to_back_us(fn)) for name, fn in pieces.items()}
        launch_fn, run.__self__._launch = run.__self__._launch, lambda stream, args: None
        try:
            rows["runner, launch replaced by nothing"] = (isolated_host_us(pieces["runner"], 300),
                                                          back_to_back_us(pieces["runner"]))
        finally:
            run.__self__._launch = launch_fn
        xb = torch.randn(1, 32, 4, 4, 4, device="cuda")
        fused_b = fullfuse.fused_model(SeedB().cuda().eval(), path="fused")
        rows["B fused_model(x), (1, 32, 4, 4, 4)"] = (isolated_host_us(lambda: fused_b(xb), 300),
                                                      back_to_back_us(lambda: fused_b(xb)))
        fallback_b = fullfuse.fused_model(SeedB().cuda().eval(), path="fallback")
        rows["B fallback fused_model(x), (1, 32, 4, 4, 4)"] = (isolated_host_us(lambda: fallback_b(xb), 300),
                                                               back_to_back_us(lambda: fallback_b(xb)))
    print(f"{'piece (µs)':40s} {'isolated':>9s} {'back to back':>13s}")
    for name, (iso, b2b) in rows.items():
        print(f"{name:40s} {iso:9.2f} {b2b:13.2f}", flush=True)


def fallback_pieces() -> None:
    """Part 2 (see the module's text)."""
    print(f"\n{'fallback piece (µs)':58s} {'isolated':>9s} {'back to back':>13s}")
    cases = (("A", SeedA, ((1, 8, 16, 16), (4, 8, 64, 64))), ("B", SeedB, ((1, 32, 4, 4, 4), (2, 32, 8, 8, 8))))
    with torch.no_grad():
        for family, make, shapes in cases:
            model = make().cuda().eval()
            fallback = fullfuse.fused_model(model, path="fallback")
            conv = model.conv if family == "A" else model.conv_transpose
            spec = fallback.plans[0].spec
            for shape in shapes:
                x = torch.randn(shape, device="cuda")
                fallback(x)
                runner = next(entry[1] for key, entry in calls.calls_for(spec, "fallback")._prepared.items()
                              if key[4] == x.shape)
                mode = precision.resolve("auto", x.dtype)
                w = conv.weight
                if family == "A":
                    spatial = spec.output_spatial(tuple(shape[2:]))
                    direct = torch_conv.conv(2, spec.stride, spec.padding, spec.dilation, mode, True,
                                             torch_conv.image_elements(shape), 1)
                    args = (spec.stride, spec.padding, spec.dilation)
                    out_shape = (shape[0], spec.out_channels, *spatial)
                else:
                    direct = fallback_b._Calls(spec, x, mode, True).torch_call
                    args = (spec.stride, spec.padding, spec.output_padding, 1, spec.dilation)
                    out_shape = (shape[0], spec.out_channels, *spec.conv_output_spatial(tuple(shape[2:])))
                conv_fn = (torch_path.CONV if family == "A" else torch_path.CONV_T)[spec.dims]

                def flags_conv(x=x, w=w, conv_fn=conv_fn, args=args, mode=mode):
                    with precision.cudnn_settings(mode, True):
                        return conv_fn(x, w, None, *args)
                y = direct(x, w)
                out = torch.empty(shape[0], spec.out_channels if family == "A" else 1, device="cuda")
                kind = "fprop" if family == "A" else "dgrad"
                convs = cudnn_conv.SignatureConvs(kind, spec.padding, spec.stride, spec.dilation, mode, True, None,
                                                  direct, lambda rows, s=out_shape: (rows, *s[1:]))
                bias = conv.bias
                if family == "A":
                    epi = lambda y=y, bias=bias, out=out, e=fallback_a.Epilogue(spec, 0): e(y, bias, out)  # noqa
                else:
                    pooled = torch.empty(shape[0], *spec.pooled_spatial(tuple(shape[2:])), device="cuda")
                    epi = lambda y=y, bias=bias, out=pooled, e=fallback_b.Epilogue(spec, 0): e(y, bias, out)  # noqa
                region = fallback.graph_module._modules["fullfuse_region_0"]
                pieces = {"fused_model(x)": lambda f=fallback, x=x: f(x),
                          "region.forward(x)": lambda r=region, x=x: r.forward(x),
                          "ops.run_spec": lambda x=x, w=w, b=bias, s=spec: ops.run_spec(s, x, w, b, "fallback"),
                          "SpecCalls.run": lambda x=x, w=w, b=bias, s=spec: calls.calls_for(s, "fallback").run(x, w, b),
                          "prepared runner": lambda r=runner, x=x, w=w, b=bias: r(x, w, b),
                          "conv: PyTorch's cuDNN op, direct": lambda d=direct, x=x, w=w: d(x, w),
                          "conv: F.convNd under cudnn_settings": flags_conv,
                          "conv problem lookup (SignatureConvs)": lambda c=convs, x=x, w=w, n=shape[0]: c(x, w, (0, n)),
                          "epilogue launch": epi,
                          "new_output": lambda x=x, n=shape[0], k=out.shape[1]: launch.new_output(x, (n, k),
                                                                                                  torch.float32)}
                entry, _ = cudnn_conv.lookup(kind, x, w, out_shape, spec.padding, spec.stride, spec.dilation, mode,
                                             True, None, direct)
                if isinstance(entry, cudnn_conv._Entry):
                    pieces["conv: the frontend's plan (its execute)"] = lambda e=entry, x=x, w=w: e(x, w)
                chose = "frontend plan" if isinstance(entry, cudnn_conv._Entry) else (entry or "no plan")
                print(f"{family} {shape}: the conv's first call chose {chose}")
                for name, fn in pieces.items():
                    fn()
                    print(f"  {name:56s} {isolated_host_us(fn, 300):9.2f} {back_to_back_us(fn, 500):13.2f}",
                          flush=True)


def torch_route_pieces() -> None:
    """Part 3 (see the module's text)."""
    torch.manual_seed(0)
    model = seed_model("A", 3, 2, (64, 5, 2, 0)).cuda().to(torch.bfloat16).eval()
    x = torch.randn(1, 3, 20, 20, device="cuda", dtype=torch.bfloat16)
    fused = fullfuse.fused_model(model)
    region = fused.graph_module._modules["fullfuse_region_0"]
    conv, act, pool = model.conv, model.act, model.pool
    weight, bias = conv.weight, conv.bias
    with torch.no_grad():
        fused(x)
        print(f"\n(1, 3, 20, 20) bf16: auto ran {fused.plans[0].last_path} ({fused.plans[0].last_reason})")
        (_, ops_run), = region.calls._prepared.values()
        as_written = torch_path.prepared(region.calls.spec)
        pieces = {
            "eager model": lambda: model(x),
            "fused_model(x)": lambda: fused(x),
            "region.run(x)": lambda: region.run(x),
            "SpecCalls.eager": lambda: region.calls.eager(x, weight, bias),
            "SpecCalls.run": lambda: region.calls.run(x, weight, bias),
            "the prepared ops": lambda: ops_run(x, weight, bias),
            "the spec's ops as written (post view not folded)": lambda: as_written(x, weight, bias),
            "the model's modules, called": lambda: pool(act(conv(x))).squeeze(),
            "the model's ops, called as its forwards do": lambda: F.adaptive_avg_pool2d(F.gelu(F.conv2d(
                x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups), approximate="none"),
                1).squeeze(),
        }
        measured = interleaved_host_us(pieces, 300)
    print(f"{'piece (µs)':50s} {'isolated':>9s} {'back to back':>13s}")
    for name, (iso, b2b) in measured.items():
        print(f"{name:50s} {iso:9.2f} {b2b:13.2f}", flush=True)
    with torch.no_grad():   # GPU time per call of the eager and the fused model: what back-to-back calls cannot beat
        for name in ("eager model", "fused_model(x)"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(300):
                pieces[name]()
            end.record()
            torch.cuda.synchronize()
            print(f"{name}: GPU span of 300 back-to-back calls, per call {start.elapsed_time(end) * 1e3 / 300:.2f} µs")


def seed_kernels() -> None:
    for family in ("A", "B"):
        for dtype in (torch.float32, torch.bfloat16):
            model = seed_model(family).cuda().eval().to(dtype)
            x = torch.randn(SEED_SHAPE[family], device="cuda", dtype=dtype)
            fused = fullfuse.fused_model(model, path="fused")
            with torch.no_grad():
                for _ in range(3):
                    fused(x)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fused(x)
                    torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            per_call = len(events) // 5
            print(f"{family} {dtype}: {per_call} kernel(s) per call")
            by_name = {}
            for e in events:
                by_name.setdefault(e.name[:60], []).append(e.device_time_total)
            for name, times in by_name.items():
                print(f"  {name:60s} median {statistics.median(times):8.1f} µs")
            last = sorted((e.time_range.start, e.time_range.end) for e in events)[-per_call:]
            print(f"  one call: first kernel start -> last kernel end {last[-1][1] - last[0][0]:.1f} µs")


if __name__ == "__main__":
    host_pieces()
    fallback_pieces()
    torch_route_pieces()
    seed_kernels()
