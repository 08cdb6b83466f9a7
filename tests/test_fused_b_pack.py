"""CPU: the fused family-B kernel's packed weights (one [C/4][64][4] TF32 slice per residue class and tap) rebuild
the transposed convolution exactly through the sub-pixel decomposition the kernel uses (o = s*q + r - p,
tap r + s*m at input q - m)."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from fullfuse.fused.convt_pool_reduce import pack_weights, padded_channels


@pytest.mark.parametrize("kernel,stride,padding,c_in", [((3, 4, 2), (2, 3, 1), (1, 0, 0), 8),
                                                        ((5, 5, 5), (2, 2, 2), (2, 2, 2), 16),
                                                        ((2, 2, 2), (3, 3, 3), (0, 1, 0), 12)])
def test_packed_slices_rebuild_conv_transpose(kernel, stride, padding, c_in):
    gen = torch.Generator().manual_seed(0)
    k_out = 5
    c_pad = padded_channels(c_in)
    x = torch.randn(1, c_in, 3, 4, 3, generator=gen, dtype=torch.float64)
    w = torch.randn(c_in, k_out, *kernel, generator=gen)
    packed = pack_weights(w, stride).double()
    w_tf32 = pack_weights_reference_rounding(w).double()
    ref = F.conv_transpose3d(x, w_tf32, None, stride, padding)
    out = torch.zeros_like(ref)
    offset = 0
    slices = {}
    for r in itertools.product(*[range(s) for s in stride]):
        taps = [range(len(range(r[a], kernel[a], stride[a]))) for a in range(3)]
        for m in itertools.product(*taps):
            sl = packed[offset:offset + c_pad * 64].view(c_pad // 4, 64, 4).permute(1, 0, 2).reshape(64, c_pad)
            assert not sl[k_out:].any() and not sl[:, c_in:].any()     # padding is zero
            slices[r, m] = sl[:k_out, :c_in]                            # (K, C)
            offset += c_pad * 64
    assert offset == packed.numel()
    for o in itertools.product(*[range(n) for n in ref.shape[2:]]):
        r = tuple((o[a] + padding[a]) % stride[a] for a in range(3))
        q = tuple((o[a] + padding[a] - r[a]) // stride[a] for a in range(3))
        acc = torch.zeros(k_out, dtype=torch.float64)
        for (rr, m), wk in slices.items():
            if rr != r:
                continue
            i = tuple(q[a] - m[a] for a in range(3))
            if all(0 <= i[a] < x.shape[2 + a] for a in range(3)):
                acc += wk @ x[0, :, i[0], i[1], i[2]]
        out[0, :, o[0], o[1], o[2]] = acc
    assert (out - ref).abs().max().item() < 1e-9


def pack_weights_reference_rounding(w):
    bits = w.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def _spec(**kw):
    from fullfuse.spec import ConvTPoolReduceSpec
    base = dict(dims=3, in_channels=32, out_channels=64, kernel_size=(5, 5, 5), stride=(2, 2, 2), padding=(2, 2, 2),
                output_padding=(0, 0, 0), dilation=(1, 1, 1), has_bias=True, window=(6, 6, 6))
    base.update(kw)
    return ConvTPoolReduceSpec(**base)


@pytest.mark.parametrize("change,expect", [({}, None), ({"in_channels": 4}, None), ({"in_channels": 6}, "C_in % 4"),
                                           ({"in_channels": 68}, "C_in > 64"), ({"out_channels": 65}, "C_out > 64"),
                                           ({"dilation": (1, 2, 1)}, "dilation"),
                                           ({"groups": 2, "out_channels": 64}, "groups"),
                                           ({"dims": 2, "kernel_size": (5, 5), "stride": (2, 2), "padding": (2, 2),
                                             "output_padding": (0, 0), "dilation": (1, 1), "window": (6, 6)},
                                            "ConvTranspose2d")])
def test_fused_b_static_reasons(change, expect):
    """Shapes the fused family-B kernel can never serve are refused up front with the reason (the fallback runs)."""
    from fullfuse.fused.convt_pool_reduce import static_unsupported
    why = static_unsupported(_spec(**change))
    assert (why is None) if expect is None else (why is not None and expect in why)


@pytest.mark.parametrize("c_in,c_pad", [(4, 8), (8, 8), (12, 16), (16, 16), (24, 32), (32, 32), (40, 64), (64, 64)])
def test_padded_channels(c_in, c_pad):
    assert padded_channels(c_in) == c_pad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_16bit_slices(dtype):
    """bf16 / fp16 slices: [C_pad/8][64][8] in the input dtype (no rounding), C_in padded to 16 / 32 / 64."""
    gen = torch.Generator().manual_seed(1)
    c_in, k_out, stride = 24, 5, (2, 2, 2)
    w = torch.randn(c_in, k_out, 3, 3, 3, generator=gen).to(dtype)
    packed = pack_weights(w, stride, dtype)
    c_pad = padded_channels(c_in, dtype)
    assert c_pad == 32 and packed.dtype == dtype
    first = packed[:c_pad * 64].view(c_pad // 8, 64, 8).permute(1, 0, 2).reshape(64, c_pad)   # class (0,0,0), tap 0
    assert torch.equal(first[:k_out, :c_in], w[:, :, 0, 0, 0].t())
    assert not first[k_out:].any() and not first[:, c_in:].any()
    assert packed.numel() == 27 * c_pad * 64      # kernel 3 at stride 2: (2 + 1) ** 3 tap slices


def test_packed_ieee_slices():
    """fp32 at precision ieee: per tap [tf32(w)] [tf32(w - tf32(w))] [bf16(w)]; hi + lo is w to 2^-21 of max |w|."""
    gen = torch.Generator().manual_seed(2)
    c_in, k_out, stride = 12, 5, (2, 2, 2)
    w = torch.randn(c_in, k_out, 3, 3, 3, generator=gen)
    packed = pack_weights(w, stride, torch.float32, "ieee")
    c32, c16 = padded_channels(c_in), padded_channels(c_in, torch.bfloat16)
    assert packed.dtype == torch.uint8 and (c32, c16) == (16, 16)
    tap = packed.view(27, -1)[0]            # class (0,0,0), tap 0
    hi = tap[:c32 * 256].view(torch.float32).view(c32 // 4, 64, 4).permute(1, 0, 2).reshape(64, c32)
    lo = tap[c32 * 256:c32 * 512].view(torch.float32).view(c32 // 4, 64, 4).permute(1, 0, 2).reshape(64, c32)
    bf = tap[c32 * 512:].view(torch.bfloat16).view(c16 // 8, 64, 8).permute(1, 0, 2).reshape(64, c16)
    exact = w[:, :, 0, 0, 0].t()
    assert torch.equal(hi[:k_out, :c_in], pack_weights_reference_rounding(exact))
    assert ((hi + lo)[:k_out, :c_in].double() - exact.double()).abs().max() <= 2 ** -21 * exact.abs().max()
    assert torch.equal(bf[:k_out, :c_in], exact.to(torch.bfloat16))
    for part in (hi, lo, bf):
        assert not part[k_out:].any() and not part[:, c_in:].any()
    assert packed.numel() == 27 * (2 * c32 * 256 + c16 * 128)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "channels_last_3d", "sliced"])
@pytest.mark.parametrize("dtype,mode", [(torch.float32, "tf32"), (torch.float32, "ieee"), (torch.bfloat16, "bfloat16"),
                                        (torch.float16, "float16")])
@pytest.mark.parametrize("c_in,k_out,kernel,stride", [(32, 64, (5, 5, 5), (2, 2, 2)), (12, 5, (3, 4, 2), (2, 3, 1)),
                                                       (8, 64, (2, 2, 2), (3, 3, 3)), (40, 17, (1, 3, 3), (1, 2, 2)),
                                                       (6, 33, (7, 5, 4), (2, 3, 2)), (3, 2, (9, 9, 4), (1, 2, 3))])
def test_gpu_packing_equals_pack_weights(c_in, k_out, kernel, stride, dtype, mode, layout):
    """The packing kernel (run before a fused launch of several waves) gives pack_weights' bytes exactly, for any
    weight strides, tiles of channel groups that C only partly fills, output channels short of 64, taps past one
    tile's 128 (140 and 324 taps) and stride classes with no tap; inf / NaN weights keep their class in the high part
    and give 0 in the other two parts (ieee)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fullfuse.fused.convt_pool_reduce import packed_weights
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(c_in, k_out, *kernel, generator=gen).to(dtype)
    w.view(-1)[::97] = float("inf")
    w.view(-1)[5::101] = float("nan")
    want = pack_weights(w, stride, dtype, mode if dtype == torch.float32 else "tf32").reshape(-1).view(torch.uint8)
    wc = w.cuda()
    if layout == "channels_last_3d":
        wc = wc.contiguous(memory_format=torch.channels_last_3d)
    elif layout == "sliced":
        wc = torch.cat([wc, wc], dim=1)[:, k_out:]
    bits = torch.int32 if dtype == torch.float32 else torch.int16   # bit for bit: w holds NaNs
    assert torch.equal(wc.cpu().view(bits), w.view(bits))
    spec = _spec(in_channels=c_in, out_channels=k_out, kernel_size=kernel, stride=stride, padding=(0, 0, 0))
    got = packed_weights(spec, wc, mode).cpu()
    assert got.shape == want.shape
    if mode != "ieee":
        assert torch.equal(got, want)
        return
    c32, c16 = padded_channels(c_in), padded_channels(c_in, torch.bfloat16)
    rows_got, rows_want = got.view(-1, 2 * c32 * 256 + c16 * 128), want.view(-1, 2 * c32 * 256 + c16 * 128)
    assert torch.equal(rows_got[:, :c32 * 256], rows_want[:, :c32 * 256])                 # hi: bit for bit
    hi = rows_want[:, :c32 * 256].view(torch.float32)
    # a weight whose high part is not finite has 0 in the other two parts (the kernel's split keeps Inf / NaN away
    # from inf - inf and inf * 0); the reference's low part there is inf - inf
    lo_got = rows_got[:, c32 * 256:c32 * 512].view(torch.float32)
    lo_want = rows_want[:, c32 * 256:c32 * 512].view(torch.float32).clone()
    lo_want[~torch.isfinite(hi)] = 0.0
    assert torch.equal(lo_got, lo_want)
    bf_got, bf_want = (r[:, c32 * 512:].view(torch.bfloat16).float() for r in (rows_got, rows_want))
    bad = ~torch.isfinite(bf_want)
    assert not torch.isnan(bf_got).any() and torch.equal(bf_got[bad], torch.zeros_like(bf_got[bad]))
    assert torch.equal(bf_got[~bad], bf_want[~bad])


