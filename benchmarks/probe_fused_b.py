"""Probe for csrc/fused_convt_pool_reduce.cu (family B fused) straight through ctypes.

Uses the product build (or, per FF_PROBE_VARIANTS, builds of the kernel with extra nvcc flags in FF_PROBE_SO_DIR),
packs the weights per residue class and tap, checks fresh random inputs of each FF_PROBE_DTYPES dtype in three
layouts (channels_last_3d, NCDHW, NCDHW one element off a 16-byte boundary) against a float64 reference
(conv_transpose3d -> max over the composed window -> channel reduction) with the output poisoned with NaN first, then
times the seed (CUDA events, median, L2 flushed).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fullfuse.fused.convt_pool_reduce import LIB, pack_weights, problem  # noqa: E402
from fullfuse.launch import bind  # noqa: E402
import cutlass_ops.builder  # noqa: E402
from fullfuse.spec import ConvTPoolReduceSpec  # noqa: E402
from fullfuse.torch_path import float64_reference  # noqa: E402
from fullfuse.measure import time_cuda  # noqa: E402


# FF_PROBE_VARIANTS="-DX=1 -DY=2;-DZ": builds to compare (';'-separated nvcc flag sets, "_" = none), kept in
# FF_PROBE_SO_DIR (build them here, carry them to the device); FF_PROBE_NCU=1: the seed only (for Nsight Compute)
VARIANTS = [v.strip() for v in os.environ.get("FF_PROBE_VARIANTS", "_").split(";")]
SO_DIR = Path(os.environ.get("FF_PROBE_SO_DIR", "/tmp"))
NCU = os.environ.get("FF_PROBE_NCU") == "1"
# FF_PROBE_DTYPES="float32 ieee bfloat16 float16": input dtypes to check (each with its relerr bound; "ieee": fp32
# input at precision ieee, "float32" is TF32)
DTYPES = os.environ.get("FF_PROBE_DTYPES", "float32").split()
BOUND = {"float32": 1e-3, "ieee": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}


def build(variant):
    if variant == "_":   # the product's own build (cached by cutlass_ops)
        return bind(ctypes.CDLL(str(cutlass_ops.builder.build(LIB))), LIB)
    src = ROOT / "csrc" / "fused_convt_pool_reduce.cu"
    key = variant.encode() + src.read_bytes() + (ROOT / "csrc" / "activation.cuh").read_bytes()
    so = SO_DIR / f"ff_fused_b_probe_{hashlib.md5(key).hexdigest()[:10]}.so"   # source + flags: never a stale build
    cmd = ["nvcc", "-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-shared", "--expt-relaxed-constexpr", "-lineinfo",
           "-gencode=arch=compute_90a,code=sm_90a", *variant.split(), f"-I{ROOT / 'csrc'}", "-o", so,
           str(src)]
    if not so.exists():
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    return bind(ctypes.CDLL(so), LIB)   # the product's ctypes signatures


def make_spec(x, K, T, s, p, op, win, act, red, has_bias):
    return ConvTPoolReduceSpec(3, x.shape[1], K, T, s, p, op, (1, 1, 1), has_bias, win, act, red, keepdim=False)


_workspaces = {}


def workspace(lib, prob):
    """The problem's zeroed workspace (the kernel leaves it zeroed), made once per library and problem."""
    key = (id(lib), prob)
    if key not in _workspaces:
        n = lib.ff_fused_convt_pool_reduce_workspace_bytes(prob.address)
        _workspaces[key] = torch.zeros(max(n, 1), dtype=torch.uint8, device="cuda")
    return _workspaces[key].data_ptr()


def run(lib, x, wp, b, out, spec, mode):
    prob = problem(spec, x, mode)                                # the product path's problem array
    why = lib.ff_fused_convt_pool_reduce_unsupported(prob.address)
    if why:
        return why.decode()
    rc = lib.ff_fused_convt_pool_reduce(x.data_ptr(), wp.data_ptr(), b.data_ptr() if b is not None else None,
                                        out.data_ptr(), prob.address, workspace(lib, prob), torch.cuda.current_stream().cuda_stream)
    return None if rc == 0 else f"launch error {rc}"


