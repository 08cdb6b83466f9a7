"""fullfuse.launch on CPU: the buffers kernels write."""
import pytest
import torch

from fullfuse import launch


@pytest.mark.parametrize("poison", [False, True])
def test_new_output_follows_its_like_tensor_unless_told(monkeypatch, poison):
    """launch.new_output: the shape asked for, on the like tensor's device, in its dtype unless told (whatever the
    like tensor's own shape and layout); poisoned outputs start as NaN."""
    monkeypatch.setattr(launch, "POISON_OUTPUTS", poison)
    like = torch.zeros(3, 8, 5, 5, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    for dtype, want in ((None, torch.bfloat16), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
        out = launch.new_output(like, (3, 16, 1, 1), dtype)
        assert out.shape == (3, 16, 1, 1) and out.dtype == want and out.device == like.device
        assert out.is_contiguous() and not out.requires_grad
        assert bool(out.isnan().all()) == poison
    scalar = launch.new_output(like, ())   # (a squeezed (1, 1) output)
    assert scalar.shape == () and scalar.dtype == like.dtype
