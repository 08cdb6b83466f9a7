"""`fullfuse bench`: eager vs torch.compile vs fullfuse's fallback and fused paths, side by side in one run.

Each variant is timed with CUDA events (warm-up, median and min of many runs, L2 flushed before every run),
checked against a float64 evaluation of the same model and input, and its peak extra GPU memory is recorded.
Results go to a JSON file (with commit, GPU, torch, CUDA, cuDNN) and a bar chart PNG.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from .cudnn_peer import cudnn_fused_a
from .errors import UnsupportedError
from .fallback import cudnn_conv, pipeline
from .measure import environment, errors, gpu_state, peak_extra_memory, result_stem, time_cuda
from .model import fused_model
from .precision import cudnn_conv_precision, resolve
from .seed_models import SEED_SHAPE, SMALL_SHAPE, seed_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
VARIANTS = ("eager", "compile", "compile-max-autotune", "cudnn-fused-graph", "fallback", "fused")


def _variant(name: str, model, precision: str, x) -> Optional[Callable]:
    if name == "cudnn-fused-graph":
        return cudnn_fused_a(model, x) if x.dim() == 4 else None
    if name == "eager":
        return model
    if name == "compile":
        return torch.compile(model)
    if name == "compile-max-autotune":
        return torch.compile(model, mode="max-autotune-no-cudagraphs")
    path = name
    try:
        return fused_model(model, path=path, precision=precision)
    except UnsupportedError as exc:
        print(f"  {name}: not available: {exc}")
        return None


def bench_family(family: str, shape, dtype: str, precision: str, channels_last: bool, variants, repeats: int,
                 seed: int = 0, conv: Optional[tuple] = None) -> Dict:
    torch.manual_seed(seed)
    dims = len(shape) - 2 if family == "A" else 3       # family A: a 5-d shape benchmarks the Conv3d form
    model = seed_model(family, shape[1], dims, conv).cuda().to(DTYPES[dtype]).eval()
    x = torch.randn(shape, device="cuda", dtype=DTYPES[dtype])
    if channels_last:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x, model = x.contiguous(memory_format=fmt), model.to(memory_format=fmt)
    mode = resolve(precision, x.dtype)
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        ref = seed_model(family, shape[1], dims, conv).cuda().double()
        ref.load_state_dict(model.state_dict())
        reference = ref(x.double())
        del ref
    rows = []
    # the fallback's cuDNN plans and chunk schedules are process-wide caches: a row records the entries this call added
    # (a grid of shapes in one process would otherwise repeat every earlier shape's in each row)
    seen = {"cudnn_frontend_plans": {d[0] for d in cudnn_conv.describe()},
            "chunk_schedules": {d[0] for d in pipeline.describe()}}
    for name in variants:
        fn_model = _variant(name, model, precision, x)
        if fn_model is None:
            rows.append({"variant": name, "available": False})
            continue
        with torch.no_grad(), cudnn_conv_precision(mode):
            call = lambda: fn_model(x)  # noqa: E731
            t0 = time.time()
            try:
                out = call()                                # first call: compiles / autotunes / builds
            except UnsupportedError as exc:                 # a path requested explicitly that this input cannot take
                print(f"  {name}: not available: {exc}")
                rows.append({"variant": name, "available": False, "why": str(exc)})
                continue
            first_s = time.time() - t0
            err = errors(out, reference)
            del out
            timing = time_cuda(call, repeats=repeats)
            state = gpu_state()                             # clock / power right after the timed runs
            extra = peak_extra_memory(call)
        row = {"variant": name, "available": True, **timing, **err, "peak_extra_mb": extra / 2**20,
               "first_call_s": first_s,
               "gpu_after_timing": state}
        if name in ("fallback", "fused"):
            row["plans"] = [str(p) for p in fn_model.plans]
            row["ran"] = [p.last_path for p in fn_model.plans]
            row["reasons"] = [p.last_reason for p in fn_model.plans]
            row["chunk_schedules"] = [str(d) for d in pipeline.describe() if d[0] not in seen["chunk_schedules"]]
            row["cudnn_frontend_plans"] = [str(d) for d in cudnn_conv.describe()
                                           if d[0] not in seen["cudnn_frontend_plans"]]
        rows.append(row)
        clock = (f"  SM {state['sm_clock_mhz']:.0f} MHz {state.get('power_w', 0):.0f} W"
                 if "sm_clock_mhz" in state else "")
        print(f"  {name:22} {timing['median_ms']:8.3f} ms (min {timing['min_ms']:.3f})  relerr {err['relerr']:.2e}  "
              f"extra mem {extra / 2**20:8.1f} MB  host {timing['host_us_median']:.0f} us{clock}", flush=True)
    return {"family": family, "shape": list(shape), "conv": str(model.conv) if family == "A" else None, "dtype": dtype,
            "precision": precision, "mode": mode,
            "layout": "channels_last" if channels_last else "contiguous", "rows": rows}


def plot(results: List[Dict], path: Path) -> bool:
    """Draw the results to ``path``; False (and a hint) where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("fullfuse bench: no plot (matplotlib is not installed: pip install 'fullfuse[bench]')")
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results):
        rows = [r for r in res["rows"] if r.get("available")]
        names = [r["variant"] for r in rows]
        values = [r["median_ms"] for r in rows]
        bars = ax.bar(names, values, color=["#2a7" if n in ("fallback", "fused") else "#888" for n in names])
        ax.bar_label(bars, fmt="%.2f")
        ax.set_ylabel("median ms (lower is better)")
        conv = f" {res['conv']}" if res.get("conv") else ""
        ax.set_title(f"{res['family']} {tuple(res['shape'])}{conv} {res['dtype']} {res['mode']} {res['layout']}",
                     fontsize=8)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def bench_cpu(families) -> int:
    print("fullfuse bench: no CUDA GPU on this machine: the kernels need one. Running the PyTorch reference "
          "(torch path) on small shapes on the CPU instead.")
    for family in families:
        model = seed_model(family).eval()
        x = torch.randn(SMALL_SHAPE[family])
        fused = fused_model(model)
        with torch.no_grad():
            reference = copy.deepcopy(model).double()(x.double())
            for name, fn in (("eager", model), ("fullfuse (torch path)", fused)):
                fn(x)
                t0 = time.perf_counter()
                for _ in range(5):
                    out = fn(x)
                ms = (time.perf_counter() - t0) / 5 * 1e3
                err = errors(out, reference)
                print(f"  {family} {tuple(x.shape)} {name:24} {ms:8.2f} ms  relerr {err['relerr']:.1e}")
        for plan in fused.plans:
            print(f"  plan: {plan}")
    return 0


