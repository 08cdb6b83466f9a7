"""Standalone probe for csrc/fused_conv_act_pool.cu (family A: Conv2d -> activation -> global mean/max pool, fused).

Loads the library with ctypes (FF_FUSED_A_SO=path, else compiles it with nvcc into /tmp), checks it against a
float64 reference (torch.float64 conv on the GPU) on fresh random inputs with the output poisoned with NaN first,
over the seed problem and odd shapes, for every precision/dtype/layout/pool/reduction mode, then times the seed
(CUDA events, warm-up, median of >= 30, 256 MB L2 flush before each run) and prints a table; JSON goes to $OUT.

Env: FF_FUSED_A_SO, FF_PROBE_QUICK=1 (fewer cases), FF_PROBE_REPS (timed runs, default 40),
FF_PROBE_VARIANTS (';'-separated list of 'VAR=VAL,VAR=VAL' env settings to time, e.g. 'FF_FUSED_A_IMPL=1'; the
library reads its knobs once per process, so each variant runs in a child process; prefix a variant with 'check:' to
also run the quick correctness pass under it), FF_PROBE_TIME_ALL=1 (time every pool/det/act combination per mode), FF_PROBE_SKIP_TIME=1, FF_PROBE_SKIP_CHECK=1,
FF_PROBE_MODES=tf32,ieee,bf16,fp16 / FF_PROBE_LAYOUTS=0,1 / FF_PROBE_CASES=substr|substr (filters), FF_PROBE_VERBOSE=1.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops.builder import compile_command
from fullfuse.launch import bind

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "csrc" / "fused_conv_act_pool.cu"

DT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
ACTS = {"none": 0, "relu": 1, "gelu_erf": 2, "gelu_tanh": 3, "silu": 4}
TOL = {"tf32": 1e-3, "ieee": 1e-5, "bf16": 1e-2, "fp16": 2e-3}


def load_lib(so=None):
    so = so or os.environ.get("FF_FUSED_A_SO")
    if not so:
        so = "/tmp/ff_fused_a_probe.so"
        cmd = compile_command(cutlass_ops.LIBRARIES["fused_conv_act_pool"], SRC, Path(so))   # the product's flags
        t = time.time()
        subprocess.run(cmd, check=True)
        print(f"compiled in {time.time() - t:.0f} s", flush=True)
    return bind(ctypes.CDLL(so), "fused_conv_act_pool")   # the product's ctypes signatures


class Case:
    def __init__(self, name, N, C, H, W, K, R, S, stride=(1, 1), pad=(0, 0), dil=(1, 1), bias=True):
        self.name, self.N, self.C, self.H, self.W, self.K, self.R, self.S = name, N, C, H, W, K, R, S
        self.stride, self.pad, self.dil, self.bias = stride, pad, dil, bias

    def args(self, dtype_code, cl, act, pool, prec, det):
        return [dtype_code, cl, self.N, self.C, self.H, self.W, self.K, self.R, self.S, self.stride[0], self.stride[1],
                self.pad[0], self.pad[1], self.dil[0], self.dil[1], act, pool, prec, det, 0, 1, 1, 0, 1]   # (no depth)


def make_inputs(c: Case, gen_seed=0):
    g = torch.Generator(device="cuda").manual_seed(gen_seed)
    x = torch.rand(c.N, c.C, c.H, c.W, device="cuda", generator=g)
    bound = 1.0 / (c.C * c.R * c.S) ** 0.5
    w = (torch.rand(c.K, c.C, c.R, c.S, device="cuda", generator=g) * 2 - 1) * bound
    b = (torch.rand(c.K, device="cuda", generator=g) * 2 - 1) * bound if c.bias else None
    return x, w, b


def ref_conv64(c: Case, x, w, b):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), c.stride, c.pad, c.dil)


def ref_pool(y64, act, pool):
    if act == "relu":
        y64 = torch.relu(y64)
    elif act == "gelu_erf":
        y64 = F.gelu(y64)
    elif act == "gelu_tanh":
        y64 = F.gelu(y64, approximate="tanh")
    elif act == "silu":
        y64 = F.silu(y64)
    return y64.mean(dim=(2, 3)) if pool == 0 else y64.amax(dim=(2, 3))


def run_kernel(lib, c, xin, win, b, dtype, cl, act, pool, prec, det, out=None, ws=None):
    a = c.args(DT[dtype], cl, ACTS[act], pool, prec, det)
    why = lib.ff_fused_conv_act_pool_unsupported(*a)
    if why:
        return None, why.decode()
    nws = lib.ff_fused_conv_act_pool_workspace_bytes(*a)
    if out is None:
        out = torch.full((c.N, c.K), float("nan"), device="cuda")   # poisoned
    if pool == 0 and not det:
        out.zero_()              # atomic mean accumulates into a zero-filled out; other modes overwrite the NaN poison
    if ws is None:
        ws = torch.zeros(max(nws, 16), dtype=torch.uint8, device="cuda")
    rc = lib.ff_fused_conv_act_pool(xin.data_ptr(), win.data_ptr(), b.data_ptr() if b is not None else None,
                                    out.data_ptr(), *a, ws.data_ptr(), torch.cuda.current_stream().cuda_stream)
    if rc != 0:
        raise RuntimeError(f"kernel returned {rc}")
    return out, None


def seed_case(n, dtype, cl, seed):
    """The seed problem (C 8 -> K 64, 3x3, 256x256) with n images: (case, input in its layout, weights, bias)."""
    c = Case("seed", n, 8, 256, 256, 64, 3, 3)
    x, w, b = make_inputs(c, seed)
    _, xin, wd = prep(x, w, dtype, cl)
    return c, xin, wd, b


def seed_call(lib, case, dtype, cl, prec, det):
    """A closure that runs the fused kernel of ``lib`` on ``case`` (GELU erf, mean pool) with its own workspace."""
    c, xin, wd, b = case
    a = c.args(DT[dtype], cl, ACTS["gelu_erf"], 0, prec, det)
    ws = torch.zeros(max(lib.ff_fused_conv_act_pool_workspace_bytes(*a), 16), dtype=torch.uint8, device="cuda")
    out = torch.zeros(c.N, c.K, device="cuda")
    return lambda: run_kernel(lib, c, xin, wd, b, dtype, cl, "gelu_erf", 0, prec, det, out, ws)


def modes():
    # (label, dtype, prec); FF_PROBE_MODES=tf32,bf16 restricts
    allm = [("tf32", torch.float32, 0), ("ieee", torch.float32, 1), ("bf16", torch.bfloat16, 0), ("fp16", torch.float16, 0)]
    want = os.environ.get("FF_PROBE_MODES")
    return [m for m in allm if not want or m[0] in want.split(",")]


def layouts():
    want = os.environ.get("FF_PROBE_LAYOUTS")   # "0", "1" or "0,1"
    return [cl for cl in (0, 1) if not want or str(cl) in want.split(",")]


def prep(x, w, dtype, cl):
    xd = x.to(dtype)
    xin = xd.contiguous(memory_format=torch.channels_last) if cl else xd.contiguous()
    return xd, xin, w.to(dtype).contiguous()


def check_all(lib, quick):
    cases = [
        Case("seed", 128, 8, 256, 256, 64, 3, 3),
        Case("N1 C3 37x45 K40 nobias", 1, 3, 37, 45, 40, 3, 3, bias=False),
        Case("C8 33x50 s2 p1", 2, 8, 33, 50, 64, 3, 3, stride=(2, 2), pad=(1, 1)),
        Case("C5 40x31 p1 d2 K16", 3, 5, 40, 31, 16, 3, 3, pad=(1, 1), dil=(2, 2)),
        Case("C8 20x300 K72 1x1", 2, 8, 20, 300, 72, 1, 1),
        Case("C16 1x3 p(0,1) K130", 2, 16, 19, 23, 130, 1, 3, pad=(0, 1)),
        Case("C8 12x5000 K64 (segments)", 1, 8, 12, 5000, 64, 3, 3),
        Case("C24 3x1 s(1,2) H17 W9", 2, 24, 17, 9, 33, 3, 1, stride=(1, 2)),
        Case("N5 C8 70x300 K64 (2 segs, blocks span images)", 5, 8, 70, 300, 64, 3, 3, pad=(1, 1)),
        Case("C16 1x3 K64 (2 ch groups)", 3, 16, 21, 40, 64, 1, 3),
        Case("C8 3x3 s(2,1) K48", 2, 8, 41, 37, 48, 3, 3, stride=(2, 1)),
        Case("C4 5x1 d(2,1) K20 p(3,0)", 2, 4, 29, 33, 20, 5, 1, pad=(3, 0), dil=(2, 1)),
        Case("C8 3x3 K64 W=1 H=300", 2, 8, 300, 3, 64, 3, 3),
        Case("C8 3x3 p(1,2) 30x64 (NCHW quads start 2 columns early)", 2, 8, 30, 64, 64, 3, 3, pad=(1, 2)),
        Case("C4 3x3 p(0,3) 9x36 K16 (NCHW quads, 4 channels)", 2, 4, 9, 36, 16, 3, 3, pad=(0, 3)),
        # more than 9 K units: the sm_90 kernel's general op chain (the mma.sync kernel holds at most 9)
        Case("C16 3x3 p1 K64 (18 K units)", 2, 16, 30, 300, 64, 3, 3, pad=(1, 1)),
        Case("C3 7x7 p3 K48 (stem, 49 K units)", 2, 3, 45, 60, 48, 7, 7, pad=(3, 3)),
        Case("C24 3x3 K64 (27 K units: one block per SM, fallback by default)", 1, 24, 20, 70, 64, 3, 3),
        Case("C8 5x5 p2 K64 (26 ops)", 2, 8, 30, 270, 64, 5, 5, pad=(2, 2)),
    ]
    results, fails = [], 0
    only = os.environ.get("FF_PROBE_CASES")       # '|'-separated substrings of case names
    if only:
        cases = [c for c in cases if any(o in c.name for o in only.split("|"))]
    verbose = os.environ.get("FF_PROBE_VERBOSE") == "1"
    for c in cases:
        x, w, b = make_inputs(c, 1)
        ref_cache = {}
        for label, dtype, prec in modes():
            for cl in layouts():
                xd, xin, wd = prep(x, w, dtype, cl)
                key = dtype
                if key not in ref_cache:
                    ref_cache[key] = ref_conv64(c, xd, wd, b)
                y64 = ref_cache[key]
                combos = []
                acts = list(ACTS) if (c.name == "seed" and cl == 0) or c.name.startswith("N1") else ["gelu_erf"]
                for act in acts:
                    combos.append((act, 0, 0))
                if not quick or c.name != "seed" or (label == "tf32" and cl == 0) or label == "ieee":
                    combos += [("gelu_erf", 0, 1), ("gelu_erf", 1, 0), ("gelu_erf", 1, 1), ("relu", 1, 0)]
                for act, pool, det in combos:
                    out, why = run_kernel(lib, c, xin, wd, b, dtype, cl, act, pool, prec, det)
                    if why:
                        results.append(dict(case=c.name, mode=label, cl=cl, act=act, pool=pool, det=det, unsupported=why))
                        print(f"  {c.name:28s} {label:5s} cl={cl} {act:9s} pool={pool} det={det}: UNSUPPORTED {why}")
                        continue
                    torch.cuda.synchronize()
                    ref = ref_pool(y64, act, pool)
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    maxabs = (out.double() - ref).abs().max().item()
                    ok = err <= TOL[label] and bool(torch.isfinite(out).all())
                    bitsame = None
                    if det or pool == 1:
                        out2, _ = run_kernel(lib, c, xin, wd, b, dtype, cl, act, pool, prec, det)
                        bitsame = bool(torch.equal(out.view(torch.int32), out2.view(torch.int32)))
                        ok = ok and bitsame
                    fails += not ok
                    e32 = None
                    if dtype != torch.float32 and torch.float32 in ref_cache:   # end to end vs the fp32 model in float64
                        r32 = ref_pool(ref_cache[torch.float32], act, pool)
                        e32 = ((out.double() - r32).norm() / r32.norm()).item()
                    results.append(dict(case=c.name, mode=label, cl=cl, act=act, pool=pool, det=det, rel_err=err,
                                        max_abs=maxabs, ok=ok, repeat_bitwise=bitsame, rel_err_vs_fp32_model=e32))
                    if verbose or not ok or c.name == "seed" or act == "gelu_erf":
                        print(f"  {c.name:28s} {label:5s} cl={cl} {act:9s} pool={pool} det={det}: rel {err:.2e} "
                              f"maxabs {maxabs:.2e} {'ok' if ok else 'FAIL'}" + ("" if bitsame is None else f" bits={bitsame}")
                              + ("" if e32 is None else f" vs_fp32_model {e32:.2e}"),
                              flush=True)
        del ref_cache
        torch.cuda.empty_cache()
    # unsupported report
    for c in [Case("C64 3x3 (72 K units)", 1, 64, 32, 32, 64, 3, 3), Case("W huge dilation", 1, 8, 8, 64, 8, 3, 3, dil=(1, 200))]:
        why = lib.ff_fused_conv_act_pool_unsupported(*c.args(0, 0, 2, 0, 0, 0))
        print(f"  unsupported check {c.name}: {why.decode() if why else 'SUPPORTED'}")
        results.append(dict(case=c.name, unsupported=why.decode() if why else None))
    return results, fails


def time_seed(lib, reps, variants):
    c = Case("seed", 128, 8, 256, 256, 64, 3, 3)
    x, w, b = make_inputs(c, 2)
    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    rows = []
    for var in variants:
        for label, dtype, prec in modes():
            for cl in layouts():
                xd, xin, wd = prep(x, w, dtype, cl)
                for act, pool, det in [("gelu_erf", 0, 0), ("gelu_erf", 0, 1), ("gelu_erf", 1, 0), ("none", 0, 0)]:
                    if (act, pool, det) != ("gelu_erf", 0, 0) and os.environ.get("FF_PROBE_TIME_ALL") != "1" and (
                            var or label not in ("tf32", "bf16") or cl != 0):
                        continue
                    a = c.args(DT[dtype], cl, ACTS[act], pool, prec, det)
                    nws = lib.ff_fused_conv_act_pool_workspace_bytes(*a)
                    out = torch.zeros(c.N, c.K, device="cuda")
                    ws = torch.zeros(max(nws, 16), dtype=torch.uint8, device="cuda")
                    stream = torch.cuda.current_stream().cuda_stream

                    def call():
                        out.zero_()
                        rc = lib.ff_fused_conv_act_pool(xin.data_ptr(), wd.data_ptr(), b.data_ptr(), out.data_ptr(), *a,
                                                        ws.data_ptr(), stream)
                        assert rc == 0, rc
                    for _ in range(5):
                        call()
                    ts = []
                    for _ in range(reps):
                        flush.fill_(1.0)
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        call()
                        e1.record()
                        e1.synchronize()
                        ts.append(e0.elapsed_time(e1))
                    ts.sort()
                    med = ts[len(ts) // 2]
                    tflops = 2 * c.N * c.K * 254 * 254 * c.C * 9 / (med * 1e-3) / 1e12
                    row = dict(variant=var or "default", mode=label, cl=cl, act=act, pool=pool, det=det, median_ms=med,
                               min_ms=ts[0], tflops=tflops)
                    rows.append(row)
                    print(f"  {row['variant']:24s} {label:5s} cl={cl} {act:9s} pool={pool} det={det}: median {med:.4f} ms "
                          f"(min {ts[0]:.4f}) {tflops:6.1f} TFLOP/s", flush=True)
    return rows


def main():
    quick = os.environ.get("FF_PROBE_QUICK") == "1"
    reps = int(os.environ.get("FF_PROBE_REPS", "40"))
    variants = [v for v in os.environ.get("FF_PROBE_VARIANTS", "").split(";") if v]
    lib = load_lib()
    if os.environ.get("FF_PROBE_CHILD") != "1":
        os.environ["FF_FUSED_A_SO"] = os.environ.get("FF_FUSED_A_SO") or "/tmp/ff_fused_a_probe.so"
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    res = {}
    if os.environ.get("FF_PROBE_SKIP_CHECK") != "1":
        print("== correctness vs float64 ==", flush=True)
        res["checks"], fails = check_all(lib, quick)
        res["check_failures"] = fails
        print(f"check failures: {fails}", flush=True)
    print("== timing, seed (128x8x256x256 -> 64, 3x3), median of %d, L2 flushed ==" % reps, flush=True)
    label = os.environ.get("FF_PROBE_LABEL", "")
    if os.environ.get("FF_PROBE_SKIP_TIME") == "1":
        return
    res["timing"] = time_seed(lib, reps, [label])
    if os.environ.get("OUT"):
        tag = "".join(ch if ch.isalnum() else "_" for ch in label)
        Path(os.environ["OUT"], f"probe_fused_a{('_' + tag) if tag else ''}.json").write_text(json.dumps(res, indent=1))
    if os.environ.get("FF_PROBE_CHILD") == "1":
        return
    for var in variants:
        check = var.startswith("check:")
        var = var[len("check:"):] if check else var
        env = dict(os.environ, FF_PROBE_CHILD="1", FF_PROBE_LABEL=var, FF_PROBE_QUICK="1",
                   FF_PROBE_SKIP_CHECK="0" if check else "1")
        for kv in filter(None, var.split(",")):
            k, v = kv.split("=")
            env[k] = v
        print(f"== variant {var} (child process{', with checks' if check else ''}) ==", flush=True)
        subprocess.run([sys.executable, __file__], env=env, check=False)


if __name__ == "__main__":
    main()
