"""Host time per call: the same call signature repeated, isolated calls (no other work queued), per path, at a tiny, a
small and the seed shape of each family, with one eager PyTorch op's cost beside it.

    python benchmarks/host_time.py [--out benchmarks/results]

Per row: the wall time per call of back-to-back calls, synchronised at the end, best of 5 rounds (µs); at the tiny
and small shapes the GPU finishes each kernel before the host issues the next, so this is the host time of a call.
"auto" is what fused_model() runs by default (its first-call measurement done before timing); "auto ran" says which
path it kept.  The seed shapes are GPU-bound: their rows show GPU time, for scale.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import fullfuse
from fullfuse.first_call import per_call_ms
from fullfuse.measure import environment, result_stem
from fullfuse.seed_models import SEED_SHAPE, seed_model

SHAPES = {"A": [("tiny", (1, 8, 16, 16)), ("small", (4, 8, 64, 64)), ("seed", SEED_SHAPE["A"])],
          "B": [("tiny", (1, 32, 4, 4, 4)), ("small", (2, 32, 8, 8, 8)), ("seed", SEED_SHAPE["B"])]}


def per_call_us(fn, calls: int) -> float:
    return 1e3 * per_call_ms(fn, torch.device("cuda"), rounds=5, calls=calls)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    one = torch.randn(64, device="cuda")
    rows = []
    with torch.inference_mode():
        eager_op = per_call_us(lambda: torch.nn.functional.gelu(one), 500)
        for family, shapes in SHAPES.items():
            model = seed_model(family).cuda().eval()
            for size, shape in shapes:
                x = torch.randn(shape, device="cuda")
                calls = 20 if size == "seed" else 300
                row = {"family": family, "size": size, "shape": list(shape),
                       "eager_us": per_call_us(lambda: model(x), calls)}
                for path in ("fused", "fallback", "auto"):
                    fused = fullfuse.fused_model(model, path=path)
                    try:
                        row[f"{path}_us"] = per_call_us(lambda: fused(x), calls)
                    except fullfuse.UnsupportedError as exc:
                        row[f"{path}_us"] = None
                        row[f"{path}_why"] = str(exc)[:120]
                    if path == "auto":
                        row["auto_ran"] = fused.plans[0].last_path
                row["eager_op_us"] = eager_op
                rows.append(row)
                print(" ".join(f"{k}={round(v, 1) if isinstance(v, float) else v}" for k, v in row.items()),
                      flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result_stem('host_time')}.json"
    path.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
