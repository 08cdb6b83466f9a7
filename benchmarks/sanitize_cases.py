"""Cases for benchmarks/sanitize.sh: each runs fullfuse's own kernels once through fused_model(path=...) — both fused
kernels and both fallback epilogues at the seed shapes (N = 2) and three odd shapes each.

    python3 benchmarks/sanitize_cases.py --list                 # the case names
    python3 benchmarks/sanitize_cases.py CASE [CASE ...]        # run these cases once each, in one process
    python3 benchmarks/sanitize_cases.py --warm                 # load / build every library once, outside the sanitizer
    python3 benchmarks/sanitize_cases.py --summarize TOOL CASE LOG   # one summary line of a sanitizer log

A case prints the path and kernel that served it (`.plans`) and whether its output is finite.  The chunk-schedule tuning
of the fallback is off (it would run every candidate schedule: many more launches under the sanitizer, same kernels).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# fullfuse's kernels (csrc/): fused A (wgmma, mma.sync), fused B (and its weight packing), fallback epilogues
OURS = re.compile(r"fa_wgmma_kernel|fused_conv_act_pool_kernel|fb_kernel|fb_pack::|pool_planes|pool_rows|"
                  r"window_reduce")

# name -> (family, path, input shape, dtype, channels_last, conv of family A: (C_out, kernel, stride, padding))
CASES = {}
for _path, _tag in (("fused", "fused"), ("fallback", "fallback")):
    CASES.update({
        f"{_tag}A_seed": ("A", _path, (2, 8, 256, 256), "float32", False, None),
        f"{_tag}A_odd": ("A", _path, (2, 8, 31, 255), "float32", False, None),                 # odd H and W
        f"{_tag}A_s2_cl": ("A", _path, (2, 8, 33, 264), "float32", True, (64, 3, 2, 1)),       # stride 2, NHWC
        f"{_tag}A_bf16_odd": ("A", _path, (3, 8, 17, 133), "bfloat16", False, None),          # bf16, odd
        f"{_tag}B_seed": ("B", _path, (2, 32, 32, 32, 32), "float32", False, None),
        f"{_tag}B_odd": ("B", _path, (1, 32, 13, 11, 9), "float32", False, None),             # odd D, H, W
        f"{_tag}B_cl": ("B", _path, (2, 32, 12, 10, 14), "float32", True, None),              # channels_last_3d
        f"{_tag}B_bf16_odd": ("B", _path, (3, 32, 9, 15, 11), "bfloat16", False, None),       # bf16, odd
    })


def run_case(name: str) -> int:
    import torch

    import fullfuse
    from fullfuse.fallback import pipeline
    from fullfuse.seed_models import seed_model

    pipeline.AUTOTUNE = False
    family, path, shape, dtype_name, channels_last, conv = CASES[name]
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    model = seed_model(family, conv=conv).cuda().eval().to(dtype)
    fused = fullfuse.fused_model(model, path=path, precision="tf32" if dtype == torch.float32 else "auto")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    try:
        with torch.no_grad():
            out = fused(x)
        torch.cuda.synchronize()
    except fullfuse.UnsupportedError as exc:
        print(f"{name}: NOT SERVED by path {path}: {exc}")
        return 3
    plan = fused.plans[0]
    print(f"{name}: {plan.last_path} ({plan.last_reason}); output {tuple(out.shape)} "
          f"{'finite' if torch.isfinite(out).all() else 'NOT FINITE'}")
    return 0


def warm() -> int:
    """Build / load every library the cases use, outside the sanitizer."""
    from fullfuse.fallback import pipeline

    pipeline.AUTOTUNE = False
    status = 0
    for name in CASES:
        if name.endswith("_seed"):
            status |= run_case(name)
    return status


def summarize(tool: str, case: str, log_path: str) -> str:
    """One line: the sanitizer's own summary, then its reports split into fullfuse's kernels and others (cuDNN...)."""
    text = Path(log_path).read_text(errors="replace").splitlines()
    summary = next((ln.split("=========", 1)[-1].strip() for ln in reversed(text)
                    if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln), "no summary line (crashed or timed out?)")
    reports, current = [], None
    for line in text:
        if not line.startswith("========= "):
            continue
        body = line[len("========= "):]
        if body and not body[0].isspace() and not re.match(
                r"(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|Target application|Saved host|Host Frame|"
                r"This tool|Note:)", body):
            current = [body]
            reports.append(current)
        elif current is not None:
            current.append(body)
    ours, others = 0, {}
    for rep in reports:
        block = "\n".join(rep)
        if OURS.search(block):
            ours += 1
            continue
        names = re.findall(r"\bat (?:void )?([A-Za-z_][\w:]*)", block) or ["(unknown)"]
        key = names[0][:60]
        others[key] = others.get(key, 0) + 1
    other_text = ", ".join(f"{k} x{v}" for k, v in sorted(others.items())) or "none"
    return (f"{tool:9} {case:22} {summary} | reports in fullfuse kernels: {ours} | elsewhere: "
            f"{sum(others.values())} ({other_text})")


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--list":
        print("\n".join(CASES))
        return 0
    if argv[0] == "--warm":
        return warm()
    if argv[0] == "--summarize":
        print(summarize(*argv[1:4]))
        return 0
    return max(run_case(name) for name in argv)   # several cases: one process (one sanitizer start) for all


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