def main(families=("A", "B"), shape=None, dtype="float32", precision="auto", layouts=("contiguous",),
         variants=VARIANTS, repeats=30, out_dir="benchmarks/results", tag="", conv=None) -> int:
    if not torch.cuda.is_available():
        return bench_cpu(families)
    env = environment()
    print(f"fullfuse bench on {env['gpu']}: torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
          f"commit {env['commit']}")
    results = []
    for family in families:
        for layout in layouts:
            fam_shape = tuple(shape) if shape else SEED_SHAPE[family]
            fam_conv = conv if family == "A" else None
            print(f"{family} {fam_shape}{' conv ' + str(fam_conv) if fam_conv else ''} {dtype} precision={precision} "
                  f"layout={layout}", flush=True)
            results.append(bench_family(family, fam_shape, dtype, precision, layout == "channels_last", variants,
                                        repeats,
                                        conv=fam_conv))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(f"bench_{''.join(families)}_{dtype}_{precision}{'_' + tag if tag else ''}")
    (out / f"{stem}.json").write_text(json.dumps({"environment": env, "results": results}, indent=1))
    drawn = plot(results, out / f"{stem}.png")
    print(summary(results))
    print(f"wrote {out / stem}.json" + (" and .png" if drawn else ""))
    return 0


def summary(results: List[Dict]) -> str:
    lines = [f"{'problem':44} " + " ".join(f"{v:>12}" for v in VARIANTS)]
    for res in results:
        by = {r["variant"]: r for r in res["rows"]}
        cells = [f"{by[v]['median_ms']:12.3f}" if by.get(v, {}).get("available") else f"{'-':>12}" for v in VARIANTS]
        head = f"{res['family']} {res['dtype']} {res['mode']} {res['layout']:13}".ljust(44)
        lines.append(head + " " + " ".join(cells))
    return "\n".join(lines)
