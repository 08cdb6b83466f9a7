"""CPU: the family-B fused kernel's planner (fullfuse/fused/convt_pool_reduce_plan.py) -- a pure function of the
problem and the device's properties: its refusals, the seed's known plan, and invariants over many problems (the
plan fits the shared memory, the grid covers every item and the tail split, every plan maps to a built variant)."""
import ctypes
import dataclasses
import random

import pytest

from cutlass_ops import convt_pool_reduce as abi
from fullfuse.fused import convt_pool_reduce_plan as planner
from fullfuse.runtime import DeviceProps

H200 = DeviceProps(9, 0, 132, 232448)
SEED = [0, 0, 0, 16, 32, 32, 32, 32, 64, 5, 5, 5, 2, 2, 2, 2, 2, 2, 0, 0, 0, 6, 6, 6, 0, 0]


def _problem(**kw):
    q = dict(zip(planner.PROBLEM_FIELDS, SEED))
    q.update(kw)
    return [q[f] for f in planner.PROBLEM_FIELDS]


def test_abi_struct_sizes():
    """The ctypes mirrors' sizes as the C++ structs had them (the compile units assert every offset)."""
    assert ctypes.sizeof(abi.FBParams) == 1112 and ctypes.sizeof(abi.PackGeometry) == 96
    assert abi.FBParams.nfull.offset == 928 and abi.FBParams.inv_k.offset == 976


@pytest.mark.parametrize("problem,expect", [
    ({"dtype": 3}, "bad dtype"),
    ({"precision": 2}, "bad precision code"),
    ({"C": 6}, "C_in % 4 == 0"),
    ({"dtype": 1, "C": 12}, "% 8 == 0 (bf16"),
    ({"C": 68}, "C_in <= 64"),
    ({"K": 65}, "C_out > 64"),
    ({"act": 5}, "bad activation/reduction code"),
    ({"N": 0}, "empty batch"),
    ({"precision": 1, "C": 40}, "precision ieee needs C_in <= 32"),
    ({"sd": 0}, "bad parameters"),
    ({"D": 1, "Td": 1, "sd": 1, "pd": 0, "wind": 2}, "empty pooled output"),
    ({"sd": 4, "sh": 4, "sw": 4}, "more than 27 residue classes"),
    ({"winw": 64, "W": 64}, "exceed the 32-column tile"),
])
def test_refusals(problem, expect):
    why = planner.plan(_problem(**problem), H200).why
    assert why is not None and why.startswith(planner.PREFIX) and expect in why


def test_needs_sm90():
    for props in (DeviceProps(8, 0, 108, 166912), DeviceProps(10, 0, 148, 232448), DeviceProps(9, 1, 132, 232448)):
        assert planner.plan(SEED, props).why == planner.PREFIX + "needs sm_90 (wgmma)"


def test_seed_plan():
    """The seed (ConvTranspose3d(32->64, k5, s2, p2), x (16, 32, 32, 32, 32), window 6) on an H200: the plan the C++
    planner made (856 blocks, as profiled)."""
    p = planner.plan(SEED, H200)
    assert p.why is None
    assert (p.smem, p.blocks, p.ks, p.kv, p.threads, p.ws_parts, p.ws_bytes) == (222736, 856, 4, 0, 256, 16, 82000)
    prm = p.params
    assert list(prm.P) == [10, 10, 10] and (prm.pwb, prm.nwc, prm.wh, prm.nhb, prm.nd, prm.nh) == (10, 1, 2, 5, 5, 8)
    assert (prm.nfull, prm.tail_nhalf, prm.tail_g, prm.max_steps, prm.tile_alloc, prm.ncls) == (792, 2, 4, 125,
                                                                                                 165888, 8)
    assert abi.fused_variant(p.has_act, p.ks, p.kv).kernel == "fb_kernel<false, 4, 0>"
    # the packing: 125 slices of 32 x 64 tf32 values; 856 blocks (6.5 waves): the packing kernel's grid before it
    # (8 groups of 4 channels x 16 tiles of 4 output channels, the 125 taps in one tile), no chunks in the kernel,
    # none packing only
    assert (prm.nblocks, prm.pack_total, prm.pack_chunks, p.ws_pack_offset) == (856, 256000, 0, 81984)
    assert p.pack_grid == (128, 1, 1)
    bf16 = planner.plan(_problem(dtype=1, channels_last=1), H200)
    assert (bf16.smem, bf16.blocks, bf16.ks, bf16.kv, bf16.ws_bytes) == (156208, 856, 2, 1, 82000)
    ieee = planner.plan(_problem(precision=1), H200)
    assert (ieee.smem, ieee.blocks, ieee.ks, ieee.kv, ieee.threads, ieee.ws_bytes) == (224272, 1712, 4, 3, 128, 41040)


