"""Family A's planner without a GPU (fullfuse/fused/conv_act_pool_plan.py, a pure function of the problem and the
device's properties): which kernel, loader, op count and blocks per SM it picks for a problem on an H200 (sm_90,
132 SMs, 227 KB of shared memory per block), and why it refuses one; every plan maps to a kernel of the build table
(cutlass_ops.conv_act_pool.VARIANTS).  The GPU tests check the same names on the H200 for the shapes they run
(tests/test_gpu.py)."""
import random

import pytest
import torch

from cutlass_ops import conv_act_pool as abi
from fullfuse.fused import conv_act_pool as fa
from fullfuse.fused import conv_act_pool_plan as plan
from fullfuse.runtime import DeviceProps
from fullfuse.spec import ConvActPoolSpec

H200 = DeviceProps(major=9, minor=0, sm_count=132, smem_optin=232448)

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
    # 32 channels: ring slots of 256 + halo columns leave one block per SM (docs/design.md); rows of <= 128 output
    # pixels size them for 128 + halo (docs/design.md): two
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
    # 5x5 stride 2 over 3 channels: 25 K units (beyond the mma.sync kernel), stride-2 columns through TMA rows only;
    # 20 fp32 columns are 80 bytes, 20 bf16 ones 40 (no TMA row): the refusal names the layout and both kernels' limits
    ("5x5 stride 2, fp32 rows of 80 bytes", (1, 3, 20, 20), "float32", False, (64, 5, 2, 0, 1, 1), "tf32",
     "NCHW rows by TMA split into even / odd columns (stride 2)", None),
    ("5x5 stride 2, bf16 rows of 40 bytes", (1, 3, 20, 20), "bfloat16", False, (64, 5, 2, 0, 1, 1), "auto",
     None, "stride 2: the sm_90 kernel reads it through TMA rows, which need a 16-byte-aligned input, NCHW with rows "
           "of whole 16 bytes (W % 8 == 0) or channels_last with C % 8 == 0; R*S*ceil(C/8) > 9"),
    ("5x5 stride 3", (1, 3, 20, 20), "float32", False, (64, 5, 3, 0, 1, 1), "tf32",
     None, "column stride 3: the sm_90 kernel takes 1 or 2; R*S*ceil(C/8) > 9"),
]

def _plan(case, props=H200):
    name, shape, dtype, cl, (k, r, s, p, d, g), prec, _, _ = case
    spec = ConvActPoolSpec(dims=2, in_channels=shape[1], out_channels=k, kernel_size=(r, r), stride=(s, s),
                           padding=(p, p), dilation=(d, d), has_bias=True, groups=g)
    x = torch.empty(shape, dtype=getattr(torch, dtype))
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    why = fa.static_unsupported(spec)
    if why:
        return why, None, None
    _, problem = fa._problem(spec, x, prec, True)
    return plan.unsupported(problem, props), plan.kernel_text(problem, props), problem


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_family_a_plan_as_on_an_h200(case):
    *_, text, refusal = case
    why, kernel, problem = _plan(case)
    if text is not None:
        assert why is None and text in kernel, (why, kernel)
        for aligned in (True, False):   # the plan of an aligned and of an unaligned input: a kernel that is built
            c = plan.choose_call(problem, H200, aligned)
            if not c.why:
                assert fa._variant(problem, c) in abi.VARIANTS
    else:
        assert why is not None and refusal in why, (why, kernel)


@pytest.mark.parametrize("n, served", [(1, True), (16, False)])
def test_family_a_one_block_per_sm_only_where_the_grid_has_no_more_blocks_than_sms(n, served):
    """A ring that leaves one block per SM (5x5 stride 2 over 3 channels, TF32): refused where the grid would have
    more blocks than SMs (16 images: 160 lines), served at one block per SM where it has no more (1 image: 10)."""
    case = ("5x5 s2", (n, 3, 20, 20), "float32", False, (64, 5, 2, 2, 1, 1), "tf32", None, None)
    why, kernel, problem = _plan(case)
    if served:
        assert why is None and "1 blocks per SM" in kernel, (why, kernel)
        assert fa._variant(problem, plan.choose_call(problem, H200)) in abi.VARIANTS
    else:
        assert why is not None and "one block per SM" in why


