"""Family A beyond the seed: fused vs fallback vs eager over a grid of common Conv2d shapes, in one process.

Each row is `fullfuse bench`'s measurement (fullfuse.bench.bench_family: CUDA events, L2 flushed, median, checked
against float64) for one (input shape, conv, dtype, layout); the fused row records which kernel served it (`.plans`).
Writes benchmarks/results/general_a_<commit>_<GPU>_<torch>_<CUDA>.json and prints a markdown table (ms, and fused /
fallback).

    python3 benchmarks/general_a.py [--out DIR] [--repeats N] [--quick]
        [--modes float32:auto float32:ieee ...] [--tag T]

"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fullfuse.bench import bench_family
from fullfuse.measure import environment, result_stem

# (input shape, conv = (out_channels, kernel, stride, padding), what it exercises)
GRID = [
    ((32, 8, 256, 256), (64, 3, 1, 0), "the seed's conv, 1/4 of its batch"),
    ((32, 8, 256, 256), (32, 3, 1, 0), "32 output channels"),
    ((32, 8, 256, 256), (128, 3, 1, 0), "128 output channels"),
    ((32, 8, 256, 256), (256, 3, 1, 0), "256 output channels"),
    ((32, 8, 256, 256), (64, 3, 2, 1), "stride 2"),
    ((32, 8, 256, 256), (64, 5, 1, 2), "5x5"),
    ((32, 16, 256, 256), (64, 3, 1, 1), "16 input channels"),
    ((32, 16, 256, 256), (64, 1, 1, 0), "1x1"),
    ((32, 3, 224, 224), (64, 3, 1, 1), "RGB input"),
    ((32, 3, 224, 224), (64, 7, 2, 3), "7x7 stride-2 stem"),
    ((512, 8, 64, 64), (64, 3, 1, 0), "64-pixel rows"),
    ((2048, 8, 32, 32), (64, 3, 1, 0), "32-pixel rows"),
    ((32, 8, 255, 255), (64, 3, 1, 0), "odd width"),
    ((32, 32, 128, 128), (64, 3, 1, 1), "32 input channels"),
    ((32, 16, 256, 256), (64, 3, 2, 1), "stride 2, 16 input channels"),
    ((32, 3, 224, 224), (64, 3, 2, 1), "RGB input, stride 2"),
    ((128, 8, 128, 128), (64, 3, 2, 1), "stride 2, 64-pixel output rows"),
    ((288, 8, 50, 50), (64, 3, 1, 0), "48-pixel rows"),
    ((32, 24, 128, 128), (64, 3, 1, 1), "24 input channels"),
    ((32, 16, 128, 128), (64, 3, 1, 1), "16 input channels, 128-pixel rows"),
    ((32, 16, 128, 128), (64, 5, 1, 2), "5x5 over 16 input channels, 128-pixel rows"),
    ((32, 8, 128, 128), (64, 7, 1, 3), "7x7 over 8 input channels, 128-pixel rows"),
]
QUICK = [0, 2, 10, 11]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", type=int, default=None, help="indices into GRID")
    ap.add_argument("--modes", nargs="*", default=["float32:auto", "bfloat16:auto"], help="dtype:precision")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("general_a: needs a CUDA GPU")
        return 1
    env = environment()
    print(f"general_a on {env['gpu']}: torch {env['torch']}, CUDA {env['cuda']}, commit {env['commit']}", flush=True)
    grid = [GRID[i] for i in (args.only if args.only is not None else QUICK if args.quick else range(len(GRID)))]
    results = []
    for shape, conv, what in grid:
        for dtype, precision in (m.split(":") for m in args.modes):
            for channels_last in (False, True):
                print(f"{shape} conv {conv} {dtype} {precision} {'channels_last' if channels_last else 'NCHW'}: {what}",
                      flush=True)
                res = bench_family("A", shape, dtype, precision, channels_last, ("eager", "fallback", "fused"),
                                   args.repeats, conv=conv)
                res["what"], res["conv_args"] = what, list(conv)
                results.append(res)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result_stem('general_a' + ('_' + args.tag if args.tag else ''))}.json"
    path.write_text(json.dumps({"environment": env, "results": results}, indent=1))
    print(table(results))
    print(f"wrote {path}")
    return 0


def table(results) -> str:
    """Markdown: one line per (shape, conv, dtype), NCHW / channels_last in each cell."""
    lines = ["| x | conv (out, k, s, p) | dtype | eager | fallback | fused | fused / fallback | fused kernel |",
             "|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in results:
        groups.setdefault((tuple(r["shape"]), tuple(r["conv_args"]), f"{r['dtype']} {r['mode']}"), {})[r["layout"]] = r
    for (shape, conv, dtype), by_layout in groups.items():
        cells, kernels = {v: [] for v in ("eager", "fallback", "fused", "ratio")}, []
        for layout in ("contiguous", "channels_last"):
            rows = {row["variant"]: row for row in by_layout[layout]["rows"]} if layout in by_layout else {}
            ms = {v: rows[v]["median_ms"] if rows.get(v, {}).get("available") else None
                  for v in ("eager", "fallback", "fused")}
            for v in ("eager", "fallback", "fused"):
                cells[v].append(f"{ms[v]:.3f}" if ms[v] is not None else "-")
            ran = rows.get("fused", {}).get("ran", [None])[0] if rows.get("fused", {}).get("available") else None
            fused_ms = ms["fused"] if ran == "fused" else None
            cells["ratio"].append(f"{fused_ms / ms['fallback']:.2f}" if fused_ms and ms["fallback"] else "-")
            if rows.get("fused", {}).get("available"):
                kernels.append(f"{ran}: {rows['fused']['reasons'][0]}")
        lines.append(f"| {shape} | {conv} | {dtype} | " + " | ".join(" / ".join(cells[v]) for v in cells) + " | "
                     + (" / ".join(dict.fromkeys(kernels)) or "-") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
