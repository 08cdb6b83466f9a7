"""`auto` (what fused_model() runs by default) against eager PyTorch, per call as a user's loop sees it, over family A's
general grid (benchmarks/general_a.py GRID) and tiny problems of both families, float32 and bfloat16, NCHW and
channels_last, in one process.

Per case the eager model and fused_model(model) take turns (fullfuse.measure.interleaved_host_us, after auto's
first call, which makes its measured choice): the best wall time per call of back-to-back calls synchronised at the
end (host and GPU time together, whichever is longer sets it; no L2 flush), best of ``--rounds`` rounds (15: where
auto runs PyTorch's ops on a host-bound problem the two tie, and with 5 rounds such a case landed at 0.87-1.07x of
eager between runs on the shared host), and the median host time of an isolated call.  ``ratio`` = eager / auto per
call: >= 1 where auto is at least as fast.  auto's output is checked against the model in float64 (TOLERANCE of its
precision).  Writes benchmarks/results/auto_vs_eager_<commit>_<GPU>_<torch>_<CUDA>.json after each case
("complete": whether all ran) and prints one line per case, then the lowest ratios.

    python3 benchmarks/auto_vs_eager.py [--out DIR] [--only-tiny] [--budget-s 0.1] [--rounds 15]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import fullfuse
from fullfuse.measure import environment, errors, interleaved_host_us, result_stem
from fullfuse.precision import TOLERANCE, cudnn_conv_precision, resolve
from fullfuse.seed_models import seed_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from general_a import GRID  # noqa: E402

# (family, input shape, family A's conv (out, k, s, p) or None, what it exercises)
TINY = [
    ("A", (1, 3, 20, 20), (64, 5, 2, 0), "5x5 stride 2 over 3 channels, one image"),
    ("A", (1, 8, 16, 16), (64, 3, 1, 0), "the seed's conv, one 16 x 16 image"),
    ("A", (4, 8, 64, 64), (64, 3, 1, 0), "the seed's conv, 4 images of 64 x 64"),
    ("A", (2, 3, 32, 32), (16, 3, 1, 1), "16 output channels, 32 x 32"),
    ("A", (8, 16, 16, 16), (32, 3, 1, 1), "16 -> 32 channels, 16 x 16"),
    ("B", (1, 32, 4, 4, 4), None, "seed B, one 4^3 volume"),
    ("B", (2, 32, 8, 8, 8), None, "seed B, two 8^3 volumes"),
    ("B", (1, 32, 6, 10, 8), None, "seed B, one 6 x 10 x 8 volume"),
    ("B", (4, 32, 12, 12, 12), None, "seed B, four 12^3 volumes"),
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def measure(family, shape, conv, dtype, channels_last, budget_s, rounds):
    torch.manual_seed(0)
    dims = len(shape) - 2
    model = seed_model(family, shape[1], dims, conv).cuda().to(DTYPES[dtype]).eval()
    x = torch.randn(shape, device="cuda", dtype=DTYPES[dtype])
    if channels_last:
        fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
        x, model = x.contiguous(memory_format=fmt), model.to(memory_format=fmt)
    with torch.no_grad(), cudnn_conv_precision("ieee"):
        ref = seed_model(family, shape[1], dims, conv).cuda().double()
        ref.load_state_dict(model.state_dict())
        want = ref(x.double())
    auto = fullfuse.fused_model(model)
    with torch.no_grad():
        t0 = time.perf_counter()
        got = auto(x)                     # its first call: the measured choice of path
        first_s = time.perf_counter() - t0
        err = errors(got, want)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) / 3
        calls = max(10, min(300, int(budget_s / per_call)))
        measured = interleaved_host_us({"eager": lambda: model(x), "auto": lambda: auto(x)}, calls, rounds=rounds)
    mode = resolve("auto", x.dtype)
    (eager_host, eager_us), (auto_host, auto_us) = measured["eager"], measured["auto"]
    return {"family": family, "shape": list(shape), "conv": list(conv) if conv else None, "dtype": dtype,
            "mode": mode, "layout": "channels_last" if channels_last else "contiguous", "calls": calls,
            "eager_us": eager_us, "auto_us": auto_us, "ratio": eager_us / auto_us,
            "eager_host_us": eager_host, "auto_host_us": auto_host,
            "auto_ran": [p.last_path for p in auto.plans], "why": [p.last_reason for p in auto.plans],
            "first_call_s": first_s, **err, "within_bound": err["relerr"] <= TOLERANCE[mode]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--only-tiny", action="store_true")
    ap.add_argument("--budget-s", type=float, default=0.1, help="eager time per round of back-to-back calls")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of back-to-back calls (the best counts)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("auto_vs_eager: needs a CUDA GPU")
        return 1
    env = environment()
    print(f"auto_vs_eager on {env['gpu']}: torch {env['torch']}, CUDA {env['cuda']}, commit {env['commit']}",
          flush=True)
    cases = list(TINY) + ([] if args.only_tiny else [("A", shape, conv, what) for shape, conv, what in GRID])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result_stem('auto_vs_eager')}.json"
    rows = []
    for family, shape, conv, what in cases:
        for dtype in DTYPES:
            for channels_last in (False, True):
                row = measure(family, shape, conv, dtype, channels_last, args.budget_s, args.rounds)
                row["what"] = what
                rows.append(row)
                print(f"{family} {tuple(shape)} {tuple(conv) if conv else ''} {dtype} {row['layout']}: eager "
                      f"{row['eager_us']:.1f} us, auto {row['auto_us']:.1f} us ({row['auto_ran'][0]}), ratio "
                      f"{row['ratio']:.2f}; host {row['eager_host_us']:.1f} / {row['auto_host_us']:.1f} us; relerr "
                      f"{row['relerr']:.1e}{'' if row['within_bound'] else ' OVER BOUND'}", flush=True)
                # written after each case: a run stopped part way keeps what it measured ("complete" says whether
                # every case ran)
                done = len(rows) == len(cases) * len(DTYPES) * 2
                path.write_text(json.dumps({"environment": env, "complete": done, "rows": rows}, indent=1))
    worst = sorted(rows, key=lambda r: r["ratio"])[:5]
    print("lowest eager / auto ratios: " + "; ".join(
        f"{r['family']} {tuple(r['shape'])} {r['dtype']} {r['layout']} {r['ratio']:.2f} ({r['auto_ran'][0]})"
        for r in worst))
    print(f"cases {len(rows)}, below 0.95: {sum(r['ratio'] < 0.95 for r in rows)}, over the error bound: "
          f"{sum(not r['within_bound'] for r in rows)}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