CASES = [  # name, (N, C, D, H, W), K, T, s, p, op, win, act, red, bias
    ("seed-like (pools 2 then 3)", (2, 32, 8, 8, 8), 64, (5, 5, 5), (2, 2, 2), (2, 2, 2), (0, 0, 0), (6, 6, 6), "none", "sum", True),
    ("stride 3, output_padding 1, window (2,3,2)", (1, 8, 5, 6, 4), 7, (4, 4, 4), (3, 3, 3), (1, 1, 1), (1, 1, 1), (2, 3, 2), "none", "sum", True),
    ("kernel < stride, mean", (2, 8, 6, 5, 7), 9, (2, 2, 2), (3, 3, 3), (0, 0, 0), (0, 0, 0), (2, 2, 2), "none", "mean", True),
    ("gelu before pools, max, no bias", (1, 16, 5, 5, 5), 10, (3, 3, 3), (2, 2, 2), (1, 1, 1), (0, 0, 0), (3, 3, 3), "gelu_erf", "max", False),
    ("relu, window (1,2,2)", (2, 8, 4, 7, 6), 5, (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 2, 2), "relu", "sum", True),
    ("C 24 (padded to 32), wide W: w-chunks", (2, 24, 5, 6, 40), 33, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (2, 2, 2), "none", "sum", True),
    ("stride 1, window 6: 2 h-groups, 4 tile groups", (1, 16, 9, 10, 11), 64, (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (6, 6, 6), "none", "max", True),
    ("C 4, anisotropic", (2, 4, 6, 5, 9), 3, (2, 3, 4), (2, 1, 3), (0, 1, 2), (1, 0, 2), (3, 2, 2), "silu", "mean", True),
    ("C 64, K 64, seed geometry small", (1, 64, 6, 6, 6), 64, (5, 5, 5), (2, 2, 2), (2, 2, 2), (0, 0, 0), (6, 6, 6), "gelu_erf", "sum", True),
]


SEED = ("seed", (16, 32, 32, 32, 32), 64, (5, 5, 5), (2, 2, 2), (2, 2, 2), (0, 0, 0), (6, 6, 6), "none", "sum", True)


def time_seed(lib, x, wp, b, out, spec, mode):
    t = time_cuda(lambda: run(lib, x, wp, b, out, spec, mode), repeats=20)
    return t["median_ms"], t["min_ms"]


def main():
    if os.environ.get("FF_PROBE_BUILD_ONLY") == "1":   # prebuild the variants here (no GPU), carry FF_PROBE_SO_DIR
        for variant in VARIANTS:
            build(variant)
        return
    fails = 0
    for variant in VARIANTS:
        lib = build(variant)
        for name, shape, K, T, s, p, op, win, act, red, has_bias in ([] if NCU else CASES) + [SEED]:
            # "NCDHW+1": an NCDHW view one element past a 16-byte boundary (the per-element loader, not the 16-byte one)
            for layout, dtype in [(lay, dt) for dt in DTYPES for lay in ("channels_last", "NCDHW", "NCDHW+1")]:
                torch.manual_seed(len(name))
                mode = "ieee" if dtype == "ieee" else "tf32"
                dt = torch.float32 if dtype == "ieee" else getattr(torch, dtype)
                x = torch.randn(shape, device="cuda").to(dt)
                if layout == "channels_last":
                    x = x.contiguous(memory_format=torch.channels_last_3d)
                elif layout == "NCDHW+1":
                    x = torch.empty(x.numel() + 8, device="cuda", dtype=dt)[1:1 + x.numel()].view(x.shape).copy_(x)
                w = (torch.randn(shape[1], K, *T, device="cuda") / (shape[1] * T[0] * T[1] * T[2]) ** 0.5).to(dt)
                b = torch.randn(K, device="cuda") if has_bias else None     # the product path passes an fp32 bias
                spec = make_spec(x, K, T, s, p, op, win, act, red, has_bias)
                ref = float64_reference(spec, x, w, b)
                out = torch.full(ref.shape, float("nan"), device="cuda", dtype=dt)   # the kernel writes the input's dtype
                wp = pack_weights(w, s, dt, mode)
                layout = f"{layout} {dtype}"
                why = run(lib, x, wp, b, out, spec, mode)
                if why:
                    print(f"[{variant}] {name} {layout}: unsupported: {why}")
                    continue
                torch.cuda.synchronize()
                err = (out.double() - ref).norm().item() / max(ref.norm().item(), 1e-30)
                ok = err <= BOUND[dtype] and not torch.isnan(out).any().item()
                if "SKIP" in variant:      # stage-isolation builds: timing only
                    if name != "seed":
                        continue
                    ok = True
                fails += not ok
                print(f"[{variant}] {name} {layout}: relerr {err:.2e} maxabs {(out.double() - ref).abs().max().item():.2e} "
                      f"{'ok' if ok else 'FAIL'}", flush=True)
                if name == "seed" and not NCU:
                    med, mn = time_seed(lib, x, wp, b, out, spec, mode)
                    print(f"[{variant}] seed {layout} fused B (kernel only): median {med:.3f} ms, min {mn:.3f}", flush=True)
    print(f"failures: {fails}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
