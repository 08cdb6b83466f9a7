"""The `fullfuse` command: info | build | check | bench."""
from __future__ import annotations

import argparse
import sys


def _shape(text: str):
    return tuple(int(v) for v in text.replace("x", ",").split(",") if v)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fullfuse", description="Fused convolution pipelines for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="GPU, versions, kernel cache")
    p_build = sub.add_parser("build", help="compile every kernel variant ahead of time with NVRTC (no GPU needed)")
    p_build.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per core)")
    p_build.add_argument("--arch", nargs="*", default=None,
                         help="architectures, e.g. sm_90a sm_80 sm_86 (default: each kernel's own: sm_90a, sm_80)")
    p_build.add_argument("--family", nargs="*", default=None,
                         choices=["conv_act_pool", "convt_pool_reduce", "fallback"])
    p_check = sub.add_parser("check", help="every path vs float64 on fresh random inputs")
    p_check.add_argument("--family", choices=["A", "B", "both"], default="both")
    p_check.add_argument("--quick", action="store_true")
    p_check.add_argument("--seed", type=int, default=None)
    p_bench = sub.add_parser("bench", help="eager vs torch.compile vs fallback vs fused at the seed shapes")
    p_bench.add_argument("--family", choices=["A", "B", "both"], default="both")
    p_bench.add_argument("--shape", type=_shape, default=None,
                         help="input shape, e.g. 128,8,256,256 (family A: a 5-d shape benchmarks its Conv3d form)")
    p_bench.add_argument("--conv", type=_shape, default=None,
                         help="family A's conv: out_channels,kernel_size[,stride[,padding]] "
                              "(default the seed's 64,3,1,0)")
    p_bench.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p_bench.add_argument("--precision", choices=["auto", "tf32", "ieee"], default="auto")
    p_bench.add_argument("--layout", choices=["contiguous", "channels_last", "both"], default="contiguous")
    p_bench.add_argument("--variants", nargs="*", default=None,
                         help="subset of: eager compile compile-max-autotune fallback fused")
    p_bench.add_argument("--repeats", type=int, default=30)
    p_bench.add_argument("--out", default="benchmarks/results", help="folder for the JSON and PNG")
    p_bench.add_argument("--tag", default="")
    args = parser.parse_args(argv)

    if args.command == "info":
        from .info import main as run
        return run()
    if args.command == "build":
        from cutlass_ops.build import build
        from cutlass_ops.cache import BuildError
        try:
            summary = build(args.arch, workers=args.jobs, families=args.family)
        except BuildError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"fullfuse build: {summary['kernels']} kernels in {summary['seconds']} s (slowest {summary['slowest']})")
        return 0
    families = ("A", "B") if args.family == "both" else (args.family,)
    if args.command == "bench" and args.shape is not None:
        ranks = {"A": (4, 5), "B": (5,)}   # (family A's 5-d shape: its Conv3d form)
        if any(len(args.shape) not in ranks[f] for f in families) or min(args.shape, default=0) < 1:
            parser.error(f"--shape {','.join(map(str, args.shape))}: family A takes (N, C, H, W) or (N, C, D, H, W), "
                         f"family B (N, C, D, H, W), every size at least 1"
                         + (" (give --family to bench one family)" if len(families) > 1 else ""))
    if args.command == "check":
        from .check import main as run
        return run(families, quick=args.quick, seed=args.seed)
    from .bench import VARIANTS, main as run
    layouts = ("contiguous", "channels_last") if args.layout == "both" else (args.layout,)
    return run(families, args.shape, args.dtype, args.precision, layouts, tuple(args.variants or VARIANTS),
               args.repeats, args.out, args.tag, args.conv)


if __name__ == "__main__":
    sys.exit(main())
