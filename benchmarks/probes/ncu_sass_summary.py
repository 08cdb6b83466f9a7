"""Summarise an Nsight Compute per-SASS-instruction export (device_run.sh stage ncu-a-sass:
`ncu --section SourceCounters
--section WarpStateStats --page source --csv --print-source sass`, gzipped) of the fused family-A kernel: instructions
executed per warp and tile, by opcode, with each opcode's share of the stall samples; the stall reasons;
the instructions
holding the most samples.  Tiles = N x P x ceil(Q / 128) (64 x 128 accumulators, one warpgroup = 4 warps each).

    python3 benchmarks/ncu_sass_summary.py FILE.csv.gz [--tiles T]     (default T: the seed, 128 x 254 x 2)
"""
import argparse
import collections
import csv
import gzip
import re


def load(path):
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith('"Address"'))
    rows = csv.reader(lines[start:])
    hdr = next(rows)
    return hdr, [dict(zip(hdr, r)) for r in rows if len(r) >= len(hdr)]


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--tiles", type=int, default=128 * 254 * 2)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    hdr, rows = load(a.path)
    wt = a.tiles * 4
    samples = lambda r: num(r["Warp Stall Sampling (All Samples)"])
    executed = lambda r: num(r["Instructions Executed"])
    tot_s = sum(map(samples, rows)) or 1.0
    print(f"{a.path}: {sum(map(executed, rows)) / wt:.1f} instructions executed per warp and tile, {tot_s:.0f} samples")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    agg = {h[6:]: sum(num(r[h]) for r in rows) for h in stalls}
    print("stall reasons (% of samples):", ", ".join(f"{k} {100 * v / tot_s:.1f}" for k, v in
                                                   sorted(agg.items(), key=lambda x: -x[1]) if v > 0))
    ex, sm = collections.Counter(), collections.Counter()
    for r in rows:
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r["Source"])
        op = m.group(2) if m else r["Source"].strip()
        ex[op] += executed(r)
        sm[op] += samples(r)
    print("opcode: executed per warp and tile, % of samples")
    for op, v in ex.most_common(30):
        print(f"  {op:12s} {v / wt:7.1f}  {100 * sm[op] / tot_s:5.1f} %")
    print(f"the {a.top} instructions with the most samples: % of samples, executed per warp and tile, "
          "top stall reasons")
    for r in sorted(rows, key=samples, reverse=True)[:a.top]:
        s = samples(r)
        top = sorted(((num(r[h]), h[6:]) for h in stalls), reverse=True)[:2]
        print(f"  {100 * s / tot_s:5.1f} % {executed(r) / wt:6.2f}  {r['Source'].strip()[:64]:64s} "
              + " ".join(f"{n} {100 * v / max(s, 1):.0f}%" for v, n in top))


if __name__ == "__main__":
    main()