def test_family_a_plan_on_an_a100():
    """Not sm_90: the mma.sync kernel where it fits (no wgmma plan), its reason where it does not."""
    a100 = DeviceProps(major=8, minor=0, sm_count=108, smem_optin=166912)
    why, kernel, _ = _plan(CASES[0], a100)
    assert why is None and kernel == "mma.sync kernel, TF32"
    why, kernel, _ = _plan(CASES[6], a100)   # 3x3 over 16 channels: 18 K units, beyond the mma.sync kernel's 9
    assert kernel is None and "beyond the mma.sync kernel" in why


def test_family_a_seed_plan_parameters():
    """The seed's TF32 NCHW plan, field by field where the kernel depends on exact values (magic-number division,
    shared-memory layout, grid): the values the C++ planner produced."""
    problem = plan.Problem(0, 0, 128, 8, 256, 256, 64, 3, 3, 1, 1, 0, 0, 1, 1, 2, 0, 0, 1)
    c = plan.choose_call(problem, H200)
    p = c.wp.prm
    assert c.wp.ok and c.wp.lm == abi.WG_LM_TNCHW and c.wp.bps == 3 and p.nops == 10
    assert (p.mTWa, p.sTWa) == plan._magic(p.TWa) and all((p.mTWa * n) >> p.sTWa == n // p.TWa for n in range(1 << 16))
    assert p.G == 3 * 132 and p.RB >= 4 and c.wp.smem <= 232448 // 3
    assert plan.workspace_bytes(problem, H200) == 203264


WEIGHT_LAYOUT_CASES = [   # (shape, dtype, (K, R, stride, padding), precision): wgmma plans of several op forms
    ((2, 8, 64, 64), "float32", (64, 3, 1, 0), "tf32"),       # the seed's conv, TF32
    ((2, 8, 34, 130), "float32", (64, 3, 1, 0), "ieee"),
    ((2, 8, 64, 64), "bfloat16", (64, 3, 1, 0), "tf32"),      # 16-bit: tap pairs, the column pair, the spare chunk
    ((2, 16, 40, 72), "bfloat16", (96, 3, 1, 1), "tf32"),     # two channel groups, K > 64 (two launches)
    ((2, 5, 30, 40), "float32", (64, 5, 1, 2), "tf32"),       # 5 channels (a partial K chunk), 5x5
    ((1, 3, 20, 20), "float32", (64, 5, 2, 0), "tf32"),       # 3 channels, stride-2 columns
    ((1, 8, 16, 16), "float32", (64, 3, 1, 0), "tf32"),       # the mma.sync kernel (every element through 4 strides)
    ((1, 8, 16, 16), "bfloat16", (64, 3, 1, 0), "tf32"),
]


@pytest.mark.parametrize("case", WEIGHT_LAYOUT_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in WEIGHT_LAYOUT_CASES])
def test_family_a_reads_a_weight_as_it_lies(case):
    """The wgmma kernel reads weight element (m, c0 + e) of op j's K chunk h at m * wsk + op_wo[h][j] + e * wsc
    (wgmma_block_setup.cuh), the mma.sync kernel element (k, c, r, s) through four strides.  Launches.blocks_for
    re-derives them and each launch's offset for a weight's own strides: every element read in a channels_last or
    permuted weight must be the one the contiguous plan reads in the contiguous weight (values unique: arange)."""
    shape, dtype, (k, r, s, p), prec = case
    spec = ConvActPoolSpec(dims=2, in_channels=shape[1], out_channels=k, kernel_size=(r, r), stride=(s, s),
                           padding=(p, p), dilation=(1, 1), has_bias=True)
    x = torch.empty(shape, dtype=getattr(torch, dtype))
    _, problem = fa._problem(spec, x, prec, True)
    choice = plan.choose_call(problem, H200)
    assert choice.wp.ok == (shape[2] > 16), (choice.why, choice.wp)
    launches = fa.Launches(problem, H200, choice)
    weight = torch.arange(k * shape[1] * r * r, dtype=torch.float64).view(k, shape[1], r, r)
    esize = launches.esize

    def reads(w, blocks):
        flat = torch.as_strided(w, (w.untyped_storage().nbytes() // 8,), (1,), 0)   # the storage in memory order
        got = []
        for template, k0, kk, woff in blocks:
            assert woff % esize == 0
            if not launches.wgmma:   # mma_sync_kernel.cuh wat(): k wsk + c wsc + r wsr + s wss
                q = abi.FAParams.from_buffer_copy(template)
                got += [float(flat[m * q.wsk + c * q.wsc + i * q.wsr + j * q.wss])
                        for m in range(k) for c in range(shape[1]) for i in range(r) for j in range(r)]
                continue
            q = abi.WGParams.from_buffer_copy(template)
            for h in range(2):
                for j in range(q.na):
                    for e in range(max(0, q.op_wn[h][j])):
                        for m in range(kk):
                            got.append(float(flat[woff // esize + m * q.wsk + q.op_wo[h][j] + e * q.wsc]))
        return got

    want = reads(weight, launches.blocks)
    assert launches.blocks_for(weight.stride()) is launches.blocks
    layouts = [weight.contiguous(memory_format=torch.channels_last),
               weight.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2),     # taps transposed in memory
               weight.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)]     # input channels outermost
    for w in layouts:
        assert torch.equal(w, weight)
        blocks = launches.blocks_for(w.stride())
        assert blocks is not None and blocks is launches.blocks_for(w.stride())   # kept per layout
        assert reads(w, blocks) == want, w.stride()


def _random_problem(rng: random.Random):
    """A family-A problem over the planner's whole range (dtype, precision, layout, Conv2d / Conv3d, filter, stride,
    padding, dilation, sizes), or None where the output would be empty."""
    dt = rng.choice([abi.F32, abi.BF16, abi.F16])
    R, S = rng.choice([1, 2, 3, 3, 3, 5, 7]), rng.choice([1, 2, 3, 3, 3, 5, 7])
    H = rng.choice([R, 8, 16, 31, 32, 64, 100, 128, 256, rng.randint(R, 300)])
    W = rng.choice([S, 8, 16, 31, 32, 64, 100, 128, 256, rng.randint(S, 600)])
    ph, pw = rng.choice([0, 0, R // 2, 1]), rng.choice([0, 0, S // 2, 1])
    dh, dw = rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
    if H + 2 * ph - dh * (R - 1) < 1 or W + 2 * pw - dw * (S - 1) < 1:
        return None
    volume = {}
    if rng.random() < 0.3:
        T = rng.choice([1, 2, 3])
        volume = dict(D=rng.choice([T, 4, 8, 16]), T=T, sd=rng.choice([1, 2]), pd=rng.choice([0, T // 2]), dd=1)
    return plan.Problem(dt, rng.choice([0, 1]), rng.choice([1, 2, 8, 128]),
                        rng.choice([1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32, 64, rng.randint(1, 128)]), H, W,
                        rng.choice([1, 8, 16, 32, 64, 96, 128, 256, rng.randint(1, 300)]), R, S,
                        rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 3]), ph, pw, dh, dw, rng.choice([0, 1, 2, 3, 4]),
                        rng.choice([0, 1]), rng.choice([0, 1]) if dt == abi.F32 else 0, rng.choice([0, 1]), **volume)


def test_family_a_every_built_variant_is_one_a_plan_picks():
    """The build table is what the planner picks on an H200, no more and no less: each random problem's plan (an
    aligned and an unaligned input, and a TMA plan's copy-loader fallback) maps to a built variant, and every built
    variant is some problem's (a unit no plan picks would cost ``fullfuse build`` ~5 s per architecture for nothing)."""
    rng, table, reached = random.Random(0), set(abi.VARIANTS), set()
    for _ in range(150_000):
        problem = _random_problem(rng)
        for aligned in (True, False) if problem is not None else ():
            c = plan.choose_call(problem, H200, aligned)
            for choice in [c, plan.fallback_choice(problem, H200, c)] if plan.uses_tma(c) else [c]:
                if not choice.why:
                    variant = fa._variant(problem, choice)
                    assert variant in table, (problem, variant.label)
                    reached.add(variant)
        if reached == table:
            break
    assert reached == table, f"built, no plan picks them: {sorted(v.label for v in table - reached)}"
