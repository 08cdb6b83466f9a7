"""Probe (device): where a fused family-A call spends its time inside fa_wgmma_kernel, block by block — a build with
-DFF_FUSED_A_DIAG stamps %globaltimer per block at entry, after the setup (weights, descriptor table), when the first
input rows have landed, after the line loop and at exit (csrc/fused_conv_act_pool/wgmma_params.cuh, fa_diag_t).  One call per case
after the benchmark's L2 flush and host lead; times in us from the first block's entry.

    FF_FUSED_A_SO=/path/diag.so PYTHONPATH=. python3 benchmarks/probe_timeline_a.py
"""
import ctypes
import statistics
from collections import Counter

import torch

from fullfuse.measure import environment, time_cuda
from probe_fused_a import load_lib, seed_call, seed_case

lib = load_lib()
lib.ff_fused_a_diag_times.argtypes = [ctypes.c_void_p, ctypes.c_int]
MAXB = 4096


def stamps():
    buf = (ctypes.c_ulonglong * (MAXB * 8))()
    assert lib.ff_fused_a_diag_times(buf, MAXB) == 0
    return [list(buf[i * 8:(i + 1) * 8]) for i in range(MAXB)]


def q(v):
    v = sorted(v)
    return f"{v[0]:7.1f} {v[len(v) // 4]:7.1f} {statistics.median(v):7.1f} {v[3 * len(v) // 4]:7.1f} {v[-1]:7.1f}"


print("# environment:", environment())
for label, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16)):
    for n, det in ((1, 1), (8, 1), (128, 1), (128, 0)):
        call = seed_call(lib, seed_case(n, dtype, 1, 3), dtype, 1, 0, det)
        ms = time_cuda(call, repeats=10)["median_ms"]
        before = stamps()
        time_cuda(call, repeats=1, warmup=1)   # the last call's stamps: flushed, lead, as timed
        after = stamps()
        rows = [r for r, o in zip(after, before) if r[0] != o[0]]
        t0 = min(r[0] for r in rows)
        rel = [[(r[i] - t0) / 1e3 for i in range(5)] for r in rows]
        print(f"\n{label} N={n} det={det}: {len(rows)} blocks, event-timed median {ms * 1e3:.1f} us, kernel span "
              f"{max(r[4] for r in rel):.1f} us (first entry to last exit)")
        print("                         min     25%  median     75%     max   (us)")
        print("  entry               ", q([r[0] for r in rel]))
        print("  setup (1 - 0)       ", q([r[1] - r[0] for r in rel]))
        landed = [r for r in rel if r[2] >= r[1]]   # stamp 2 is taken by the copy loaders only (not the TMA ones)
        if landed:
            print("  first rows (2 - 1)  ", q([r[2] - r[1] for r in landed]))
            print("  loop (3 - 2)        ", q([r[3] - r[2] for r in landed]))
        else:
            print("  first rows          ", "(not stamped: TMA loader, its first rows land inside the loop)")
            print("  loop (3 - 1)        ", q([r[3] - r[1] for r in rel]))
        print("  flush (4 - 3)       ", q([r[4] - r[3] for r in rel]))
        print("  exit                ", q([r[4] for r in rel]))
        lines = [r[6] for r in rows]
        per_sm = Counter(r[5] for r in rows)
        if n == 128:   # is the spread of the loop times per block, per SM, or per piece count?
            G = len(rows)
            L = n * 254
            loop = {i: (r[3] - (r[2] if r[2] >= r[1] else r[1])) / 1e3 for i, r in enumerate(after) if r[0] != before[i][0]}
            pieces = {i: 1 + ((i + 1) * L // G - 1) // 254 - (i * L // G) // 254 for i in loop}
            sm_of = {i: after[i][5] for i in loop}
            by_sm = {}
            for i, v in loop.items():
                by_sm.setdefault(sm_of[i], []).append(v)
            sm_mean = sorted(statistics.mean(v) for v in by_sm.values())
            within = statistics.median(max(v) - min(v) for v in by_sm.values())
            print(f"  per-SM mean loop: min {sm_mean[0]:.1f} median {statistics.median(sm_mean):.1f} max {sm_mean[-1]:.1f};"
                  f" median spread inside an SM {within:.1f} us")
            for k in (1, 2):
                v = [loop[i] for i in loop if pieces[i] == k]
                if v:
                    print(f"  blocks with {k} piece(s): {len(v)}, loop median {statistics.median(v):.1f} us")
            nsm = torch.cuda.get_device_properties(0).multi_processor_count
            for wv in range((G + nsm - 1) // nsm):   # launch waves: blocks wv * nsm .. (wv + 1) * nsm - 1
                v = [loop[i] for i in loop if i // nsm == wv]
                ex = [(after[i][4] - t0) / 1e3 for i in loop if i // nsm == wv]
                print(f"  wave {wv} (blocks {wv * nsm}..{min(G, (wv + 1) * nsm) - 1}): loop median {statistics.median(v):.1f}"
                      f" (min {min(v):.1f}, max {max(v):.1f}) us, exit median {statistics.median(ex):.1f} us")
            order = sorted(loop, key=loop.get)
            print("  fastest (block, SM, loop us):", [(i, sm_of[i], round(loop[i], 1)) for i in order[:6]])
            print("  slowest (block, SM, loop us):", [(i, sm_of[i], round(loop[i], 1)) for i in order[-6:]])
        print(f"  lines per block {min(lines)}..{max(lines)}; blocks per SM {min(per_sm.values())}..{max(per_sm.values())}"
              f" over {len(per_sm)} SMs")
