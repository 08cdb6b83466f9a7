"""fullfuse.fallback.torch_conv: PyTorch's cuDNN conv with the fallback's precision and determinism as arguments.

CPU: which route a call takes and what it passes on (the direct op where F.convNd would pick cuDNN, F.convNd under
the flags elsewhere).  GPU: the direct op gives F.convNd's bits under the same flags, for forward and transposed
convs of both ranks, every mode and both layouts.
"""
import pytest
import torch
import torch.nn.functional as F

from fullfuse import precision
from fullfuse.fallback import torch_conv

_CONV = {(2, False): F.conv2d, (3, False): F.conv3d, (2, True): F.conv_transpose2d, (3, True): F.conv_transpose3d}


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return "direct"


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("mode, allow_tf32", [("tf32", True), ("ieee", False), ("bfloat16", True)])
@pytest.mark.parametrize("deterministic, torch_flags, exact", [
    (True, (False, False, False), True),      # the fallback's determinism whatever torch says
    (False, (False, False, False), False),    # else torch's own switches, as F.convNd reads them
    (False, (True, True, False), True),       # (benchmark, cudnn.deterministic, use_deterministic_algorithms)
    (False, (True, False, True), True),
])
def test_direct_op_gets_the_modes_flags_and_torchs_current_switches(monkeypatch, transposed, mode, allow_tf32,
                                                                     deterministic, torch_flags, exact):
    benchmark, cudnn_det, algos_det = torch_flags
    monkeypatch.setattr(torch_conv, "_direct_ok", lambda image_in, image_out: True)
    monkeypatch.setattr(torch_conv, "_cudnn_enabled", lambda: True)
    monkeypatch.setattr(torch_conv, "_benchmark", lambda: benchmark)
    monkeypatch.setattr(torch_conv, "_deterministic_cudnn", lambda: cudnn_det)
    monkeypatch.setattr(torch_conv, "_deterministic_algorithms", lambda: algos_det)
    op = _Recorder()
    monkeypatch.setattr(torch, "cudnn_convolution_transpose" if transposed else "cudnn_convolution", op)
    call = torch_conv.conv(2, (2, 1), (1, 0), (1, 2), mode, deterministic, 10, 10, (1, 0) if transposed else None)
    x, w = object(), object()
    assert call(x, w) == "direct"
    (args,) = op.calls
    assert args[0] is x and args[1] is w                        # the operands as given
    geometry = ((1, 0), (1, 0), (2, 1), (1, 2)) if transposed else ((1, 0), (2, 1), (1, 2))
    assert args[2:-4] == geometry and args[-4] == 1              # padding, [output padding,] stride, dilation, groups
    assert args[-3:] == (benchmark, exact, allow_tf32)


def _through_flags_recorder(monkeypatch, dims, transposed):
    seen = []
    fn = _CONV[(dims, transposed)]

    def spy(x, w, bias, *args):
        seen.append((precision.torch_conv_precision(), torch.backends.cudnn.deterministic, bias, args))
        return fn(x, w, bias, *args)
    table = torch_conv.CONV_T if transposed else torch_conv.CONV
    monkeypatch.setitem(table, dims, spy)
    return seen


@pytest.mark.parametrize("why", ["cudnn disabled", "image past 2^31 elements", "no cuDNN"])
@pytest.mark.parametrize("transposed", [False, True])
def test_elsewhere_the_call_is_pytorchs_conv_under_the_flags(monkeypatch, why, transposed):
    """Where F.convNd would not pick cuDNN (or there is none), the call is F.convNd itself, inside
    precision.cudnn_settings: the mode's precision and the deterministic switch hold during it and are restored."""
    seen = _through_flags_recorder(monkeypatch, 2, transposed)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: why != "no cuDNN")
    monkeypatch.setattr(torch_conv, "_cudnn_enabled", lambda: why != "cudnn disabled")
    monkeypatch.setattr(torch, "cudnn_convolution", _Recorder())
    monkeypatch.setattr(torch, "cudnn_convolution_transpose", _Recorder())
    image = 2 ** 31 if why == "image past 2^31 elements" else 100
    before = (precision.torch_conv_precision(), torch.backends.cudnn.deterministic)
    call = torch_conv.conv(2, (1, 1), (1, 1), (1, 1), "ieee", True, image, 100, (0, 0) if transposed else None)
    x, w = torch.randn(2, 3, 6, 6), torch.randn(3, 3, 3, 3)
    y = call(x, w)
    want = _CONV[(2, transposed)](x, w, None, 1, 1, *((0,) if transposed else ()))
    assert torch.allclose(y, want, atol=1e-5)
    (mode_inside, det_inside, bias, _), = seen
    assert (mode_inside, det_inside, bias) == ("ieee", True, None)
    assert (precision.torch_conv_precision(), torch.backends.cudnn.deterministic) == before
    assert not torch.cudnn_convolution.calls and not torch.cudnn_convolution_transpose.calls


def test_image_elements():
    assert torch_conv.image_elements((7, 3, 4, 5)) == 60


# --- GPU: the direct op's bits are F.convNd's ---------------------------------------------------------------------

_PROBLEMS = [   # (dims, transposed, x shape, weight shape, stride, padding, dilation, output padding)
    (2, False, (3, 8, 19, 23), (16, 8, 3, 3), (1, 1), (0, 0), (1, 1), None),
    (2, False, (2, 3, 33, 31), (8, 3, 5, 5), (2, 2), (1, 2), (1, 1), None),
    (3, False, (2, 4, 7, 9, 10), (8, 4, 3, 3, 3), (1, 1, 1), (1, 0, 1), (1, 2, 1), None),
    (2, True, (2, 16, 9, 11), (16, 8, 4, 4), (2, 2), (1, 1), (1, 1), (0, 1)),
    (3, True, (2, 32, 4, 5, 4), (32, 64, 5, 5, 5), (2, 2, 2), (2, 2, 2), (1, 1, 1), (0, 0, 0)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("mode", ["tf32", "ieee", "bfloat16", "float16"])
@pytest.mark.parametrize("problem", _PROBLEMS, ids=lambda p: f"{p[0]}d{'T' if p[1] else ''}-{'x'.join(map(str, p[2]))}")
def test_direct_op_gives_pytorchs_bits(problem, mode, channels_last):
    dims, transposed, xs, ws, stride, padding, dilation, output_padding = problem
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(mode, torch.float32)
    torch.manual_seed(0)
    x = torch.randn(xs, device="cuda").to(dtype)
    w = (torch.randn(ws, device="cuda") / 8).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if dims == 2 else torch.channels_last_3d)
    call = torch_conv.conv(dims, stride, padding, dilation, mode, True, torch_conv.image_elements(xs), 1,
                           output_padding)
    assert call.__name__ == "direct"      # the route under test (F.convNd under the flags is the reference)
    got = call(x, w)
    args = (stride, padding, output_padding, 1, dilation) if transposed else (stride, padding, dilation)
    with precision.cudnn_settings(mode, True):
        want = _CONV[(dims, transposed)](x, w, None, *args)
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    assert torch.equal(got, want)
