"""Family A's planner without a GPU: which kernel, loader, op count and blocks per SM the fused library picks for a
problem, and why it refuses one, with the library planning as on an H200 (FF_FUSED_A_PLAN_AS_SM90 = 132 SMs, honoured
only where the process sees no CUDA device: csrc/fused_conv_act_pool.cu, dev_info).  Runs in a child process (the
library caches the device it plans for); needs the compiled library (`fullfuse build`), else it skips.  The GPU tests check the
same names on the H200 for the shapes they run (tests/test_gpu.py)."""
import json
import os
import subprocess
import sys

import pytest
import torch

# (name, x shape, dtype, channels_last, (C_out, kernel, stride, padding, dilation, groups), precision, expected text
#  or None, expected refusal or None: exactly one of the two)
CASES = [
    ("seed conv, TF32 NCHW", (128, 8, 256, 256), "float32", False, (64, 3, 1, 0, 1, 1), "tf32",
     "sm_90 wgmma kernel, NCHW rows by TMA, 10 ops per tile (straight-line), 3 blocks per SM", None),
    ("seed conv, bf16 channels_last", (128, 8, 256, 256), "bfloat16", True, (64, 3, 1, 0, 1, 1), "auto",
     "sm_90 wgmma kernel, channels_last rows by TMA, 5 ops per tile (straight-line), 3 blocks per SM", None),
    ("seed conv, ieee", (128, 8, 256, 256), "float32", True, (64, 3, 1, 0, 1, 1), "ieee",
     "sm_90 wgmma kernel, channels_last rows by TMA, 10 ops per tile (straight-line), 2 blocks per SM", None),
    ("62-pixel rows: two per tile", (512, 8, 64, 64), "float32", False, (64, 3, 1, 0, 1, 1), "tf32",
     "two output rows per tile, 10 ops per tile", None),
    ("30-pixel rows: mma.sync", (2048, 8, 32, 32), "float32", False, (64, 3, 1, 0, 1, 1), "tf32",
     "mma.sync kernel, TF32", None),
    ("stride 2", (32, 8, 256, 256), "float32", False, (64, 3, 2, 1, 1, 1), "tf32",
     "split into even / odd columns (stride 2)", None),
    # 16-bit over > 8 channels: two channel groups per k16 op (9 pairs + the bias op)
    # (9 pairs + the bias op = 10 ops through TMA rows or NCHW's 16-byte copies: a straight-line kernel of their own,
    # wg_ops_c16; rows per element keep the general chain)
    ("bf16 3x3 C16", (32, 16, 256, 256), "bfloat16", True, (64, 3, 1, 1, 1, 1), "auto",
     "channels_last rows by TMA, 10 ops per tile (straight-line)", None),
    # (NCHW: the 16-byte copies' plan fits 3 blocks per SM, TNCHW's staging leaves 2: the copies)
    ("bf16 3x3 C16 NCHW", (32, 16, 256, 256), "bfloat16", False, (64, 3, 1, 1, 1, 1), "auto",
     "NCHW rows by 16-byte copies, 10 ops per tile (straight-line), 3 blocks per SM", None),
    ("bf16 3x3 C16, rows per element: the general chain", (32, 16, 100, 100), "bfloat16", False, (64, 3, 1, 1, 1, 1),
     "auto", "rows per element, 10 ops per tile (general chain)", None),
    ("bf16 3x3 C24: a pair and a lone group per tap", (32, 24, 128, 128), "bfloat16", True, (64, 3, 1, 1, 1, 1), "auto",
     "channels_last rows by TMA, 18 ops per tile (general chain), 3 blocks per SM", None),
    ("bf16 3x3 C24 NCHW", (32, 24, 128, 128), "bfloat16", False, (64, 3, 1, 1, 1, 1), "auto",
     "18 ops per tile (general chain), 2 blocks per SM", None),
    # 32 channels: ring slots of 256 + halo columns leave one block per SM (NOTES run 32); rows of <= 128 output pixels
    # size them for 128 + halo (NOTES run 33): two
    ("bf16 3x3 C32 at 128-pixel rows", (32, 32, 128, 128), "bfloat16", False, (64, 3, 1, 1, 1, 1), "auto",
     "NCHW rows by 16-byte copies, 19 ops per tile (general chain), 2 blocks per SM", None),
    ("bf16 3x3 C32 at 256-pixel rows: fallback", (32, 32, 256, 256), "bfloat16", False, (64, 3, 1, 1, 1, 1), "auto",
     None, "one block per SM"),
    ("bf16 5x5 C16 at 128-pixel rows", (32, 16, 128, 128), "bfloat16", True, (64, 5, 1, 2, 1, 1), "auto",
     "channels_last rows by TMA, 26 ops per tile (general chain), 2 blocks per SM", None),
    ("bf16 1x1 C16", (32, 16, 256, 256), "float16", False, (64, 1, 1, 0, 1, 1), "auto",
     "2 ops per tile (general chain)", None),
    # fp32 3x3 over 16 channels: 18 + the bias op, straight-line through TMA rows or NCHW's 16-byte copies (wg_ops_c16)
    ("TF32 3x3 C16", (32, 16, 256, 256), "float32", True, (64, 3, 1, 1, 1, 1), "tf32",
     "channels_last rows by TMA, 19 ops per tile (straight-line), 2 blocks per SM", None),
    ("TF32 3x3 C16 NCHW at 128-pixel rows", (32, 16, 128, 128), "float32", False, (64, 3, 1, 1, 1, 1), "tf32",
     "NCHW rows by TMA, 19 ops per tile (straight-line), 2 blocks per SM", None),
    # (at 256-pixel rows TNCHW's staging would cost a block per SM: the 16-byte copies, straight-line too)
    ("TF32 3x3 C16 NCHW at 256-pixel rows", (32, 16, 256, 256), "float32", False, (64, 3, 1, 1, 1, 1), "tf32",
     "NCHW rows by 16-byte copies, 19 ops per tile (straight-line), 2 blocks per SM", None),
    ("TF32 3x3 C16, rows per element: the general chain", (32, 16, 102, 102), "float32", False, (64, 3, 1, 1, 1, 1),
     "tf32", "rows per element, 19 ops per tile (general chain)", None),
    # fp32 over 32 channels: weights and ring leave one block per SM
    ("TF32 3x3 C32: fallback", (32, 32, 128, 128), "float32", True, (64, 3, 1, 1, 1, 1), "tf32",
     None, "one block per SM"),
    ("groups: never", (2, 8, 16, 16), "float32", False, (64, 3, 1, 0, 1, 2), "tf32", None, "groups != 1"),
]

