"""A fused model's answer against its original's, as the CPU tests compare them: the same error type where the
original raises, else the same shape, dtype and requires_grad, and the same values bit for bit."""
import warnings

import torch


def answer(fn, x, mode):
    """``fn(x)`` under ``mode()`` (a context: a grad mode, an autocast), or the exception it raised."""
    try:
        with warnings.catch_warnings():   # (fullfuse says once per process that autograd runs PyTorch's ops)
            warnings.simplefilter("ignore")
            with mode():
                return fn(x)
    except Exception as exc:   # (compared by type)
        return exc


def assert_same_answer(expected, got, what: str, values: bool = True) -> None:
    """(values: compare the values too; where False, only the error type or the shape, dtype and requires_grad.)"""
    if isinstance(expected, Exception) or isinstance(got, Exception):
        assert type(got) is type(expected), f"{what}: {expected!r} against {got!r}"
        return
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    assert got.requires_grad == expected.requires_grad, what
    assert not values or torch.equal(got.detach(), expected.detach()), what
