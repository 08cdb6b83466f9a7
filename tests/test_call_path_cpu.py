"""The per-call path of a fused model: once a call signature is prepared, a common call (a batched input, no grad, no
hooks, no autocast, no tracing) is a few checks and one lookup between ``fused_model(x)`` and the signature's prepared
call — no more of fullfuse's Python frames than the layers that own those checks (host time per call), and the
prepared call's answer returned as it is.  The prepared call is a stand-in here (a CPU input's own would be PyTorch's
ops): what is counted is the path above it."""
import contextlib
import sys
import warnings

import pytest
import torch

import fullfuse
import fullfuse.precision
from fullfuse.seed_models import seed_model

# the fused model's call, the region's change test and call, SpecCalls' common-call test and dispatcher (float32's
# precision under "auto", read per call from torch's flags, is not counted: how it reads them depends on the torch
# build)
FRAMES_ABOVE_THE_PREPARED_CALL = 5
SHAPES = {"A": (1, 8, 16, 16), "B": (1, 32, 4, 4, 4)}


@contextlib.contextmanager
def _stand_in(fused, prepared):
    """The fused model's prepared calls (their process-wide SpecCalls, which other models of the spec share) replaced
    by ``prepared`` for the block, as they were after it."""
    spec_calls = fused.plans[0].calls
    kept = dict(spec_calls._prepared)
    try:
        for key in kept:
            spec_calls._prepared[key] = (("fused", "a stand-in prepared call"), prepared)
        yield
    finally:
        spec_calls._prepared.clear()
        spec_calls._prepared.update(kept)


def _fullfuse_frames(call, until) -> list:
    """The names of fullfuse's own Python frames (but precision.py's) entered while ``call()`` runs, in order, up to
    the first frame of function ``until`` (its name last; nothing after it)."""
    package = fullfuse.__file__.rsplit("/", 1)[0]
    precision = fullfuse.precision.__file__
    seen = []

    def profile(frame, event, arg):
        if event != "call" or (seen and seen[-1] == until.__name__):
            return
        name = frame.f_code.co_filename
        if frame.f_code is until.__code__ or (name.startswith(package) and name != precision):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("family", ["A", "B"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_a_prepared_signature_is_a_lookup_away(family, mode):
    torch.manual_seed(0)
    model = seed_model(family).eval()
    x = torch.randn(SHAPES[family])
    fused = fullfuse.fused_model(model)
    answer = torch.zeros(3)
    calls = []

    def prepared(x_, weight, bias):
        calls.append((x_, weight, bias))
        return answer

    with getattr(torch, mode)():
        fused(x)   # (prepares the signature)
        with _stand_in(fused, prepared):
            frames = _fullfuse_frames(lambda: fused(x), prepared)
            assert fused(x) is answer
        assert frames[-1] == "prepared"
        above = frames[:-1]
        assert len(above) <= FRAMES_ABOVE_THE_PREPARED_CALL, above
    conv = model.conv if family == "A" else model.conv_transpose
    got_x, got_weight, got_bias = calls[-1]
    assert got_x is x and got_weight is conv.weight and got_bias is conv.bias
    assert fused.plans[0].last_path == "fused"


@pytest.mark.parametrize("family", ["A", "B"])
def test_the_prepared_call_serves_only_the_common_call(family):
    """Autograd (parameters that need grad, grad on) and a hook added to the conv since fusing take the region's own
    ops; a hook on the fused model itself runs around the prepared call."""
    torch.manual_seed(0)
    model = seed_model(family).eval()
    x = torch.randn(SHAPES[family])
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        fused(x)
    stand_in = torch.zeros(3)
    with torch.no_grad():
        expected = model(x)
    conv = model.conv if family == "A" else model.conv_transpose
    with _stand_in(fused, lambda *args: stand_in):
        with warnings.catch_warnings():   # (fullfuse says once per process that autograd runs PyTorch's ops)
            warnings.simplefilter("ignore")
            assert torch.equal(fused(x).detach(), expected)   # (grad on, parameters need grad: PyTorch's ops)
        with torch.no_grad():
            assert fused(x) is stand_in
            handle = fused.register_forward_hook(lambda module, args, out: out + 1)
            try:
                assert torch.equal(fused(x), stand_in + 1)
            finally:
                handle.remove()
            handle = conv.register_forward_hook(lambda module, args, out: out)
            try:
                assert torch.equal(fused(x), expected)
            finally:
                handle.remove()
            assert fused(x) is stand_in