_CHILD = r"""
import json, sys, torch
from fullfuse.fused import conv_act_pool as fa
from fullfuse.spec import ConvActPoolSpec
out = []
for name, shape, dtype, cl, (k, r, s, p, d, g), prec, _, _ in json.loads(sys.argv[1]):
    spec = ConvActPoolSpec(dims=2, in_channels=shape[1], out_channels=k, kernel_size=(r, r), stride=(s, s),
                           padding=(p, p), dilation=(d, d), has_bias=True, groups=g)
    x = torch.empty(shape, dtype=getattr(torch, dtype))
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    why = fa.unsupported(spec, x, prec, True)
    out.append([why, None if why else fa.kernel(spec, x, prec, True)])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def planned():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the library plans for it (the GPU tests check the names there)")
    from cutlass_ops import builder
    if not builder.library_path("fused_conv_act_pool").exists():   # (CI builds it first: `fullfuse build`)
        pytest.skip("the fused library is not built here (fullfuse build)")
    env = dict(os.environ, FF_FUSED_A_PLAN_AS_SM90="132")
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(CASES)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip([c[0] for c in CASES], json.loads(proc.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_family_a_plan_as_on_an_h200(planned, case):
    name, *_, text, refusal = case
    why, kernel = planned[name]
    if text is not None:
        assert why is None and text in kernel, (why, kernel)
    else:
        assert why is not None and refusal in why, (why, kernel)
