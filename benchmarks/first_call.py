"""Time to a fused model's first answer on a machine whose kernel cache is empty: import, trace, compile (NVRTC) and
load the kernels, plan, and run the first call, for one family, in a fresh process.

    FULLFUSE_CACHE_DIR=$(mktemp -d) python benchmarks/first_call.py A [--dtype float32] [--layout contiguous]

Prints one JSON line: seconds for import, fused_model (trace + match), the first call (compile + load + plan + run,
"auto"'s first-call measurement included), a second call, and the path the call took.  Run it once per family, each
in a new process with a new cache directory: a cubin cached by the first would shorten the second.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

start = time.perf_counter()
import torch  # noqa: E402

import fullfuse  # noqa: E402
from fullfuse.seed_models import SEED_SHAPE, seed_model  # noqa: E402

imported = time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("family", choices=["A", "B"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "channels_last"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = seed_model(args.family).cuda().to(dtype).eval()
    x = torch.randn(SEED_SHAPE[args.family], device="cuda", dtype=dtype)
    if args.layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fused = fullfuse.fused_model(model)
    t1 = time.perf_counter()
    with torch.inference_mode():
        fused(x)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        fused(x)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
    plans = [f"{p.last_path}: {p.last_reason}" for p in fused.plans]
    print(json.dumps({"family": args.family, "dtype": args.dtype, "layout": args.layout,
                      "cache": os.environ.get("FULLFUSE_CACHE_DIR", "default"),
                      "import_s": round(imported - start, 2), "fused_model_s": round(t1 - t0, 2),
                      "first_call_s": round(t2 - t1, 2), "second_call_s": round(t3 - t2, 4),
                      "total_s": round(t2 - start, 2), "plans": plans}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