def _device_function(source: str, name: str) -> str:
    """The text of one __device__ function of a csrc header, from its declaration line to its closing brace."""
    at = source.index(f" {name}(")
    start = source.rfind("\n", 0, source.rfind("__device__", 0, at)) + 1
    depth = 0
    for end in range(source.index("{", at), len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0:
            return source[start:end + 1]
    raise ValueError(name)


_SLICE_ORDER_CHECK = r"""
#include <algorithm>
#include <cstdio>
using std::min;
struct Geometry { int T[3], s[3]; };
%s
int main() {   // every slice of every geometry with taps <= (9, 7, 7), strides <= 4, against pack_weights' loop order
  long bad = 0, n = 0;
  for (int T0 = 1; T0 <= 9; ++T0) for (int T1 = 1; T1 <= 7; ++T1) for (int T2 = 1; T2 <= 7; ++T2)
  for (int s0 = 1; s0 <= 4; ++s0) for (int s1 = 1; s1 <= 4; ++s1) for (int s2 = 1; s2 <= 4; ++s2) {
    const Geometry g{{T0, T1, T2}, {s0, s1, s2}};
    int j = 0;
    for (int rd = 0; rd < s0; ++rd) for (int rh = 0; rh < s1; ++rh) for (int rw = 0; rw < s2; ++rw)
    for (int td = rd; td < T0; td += s0) for (int th = rh; th < T1; th += s1) for (int tw = rw; tw < T2; tw += s2) {
      bad += slice_tap_bits(j, T0, T1, T2, s0, s1, s2) != (td | th << 10 | tw << 20) || tap_slice(td, th, tw, g) != j;
      ++j, ++n;
    }
  }
  std::printf("%%ld %%ld\n", n, bad);
  return 0;
}
"""


def test_slice_order_closed_forms(tmp_path):
    """The packing's slice <-> tap maps in closed form (slice_tap_bits for the fused kernel's own packing, tap_slice
    for the packing kernel), compiled from csrc by the host's C++ compiler: the same order as pack_weights' loops."""
    import shutil
    import subprocess
    from pathlib import Path
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler")
    header = (Path(__file__).resolve().parents[1] / "csrc" / "fused_convt_pack.cuh").read_text(encoding="utf-8")
    functions = [_device_function(header, n) for n in ("class_taps", "tap_class", "slice_tap_bits", "tap_slice")]
    (tmp_path / "order.cpp").write_text(_SLICE_ORDER_CHECK % "\n".join(functions))
    subprocess.run([cxx, "-O1", "-D__device__=", "-D__forceinline__=inline", "-D__noinline__=", "-o",
                    str(tmp_path / "order"), str(tmp_path / "order.cpp")], check=True)
    checked, bad = map(int, subprocess.run([str(tmp_path / "order")], check=True, capture_output=True,
                                           text=True).stdout.split())
    assert checked == 2257920 and bad == 0