def _random_problem(r):
    sizes = [r.choice([1, 2, 3, 5, 8, 13, 32]) for _ in range(3)]
    strides = [r.choice([1, 2, 3]) for _ in range(3)]
    return [r.choice([0, 1, 2]), r.randint(0, 1), r.randint(0, 1), r.choice([1, 2, 5, 16]),
            r.choice([4, 8, 16, 24, 32, 48, 64]), *sizes, r.choice([1, 5, 33, 64]),
            *[r.randint(1, 6) for _ in range(3)], *strides, *[r.randint(0, 2) for _ in range(3)],
            *[r.randint(0, s - 1) for s in strides], *[r.choice([1, 2, 3, 6]) for _ in range(3)],
            r.randint(0, 4), r.randint(0, 2)]


def test_plan_invariants():
    r = random.Random(0)
    built = {v.kernel for v in abi.VARIANTS}
    served = multi_wave = 0
    for _ in range(1500):
        q = _random_problem(r)
        props = DeviceProps(9, 0, r.choice([1, 78, 114, 132]), 232448)
        p = planner.plan(q, props)
        again = planner.plan(list(q), props)    # a pure function of its arguments
        assert again.why == p.why and (p.why or bytes(again.params) == bytes(p.params))
        if p.why:
            continue
        served += 1
        prm = p.params
        assert p.smem <= 227 * 1024 and abi.fused_variant(p.has_act, p.ks, p.kv).kernel in built
        assert p.threads == (128 if p.kv == abi.KV_X3 else 256) and p.has_act == (q[24] != 0)
        items = q[3] * prm.P[0] * prm.nhb * prm.nwc
        assert prm.nwc * prm.pwb >= prm.P[2] > (prm.nwc - 1) * prm.pwb
        assert prm.nhb * prm.wh >= prm.P[1] > (prm.nhb - 1) * prm.wh
        assert prm.nblocks == prm.nfull + (items - prm.nfull) * prm.tail_nhalf * prm.tail_g
        assert items - prm.nfull in (0, items % props.sm_count)
        assert prm.pack_total == prm.pg.nslices * planner.slice_items(p.kv, p.ks)
        per_slice = prm.pack_total // prm.pg.nslices
        if prm.nblocks > props.sm_count:
            # more than one wave: the packing kernel before it, one block per tile of 16 (c, k) rows x 128 taps
            gx, gy, gz = p.pack_grid
            assert prm.pack_chunks == 0 and p.blocks == prm.nblocks and (gy, gz) == (1, 1)
            assert gx * abi.PACK_TILE_ROWS * abi.PACK_TILE_TAPS >= per_slice * prm.pg.nslices
            assert gx == -(-prm.pg.nslices // abi.PACK_TILE_TAPS) * per_slice // abi.PACK_TILE_ROWS
            multi_wave += 1
        else:
            # the kernel's chunks cover every item; blocks that only pack make the grid up to min(chunks, SMs)
            assert p.pack_grid is None
            chunk = 8 * p.threads   # FB_PACK_PER_THREAD items per thread
            assert (prm.pack_chunks - 1) * chunk < prm.pack_total <= prm.pack_chunks * chunk
            assert p.blocks == max(prm.nblocks, min(prm.pack_chunks, props.sm_count))
        assert p.ws_pack_offset >= p.ws_parts * (prm.wh * prm.pwb * 64 + 1) * 4 and p.ws_pack_offset % 16 == 0
        assert p.ws_bytes == p.ws_pack_offset + 16
        assert (p.ws_parts > 0) == (prm.tail_g > 1)
        assert sum(prm.cls_M[c][0] * prm.cls_M[c][1] * prm.cls_M[c][2] for c in range(prm.ncls)) == q[9] * q[10] * q[11]
        assert prm.ncls == q[12] * q[13] * q[14] and prm.x is None and prm.ws is None
    assert served > 300 and 30 < multi_wave < served - 30


def test_problem_of_spec():
    import torch

    from fullfuse.fused.convt_pool_reduce import problem
    from fullfuse.spec import ConvTPoolReduceSpec
    spec = ConvTPoolReduceSpec(dims=3, in_channels=32, out_channels=64, kernel_size=(5, 5, 5), stride=(2, 2, 2),
                               padding=(2, 2, 2), output_padding=(0, 0, 0), dilation=(1, 1, 1), has_bias=True,
                               window=(6, 6, 6))
    x = torch.empty(16, 32, 32, 32, 32)
    assert list(problem(spec, x, "tf32")) == SEED
    assert problem(spec, x.contiguous(memory_format=torch.channels_last_3d), "ieee")[1:3] == (1, 1)


def test_pack_geometry():
    import torch

    from fullfuse.fused.convt_pool_reduce import pack_geometry, pack_weights, problem
    from fullfuse.spec import ConvTPoolReduceSpec
    spec = ConvTPoolReduceSpec(dims=3, in_channels=12, out_channels=5, kernel_size=(3, 4, 2), stride=(2, 3, 1),
                               padding=(0, 0, 0), output_padding=(0, 0, 0), dilation=(1, 1, 1), has_bias=True,
                               window=(2, 2, 2))
    for dtype, mode, op in ((torch.float32, "tf32", 1), (torch.float32, "ieee", 2), (torch.bfloat16, "bfloat16", 0)):
        w = torch.zeros(12, 5, 3, 4, 2, dtype=dtype)
        g, nbytes = pack_geometry(spec, w, mode)
        want = pack_weights(w, spec.stride, dtype, mode if dtype == torch.float32 else "tf32")
        assert nbytes == want.numel() * want.element_size()
        assert (g.op, g.C, g.K, g.nslices, list(g.T), list(g.s), list(g.ws)) == (op, 12, 5, 24, [3, 4, 2], [2, 3, 1],
                                                                                 list(w.stride()))
        # the planner's geometry (the kernel's own packing) is the same but for the weight's strides, set per call
        # (16-bit: 12 channels are not served, C % 8)
        plan = planner.plan(problem(spec, torch.empty(2, 12, 4, 4, 4, dtype=dtype), "ieee" if mode == "ieee" else
                                    "tf32"), H200)
        if dtype != torch.float32:
            assert plan.why and "C_in" in plan.why
            continue
        g.ws[:] = (0,) * 5
        assert bytes(plan.params.pg) == bytes(g)
        assert nbytes == plan.params.pg.nslices * planner.slice_bytes(plan.kv, plan.ks)
    spec16 = dataclasses.replace(spec, in_channels=16)
    for dtype in (torch.bfloat16, torch.float16):
        g, nbytes = pack_geometry(spec16, torch.zeros(16, 5, 3, 4, 2, dtype=dtype), "tf32")
        plan = planner.plan(problem(spec16, torch.empty(2, 16, 4, 4, 4, dtype=dtype), "tf32"), H200)
        g.ws[:] = (0,) * 5
        assert bytes(plan.params.pg) == bytes(g) and g.op == 0
        assert nbytes == plan.params.pg.nslices * planner.slice_bytes(plan.kv, plan.ks)
